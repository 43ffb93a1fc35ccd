"""Every output row of spark_jobs equals the plain-Python reference of the same rules.

Inputs: the synthetic generator's data and our own random days (the real Criteo sample, whose
first 100 lines lost trailing empty fields, is checked against the reference by
tests/test_spark_engines.py, on the run it compares the engines with). Also: counts,
histogram, table sizes, determinism, threshold independence of the train order, and the
prefix property of ids.
"""

from __future__ import annotations

import json
from collections import Counter

import pyarrow.parquet as pq
import pytest

from dlrm_contracts.config import GeneratorConfig
from dlrm_contracts.layout import WorkdirLayout
from dlrm_contracts.schema import CAT_COLUMNS
from spark_fixtures import (
    check_against_reference,
    read_split,
    reference_missing_rates,
    reference_preprocess,
    run,
    random_days,
    write_days,
)

pytestmark = pytest.mark.spark

THRESHOLD = "3,C3:1,C5:10,C20:0"


def _day_lines(directory) -> list[list[str]]:
    days = sorted(directory.glob("day_*"), key=lambda p: int(p.name.split("_")[1].split(".")[0]))
    return [p.read_text().split("\n")[:-1] for p in days]


@pytest.fixture(scope="module")
def generated(tmp_path_factory, spark):
    from pipeline.synthetic import generate

    raw = tmp_path_factory.mktemp("gen") / "raw"
    generate(
        raw,
        GeneratorConfig(
            days=3,
            rows_per_day=1500,
            seed=7,
            chunk_rows=1000,
            workers=1,
            cardinality_scale=0.00001,
            cardinality_floor=50,
        ),
    )
    work = tmp_path_factory.mktemp("gen_work")
    summary = run(spark, raw, work, THRESHOLD)
    return raw, work, summary


def test_generated_input_matches_reference(generated):
    raw, work, summary = generated
    check_against_reference(_day_lines(raw), work, summary, THRESHOLD)


def test_parquet_schema_is_the_contract(generated):
    _, work, _ = generated
    files = sorted((WorkdirLayout.at(work).parquet_split("train")).glob("part-*.parquet"))
    schema = pq.read_schema(files[0])
    assert schema.names == ["label", *[f"I{i}" for i in range(1, 14)], *CAT_COLUMNS]
    assert [str(t) for t in schema.types] == ["int32"] + ["float"] * 13 + ["int32"] * 26


def test_counts_and_histogram_match_reference(generated):
    raw, work, _ = generated
    lines = _day_lines(raw)
    ref = reference_preprocess(lines, THRESHOLD)
    counts_dir = WorkdirLayout.at(work).counts
    for k, expected in enumerate(ref.day_counts):
        table = pq.read_table(counts_dir / "values" / f"day={k}").to_pylist()
        got = {c: Counter() for c in CAT_COLUMNS}
        for r in table:  # a value is stored as the integer of its 8 hex digits
            got[r["column"]][f"{r['value']:08x}"] += r["count"]
        assert got == expected, f"counts of day {k}"
    hist = pq.read_table(counts_dir / "histogram.parquet").to_pylist()
    expected_hist = Counter()
    for c in CAT_COLUMNS:
        total = Counter()
        for counts in ref.day_counts:
            total.update(counts[c])
        expected_hist.update((c, n) for n in total.values())
    assert {(r["column"], r["count"]): r["num_values"] for r in hist} == dict(expected_hist)
    days = json.loads((counts_dir / "days.json").read_text())["days"]
    assert [d["rows_read"] for d in days] == [len(x) for x in lines]
    for d, day_lines in zip(days, lines):
        assert d["missing_rate"] == pytest.approx(reference_missing_rates(day_lines)), d["file"]


