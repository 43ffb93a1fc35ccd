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
from dlrm_contracts.schema import SPLITS
from spark_fixtures import (
    canonical_rows,
    check_against_reference,
    random_days,
    run,
    salted_days,
    split_files,
    write_days,
)

pytestmark = pytest.mark.spark


def assert_same_outputs(arrow: Path, sql: Path) -> None:
    a, s = WorkdirLayout.at(arrow), WorkdirLayout.at(sql)
    for split in SPLITS:
        files = split_files(arrow, split)
        assert files, split
        assert files == split_files(sql, split), f"{split} parquet differs between the engines"
        assert "required" in str(
            pq.ParquetFile(next(WorkdirLayout.at(arrow).parquet_split(split).glob("part-*.parquet"))).schema
        ), split
    assert canonical_rows(a.counts / "values") == canonical_rows(s.counts / "values")
    assert canonical_rows(a.parquet / "dictionaries") == canonical_rows(s.parquet / "dictionaries")
    assert canonical_rows(a.rejects) == canonical_rows(s.rejects)
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
    """The real sample (its first 100 lines lost trailing empty fields): the short lines land
    in train and in test, the clean ones in validation."""
    lines = real_sample.read_text().split("\n")
    lines = [line for line in lines if line]
    days = [lines[:60], lines[60:130], lines[130:]]
    raw = write_days(tmp_path / "raw", days)
    summaries = _both(spark, raw, tmp_path, "2")
    check_against_reference(days, tmp_path / "arrow", summaries["arrow"], "2")
    assert summaries["arrow"]["data_quality"]["rows_padded"] == 39
    assert summaries["arrow"]["data_quality"]["rows_rejected"] == 0


SALTED_THRESHOLD = "2,C7:1"


@pytest.fixture(scope="module")
def salted_arrow(tmp_path_factory, spark):
    """Salted days and the Arrow engine's run on them, shared by the SQL runs it is compared
    with: the Arrow engine joins nothing, so ``broadcast_max_values`` does not change its run."""
    days = salted_days(41, 3, 400)
    tmp = tmp_path_factory.mktemp("salted_engines")
    raw = write_days(tmp / "raw", days, crlf=True)
    summary = run(spark, raw, tmp / "arrow", SALTED_THRESHOLD, engine="arrow", max_reject_rate=0.5)
    return days, raw, tmp / "arrow", summary


@pytest.mark.parametrize("broadcast_max_values", [2_000_000, 5])
def test_engines_agree_on_salted_bad_input(tmp_path, spark, salted_arrow, broadcast_max_values):
    """The SQL engine with broadcast dictionaries, and with shuffle joins (5 values at most)."""
    days, raw, arrow, summary = salted_arrow
    assert summary["engine"] == "arrow"
    sql = run(
        spark,
        raw,
        tmp_path / "sql",
        SALTED_THRESHOLD,
        engine="sql",
        max_reject_rate=0.5,
        broadcast_max_values=broadcast_max_values,
    )
    assert sql["engine"] == "sql"
    assert_same_outputs(arrow, tmp_path / "sql")
    assert summary["data_quality"]["rows_rejected"] > 0
    check_against_reference(days, arrow, summary, SALTED_THRESHOLD)


def _gzip_day(path: Path, before: list[str], zeros: int, after: list[str]) -> None:
    """A gzip day: lines, then one line of ``zeros`` zero bytes (written a megabyte at a time,
    never held whole), then more lines."""
    import zlib

    stream = zlib.compressobj(9, zlib.DEFLATED, 31)
    with open(path, "wb") as fh:
        fh.write(stream.compress("".join(line + "\n" for line in before).encode()))
        for k in range(0, zeros, 1 << 20):
            fh.write(stream.compress(bytes(min(1 << 20, zeros - k))))
        fh.write(stream.compress(("\n" + "".join(line + "\n" for line in after)).encode()))
        fh.write(stream.flush())


