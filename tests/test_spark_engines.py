"""The two engines (preprocess.engine: arrow, sql) write the same data.

Real Criteo rows (with their short lines) and salted bad input, with broadcast and with
shuffle-joined dictionaries: every split is compared file by file, row for row in order, with
the same parquet schema (the Arrow engine's files are encoded by pyarrow, the SQL engine's by
Spark, so their bytes differ); the counts, dictionaries, rejects and reports row for row.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from dlrm_contracts.layout import WorkdirLayout
from spark_fixtures import run, salted_days, spark, write_days  # noqa: F401
from test_spark_exactness import check_against_reference

pytestmark = pytest.mark.spark

SPLITS = ("train", "test", "validation")


def _split_files(work: Path, split: str) -> list:
    """Each file of the split, in name order, as (its parquet schema, its rows in order)."""
    files = sorted(WorkdirLayout.at(work).parquet_split(split).glob("part-*.parquet"))
    return [(str(pq.read_schema(p).remove_metadata()), pq.read_table(p).to_pylist()) for p in files]


def _rows(directory: Path) -> list[tuple]:
    """Every row of a Spark-written parquet or JSON directory, in a canonical order."""
    if any(directory.rglob("*.json")):
        rows = [tuple(sorted(json.loads(line).items())) for p in directory.rglob("*.json")
                for line in p.read_text().splitlines()]
    else:
        table = pq.read_table(directory)
        rows = [tuple(sorted(r.items())) for r in table.to_pylist()]
    return sorted(rows, key=repr)


def assert_same_outputs(arrow: Path, sql: Path) -> None:
    a, s = WorkdirLayout.at(arrow), WorkdirLayout.at(sql)
    for split in SPLITS:
        files = _split_files(arrow, split)
        assert files, split
        assert files == _split_files(sql, split), f"{split} parquet differs between the engines"
        assert "required" in str(pq.ParquetFile(next(WorkdirLayout.at(arrow).parquet_split(split)
                                                     .glob("part-*.parquet"))).schema), split
    assert _rows(a.counts / "values") == _rows(s.counts / "values")
    assert _rows(a.parquet / "dictionaries") == _rows(s.parquet / "dictionaries")
    assert _rows(a.rejects) == _rows(s.rejects)
    assert (a.counts / "histogram.parquet").read_bytes() == (s.counts / "histogram.parquet").read_bytes()
    for name in ("data_quality.json", "model_size.json"):
        assert json.loads((a.parquet / name).read_text()) == json.loads((s.parquet / name).read_text())
    days_a = json.loads((a.counts / "days.json").read_text())
    days_s = json.loads((s.counts / "days.json").read_text())
    assert days_a == days_s


def _both(spark, raw: Path, tmp: Path, threshold: str, **preprocess):
    summaries = {}
    for engine in ("arrow", "sql"):
        summaries[engine] = run(spark, raw, tmp / engine, threshold, engine=engine, **preprocess)
        assert summaries[engine]["engine"] == engine
    assert_same_outputs(tmp / "arrow", tmp / "sql")
    return summaries


def test_engines_agree_on_real_rows(tmp_path, spark, real_sample):
    lines = real_sample.read_text().split("\n")
    lines = [line for line in lines if line]
    days = [lines[:60], lines[60:130], lines[130:]]
    raw = write_days(tmp_path / "raw", days)
    summaries = _both(spark, raw, tmp_path, "2")
    check_against_reference(days, tmp_path / "arrow", summaries["arrow"], "2")
    assert summaries["arrow"]["data_quality"]["rows_padded"] == 39


@pytest.mark.parametrize("broadcast_max_values", [2_000_000, 5])
def test_engines_agree_on_salted_bad_input(tmp_path, spark, broadcast_max_values):
    days = salted_days(41, 3, 400)
    raw = write_days(tmp_path / "raw", days, crlf=True)
    summaries = _both(spark, raw, tmp_path, "2,C7:1", max_reject_rate=0.5,
                      broadcast_max_values=broadcast_max_values)
    assert summaries["arrow"]["data_quality"]["rows_rejected"] > 0
    check_against_reference(days, tmp_path / "arrow", summaries["arrow"], "2,C7:1")


def test_order_keys_are_sparks_xxhash64(spark):
    from pyspark.sql import functions as F

    from spark_jobs.order import train_key_columns, train_keys

    lines = np.array([0, 1, 2, 12345, 2**33 + 7, 10**12], np.int64)
    frame = spark.createDataFrame([(int(x),) for x in lines], "line long")
    for seed, day in [(12345, 0), (7, 23), (-5, 3)]:
        key, tie = train_key_columns(seed, day, F.col("line"))
        got = frame.select(key.alias("key"), tie.alias("tie")).collect()
        want_key, want_tie = train_keys(seed, day, lines)
        assert [r["key"] for r in got] == want_key.tolist()
        assert [r["tie"] for r in got] == want_tie.tolist()


def test_engine_choice():
    from dlrm_contracts.config import PreprocessConfig, SparkConfig
    from dlrm_contracts.config import ConfigError
    from spark_jobs.preprocess import engine_name

    assert engine_name(PreprocessConfig(), SparkConfig()) == "arrow"
    assert engine_name(PreprocessConfig(), SparkConfig(gpu=True)) == "sql"   # RAPIDS runs SQL
    assert engine_name(PreprocessConfig(engine="arrow"), SparkConfig(gpu=True)) == "arrow"
    with pytest.raises(ConfigError, match="preprocess.engine 'fast'"):
        engine_name(PreprocessConfig(engine="fast"), SparkConfig())
