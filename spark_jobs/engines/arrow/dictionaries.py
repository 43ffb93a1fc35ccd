"""The Arrow engine's value totals, dictionaries and dictionary index, for columns of any size.

The count tasks (``spark_jobs.engines.arrow.tasks``) write, per chunk, each column's distinct values and
their counts as sorted arrays in a partial file (``spark_jobs.engines.arrow.partial_files``), and emit an
evenly spaced sample of the values. The JVM never sees a value. Then:

1. **Groups.** Each column's values are split into ranges of about ``GROUP_VALUES`` partial
   entries, with bounds from the samples (so a skewed column splits as evenly as a uniform
   one). A group is one (column, value range); every later step works on one group at a time,
   so a worker's memory is bounded whatever the number of distinct values.
2. **Merge** (one task per batch of groups): a group's range is read from every partial file
   and summed per day (the recounted days' counts are written, ``counts/values/day=<k>/``) and
   over the dictionary days (the totals), with the histogram of their counts. Only the
   histogram goes back to Spark.
   With frequency ids the merge then stages the group's dictionary part and index region in
   ``counts/.totals/`` (``spark_jobs.engines.arrow.dictionary_parts``): everything but the ids. With stable
   ids it leaves the totals there, as two flat arrays, for the stable-ids pass.
3. **Ids.** A value's id is 1 + the number of kept values of its column with a higher count, or
   the same count and a lower value (count descending, value ascending). Because groups are
   value ranges in order, that is ``first id of (group, count) + rank of the value among the
   group's values of that count``; the first ids come from the groups' histograms alone,
   summed on the driver. No global sort, no dictionary on the driver.
4. **Fill**: each group's task writes the ids into its staged part (value, id, count), moves it
   into the dictionaries and writes its index region (``spark_jobs.engines.arrow.dictionary_index``).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dlrm_contracts.hex_text import format_hex
from dlrm_contracts.layout import COUNT_VALUES_DIR, values_dir
from dlrm_contracts.schema import CAT_COLUMNS
from dlrm_contracts.thresholds import ThresholdSpec
from spark_jobs.engines.arrow import dictionary_index, dictionary_parts, partial_files, remote
from spark_jobs.engines.arrow.atomic_write import write_atomically
from spark_jobs.engines.arrow.value_counts import (
    DAY_COUNT_DTYPE,
    TOTAL_COUNT_DTYPE,
    VALUE_DTYPE,
    Counts,
    count_histogram,
    evenly_spaced,
    merge_counts,
    to_binary,
)

KIND_STATS, KIND_SAMPLE = 0, 2
# What the count tasks emit (their partial counts go to files, ``spark_jobs.engines.arrow.partial_files``).
# Statistics rows: value = chunk << CODE_BITS | code, count = lines. Sample rows: every
# SAMPLE_STEP-th of a (chunk, column)'s distinct values, value = how many the sample stands for.
COUNT_SCHEMA = "kind INT, day INT, column INT, value LONG, count LONG, values BINARY, counts BINARY"
TOTALS_SCHEMA = "group INT, entries LONG, histogram_counts BINARY, histogram_sizes BINARY"
WRITTEN_SCHEMA = "group INT, kept LONG, checksum STRING"  # the region's, at a URL (else null)
SAMPLE_STEP = 1024
# Partial entries per group: a merge holds ~40 bytes per entry at its peak, so ~80 MB.
GROUP_VALUES = 2_000_000
_MAX_COUNT = 2**63 - 1


# ---------------------------------------------------------------- partial counts as rows


def sample_rows(day: int, counts_by_column: dict[int, Counts]):
    """One record batch: a sample row per column with values (value = the entries it stands
    for), from which the driver plans the value groups."""
    import pyarrow as pa

    columns = [j for j, c in counts_by_column.items() if len(c)]
    n = len(columns)
    return pa.record_batch(
        {
            "kind": pa.array([KIND_SAMPLE] * n, pa.int32()),
            "day": pa.array([day] * n, pa.int32()),
            "column": pa.array(columns, pa.int32()),
            "value": pa.array([len(counts_by_column[j]) for j in columns], pa.int64()),
            "count": pa.array([0] * n, pa.int64()),
            "values": to_binary([evenly_spaced(counts_by_column[j].values, SAMPLE_STEP) for j in columns]),
            "counts": pa.nulls(n, pa.binary()),
        }
    )


def write_partials(path: str, day: int, counts_by_column: dict[int, Counts]):
    """A chunk's (or a stored file's) partial counts written for the merge; its sample rows."""
    partial_files.write(path, [(day, j, c) for j, c in sorted(counts_by_column.items())])
    return sample_rows(day, counts_by_column)


def stored_files(counts_dir: Path, days: list[int]) -> list[tuple[int, str, int]]:
    """(day, parquet file, its size) of the stored value counts of ``days``; at a URL the
    sizes come with the listing of each day (one request per day, none per file)."""
    files = []
    for day in days:
        if remote.is_url(counts_dir):
            folder = remote.join(counts_dir, COUNT_VALUES_DIR, f"day={day}")
            files += [
                (day, p, size)
                for p, size in remote.list_sized(folder, ".parquet")
                if not p.rsplit("/", 1)[-1].startswith("_")
            ]
            continue
        folder = values_dir(counts_dir) / f"day={day}"
        files += [
            (day, str(p), p.stat().st_size)
            for p in sorted(folder.glob("*.parquet"))
            if not p.name.startswith((".", "_"))
        ]
    return files


def stored_batches(files: list[tuple[int, str, int]], tasks: int) -> list[list[tuple[int, str, int]]]:
    """The stored files (``stored_files``) dealt into about ``tasks`` lists of equal bytes: a
    task per file cost more than the reading (the Arrow engine stores a file per day, column
    and value group: 720 for 24 days)."""
    sizes = {k: size for k, (_day, _path, size) in enumerate(files)}
    return [[files[k] for k in batch] for batch in balanced_batches(sizes, tasks)]


def stored_partials_task(batches: list[list[tuple[int, str, int]]], directory: str | None):
    """mapInArrow function: stored value counts (either engine's files) → partial files and
    sample rows, one batch of files per item, one file at a time (a file is one group's or one
    day's counts: a worker's memory stays bounded whatever the batch). ``directory`` None:
    the partial counts as rows for Spark's exchange (``count_exchange``)."""

    def run(items):
        from spark_jobs.engines.arrow.count_exchange import partial_rows

        for item in items:
            for k in item.column(0).to_numpy():
                for i, (day, path, size) in enumerate(batches[int(k)]):
                    by_column = _stored_counts(path, size)
                    if not by_column:
                        continue
                    if directory is None:
                        yield sample_rows(day, by_column)
                        yield partial_rows(day, by_column)
                        continue
                    name = f"stored-{int(k):05d}-{i:05d}{partial_files.SUFFIX}"
                    yield write_partials(remote.join(directory, name), day, by_column)

    return run


def _stored_counts(path: str, size: int) -> dict[int, Counts]:
    """One stored file (of ``size`` bytes, as listed) its counts per column, values ascending."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    try:
        if remote.is_url(path):
            fs, inner = remote.filesystem(path)
            remote.log_request("get", size)
            table = pq.read_table(inner, filesystem=fs, columns=["column", "value", "count"])
        else:
            table = pq.read_table(path, columns=["column", "value", "count"])
    except Exception as error:  # named here: the task's traceback reaches the user as one line
        raise ValueError(
            f"the stored value counts {path} are damaged ({error}); delete "
            f"{Path(path).parent} and run again to count that day again"
        ) from error
    by_column = {}
    names = pc.unique(table["column"]).to_pylist()
    for name in names:
        rows = table if len(names) == 1 else table.filter(pc.equal(table["column"], name))
        values = rows["value"].to_numpy().astype(VALUE_DTYPE)
        order = np.argsort(values, kind="stable")
        counts = rows["count"].to_numpy().astype(DAY_COUNT_DTYPE)
        by_column[CAT_COLUMNS.index(name)] = Counts(values[order], counts[order])
    return by_column


# ---------------------------------------------------------------- groups


@dataclass(frozen=True)
class GroupPlan:
    """Each column's value ranges and their group numbers: group = first[column] + range."""

    bounds: tuple[np.ndarray, ...]  # per column: lowest value of each range, bounds[0] = 0
    first: tuple[int, ...]  # per column: the group of its first range
    entries: int = 0  # partial entries in all (what the merge will read)
    column_entries: tuple[int, ...] = ()  # per column (empty: unknown)

    @property
    def groups(self) -> int:
        return self.first[-1] + len(self.bounds[-1])

    def column_range(self, group: int) -> tuple[int, int]:
        column = int(np.searchsorted(self.first, group, side="right")) - 1
        return column, group - self.first[column]

    def value_range(self, group: int) -> tuple[int, int, int | None]:
        """(column, lowest value, the next range's lowest or None) of a group."""
        column, rank = self.column_range(group)
        bounds = self.bounds[column]
        return column, int(bounds[rank]), int(bounds[rank + 1]) if rank + 1 < len(bounds) else None

    def group_entries(self) -> dict[int, int]:
        """Each group's expected partial entries (its column's, spread evenly over its
        ranges, as the ranges were cut): the weights the merge's tasks are balanced by."""
        out = {}
        for j, bounds in enumerate(self.bounds):
            share = self.column_entries[j] // len(bounds) if self.column_entries else 1
            out.update({self.first[j] + r: max(1, share) for r in range(len(bounds))})
        return out

    @classmethod
    def from_samples(
        cls, samples: list[tuple[int, int, np.ndarray]], group_values: int = GROUP_VALUES
    ) -> "GroupPlan":
        """``samples``: (column, entries the sample stands for, sampled values) per partial."""
        by_column: dict[int, list] = {j: [] for j in range(len(CAT_COLUMNS))}
        for column, entries, values in samples:
            by_column[column].append((entries, values))
        bounds, first, next_group = [], [], 0
        for j in range(len(CAT_COLUMNS)):
            column_bounds = _range_bounds(by_column[j], group_values)
            bounds.append(column_bounds)
            first.append(next_group)
            next_group += len(column_bounds)
        return cls(
            tuple(bounds),
            tuple(first),
            sum(entries for _, entries, _ in samples),
            tuple(sum(entries for entries, _ in by_column[j]) for j in range(len(CAT_COLUMNS))),
        )


def _range_bounds(samples: list[tuple[int, np.ndarray]], group_values: int) -> np.ndarray:
    """Lower bounds of ranges holding about ``group_values`` entries each (weighted quantiles
    of the samples; each sampled value stands for entries / len(sample) entries)."""
    total = sum(entries for entries, _ in samples)
    ranges = -(-total // group_values)
    if ranges <= 1:
        return np.zeros(1, VALUE_DTYPE)
    values = np.concatenate([v for _, v in samples if len(v)])
    weights = np.concatenate([np.full(len(v), entries / len(v)) for entries, v in samples if len(v)])
    order = np.argsort(values, kind="stable")
    values, cumulative = values[order], np.cumsum(weights[order])
    targets = total * np.arange(1, ranges) / ranges
    cuts = values[np.minimum(np.searchsorted(cumulative, targets), len(values) - 1)]
    return np.unique(np.concatenate([[0], cuts]).astype(VALUE_DTYPE))


# ---------------------------------------------------------------- merge


@dataclass(frozen=True)
class MergeSpec:
    plan: GroupPlan
    recount: frozenset[int]  # days whose counts are written
    dictionary_days: frozenset[int]  # days summed into the totals
    counts_dir: str
    totals_dir: str
    # frequency ids: each column's threshold, and the merge stages the group's dictionary part;
    # None (stable ids): the merge leaves the group's totals
    minimum: tuple[int, ...] | None = None


def merge_task(spec: MergeSpec, batches: list[list[int]], paths: list[str]):
    """mapInArrow function over batch numbers: for each group of the batch, its value range
    read from every partial file (``paths``; a worker holds one group's entries at a time),
    the recounted days' counts written, the totals over the dictionary days staged and their
    histogram returned (``TOTALS_SCHEMA``)."""

    def run(items):
        layouts: dict = {}  # each file's segment table, read once a task
        with remote.writes_behind():  # a group's objects land while the next one merges
            for item in items:
                for k in item.column(0).to_numpy():
                    for group in batches[int(k)]:
                        column, low, high = spec.plan.value_range(group)
                        by_day = partial_files.read_range(paths, column, low, high, layouts)
                        if by_day:  # a range no partial reaches has no row
                            yield merge_group(spec, group, {d: merge_counts(p) for d, p in by_day.items()})

    return run


def merge_group(spec: MergeSpec, group: int, per_day: dict[int, Counts]):
    """One group's merge, from its counts per day: the recounted days' counts written, the
    totals staged (frequency ids) or left (stable ids); its histogram as one row."""
    import pyarrow as pa

    column, rank = spec.plan.column_range(group)
    for day in sorted(spec.recount & per_day.keys()):
        if len(per_day[day]):
            _write_day_counts(spec.counts_dir, day, CAT_COLUMNS[column], rank, per_day[day])
    totals = merge_counts([c for d, c in per_day.items() if d in spec.dictionary_days])
    sizes_of = count_histogram(totals.counts)
    if spec.minimum is None:
        write_totals(spec.totals_dir, group, totals)
    elif remote.is_url(spec.totals_dir):
        dictionary_parts.stage_group_remote(spec.totals_dir, group, totals, sizes_of[0], spec.minimum[column])
    else:
        dictionary_parts.stage_group(spec.totals_dir, group, totals, sizes_of[0], spec.minimum[column])
    return pa.record_batch(
        {
            "group": pa.array([group], pa.int32()),
            "entries": pa.array([len(totals)], pa.int64()),
            "histogram_counts": to_binary([sizes_of[0]]),
            "histogram_sizes": to_binary([sizes_of[1]]),
        }
    )


def _write_day_counts(counts_dir: str, day: int, column: str, rank: int, counts: Counts) -> None:
    """One group's counts of one day, as both engines store them (column, the value's
    integer, count). The name is the group's, so a retried task replaces its own file.

    The values ascend, so delta encoding stores each in a byte or two instead of 8 and costs
    less to write than plain values compressed; the column name is one dictionary entry."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    name = pa.DictionaryArray.from_arrays(
        pa.array(np.zeros(len(counts), np.int32)), pa.array([column], pa.string())
    )
    table = pa.table(
        {
            "column": name,
            "value": pa.array(counts.values.astype(np.int64)),
            "count": pa.array(counts.counts.astype(np.int64)),
        }
    )
    name = f"part-{column}-{rank:05d}.parquet"

    def write(target) -> None:
        pq.write_table(
            table,
            target,
            compression="snappy",
            use_dictionary=["column", "count"],
            column_encoding={"value": "DELTA_BINARY_PACKED"},
            write_statistics=["value"],
            store_schema=False,
        )

    if remote.is_url(counts_dir):
        write_parquet_object(write, remote.join(counts_dir, COUNT_VALUES_DIR, f"day={day}", name))
        return
    write_atomically(values_dir(counts_dir) / f"day={day}" / name, write)


def write_parquet_object(write, url: str) -> None:
    """``write(sink)`` into memory, then sent as one object (a reader never sees half)."""
    import pyarrow as pa

    sink = pa.BufferOutputStream()
    write(sink)
    remote.write_bytes(url, sink.getvalue())


def totals_dir(counts_dir: str | Path) -> Path | str:
    """Where the merge leaves each group's totals for the dictionary tasks (removed after)."""
    if remote.is_url(counts_dir):
        return remote.join(counts_dir, "_totals")
    return Path(counts_dir) / ".totals"


def clear_dir(directory: str | Path) -> None:
    """A scratch directory (or a URL's prefix) removed with everything in it."""
    if remote.is_url(directory):
        remote.delete_tree(str(directory))
    else:
        shutil.rmtree(directory, ignore_errors=True)


def _totals_paths(directory: str, group: int) -> tuple[Path, Path]:
    base = Path(directory) / f"group-{group:07d}"
    return base.with_suffix(".values.npy"), base.with_suffix(".counts.npy")


def write_totals(directory: str, group: int, totals: Counts) -> None:
    """A group's totals as two .npy files, each replaced whole (a retried task rewrites them)."""
    for path, array in zip(
        _totals_paths(directory, group), (totals.values, totals.counts.astype(TOTAL_COUNT_DTYPE, copy=False))
    ):
        dictionary_parts.save_array(path, array)


def read_totals(directory: str, group: int) -> Counts:
    values, counts = (np.load(path) for path in _totals_paths(directory, group))
    if len(values) != len(counts):
        raise ValueError(f"the totals of value group {group} in {directory} are damaged")
    return Counts(values, counts)


def write_parquet_atomically(
    table, path: Path, use_dictionary=True, row_group_size: int | None = None
) -> None:
    import pyarrow.parquet as pq

    write_atomically(
        path,
        lambda temporary: pq.write_table(
            table,
            temporary,
            compression="snappy",
            use_dictionary=use_dictionary,
            row_group_size=row_group_size,
        ),
    )


# ---------------------------------------------------------------- ids and writing


def thresholds(spec: ThresholdSpec) -> tuple[int, ...]:
    """Each column's effective threshold (a count is a LONG: a higher one keeps nothing)."""
    return tuple(min(spec.effective(c), _MAX_COUNT) for c in CAT_COLUMNS)


def first_ids(
    plan: GroupPlan, histograms: dict[int, tuple[np.ndarray, np.ndarray]], minimum: tuple[int, ...]
) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Per group: its kept counts (ascending) and the id of the first (lowest) value of each
    among the group's values. Ordered by (count descending, group ascending), a column's
    (group, count) classes are its ids in blocks: each block starts after the ones before."""
    out = {}
    for j in range(len(CAT_COLUMNS)):
        groups = [plan.first[j] + r for r in range(len(plan.bounds[j]))]
        entries = [
            (g, c, n) for g in groups if g in histograms for c, n in zip(*histograms[g]) if c >= minimum[j]
        ]
        if not entries:
            continue
        group, count, size = (np.array(x, np.int64) for x in zip(*entries))
        order = np.lexsort((group, -count))
        start = np.zeros(len(order), np.int64)
        np.cumsum(size[order][:-1], out=start[1:])
        first = np.empty_like(start)
        first[order] = 1 + start
        for g in np.unique(group):
            mine = np.flatnonzero(group == g)  # counts ascending, as in the histogram
            out[int(g)] = (count[mine], first[mine])
    return out


def assign_ids(
    values: np.ndarray, counts: np.ndarray, classes: np.ndarray, class_first: np.ndarray
) -> np.ndarray:
    """Ids of a group's kept values (ascending, their counts all in ``classes``): the class's
    first id plus the value's rank among the group's values of the same count."""
    from spark_jobs.engines.arrow.kernels import ranks_in_class

    ids = np.empty(len(values), np.int64)
    ranks_in_class(np.searchsorted(classes, counts), np.ascontiguousarray(class_first, np.int64), ids)
    return ids


@dataclass(frozen=True)
class WriteSpec:
    plan: GroupPlan
    dict_dir: str
    index_dir: str
    regions: dict[int, tuple[int, int]]  # group → (first slot, slots) in its column's index
    totals_dir: str  # where the merge staged the groups' parts


def dictionary_task(spec: WriteSpec, batches_of_groups: list[list[int]], first_ids_broadcast):
    """mapInArrow function over item numbers (one item = some groups): each group's staged part
    given its ids and moved into the dictionaries, its index region written."""
    import pyarrow as pa

    def run(batches):
        firsts = first_ids_broadcast.value
        with remote.writes_behind():  # a group's part and region land while the next one fills
            for batch in batches:
                for item in batch.column("id").to_numpy():
                    groups = batches_of_groups[int(item)]
                    kept, checksums = zip(*(_filled(spec, g, firsts.get(g)) for g in groups))
                    yield pa.record_batch(
                        {
                            "group": pa.array(groups, pa.int32()),
                            "kept": pa.array(kept, pa.int64()),
                            "checksum": pa.array(checksums, pa.string()),
                        }
                    )

    return run


def balanced_batches(entries: dict[int, int], batches: int) -> list[list[int]]:
    """Groups dealt into ``batches`` lists of about equal entries (largest first, each to the
    lightest list)."""
    loads = [(0, k) for k in range(max(1, min(batches, len(entries))))]
    out: list[list[int]] = [[] for _ in loads]
    for group in sorted(entries, key=lambda g: -entries[g]):
        load, k = min(loads)
        out[k].append(group)
        loads[k] = (load + entries[group], k)
    return [sorted(b) for b in out if b]


def _fill_group(spec: WriteSpec, group: int, classes) -> int:
    """The values a group keeps, its part and region written."""
    return _filled(spec, group, classes)[0]


def _filled(spec: WriteSpec, group: int, classes) -> tuple[int, str | None]:
    """(values kept, the region's checksum at a URL, else None)."""
    if classes is None:  # nothing kept in this group
        return 0, None
    column, rank = spec.plan.column_range(group)
    name = CAT_COLUMNS[column]
    fill = dictionary_parts.GroupFill(group, name, rank, spec.regions[group][1], classes[0], classes[1])
    if remote.is_url(spec.dict_dir):
        part_url = remote.join(spec.dict_dir, f"column={name}", f"part-{rank:05d}.parquet")
        return dictionary_parts.fill_group_remote(spec.totals_dir, fill, part_url, spec.index_dir)
    part = Path(spec.dict_dir) / f"column={name}" / f"part-{rank:05d}.parquet"
    kept = dictionary_parts.fill_group(spec.totals_dir, fill, part, spec.index_dir)
    return kept, None


@dataclass(frozen=True)
class PartPlace:
    """Where a value group's dictionary part and index region go: the dictionaries and the
    index, its column (index), its rank among the column's groups, its region's slots."""

    dict_dir: str
    index_dir: str
    column: int
    rank: int
    slots: int


def write_group_part(
    place: PartPlace,
    values: np.ndarray,
    ids: np.ndarray,
    counts: np.ndarray,
    row_group_size: int | None = None,
) -> None:
    """A value group's part of its column's dictionary (value, id, count; values ascending)
    and its region of the index: what both id modes write once a group's ids are known."""
    import pyarrow as pa

    name, rank = CAT_COLUMNS[place.column], place.rank
    table = pa.table(
        {
            "value": format_hex(values),
            "id": pa.array(ids.astype(np.int32)),
            "count": pa.array(counts.astype(np.int64)),
        }
    )
    # every value and id is distinct: only the counts gain from dictionary encoding
    write_parquet_atomically(
        table,
        Path(place.dict_dir) / f"column={name}" / f"part-{rank:05d}.parquet",
        use_dictionary=["count"],
        row_group_size=row_group_size,
    )
    dictionary_index.write_region(place.index_dir, name, rank, place.slots, values, ids)


def index_layouts(plan: GroupPlan, histograms, minimum) -> tuple[dict, dict]:
    """Per column its index layout, and per group its region (first slot, slots)."""
    kept = {}
    for g, (counts, sizes) in histograms.items():
        column, _ = plan.column_range(g)
        kept[g] = int(sizes[counts >= minimum[column]].sum())
    return layouts_of(plan, kept)


def layouts_of(plan: GroupPlan, kept: dict[int, int]) -> tuple[dict, dict]:
    """Index layouts and regions from the values each group keeps (absent: none)."""
    layouts, regions = {}, {}
    for j, name in enumerate(CAT_COLUMNS):
        groups = [plan.first[j] + r for r in range(len(plan.bounds[j]))]
        layout = dictionary_index.ColumnLayout.of(plan.bounds[j], [kept.get(g, 0) for g in groups])
        layouts[name] = layout
        for r, g in enumerate(groups):
            regions[g] = (int(layout.starts[r]), int(layout.sizes[r]))
    return layouts, regions


def clear_day_counts(counts_dir: Path, days) -> None:
    """Drop the recounted days' stored counts (a day left with no value gets no folder, as
    the SQL engine's partitioned write leaves none)."""
    for day in days:
        if remote.is_url(counts_dir):
            remote.delete_tree(remote.join(counts_dir, COUNT_VALUES_DIR, f"day={day}"))
        else:
            shutil.rmtree(values_dir(counts_dir) / f"day={day}", ignore_errors=True)
