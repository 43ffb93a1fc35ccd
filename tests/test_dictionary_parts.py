"""Dictionary parts staged by the merge and given their ids after the barrier
(spark_jobs.engines.arrow.dictionary_parts), against a global sort in plain Python: the parts
read back as (value, id, count) rows with the sort's ids, the index finds them, a retried fill
changes nothing, and a file of another shape is refused, not patched."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dlrm_contracts.schema import CAT_COLUMNS
from spark_jobs.engines.arrow import dictionaries as dicts
from spark_jobs.engines.arrow import dictionary_index, dictionary_parts
from spark_jobs.engines.arrow.value_counts import Counts

COLUMN = 4  # C5
THRESHOLD = 2


def _groups(rng, n: int = 30_000):
    """One column's totals cut into four value ranges: the plan, each group's totals."""
    values = np.unique(rng.integers(0, 2**32, n, dtype=np.uint64)).astype(np.uint32)
    counts = (rng.pareto(1.2, len(values)) * 2).astype(np.int64) + 1
    bounds = np.array([0, 2**30, 2**31, 3 * 2**30], np.uint32)
    all_bounds = [np.zeros(1, np.uint32)] * len(CAT_COLUMNS)
    all_bounds[COLUMN] = bounds
    first = np.concatenate([[0], np.cumsum([len(b) for b in all_bounds])[:-1]])
    plan = dicts.GroupPlan(tuple(all_bounds), tuple(int(x) for x in first))
    cut = np.concatenate([[0], np.searchsorted(values, bounds[1:]), [len(values)]])
    groups = {
        plan.first[COLUMN] + r: Counts(values[cut[r] : cut[r + 1]], counts[cut[r] : cut[r + 1]])
        for r in range(len(bounds))
    }
    return plan, groups, values, counts


def _reference(values, counts) -> dict[str, tuple[int, int]]:
    kept = sorted((-c, v) for v, c in zip(values.tolist(), counts.tolist()) if c >= THRESHOLD)
    return {f"{v:08x}": (i + 1, -c) for i, (c, v) in enumerate(kept)}


def _stage_and_fill(tmp_path: Path, plan, groups) -> tuple[Path, Path]:
    staging, dict_dir, index_dir = tmp_path / "staging", tmp_path / "dicts", tmp_path / "index"
    minimum = tuple(THRESHOLD for _ in CAT_COLUMNS)
    for g, totals in groups.items():
        dictionary_parts.stage_group(
            str(staging), g, totals, dicts.count_histogram(totals.counts)[0], THRESHOLD
        )
    histograms = {g: dicts.count_histogram(t.counts) for g, t in groups.items()}
    firsts = dicts.first_ids(plan, histograms, minimum)
    layouts, regions = dicts.index_layouts(plan, histograms, minimum)
    dictionary_index.create_index(index_dir, layouts)
    spec = dicts.WriteSpec(plan, str(dict_dir), str(index_dir), regions, str(staging))
    for g in groups:
        dicts._fill_group(spec, g, firsts.get(g))
    dictionary_index.seal_index(index_dir)
    return dict_dir, index_dir


@pytest.mark.parametrize("row_group_rows", [dictionary_parts.PART_ROW_GROUP_ROWS, 1000])
def test_filled_parts_are_the_rows_and_index_of_a_global_sort(tmp_path, monkeypatch, row_group_rows):
    """Several row groups per part (1000 rows) as well as one: each row group's ids land."""
    monkeypatch.setattr(dictionary_parts, "PART_ROW_GROUP_ROWS", row_group_rows)
    plan, groups, values, counts = _groups(np.random.default_rng(5))
    dict_dir, index_dir = _stage_and_fill(tmp_path, plan, groups)
    table = pq.read_table(dict_dir / f"column={CAT_COLUMNS[COLUMN]}")
    got = dict(zip(table["value"].to_pylist(), zip(table["id"].to_pylist(), table["count"].to_pylist())))
    assert len(got) == table.num_rows
    assert got == _reference(values, counts)
    if row_group_rows == 1000:
        part = next((dict_dir / f"column={CAT_COLUMNS[COLUMN]}").glob("*.parquet"))
        assert pq.ParquetFile(part).metadata.num_row_groups > 1
    index = dictionary_index.DictionaryIndex(str(index_dir), (CAT_COLUMNS[COLUMN],))
    out = np.zeros((1, len(values)), np.int32)
    index.lookup_into(values.astype(np.int64)[None, :], out)
    want = {int(v, 16): i for v, (i, _) in got.items()}
    assert out[0].tolist() == [want.get(v, 0) for v in values.tolist()]