def test_two_runs_identical_and_train_order_threshold_independent(generated, tmp_path, spark):
    raw, work, _ = generated
    again = tmp_path / "again"
    run(spark, raw, again, THRESHOLD)
    high = tmp_path / "high"
    run(spark, raw, high, "20")
    for split in ("train", "test", "validation"):
        first = read_split(WorkdirLayout.at(work).parquet_split(split))
        assert first == read_split(WorkdirLayout.at(again).parquet_split(split)), split
        # label and numericals do not depend on the threshold: same rows in the same order
        at_high = read_split(WorkdirLayout.at(high).parquet_split(split))
        assert [r[:14] for r in first] == [r[:14] for r in at_high], split
    # prefix property: the kept set at threshold 20 is ids 1..k' of the lower threshold
    sizes_high = json.loads(WorkdirLayout.at(high).parquet_model_size.read_text())
    low_rows = read_split(WorkdirLayout.at(work).parquet_split("train"))
    high_rows = read_split(WorkdirLayout.at(high).parquet_split("train"))
    for i, c in enumerate(CAT_COLUMNS):
        for low, hi in zip(low_rows, high_rows):
            expected = low[14 + i] if low[14 + i] < sizes_high[c] else 0
            assert hi[14 + i] == expected, f"{c}: id {low[14 + i]} at the low threshold"


def test_random_days_with_shuffle_joins_keep_line_order(tmp_path, spark):
    """Dictionaries above broadcast_max_values go through shuffle joins: still exact and ordered."""
    days = random_days(11, 3, 700)
    raw = write_days(tmp_path / "raw", days)
    summary = run(spark, raw, tmp_path / "work", "2,C7:1", broadcast_max_values=5)
    check_against_reference(days, tmp_path / "work", summary, "2,C7:1")


def _xxh64_inverse_of_8_bytes(digest: int, seed: int = 42) -> bytes:
    """Undo Spark's xxhash64 of an 8-byte string step by step (each step is a bijection)."""
    mask = 2**64 - 1
    p1, p2, p3, p4, p5 = (
        0x9E3779B185EBCA87,
        0xC2B2AE3D27D4EB4F,
        0x165667B19E3779F9,
        0x85EBCA77C2B2AE63,
        0x27D4EB2F165667C5,
    )

    def rotr(x, r):
        return ((x >> r) | (x << (64 - r))) & mask

    h = digest & mask
    h ^= h >> 32
    h = h * pow(p3, -1, 2**64) & mask
    h ^= (h >> 29) ^ (h >> 58)
    h = h * pow(p2, -1, 2**64) & mask
    h ^= h >> 33
    h = rotr((h - p4) * pow(p1, -1, 2**64) & mask, 27)
    h ^= (seed + p5 + 8) & mask
    k1 = rotr(h * pow(p1, -1, 2**64) & mask, 31) * pow(p2, -1, 2**64) & mask
    return k1.to_bytes(8, "little")


def test_join_keys_identify_categorical_values_exactly(spark):
    """The transform joins on xxhash64(value); for 8-character values that key is invertible,
    so two different values can never share a key (checked by inverting Spark's own keys)."""
    import random

    from pyspark.sql import functions as F

    from spark_jobs.engines.sql.parse import value_key

    rng = random.Random(5)
    values = ["%08x" % rng.getrandbits(32) for _ in range(2000)] + ["00000000", "ffffffff"]
    rows = (
        spark.createDataFrame([(v,) for v in values], "value string")
        .select("value", value_key(F.col("value")).alias("key"))
        .collect()
    )
    assert len({r["key"] for r in rows}) == len(values)
    for r in rows:
        assert _xxh64_inverse_of_8_bytes(r["key"]).decode("ascii") == r["value"]


def test_input_without_any_categorical_value(tmp_path, spark):
    """No valid line has a categorical (all cut after the integers): no value counts are written,
    which once failed with UNABLE_TO_INFER_SCHEMA; every table has size 1 and every id is 0."""
    days = [
        [line.split("\t", 14)[0] if i % 3 else "\t".join(line.split("\t")[:14]) for i, line in enumerate(day)]
        for day in random_days(31, 3, 30)
    ]
    work = tmp_path / "work"
    summary = run(spark, write_days(tmp_path / "raw", days), work, "1")
    check_against_reference(days, work, summary, "1")
    assert set(summary["table_sizes"].values()) == {1}


def test_thresholds_above_any_count_even_beyond_64_bits(tmp_path, spark):
    days = random_days(33, 2, 40)
    threshold = "5,C3:99999999999999999999,C4:9223372036854775807"
    work = tmp_path / "work"
    summary = run(spark, write_days(tmp_path / "raw", days), work, threshold)
    check_against_reference(days, work, summary, threshold)
    assert summary["table_sizes"]["C3"] == summary["table_sizes"]["C4"] == 1
