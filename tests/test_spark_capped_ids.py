"""Capped ids (``preprocess.ids: modulo``): id = the value's hex digits as an integer, modulo its
column's cap (missing: 0), in both engines, with the same accounting, rejects and splits as the
other modes.

The ids are checked against a plain computation, ``int(hex, 16) % cap`` over the lines read
by the documented rules (``spark_fixtures.reference_parse``), on generated days salted with
every kind of bad line and on the 200 real rows; the two engines' splits file by file; the
pipeline end to end (preprocess, convert) to a binary dataset whose tables are the caps.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dlrm_contracts.config import ConfigError, PreprocessConfig
from dlrm_contracts.errors import ExitCode
from dlrm_contracts.layout import WorkdirLayout
from dlrm_contracts.schema import CAT_COLUMNS, REJECT_REASONS
from spark_fixtures import (
    assert_rows_equal,
    read_split,
    reference_numerical,
    reference_parse,
    run,
    salted_days,
    sort_key,
    split_files,
    write_days,
)

# small caps collide (and cap 1 sends everything to 0), 2**31 keeps every 32-bit value whole
CAPS = [1, 2, 3, 7, 10, 97, 1000, 2**31, 65536, 5, *range(11, 27)]
SPLITS = ("train", "test", "validation")


def reference_modulo(days: list[list[str]], caps: list[int]) -> tuple[dict, dict]:
    """(rows per split, rejected lines per reason) by the rules, ids ``int(hex, 16) % cap``."""
    rejected = {r: 0 for r in REJECT_REASONS}
    parsed_days = []
    for lines in days:
        parsed = []
        for line in lines:
            reason, _, label, ints, cats = reference_parse(line)
            if reason:
                rejected[reason] += 1
                parsed.append(None)
                continue
            ids = [int(v or "0", 16) % cap for v, cap in zip(cats, caps)]
            parsed.append((label, *[reference_numerical(x) for x in ints], *ids))
        parsed_days.append(parsed)
    last = parsed_days[-1]
    half = (len(last) + 1) // 2
    splits = {
        "train": [r for day in parsed_days[:-1] for r in day if r],
        "test": [r for r in last[:half] if r],
        "validation": [r for r in last[half:] if r],
    }
    return splits, rejected


def _check(work: Path, summary: dict, days: list[list[str]], caps: list[int]) -> None:
    layout = WorkdirLayout.at(work)
    expected, rejected = reference_modulo(days, caps)
    for split in SPLITS:
        rows = read_split(layout.parquet_split(split))
        if split == "train":  # in its seeded order, which no other mode's tests pin either
            rows, expected[split] = sorted(rows, key=sort_key), sorted(expected[split], key=sort_key)
        assert_rows_equal(rows, expected[split], split)
    assert json.loads(layout.parquet_model_size.read_text()) == dict(zip(CAT_COLUMNS, caps))
    assert summary["table_sizes"] == dict(zip(CAT_COLUMNS, caps))
    assert summary["ids"] == "modulo" and summary["threshold_spec"] is None
    quality = json.loads(layout.data_quality.read_text())
    assert quality["identity_holds"] and quality["rows_out_checked"]
    assert quality["totals"]["rejected_by_reason"] == rejected
    assert quality["rows_in"] == sum(len(d) for d in days)
    rejects = [
        json.loads(line) for p in layout.rejects.rglob("*.json") for line in p.read_text().splitlines()
    ]
    assert len(rejects) == sum(rejected.values())
    # nothing counted, no dictionary: the count pass only read the statistics
    assert not (layout.counts / "days.json").exists()
    assert not (layout.parquet / "dictionaries").exists()


@pytest.mark.spark
def test_both_engines_cap_ids_like_the_reference(tmp_path, spark, real_sample):
    generated = salted_days(37, 3, 300)
    real = [line for line in real_sample.read_text().split("\n") if line]
    # the real rows (39 of them short) as a fourth, last day: test and validation hold them
    days = [*generated, real]
    raw = write_days(tmp_path / "raw", days)
    summaries = {}
    for engine in ("arrow", "sql"):
        summaries[engine] = run(
            spark, raw, tmp_path / engine, "2", engine=engine, ids="modulo", caps=CAPS, max_reject_rate=0.5
        )
        _check(tmp_path / engine, summaries[engine], days, CAPS)
    for split in SPLITS:
        assert split_files(tmp_path / "arrow", split) == split_files(tmp_path / "sql", split), split
    a, s = WorkdirLayout.at(tmp_path / "arrow"), WorkdirLayout.at(tmp_path / "sql")
    assert json.loads(a.data_quality.read_text()) == json.loads(s.data_quality.read_text())
    # the caps matter: the large cap kept a value whole that the small ones folded
    test = np.array(read_split(a.parquet_split("test")), dtype=np.float64)
    assert test[:, 14 + 7].max() >= 2**16 and test[:, 14].max() == 0


def test_caps_are_checked_with_the_ids_mode():
    assert PreprocessConfig(ids="modulo", caps=CAPS).caps == CAPS
    for settings, words in [
        ({"ids": "modulo"}, "caps is not set"),
        ({"caps": 5}, "only with ids: modulo"),
        ({"ids": "stable", "caps": CAPS}, "only with ids: modulo"),
        ({"ids": "modulo", "caps": [5] * 25}, "lists 25 caps"),
        ({"ids": "modulo", "caps": 0}, ">= 1"),
        ({"ids": "modulo", "caps": [5] * 25 + [2**31 + 1]}, "<= 2147483648"),
        ({"ids": "modulo", "caps": [True] * 26}, "must be integers"),
        ({"ids": "modulo", "caps": 5, "frequency_threshold": "15"}, "does not apply"),
        ({"ids": "modulo", "caps": 5, "dictionary_days": "train"}, "does not apply"),
    ]:
        with pytest.raises(ConfigError, match=words):
            PreprocessConfig(**settings)


PIPELINE_CONFIG = """
generator:
  days: 3
  rows_per_day: 3000
  seed: 77