def test_a_retried_fill_changes_nothing(tmp_path):
    """A task run again: after it finished a group (its staged files are gone), and after it
    had moved a group's part but not written its index region. Same ids, same index."""
    plan, groups, _, _ = _groups(np.random.default_rng(6), 5_000)
    dict_dir, index_dir = _stage_and_fill(tmp_path, plan, groups)
    first = pq.read_table(dict_dir).sort_by("value")
    index_bytes = _index_files(index_dir)
    assert not list((tmp_path / "staging").iterdir())  # the tasks removed their own
    histograms = {g: dicts.count_histogram(t.counts) for g, t in groups.items()}
    firsts = dicts.first_ids(plan, histograms, (THRESHOLD,) * len(CAT_COLUMNS))
    _, regions = dicts.index_layouts(plan, histograms, (THRESHOLD,) * len(CAT_COLUMNS))
    spec = dicts.WriteSpec(plan, str(dict_dir), str(index_dir), regions, str(tmp_path / "staging"))
    kept = {g: dicts._fill_group(spec, g, firsts.get(g)) for g in groups}
    assert sum(kept.values()) == first.num_rows
    assert pq.read_table(dict_dir).sort_by("value").equals(first)
    # lost after the move: the part (placeholders) is in place, its index region is not
    g = max(groups, key=lambda k: len(groups[k]))
    column, rank = plan.column_range(g)
    part = dict_dir / f"column={CAT_COLUMNS[column]}" / f"part-{rank:05d}.parquet"
    dictionary_parts.stage_group(
        str(tmp_path / "staging"), g, groups[g], dicts.count_histogram(groups[g].counts)[0], THRESHOLD
    )
    (tmp_path / "staging" / f"part-{g:07d}.parquet").replace(part)
    dictionary_index.region_path(index_dir, CAT_COLUMNS[column], rank).unlink()
    assert not pq.read_table(dict_dir).sort_by("value").equals(first)
    others = [k for k in groups if k != g]
    for k in others:
        dictionary_parts.stage_group(
            str(tmp_path / "staging"), k, groups[k], dicts.count_histogram(groups[k].counts)[0], THRESHOLD
        )
    for k in groups:
        dicts._fill_group(spec, k, firsts.get(k))
    assert pq.read_table(dict_dir).sort_by("value").equals(first)
    assert _index_files(index_dir) == index_bytes


def _index_files(index_dir: Path) -> dict[str, bytes]:
    return {str(p.relative_to(index_dir)): p.read_bytes() for p in index_dir.rglob("*.slots")}


def test_a_fill_that_died_while_relabelling_rebuilds_its_region(tmp_path):
    """A task killed with its staged region half relabelled (the region renamed to mark the
    work under way): the retry builds that region again from the filled part."""
    plan, groups, _, _ = _groups(np.random.default_rng(7), 5_000)
    dict_dir, index_dir = _stage_and_fill(tmp_path, plan, groups)
    first = pq.read_table(dict_dir).sort_by("value")
    index_bytes = _index_files(index_dir)
    g = max(groups, key=lambda k: len(groups[k]))
    column, rank = plan.column_range(g)
    staging = tmp_path / "staging"
    dictionary_parts.stage_group(
        str(staging), g, groups[g], dicts.count_histogram(groups[g].counts)[0], THRESHOLD
    )
    (staging / f"part-{g:07d}.parquet").unlink()  # the part was filled and moved
    staged_region = staging / f"part-{g:07d}.slots"
    half = np.fromfile(staged_region, np.uint64)
    half[: len(half) // 2] = 12345  # garbage: half relabelled, then killed
    half.tofile(staging / f"part-{g:07d}.slots.relabelling")
    staged_region.unlink()
    dictionary_index.region_path(index_dir, CAT_COLUMNS[column], rank).unlink()
    histograms = {k: dicts.count_histogram(t.counts) for k, t in groups.items()}
    firsts = dicts.first_ids(plan, histograms, (THRESHOLD,) * len(CAT_COLUMNS))
    _, regions = dicts.index_layouts(plan, histograms, (THRESHOLD,) * len(CAT_COLUMNS))
    spec = dicts.WriteSpec(plan, str(dict_dir), str(index_dir), regions, str(staging))
    assert dicts._fill_group(spec, g, firsts.get(g)) == len(
        pq.read_table(dict_dir / f"column={CAT_COLUMNS[column]}" / f"part-{rank:05d}.parquet")
    )
    assert pq.read_table(dict_dir).sort_by("value").equals(first)
    assert _index_files(index_dir) == index_bytes
    assert not list(staging.iterdir())


def test_a_part_of_another_shape_is_refused_untouched(tmp_path):
    """Ids compressed (or anything else that moves them): an error, and the file unchanged."""
    path = tmp_path / "part.parquet"
    ranks = np.arange(500, dtype=np.int32)
    pq.write_table(
        pa.table(
            {
                "value": pa.array([f"{i:08x}" for i in range(500)]),
                "id": pa.array(ranks),
                "count": pa.array(np.ones(500, np.int64)),
            }
        ),
        path,
        compression="snappy",
    )
    before = path.read_bytes()
    with pytest.raises(ValueError, match="id column is not where"):
        dictionary_parts.fill_ids(path, ranks, ranks + 1)
    assert path.read_bytes() == before


def test_a_stale_staging_is_an_error(tmp_path):
    plan, groups, _, _ = _groups(np.random.default_rng(7), 2_000)
    g, totals = next(iter(groups.items()))
    dictionary_parts.stage_group(str(tmp_path), g, totals, dicts.count_histogram(totals.counts)[0], THRESHOLD)
    classes = np.unique(totals.counts[totals.counts >= THRESHOLD])
    with pytest.raises(ValueError, match="stale staging"):
        dictionary_parts.fill_group(
            str(tmp_path),
            dictionary_parts.GroupFill(g, "C5", 0, 0, classes + 1, np.ones(len(classes), np.int64)),
            tmp_path / "out.parquet",
            str(tmp_path),
        )
