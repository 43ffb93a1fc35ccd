"""Multi-hot materialization (dlrm_contracts.multi_hot) and the format's multi-hot columns."""

from __future__ import annotations

import json

import numpy as np
import pytest

import dlrm_contracts.multi_hot as multi_hot
from dlrm_contracts.binary_format import (DatasetError, DatasetInfo, describe, multi_hot_extra,
                                          multi_hot_sizes, row_width)
from dlrm_contracts.multi_hot import (MultiHotError, MultiHotSpec, check_sizes, iter_tables,
                                      lookup_table, materialize, materialize_all)

# Produced with the reference (mlcommons/training aa344c7, recommendation_v2/torchrec_dlrm/
# multi_hot.py) in a venv with torch 2.13.0 and numpy 2.4.6:
#   m = Multihot(SIZES, CAPS, 1, False, "uniform")
#   torch.nn.functional.embedding(torch.tensor(IDS) % CAPS[c], m.multi_hot_tables_l[c])
CAPS = [1000, 7, 3, 50000, 1, 97, 10, 10, 10, 10, 10, 10, 10, 10, 10, 10, 10, 10, 10, 10,
        100000, 10, 10, 10, 10, 2]
SIZES = [3, 2, 1, 4, 1, 5, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 6, 1, 1, 1, 1, 3]
IDS = [0, 5, 999, 123456]
REFERENCE_ROWS = {
    0: [[0, 684, 559], [5, 277, 754], [999, 51, 473], [456, 76, 293]],
    1: [[0, 5], [5, 4], [5, 4], [4, 2]],
    3: [[0, 31098, 7000, 2321], [5, 13728, 38158, 21053], [999, 25852, 30218, 40524],
        [23456, 28602, 37728, 9603]],
    5: [[0, 18, 84, 28, 58], [5, 76, 96, 80, 92], [29, 58, 76, 42, 91], [72, 32, 2, 55, 3]],
    20: [[0, 22975, 92701, 9982, 53305, 95956], [5, 63351, 20313, 33127, 15154, 69617],
         [999, 55884, 96444, 56483, 53943, 83234], [23456, 45455, 4669, 68275, 93010, 7929]],
    25: [[0, 1, 0], [1, 1, 1], [1, 1, 1], [0, 1, 0]],
}
SPEC = MultiHotSpec(tuple(CAPS), tuple(SIZES))


def test_rows_equal_the_reference_scripts_output():
    rows = materialize_all(SPEC, [np.array(IDS, dtype=np.int64)] * 26)
    for column, want in REFERENCE_ROWS.items():
        assert rows[column].dtype == np.int32
        assert rows[column].tolist() == want, column
    # one-hot columns: the id modulo the table, one per row
    assert rows[2].tolist() == [[0], [2], [0], [0]]
    assert rows[4].shape == (4, 1) and not rows[4].any()


def test_one_column_alone_equals_the_full_pass():
    """A column's table depends on the stream the columns before it used: one column asked
    for alone (the earlier ones skipped) equals the pass that builds them all."""
    every = dict(iter_tables(SPEC))
    assert sorted(every) == [0, 1, 3, 5, 20, 25]
    for column in (3, 20, 25):
        np.testing.assert_array_equal(lookup_table(SPEC, column), every[column])
        assert materialize(np.array(IDS), lookup_table(SPEC, column)).tolist() \
            == REFERENCE_ROWS[column]


def test_chunked_draws_equal_one_draw(monkeypatch):
    """Tables are filled (and skipped) a chunk at a time: the stream is the same whatever
    the chunk (a size that is no multiple of any k, so chunks end mid-row too)."""
    whole = dict(iter_tables(SPEC))
    monkeypatch.setattr(multi_hot, "CHUNK_DRAWS", 7)
    chunked = dict(iter_tables(SPEC))
    assert sorted(chunked) == sorted(whole)
    for column in whole:
        np.testing.assert_array_equal(chunked[column], whole[column])
    np.testing.assert_array_equal(lookup_table(SPEC, 20), whole[20])


def test_seed_and_distribution_change_the_draws_but_not_the_first_id():
    base = lookup_table(SPEC, 0)
    other_seed = lookup_table(MultiHotSpec(SPEC.table_sizes, SPEC.sizes, seed=1), 0)
    pareto = lookup_table(MultiHotSpec(SPEC.table_sizes, SPEC.sizes, distribution="pareto"), 0)
    for table in (other_seed, pareto):
        np.testing.assert_array_equal(table[:, 0], np.arange(CAPS[0]))
        assert not np.array_equal(table, base)
        assert table.min() >= 0 and table.max() < CAPS[0]


@pytest.mark.parametrize("kwargs, message", [
    ({"table_sizes": (3, 0), "sizes": (1, 2)}, "table sizes must be >= 1"),
    ({"table_sizes": (3, 4), "sizes": (1, 0)}, "multi-hot sizes must be >= 1"),
    ({"table_sizes": (3,), "sizes": (1, 2)}, "1 table sizes but 2"),
    ({"table_sizes": (3,), "sizes": (2,), "distribution": "zipf"}, "not one of"),
    ({"table_sizes": (3,), "sizes": (2,), "seed": -1}, "outside"),
])
def test_bad_specs_are_clear_errors(kwargs, message):
    with pytest.raises(MultiHotError, match=message):
        MultiHotSpec(**kwargs)


def test_check_sizes():
    assert check_sizes(None) == (1,) * 26
    assert check_sizes(SIZES) == tuple(SIZES)
    for bad in ([1] * 25, [1] * 25 + [0], [1] * 25 + [True], [1] * 25 + [2.0]):
        with pytest.raises(MultiHotError, match="26 integers"):
            check_sizes(bad)


def _info(extra) -> DatasetInfo:
    return describe("/nowhere", {"train": 10, "test": 0, "validation": 0}, [1000] * 26, None,
                    "fp", extra)


def test_dataset_description_of_multi_hot_columns():
    one_hot = _info(multi_hot_extra([1] * 26))
    assert "multi_hot_sizes" not in one_hot.to_json()  # one-hot datasets are unchanged
    assert multi_hot_sizes(one_hot) == (1,) * 26 == one_hot.multi_hot_sizes
    info = _info(multi_hot_extra(SIZES))
    assert json.loads(json.dumps(info.to_json()))["multi_hot_sizes"] == SIZES
    assert multi_hot_sizes(info.to_json()) == tuple(SIZES)
    assert row_width("cat_20.bin", info) == (np.dtype("<i2"), 6)
    assert row_width("cat_2.bin", info) == (np.dtype("<i2"), 1)
    assert info.nbytes("train") == 10 * (1 + 2 * 13 + 2 * sum(SIZES))
    with pytest.raises(DatasetError, match="26 integers"):
        multi_hot_sizes({"multi_hot_sizes": [2] * 3})
