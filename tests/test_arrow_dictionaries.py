"""The Arrow engine's dictionaries at any size: value ranges, ids from histograms, the index.

Unit tests of spark_jobs.engines.arrow.dictionaries and spark_jobs.engines.arrow.dictionary_index
against plain Python (a global sort, a dict), then real Spark runs: columns split into many value groups
give the same outputs as one group and as the SQL engine, and the transform's plan has no join.
"""

from __future__ import annotations

import functools

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from dlrm_contracts.schema import CAT_COLUMNS
from spark_fixtures import random_days, run, salted_days, write_days
from spark_jobs.engines.arrow import dictionaries as dicts
from spark_jobs.engines.arrow import dictionary_index
from spark_jobs.engines.arrow.index_checks import DictionaryIndexError
from spark_jobs.engines.arrow.value_counts import Counts, count_values, merge_counts


def _plan_with(column: int, bounds: np.ndarray) -> dicts.GroupPlan:
    """A plan with ``bounds`` for one column and a single range for every other."""
    all_bounds = [np.zeros(1, np.uint32)] * len(CAT_COLUMNS)
    all_bounds[column] = np.asarray(bounds, np.uint32)
    first = np.concatenate([[0], np.cumsum([len(b) for b in all_bounds])[:-1]])
    return dicts.GroupPlan(tuple(all_bounds), tuple(int(x) for x in first))


def test_totals_files_round_trip_and_a_damaged_pair_is_refused(tmp_path):
    counts = count_values(np.array([7, 3, 7, 2**31, -1, 3, 7]))
    dicts.write_totals(str(tmp_path), 12, counts)
    back = dicts.read_totals(str(tmp_path), 12)
    assert back.values.tolist() == [3, 7, 2**31] and back.counts.tolist() == [2, 3, 1]
    assert back.counts.dtype == np.int64
    dicts.write_totals(str(tmp_path), 13, counts)
    np.save(tmp_path / "group-0000013.counts.npy", np.ones(2, np.int64))
    with pytest.raises(ValueError, match="group 13"):
        dicts.read_totals(str(tmp_path), 13)


def test_balanced_batches_deal_every_group_once_by_entries():
    entries = {g: n for g, n in enumerate([900, 10, 500, 480, 20, 5])}
    batches = dicts.balanced_batches(entries, 2)
    assert sorted(g for b in batches for g in b) == list(entries)
    loads = sorted(sum(entries[g] for g in b) for b in batches)
    assert loads == [935, 980]  # 900+20+10+5 and 500+480
    assert dicts.balanced_batches({4: 1}, 8) == [[4]]  # never more batches than groups


def _reference_ids(values: np.ndarray, counts: np.ndarray, threshold: int) -> dict[int, int]:
    """Ids by a global sort: count descending, value ascending, from 1; kept values only."""
    kept = sorted((-c, v) for v, c in zip(values.tolist(), counts.tolist()) if c >= threshold)
    return {v: i + 1 for i, (_, v) in enumerate(kept)}


def _column_totals(rng, n: int, skewed: bool) -> tuple[np.ndarray, np.ndarray]:
    if skewed:  # small integers: one corner of the 32-bit space
        values = np.unique(rng.integers(0, 3 * n, n)).astype(np.uint32)
    else:
        values = np.unique(rng.integers(0, 2**32, n, dtype=np.uint64)).astype(np.uint32)
    counts = (rng.pareto(1.2, len(values)) * 2).astype(np.int64) + 1
    return values, counts


def test_value_counts_count_and_merge_like_a_counter():
    rng = np.random.default_rng(0)
    column = rng.integers(-1, 50, 5000)  # -1: missing
    blocks = [count_values(b) for b in np.array_split(column, 7)]
    merged = merge_counts(blocks)
    want = {v: int(np.sum(column == v)) for v in range(50)}
    assert dict(zip(merged.values.tolist(), merged.counts.tolist())) == {v: c for v, c in want.items() if c}
    assert np.all(np.diff(merged.values.astype(np.int64)) > 0)


