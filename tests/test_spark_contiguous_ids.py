"""Contiguous ids (``preprocess.ids: contiguous``): TorchRec's first-appearance numbering (rare
→ 1, missing = the value 0, optional caps after), in both engines.

The numpy statement of the rule (``spark_jobs.contiguous_ids.contiguous_ids``) is checked on
the example of TorchRec's own docstring and on the cases it leaves implicit; both engines'
splits are checked against it over the lines read by the documented rules
(``spark_fixtures.reference_parse``), on generated days salted with bad lines and on the 200
real rows. ``bench/bench_contiguous_ids_anchor.py`` compares with TorchRec's scripts
themselves.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from dlrm_contracts.config import ConfigError, PreprocessConfig
from dlrm_contracts.layout import WorkdirLayout
from dlrm_contracts.schema import CAT_COLUMNS
from dlrm_contracts.thresholds import parse_threshold_spec
from spark_fixtures import (
    assert_rows_equal,
    read_split,
    reference_numerical,
    reference_parse,
    run,
    salted_days,
    sort_key,
    write_days,
)
from spark_jobs.contiguous_ids import contiguous_ids

SPLITS = ("train", "test", "validation")


def _days(*columns_per_day):
    """Days of 26 columns whose first two are given (the others missing)."""
    out = []
    for first, second in columns_per_day:
        day = np.full((len(first), 26), -1, np.int64)
        day[:, 0], day[:, 1] = first, second
        out.append(day)
    return out


def test_the_rule_is_torchrecs_docstring_example():
    # sparse_to_contiguous's docstring, threshold 2: abc=1, iop=2, lkj=3, xyz=7, tuv=8
    days = _days(([1, 2], [7, 7]), ([2, 3], [8, 7]))
    ids = contiguous_ids(days, parse_threshold_spec("2"))
    assert ids[0][:, :2].tolist() == [[1, 2], [2, 2]]
    assert ids[1][:, :2].tolist() == [[2, 1], [1, 2]]


def test_first_appearance_not_value_order_missing_is_zero_and_caps_come_after():
    # column 0: 9 first, then 5, then missing (= 0, the same value as a present 0), then 0
    days = _days(([9, 5, -1], [4, 4, 4]), ([0, 5, 9], [4, 4, 4]))
    ids = contiguous_ids(days, parse_threshold_spec("0"))
    assert np.concatenate(ids)[:, 0].tolist() == [2, 3, 4, 4, 3, 2]
    assert np.concatenate(ids)[:, 2].tolist() == [2] * 6  # every line missing: one value
    capped = contiguous_ids(days, parse_threshold_spec("0"), caps=[3] * 26)
    assert np.concatenate(capped)[:, 0].tolist() == [2, 0, 1, 1, 0, 2]
    # a per-column threshold: column 0 at 2 keeps 5, 9 and 0 (each seen twice), in that order
    spec = parse_threshold_spec("0,C1:2")
    assert np.concatenate(contiguous_ids(days, spec))[:, 0].tolist() == [2, 3, 4, 4, 3, 2]
    spec = parse_threshold_spec("0,C1:3")
    assert np.concatenate(contiguous_ids(days, spec))[:, 0].tolist() == [1] * 6


def test_the_mode_takes_optional_caps_and_its_threshold():
    assert PreprocessConfig(ids="contiguous").caps is None
    assert (
        PreprocessConfig(
            ids="contiguous", caps=[7] * 26, frequency_threshold="0", dictionary_days="train"
        ).caps
        == [7] * 26
    )
    with pytest.raises(ConfigError, match="lists 25 caps"):
        PreprocessConfig(ids="contiguous", caps=[5] * 25)


def test_the_transform_lookup_maps_missing_rare_and_caps():
    from spark_jobs.contiguous_ids import ContiguousIds, table_sizes

    class Index:  # value 5 has no id (rare); another value v has id v + 2
        def lookup_into(self, values, out):
            out[...] = np.where(values == 5, 0, values + 2)

    values = np.array([[-1, 5, 7]] * 26, np.int64)
    for caps, want in [(None, [2, 1, 9]), ([2**31] * 26, [2, 1, 9]), ([3] * 26, [2, 1, 0])]:
        out = np.empty(values.shape, np.int32)
        ContiguousIds(Index(), caps).lookup_into(values, out)
        assert out.tolist() == [want] * 26
    # a table holds ids 0 .. highest: kept values + 2 rows, or the cap
    assert table_sizes(dict.fromkeys(CAT_COLUMNS, 3), None) == dict.fromkeys(CAT_COLUMNS, 5)
    assert table_sizes({}, dict.fromkeys(CAT_COLUMNS, 9)) == dict.fromkeys(CAT_COLUMNS, 9)


def _reference(days: list[list[str]], spec: str, caps) -> dict:
    """Rows per split by the line rules, ids by ``contiguous_ids`` over the valid lines."""
    parsed_days, values = [], []
    for lines in days:
        parsed = [reference_parse(line) for line in lines]
        valid = [p for p in parsed if not p[0]]
        values.append(
            np.array([[int(v, 16) if v else -1 for v in p[4]] for p in valid], np.int64).reshape(-1, 26)
        )
        parsed_days.append(parsed)
    ids = contiguous_ids(values, parse_threshold_spec(spec), caps)
    rows_per_day = []
    for parsed, day_ids in zip(parsed_days, ids):
        it = iter(day_ids.tolist())
        rows_per_day.append(
            [None if p[0] else (p[2], *[reference_numerical(x) for x in p[3]], *next(it)) for p in parsed]
        )
    last = rows_per_day[-1]
    half = (len(last) + 1) // 2
    return {
        "train": [r for day in rows_per_day[:-1] for r in day if r],
        "test": [r for r in last[:half] if r],
        "validation": [r for r in last[half:] if r],
    }


@pytest.mark.spark
def test_both_engines_number_values_like_the_rule(tmp_path, spark, real_sample):
    real = [line for line in real_sample.read_text().split("\n") if line]
    days = [*salted_days(41, 3, 300), real]
    raw = write_days(tmp_path / "raw", days)
    # threshold 3 with C2 at 0 (every value kept); capped: small caps fold, 2**31 keeps all
    spec, caps = "3,C2:0", [2**31, 2**31, 3, 7, *[50] * 22]
    expected = _reference(days, spec, caps)
    for engine in ("arrow", "sql"):
        summary = run(
            spark,
            raw,
            tmp_path / engine,
            spec,
            engine=engine,
            ids="contiguous",
            caps=caps,
            max_reject_rate=0.5,
        )
        layout = WorkdirLayout.at(tmp_path / engine)
        for split in SPLITS:
            rows, want = read_split(layout.parquet_split(split)), expected[split]
            if split == "train":  # in its seeded order
                rows, want = sorted(rows, key=sort_key), sorted(want, key=sort_key)
            assert_rows_equal(rows, want, f"{engine} {split}")
        assert summary["ids"] == "contiguous" and summary["threshold_spec"] == spec
        assert summary["table_sizes"] == dict(zip(CAT_COLUMNS, caps))
        quality = json.loads(layout.data_quality.read_text())
        assert quality["identity_holds"] and quality["rows_out_checked"]
    # the rule mattered: ids beyond 1 in C1 (kept values), 1 (rare) too, and C2 kept them all
    train = np.array(read_split(WorkdirLayout.at(tmp_path / "sql").parquet_split("train")))
    assert (train[:, 14] == 1).any() and train[:, 14].max() > 2 and (train[:, 15] > 1).all()
