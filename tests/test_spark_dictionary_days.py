"""preprocess.dictionary_days: the dictionaries from every day (the reference's way) or from the
train days only, where a value first seen on the test/validation day maps to id 0."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from dlrm_contracts.layout import WorkdirLayout
from dlrm_contracts.schema import CAT_COLUMNS
from spark_fixtures import random_days, read_split, run, write_days

pytestmark = pytest.mark.spark

NEW_VALUE = "deadbeef"  # C1 value seen only on the last day, often enough to pass the threshold


def _days():
    days = random_days(51, 3, 200)
    last = []
    for i, line in enumerate(days[-1]):
        fields = line.split("\t")
        if i % 4 == 0:
            fields[14] = NEW_VALUE
        last.append("\t".join(fields))
    return days[:-1] + [last]


def _train_day_ids(days) -> dict[str, dict[str, int]]:
    """ids 1..k by count descending, value ascending, over the train days only (threshold 2)."""
    ids = {}
    for j, c in enumerate(CAT_COLUMNS):
        counts = Counter(
            line.split("\t")[14 + j].lower().rjust(8, "0")
            for day in days[:-1]
            for line in day
            if line.split("\t")[14 + j]
        )
        kept = sorted((v for v, n in counts.items() if n >= 2), key=lambda v: (-counts[v], v))
        ids[c] = {v: i + 1 for i, v in enumerate(kept)}
    return ids


def test_train_only_dictionaries_leave_last_day_values_out(tmp_path, spark):
    days = _days()
    raw = write_days(tmp_path / "raw", days)
    every = run(spark, raw, tmp_path / "all", "2")
    train_only = run(spark, raw, tmp_path / "train", "2", dictionary_days="train")
    assert train_only["dictionary_days"] == "train"
    expected = _train_day_ids(days)
    assert train_only["table_sizes"] == {c: len(expected[c]) + 1 for c in CAT_COLUMNS}
    assert every["table_sizes"]["C1"] > train_only["table_sizes"]["C1"]  # deadbeef (and others) kept
    test_rows = read_split(WorkdirLayout.at(tmp_path / "train").parquet_split("test"))
    test_lines = days[-1][: (len(days[-1]) + 1) // 2]
    for row, line in zip(test_rows, test_lines):
        fields = line.split("\t")
        for j, c in enumerate(CAT_COLUMNS):
            value = fields[14 + j].lower().rjust(8, "0") if fields[14 + j] else None
            assert row[14 + j] == expected[c].get(value, 0), (c, value)
    with_all = read_split(WorkdirLayout.at(tmp_path / "all").parquet_split("test"))
    assert all(r[14] > 0 for r, line in zip(with_all, test_lines) if line.split("\t")[14] == NEW_VALUE)
    model_size = json.loads((WorkdirLayout.at(tmp_path / "train").parquet / "model_size.json").read_text())
    assert model_size == train_only["table_sizes"]