def test_merge_counts_sums_runs_of_any_sizes_and_large_counts():
    """Runs of very different sizes (one empty, one of a single value), the full value range
    and counts beyond 32 bits: the merge equals a sum by value, in the asked count type."""
    rng = np.random.default_rng(5)
    runs = []
    for size in (0, 1, 17, 4000, 60_000, 60_000):
        values = np.unique(rng.integers(0, 2**32, size, dtype=np.uint64)).astype(np.uint32)
        if size == 17:
            values[-1] = 2**32 - 1
        counts = rng.integers(1, 2**40, len(values), dtype=np.int64)
        runs.append(Counts(values, counts))
    runs.append(Counts(runs[4].values[::3].copy(), np.full(len(runs[4].values[::3]), 7, np.int64)))
    merged = merge_counts(runs)
    want: dict[int, int] = {}
    for part in runs:
        for v, c in zip(part.values.tolist(), part.counts.tolist()):
            want[v] = want.get(v, 0) + c
    assert merged.counts.dtype == np.int64 and merged.values.dtype == np.uint32
    assert merged.values.tolist() == sorted(want)
    assert merged.counts.tolist() == [want[v] for v in sorted(want)]
    day = merge_counts([Counts(r.values, (r.counts % 1000).astype(np.uint32)) for r in runs[:4]], np.uint32)
    assert day.counts.dtype == np.uint32 and len(day) == len(
        set().union(*(r.values.tolist() for r in runs[:4]))
    )


@pytest.mark.parametrize("skewed", [False, True])
def test_value_ranges_split_a_column_evenly_and_cover_it(skewed):
    """Bounds from evenly spaced samples of each partial: ranges of about group_values
    entries, for uniform 32-bit values and for a column crowded into small integers."""
    rng = np.random.default_rng(1)
    partials = [np.unique(_column_totals(rng, 60_000, skewed)[0]) for _ in range(5)]
    samples = [(3, len(p), dicts.evenly_spaced(p, dicts.SAMPLE_STEP)) for p in partials]
    plan = dicts.GroupPlan.from_samples(samples, group_values=50_000)
    bounds = plan.bounds[3]
    assert bounds[0] == 0 and np.all(np.diff(bounds.astype(np.int64)) > 0)
    assert len(bounds) == 6  # 300k entries / 50k
    everything = np.concatenate(partials)
    sizes = np.bincount(np.searchsorted(bounds, everything, side="right") - 1, minlength=len(bounds))
    assert sizes.max() < 1.3 * 50_000 and sizes.min() > 0.7 * 50_000
    assert all(len(plan.bounds[j]) == 1 for j in range(26) if j != 3)  # no value: one range
    assert plan.column_range(plan.first[3] + 4) == (3, 4)
    assert plan.column_range(plan.first[4]) == (4, 0)


@pytest.mark.parametrize("threshold", [1, 2, 5])
def test_ids_from_group_histograms_equal_a_global_sort(threshold):
    """A column's totals cut into value ranges: first ids per (group, count) from the groups'
    histograms alone, plus ranks within the group, give the ids of one global sort."""
    rng = np.random.default_rng(2)
    values, counts = _column_totals(rng, 20_000, skewed=False)
    bounds = np.array([0, 2**29, 2**30, 3 * 2**30, 3 * 2**30 + 5], np.uint32)
    plan = _plan_with(7, bounds)
    cut = np.concatenate([[0], np.searchsorted(values, bounds[1:]), [len(values)]])
    groups = {
        plan.first[7] + r: Counts(values[cut[r] : cut[r + 1]], counts[cut[r] : cut[r + 1]])
        for r in range(len(bounds))
    }
    histograms = {g: dicts.count_histogram(c.counts) for g, c in groups.items()}
    minimum = (1,) * 7 + (threshold,) + (1,) * 18
    firsts = dicts.first_ids(plan, histograms, minimum)
    got = {}
    for g, totals in groups.items():
        kept = totals.counts >= threshold
        if kept.any():
            ids = dicts.assign_ids(totals.values[kept], totals.counts[kept], *firsts[g])
            got.update(zip(totals.values[kept].tolist(), ids.tolist()))
    assert got == _reference_ids(values, counts, threshold)


def _index(tmp_path: Path, columns: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]):
    """columns: name → (bounds, kept values ascending, their ids): the index, built as the
    dictionary tasks build it, region by region."""
    layouts = {}
    for name, (bounds, values, _) in columns.items():
        cut = np.concatenate([[0], np.searchsorted(values, bounds[1:]), [len(values)]])
        layouts[name] = (dictionary_index.ColumnLayout.of(bounds, np.diff(cut)), cut)
    dictionary_index.create_index(tmp_path, {n: lay for n, (lay, _) in layouts.items()})
    for name, (bounds, values, ids) in columns.items():
        layout, cut = layouts[name]
        for r in range(len(bounds)):
            dictionary_index.write_region(
                str(tmp_path),
                name,
                r,
                int(layout.sizes[r]),
                values[cut[r] : cut[r + 1]],
                ids[cut[r] : cut[r + 1]],
            )
    dictionary_index.seal_index(tmp_path)
    return dictionary_index.DictionaryIndex(str(tmp_path), tuple(columns))