spark:
  driver_memory: 2g
preprocess:
  ids: modulo
  caps: {caps}
convert:
  batch_rows: 512
"""


@pytest.mark.spark
@pytest.mark.slow
def test_the_pipeline_makes_a_binary_dataset_whose_tables_are_the_caps(tmp_path):
    import pyarrow.parquet as pq

    from dlrm_contracts.binary_format import cat_dtype, cat_file, read_info
    from pipeline_helpers import run as run_pipeline

    caps = [100_000, 40, 3, *[300] * 20, 2**31, 1, 50_000]
    config = tmp_path / "pipeline.yaml"
    config.write_text(PIPELINE_CONFIG.format(caps=json.dumps(caps)))
    proc, summary = run_pipeline(tmp_path / "work", config, "--stages", "generate,preprocess,convert")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert summary["table_sizes"] == caps
    layout = WorkdirLayout.at(tmp_path / "work")
    info = read_info(layout.binary)
    assert list(info.table_sizes) == caps and info.extra["ids"] == "modulo"
    assert info.threshold_spec is None
    # each column in the narrowest type that holds its cap, the same ids as the parquet
    test = pq.read_table(sorted(layout.parquet_split("test").glob("part-*.parquet")))
    for i, (column, cap) in enumerate(zip(CAT_COLUMNS, caps)):
        assert info.cat_dtypes[i] == cat_dtype(cap).name
        ids = np.fromfile(layout.binary / "test" / cat_file(i), cat_dtype(cap))
        assert np.array_equal(ids, test.column(column).to_numpy()), column
        assert ids.min() >= 0 and ids.max() < cap
    # no threshold to raise: one line, the converters' exit code
    raised = subprocess.run(
        [
            sys.executable,
            "-m",
            "converters",
            "rethreshold",
            "--source",
            str(layout.binary),
            "--counts",
            str(layout.counts),
            "--frequency-threshold",
            "5",
            "--output",
            str(tmp_path / "raised"),
        ],
        capture_output=True,
        text=True,
    )
    assert raised.returncode == ExitCode.CONVERT and "capped ids" in raised.stderr
    assert not (tmp_path / "raised").exists()


def test_the_preflight_sizes_the_tables_as_the_caps(tmp_path):
    from dlrm_contracts.config import PipelineConfig
    from pipeline.preflight import _table_sizes

    config = PipelineConfig(preprocess=PreprocessConfig(ids="modulo", caps=CAPS))
    assert _table_sizes(config, WorkdirLayout.at(tmp_path)) == CAPS