# Far longer than the Arrow engine's blocks (preprocess.arrow_block_kb, 1 MB) and than the
# shared session's read splits (64 KB), so each line runs across several of both.
HUGE_LINE = 6 << 20
BOMB_LINE = 16 << 20


def test_engines_agree_on_a_huge_line_and_a_gzip_bomb(tmp_path, spark):
    """A plain day with a 6 MB line and a gzip day whose 16 MB line of zeros is a few KB on
    disk: each is one line_too_long reject whose rejects entry holds only the limit's first
    bytes and the full length; the other lines are read as usual, by both engines alike."""
    from dlrm_contracts.config import PreprocessConfig

    limit = PreprocessConfig().max_line_bytes
    days = random_days(43, 3, 150)
    raw = tmp_path / "raw"
    raw.mkdir()
    cut_in_a_character = "x" + "\u00e9" * (limit // 2)  # the engines cut the same bytes
    (raw / "day_0").write_text(
        "\n".join(days[0][:150] + [cut_in_a_character, "1\t" + "7" * HUGE_LINE] + days[1][:10])
    )
    _gzip_day(raw / "day_1.gz", days[1][10:80], BOMB_LINE, days[1][80:])
    (raw / "day_2").write_text("\n".join(days[2]) + "\n")
    assert (raw / "day_1.gz").stat().st_size < 1 << 20
    for engine in ("arrow", "sql"):
        run(spark, raw, tmp_path / engine, "2", engine=engine)
    a, s = WorkdirLayout.at(tmp_path / "arrow"), WorkdirLayout.at(tmp_path / "sql")
    for split in SPLITS:  # the rows in order (how the last day's rows fall into files
        rows = [
            [row for _, part in split_files(tmp_path / e, split) for row in part] for e in ("arrow", "sql")
        ]  # follows each engine's read partitions here)
        assert rows[0] and rows[0] == rows[1], split
    for name in ("data_quality.json", "model_size.json"):
        assert json.loads((a.parquet / name).read_text()) == json.loads((s.parquet / name).read_text())
    assert canonical_rows(a.rejects) == canonical_rows(s.rejects)
    assert canonical_rows(a.counts / "values") == canonical_rows(s.counts / "values")
    assert canonical_rows(a.parquet / "dictionaries") == canonical_rows(s.parquet / "dictionaries")
    report = json.loads(WorkdirLayout.at(tmp_path / "arrow").data_quality.read_text())
    assert report["totals"]["rejected_by_reason"]["line_too_long"] == 3
    assert report["rejected"] == 3 and report["identity_holds"]
    assert report["rows_in"] == 3 * 150 + 3
    rejects = sorted(
        (
            json.loads(line)
            for p in WorkdirLayout.at(tmp_path / "arrow").rejects.glob("*.json")
            for line in p.read_text().splitlines()
        ),
        key=lambda r: (r["file"], r["line_number"]),
    )
    assert [(r["file"], r["line_number"], r["reason"], r["line_bytes"]) for r in rejects] == [
        ("day_0", 151, "line_too_long", limit + 1),
        ("day_0", 152, "line_too_long", 2 + HUGE_LINE),
        ("day_1.gz", 71, "line_too_long", BOMB_LINE),
    ]
    assert [r["line"] for r in rejects] == [
        ("x" + "\u00e9" * (limit // 2))[: limit // 2] + "\ufffd",
        ("1\t" + "7" * limit)[:limit],
        "\0" * limit,
    ]


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
    assert engine_name(PreprocessConfig(), SparkConfig(gpu=True)) == "sql"  # RAPIDS runs SQL
    assert engine_name(PreprocessConfig(engine="arrow"), SparkConfig(gpu=True)) == "arrow"
    with pytest.raises(ConfigError, match="preprocess.engine 'fast'"):
        engine_name(PreprocessConfig(engine="fast"), SparkConfig())