@pytest.mark.parametrize("skewed", [False, True])
def test_the_index_finds_every_kept_value_and_nothing_else(tmp_path, skewed):
    rng = np.random.default_rng(3)
    universe, _ = _column_totals(rng, 50_000, skewed)
    kept = np.sort(rng.choice(universe, len(universe) // 2, replace=False)).astype(np.uint32)
    if not skewed:
        kept = np.unique(np.append(kept, [0, 2**32 - 1])).astype(np.uint32)  # the extremes
    ids = (rng.permutation(len(kept)) + 1).astype(np.int64)
    bounds = np.array([0, np.quantile(kept, 0.3), np.quantile(kept, 0.9)], np.uint32)
    index = _index(
        tmp_path,
        {"C1": (bounds, kept, ids), "C2": (np.zeros(1, np.uint32), np.zeros(0, np.uint32), np.zeros(0))},
    )
    queries = np.concatenate([universe.astype(np.int64), [-1, 0, 2**32 - 1]])
    out = np.zeros((2, len(queries)), np.int32)
    index.lookup_into(np.stack([queries, queries]), out)
    want = dict(zip(kept.tolist(), ids.tolist()))
    assert out[0].tolist() == [want.get(q, 0) for q in queries.tolist()]
    assert not out[1].any()  # a column that kept nothing
    size = dictionary_index.index_bytes(tmp_path)
    assert size <= 16 * len(kept) + 3 * 4096  # 13.3 bytes a value + page rounding


def test_a_region_file_of_the_wrong_size_is_a_damaged_index(tmp_path):
    values = np.arange(1, 2000, dtype=np.uint32)
    _index(tmp_path, {"C1": (np.array([0, 1000], np.uint32), values, np.arange(1, 2000))})
    path = dictionary_index.region_path(tmp_path, "C1", 1)
    path.write_bytes(path.read_bytes()[:-8])
    with pytest.raises(DictionaryIndexError, match="damaged dictionary index"):
        dictionary_index.DictionaryIndex(str(tmp_path), ("C1",))


def test_a_copy_per_node_is_made_once_and_used(tmp_path):
    values = np.array([5, 9, 2**31], np.uint32)
    _index(tmp_path / "index", {c: (np.zeros(1, np.uint32), values, np.arange(1, 4)) for c in CAT_COLUMNS})
    local = tmp_path / "node"
    local.mkdir()
    first = dictionary_index.worker_index(str(tmp_path / "index"), CAT_COLUMNS, "run1", str(local))
    copies = list(local.iterdir())
    assert [p.name for p in copies] == ["criteo-dlrm-index-run1"]
    assert dictionary_index.local_copy(str(tmp_path / "index"), str(local), "run1") == str(copies[0])
    out = np.zeros((26, 2), np.int32)
    first.lookup_into(np.tile(np.array([9, 7], np.int64), (26, 1)), out)
    assert out[:, 0].tolist() == [2] * 26 and not out[:, 1].any()


# ---------------------------------------------------------------- real Spark runs

spark_tests = pytest.mark.spark


def _assert_same_data(arrow: Path, sql: Path) -> None:
    """assert_same_outputs of test_spark_engines, but each split's rows compared in order across
    its files (the SQL engine's test/validation files follow its read partitions, which need
    not line up with the halves of a small day)."""
    from dlrm_contracts.layout import WorkdirLayout
    from dlrm_contracts.schema import SPLITS
    from spark_fixtures import canonical_rows, split_files

    for split in SPLITS:
        rows = [[r for _, rs in split_files(work, split) for r in rs] for work in (arrow, sql)]
        assert rows[0] and rows[0] == rows[1], split
    a, s = WorkdirLayout.at(arrow), WorkdirLayout.at(sql)
    for part in ("counts/values", "parquet/dictionaries", "rejects"):
        assert canonical_rows(a.root / part) == canonical_rows(s.root / part), part
    for name in (
        "counts/histogram.parquet",
        "counts/days.json",
        "parquet/data_quality.json",
        "parquet/model_size.json",
    ):
        assert (a.root / name).read_bytes() == (s.root / name).read_bytes(), name


# Many groups need columns of more distinct values than GROUP_VALUES, not many rows. (The
# range plan samples two values of each day's partial counts here, so a column of three days
# splits into at most seven ranges, however small GROUP_VALUES is.)
ROWS = 150
GROUP_VALUES = 20


@spark_tests
def test_many_value_groups_give_the_outputs_of_one_and_of_the_sql_engine(tmp_path, spark):
    """arrow_group_values=20 splits every big column into value ranges (a few values each):
    counts, dictionaries, histogram and every split equal the SQL engine's row for row, and
    the exactness reference; a rerun with a new day reuses the stored counts of the others,
    its own (grouped) and the SQL engine's, and the SQL engine reads the Arrow engine's."""
    from spark_fixtures import check_against_reference

    days = salted_days(47, 3, ROWS)
    raw = write_days(tmp_path / "raw", days)
    arrow_run = functools.partial(
        run,
        spark,
        raw,
        tmp_path / "arrow",
        "2,C7:1",
        engine="arrow",
        max_reject_rate=0.5,
        arrow_group_values=GROUP_VALUES,
    )
    arrow = arrow_run()
    run(spark, raw, tmp_path / "sql", "2,C7:1", engine="sql", max_reject_rate=0.5)
    _assert_same_data(tmp_path / "arrow", tmp_path / "sql")
    check_against_reference(days, tmp_path / "arrow", arrow, "2,C7:1")
    meta = json.loads((tmp_path / "arrow" / "parquet" / "dictionary_index" / "index.json").read_text())
    assert max(len(c["bounds"]) for c in meta["columns"].values()) > 5
    assert arrow["lookups"] == "dictionary index"
    # the Arrow engine's workdir as its first run left it, for the SQL engine's run below
    sql_on_arrow = tmp_path / "sql_on_arrow"
    shutil.copytree(tmp_path / "arrow", sql_on_arrow, symlinks=True)
    # a fourth day: the first three are reused from their stored (grouped) counts
    days.append(salted_days(48, 1, ROWS)[0])
    (raw / "day_3").write_text("".join(line + "\n" for line in days[3]))
    again = arrow_run()
    assert again["days_counted"] == [3] and again["days_reused"] == [0, 1, 2]
    # each engine on the other's workdir: the SQL engine's stored counts (a file per day
    # holding every column) read by the Arrow engine's batched tasks, and the reverse
    swapped = run(
        spark,
        raw,
        tmp_path / "sql",
        "2,C7:1",
        engine="arrow",
        max_reject_rate=0.5,
        arrow_group_values=GROUP_VALUES,
    )
    assert swapped["days_counted"] == [3] and swapped["days_reused"] == [0, 1, 2]
    run(spark, raw, sql_on_arrow, "2,C7:1", engine="sql", max_reject_rate=0.5)
    _assert_same_data(tmp_path / "arrow", sql_on_arrow)
    _assert_same_data(tmp_path / "sql", sql_on_arrow)
    check_against_reference(days, tmp_path / "sql", swapped, "2,C7:1")


@spark_tests
def test_the_arrow_engines_transform_plan_has_no_join(tmp_path, spark):
    """The physical plan of the train rows: no join of any kind (the SQL engine's has them,
    so the check can tell)."""
    from dlrm_contracts.config import PreprocessConfig
    from dlrm_contracts.layout import WorkdirLayout
    from dlrm_contracts.thresholds import parse_threshold_spec
    from spark_jobs.engines.arrow.engine import ArrowEngine
    from spark_jobs.dictionaries import table_sizes
    from spark_jobs.engine import ByCount
    from spark_jobs.inputs import discover_days
    from spark_jobs.engines.sql.engine import SqlEngine

    raw = write_days(tmp_path / "raw", random_days(5, 3, 200))
    days = discover_days(raw)
    layout = WorkdirLayout.at(tmp_path / "work")
    cfg = PreprocessConfig(frequency_threshold="2")
    plans = {}
    for engine in (ArrowEngine(spark, days, cfg), SqlEngine(spark, days, cfg)):
        try:
            stats = engine.count([d.day for d in days], layout.counts / engine.name)
            spec = parse_threshold_spec("2")
            histogram = engine.count_totals(layout.counts / engine.name, None, frequency_ids=spec)
            sizes = table_sizes(histogram, spec)
            engine.write_dictionaries(
                ByCount(spec, sizes),
                layout.parquet / engine.name / "dictionaries",
                layout.parquet / engine.name / "index",
            )
            if engine.name == "arrow":  # the merge's staged parts are gone once used
                assert not dicts.totals_dir(layout.counts / engine.name).exists()
                spec = engine.transform_spec(stats, layout.parquet / engine.name / "index")
                frame = engine.train_rows(spec, 2)
            else:
                frame, _, _ = engine._split_rows(
                    stats, sizes, layout.parquet / engine.name / "dictionaries", days[:-1], False
                )
            plans[engine.name] = frame._jdf.queryExecution().executedPlan().toString()
        finally:
            engine.close()
    assert "Join" in plans["sql"]
    assert "Join" not in plans["arrow"] and "BroadcastExchange" not in plans["arrow"]
