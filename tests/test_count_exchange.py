"""The shuffle exchange of partial counts (spark_jobs.engines.arrow.count_exchange) without
Spark: chunks' rows cut at the group bounds and merged per group equal a count by value of
each group's range, and a group's task gets one run per (chunk, day), not one per slice of
the value space."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pyarrow as pa

from dlrm_contracts.schema import CAT_COLUMNS
from spark_jobs.engines.arrow import count_exchange
from spark_jobs.engines.arrow import dictionaries as dicts
from spark_jobs.engines.arrow.value_counts import count_values


def _plan(bounds_by_column: dict[int, list[int]]) -> dicts.GroupPlan:
    bounds = [np.asarray(bounds_by_column.get(j, [0]), np.uint32) for j in range(len(CAT_COLUMNS))]
    first = np.concatenate([[0], np.cumsum([len(b) for b in bounds])[:-1]])
    return dicts.GroupPlan(tuple(bounds), tuple(int(x) for x in first))


def _chunks(rng):
    """(day, raw values per column) of five chunks over two days: a column spread over the
    32-bit space, one crowded in a corner, one with a single value."""
    out = []
    for day in (0, 0, 0, 1, 1):
        out.append(
            (
                day,
                {
                    0: rng.integers(0, 2**32, 3000, dtype=np.uint64).astype(np.int64),
                    3: rng.integers(0, 400, 3000),
                    7: np.full(50, 2**32 - 1, np.int64),
                },
            )
        )
    return out


def test_rows_cut_at_group_bounds_merge_to_each_group_s_counts(monkeypatch):
    rng = np.random.default_rng(11)
    plan = _plan({0: [0, 2**30, 2**31 + 5, 3 * 2**30], 3: [0, 17, 200, 399, 1000], 7: [0, 5]})
    chunks = _chunks(rng)
    batches = [
        count_exchange.partial_rows(day, {j: count_values(v) for j, v in raw.items()}, row_entries=700)
        for day, raw in chunks
    ]
    table = pa.Table.from_batches(batches).select(list(count_exchange.ROUTE_INPUT))
    # batches sliced off their buffers' start, as Spark may hand them
    routed = [count_exchange.route_batch(plan, b) for b in table.combine_chunks().to_batches(max_chunksize=7)]
    routed_table = pa.Table.from_batches(routed).sort_by([("group", "ascending"), ("day", "ascending")])

    merged: dict[int, dict[int, dict[int, int]]] = {}

    def capture(spec, group, per_day):
        merged[group] = {d: dict(zip(c.values.tolist(), c.counts.tolist())) for d, c in per_day.items()}

    monkeypatch.setattr(dicts, "merge_group", capture)
    spec = dicts.MergeSpec(plan, frozenset(), frozenset(), "", "", None)
    list(count_exchange.merge_task(spec)(iter(routed_table.to_batches(max_chunksize=5))))

    want: dict[int, dict[int, Counter]] = {}
    for day, raw in chunks:
        for j, values in raw.items():
            for group in range(plan.first[j], plan.first[j] + len(plan.bounds[j])):
                _, low, high = plan.value_range(group)
                inside = values[(values >= low) & ((values < high) if high is not None else True)]
                if len(inside):
                    want.setdefault(group, {}).setdefault(day, Counter()).update(inside.tolist())
    assert merged == {g: {d: dict(c) for d, c in by_day.items()} for g, by_day in want.items()}

    # a run per (input row, group it reaches): none for the empty ranges ([1000, 2**32) of
    # column 3, [0, 5) of column 7), and each routed row holds only its group's values
    groups = routed_table.column("group").to_numpy()
    for group, values, counts in zip(
        groups, routed_table.column("values").to_pylist(), routed_table.column("counts").to_pylist()
    ):
        _, low, high = plan.value_range(int(group))
        values = count_exchange.unpack(values, counts).values
        assert len(values) and values.min() >= low and (high is None or values.max() < high)
    rows_per_group = Counter(groups.tolist())
    input_rows = Counter(table.column("column").to_pylist())
    for j in (0, 3, 7):
        for group in range(plan.first[j], plan.first[j] + len(plan.bounds[j])):
            assert rows_per_group.get(group, 0) <= input_rows[j]
    assert plan.first[3] + 4 not in rows_per_group and plan.first[7] not in rows_per_group


def test_a_chunk_s_column_is_one_row_until_it_outgrows_a_row():
    counts = {2: count_values(np.arange(2500)), 5: count_values(np.arange(10))}
    batch = count_exchange.partial_rows(3, counts, row_entries=1000)
    assert batch.column("column").to_pylist() == [2, 2, 2, 5]
    assert batch.column("count").to_pylist() == [1000, 1000, 500, 10]
    assert set(batch.column("kind").to_pylist()) == {count_exchange.KIND_PARTIAL}
    assert count_exchange.partial_rows(3, counts).num_rows == 2
    empty = count_exchange.route_batch(_plan({}), batch.slice(0, 0))
    assert empty.num_rows == 0 and empty.schema.names == ["group", "day", "values", "counts"]


def test_runs_travel_packed_and_come_back_whole():
    """A run's values (as differences) and counts are compressed for the JVM's cache and
    shuffle, and unpack to the same arrays, the empty run and the 32-bit ends included."""
    rng = np.random.default_rng(5)
    dense = count_values(rng.integers(0, 2**32, 50_000, dtype=np.uint64).astype(np.int64))
    for run in (dense, count_values(np.array([], np.int64)), count_values(np.array([0, 2**32 - 1] * 3))):
        values, counts = count_exchange.pack_values(run.values), count_exchange.pack_counts(run.counts)
        back = count_exchange.unpack(pa.py_buffer(values), counts)
        assert back.values.tolist() == run.values.tolist() and back.counts.tolist() == run.counts.tolist()
    packed = len(count_exchange.pack_values(dense.values)) + len(count_exchange.pack_counts(dense.counts))
    assert packed < 0.6 * 8 * len(dense)
