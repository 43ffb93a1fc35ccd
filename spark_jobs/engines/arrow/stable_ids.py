"""The Arrow engine's stable ids: each value group extends its range of the previous dictionaries.

The old dictionaries are never collected: each dictionary task reads the old entries of its own
value range (a pyarrow filter on the ``value`` column, which the parts' row-group statistics
answer), so a worker's memory is bounded as in the frequency mode, and the value ranges are
planned over the old dictionary as well as the new counts (``dictionary_samples``: from the
parts' footers). The record, the swap and the checks both engines share are
``spark_jobs.stable_ids``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dlrm_contracts.schema import CAT_COLUMNS
from spark_jobs.engines.arrow.dictionaries import (
    SAMPLE_STEP,
    GroupPlan,
    PartPlace,
    assign_ids,
    read_totals,
    write_group_part,
)
from spark_jobs.engines.arrow.fastparse import parse_hex
from spark_jobs.engines.arrow.value_counts import (
    TOTAL_COUNT_DTYPE,
    VALUE_DTYPE,
    Counts,
    count_histogram,
    evenly_spaced,
    to_binary,
)
from spark_jobs.stable_ids import Previous, check_old_ids

# Rows per row group of a stable dictionary part: the next run's range filters and range
# planning read the parts' row-group statistics, so finer groups mean less read per task.
ROW_GROUP_ROWS = 1 << 16
SURVEY_SCHEMA = "group INT, old LONG, old_max LONG, histogram_counts BINARY, histogram_sizes BINARY"
WRITTEN_SCHEMA = "group INT, kept LONG"


def dictionary_samples(previous: Previous | None) -> list[tuple[int, int, np.ndarray]]:
    """(column, entries, sampled values) per part of the previous dictionaries, from the parts'
    row-group statistics (each row group's lowest value): the value ranges then hold about
    ``arrow_group_values`` entries of new counts and old entries together."""
    import pyarrow.parquet as pq

    if previous is None:
        return []
    samples = []
    for j, column in enumerate(CAT_COLUMNS):
        for part in sorted((Path(previous.directory) / f"column={column}").glob("*.parquet")):
            meta = pq.ParquetFile(part).metadata
            if meta.num_rows == 0:
                continue
            index = meta.schema.to_arrow_schema().get_field_index("value")
            stats = [meta.row_group(i).column(index).statistics for i in range(meta.num_row_groups)]
            if all(s is not None and s.has_min_max for s in stats):
                values = parse_hex([s.min for s in stats])
            else:  # a part written without statistics: sample its values
                values = evenly_spaced(
                    np.sort(
                        parse_hex(pq.read_table(part, columns=["value"]).column("value").combine_chunks())
                    ),
                    SAMPLE_STEP,
                )
            samples.append((j, int(meta.num_rows), np.sort(values).astype(VALUE_DTYPE)))
    return samples


# ---------------------------------------------------------------- one value group


@dataclass(frozen=True)
class StableSpec:
    plan: GroupPlan
    minimum: tuple[int, ...]  # each column's threshold
    previous: str | None  # the previous dictionaries' directory
    totals_dir: str
    with_totals: frozenset[int]  # groups the merge left totals for


def old_entries(
    directory: str | None, column: str, low: int, high: int | None
) -> tuple[np.ndarray, np.ndarray]:
    """The previous dictionary's (values ascending, ids) of ``column`` in [low, high): a
    filter the parts' row-group statistics answer, so only this range is read."""
    import pyarrow.dataset as ds

    folder = Path(directory) / f"column={column}" if directory else None
    if folder is None or not folder.is_dir():
        return np.zeros(0, VALUE_DTYPE), np.zeros(0, np.int64)
    condition = ds.field("value") >= f"{low:08x}"
    if high is not None:
        condition = condition & (ds.field("value") < f"{high:08x}")
    table = ds.dataset(str(folder), format="parquet").to_table(columns=["value", "id"], filter=condition)
    values = parse_hex(table.column("value").combine_chunks()).astype(VALUE_DTYPE)
    ids = table.column("id").to_numpy().astype(np.int64)
    order = np.argsort(values, kind="stable")
    return values[order], ids[order]


@dataclass(frozen=True)
class GroupIds:
    """A group's old entries (with their current counts) and its kept newcomers."""

    group: int
    column: int
    rank: int
    old: Counts  # old values and their counts in this run (0: unseen)
    old_ids: np.ndarray
    new: Counts  # kept values without an id yet, ascending


def group_ids(spec: StableSpec, group: int) -> GroupIds:
    column, rank = spec.plan.column_range(group)
    bounds = spec.plan.bounds[column]
    high = int(bounds[rank + 1]) if rank + 1 < len(bounds) else None
    old_values, old_ids = old_entries(spec.previous, CAT_COLUMNS[column], int(bounds[rank]), high)
    totals = (
        read_totals(spec.totals_dir, group)
        if group in spec.with_totals
        else Counts(np.zeros(0, VALUE_DTYPE), np.zeros(0, TOTAL_COUNT_DTYPE))
    )
    at = np.searchsorted(old_values, totals.values)
    known = at < len(old_values)
    known[known] = old_values[at[known]] == totals.values[known]
    old_counts = np.zeros(len(old_values), np.int64)
    old_counts[at[known]] = totals.counts[known]
    fresh = ~known & (totals.counts >= spec.minimum[column])
    return GroupIds(
        group,
        column,
        rank,
        Counts(old_values, old_counts),
        old_ids,
        Counts(totals.values[fresh], totals.counts[fresh]),
    )


def survey_task(spec: StableSpec, batches_of_groups: list[list[int]]):
    """mapInArrow function over item numbers: per group, its old entries, their highest id
    and the count histogram of its kept newcomers (what the newcomers' first ids come from)."""
    import pyarrow as pa

    def run(batches):
        for batch in batches:
            for item in batch.column("id").to_numpy():
                groups = batches_of_groups[int(item)]
                found = [group_ids(spec, g) for g in groups]
                histograms = [count_histogram(f.new.counts) for f in found]
                yield pa.record_batch(
                    {
                        "group": pa.array(groups, pa.int32()),
                        "old": pa.array([len(f.old) for f in found], pa.int64()),
                        "old_max": pa.array([int(f.old_ids.max(initial=0)) for f in found], pa.int64()),
                        "histogram_counts": to_binary([h[0] for h in histograms]),
                        "histogram_sizes": to_binary([h[1] for h in histograms]),
                    }
                )

    return run


@dataclass(frozen=True)
class StableWriteSpec:
    ids: StableSpec
    staging: str  # where the new dictionaries are written
    index_dir: str
    regions: dict[int, tuple[int, int]]  # group → (first slot, slots) in its column's index


def write_task(spec: StableWriteSpec, batches_of_groups: list[list[int]], first_ids_broadcast):
    """mapInArrow function over item numbers: each group's old entries (their ids, their counts
    of this run) and newcomers (the next free ids) written as its dictionary part and index
    region."""
    import pyarrow as pa

    def run(batches):
        firsts = first_ids_broadcast.value
        for batch in batches:
            for item in batch.column("id").to_numpy():
                groups = batches_of_groups[int(item)]
                written = [_write_group(spec, group_ids(spec.ids, g), firsts.get(g)) for g in groups]
                yield pa.record_batch(
                    {"group": pa.array(groups, pa.int32()), "kept": pa.array(written, pa.int64())}
                )

    return run


def _write_group(spec: StableWriteSpec, found: GroupIds, classes) -> int:
    new_ids = (
        assign_ids(found.new.values, found.new.counts, *classes) if len(found.new) else np.zeros(0, np.int64)
    )
    values = np.concatenate([found.old.values, found.new.values])
    if not len(values):
        return 0
    order = np.argsort(values, kind="stable")
    values = values[order]
    ids = np.concatenate([found.old_ids, new_ids])[order]
    counts = np.concatenate([found.old.counts, found.new.counts.astype(np.int64)])[order]
    slots = spec.regions[found.group][1]
    place = PartPlace(spec.staging, spec.index_dir, found.column, found.rank, slots)
    write_group_part(place, values, ids, counts, row_group_size=ROW_GROUP_ROWS)
    return len(values)


# ---------------------------------------------------------------- the driver's arithmetic


def newcomer_first_ids(plan: GroupPlan, histograms, minimum, previous_sizes: dict[str, int]):
    """Per group: its newcomers' counts and the first id of each (group, count) class, after
    the column's previous ids: the frequency arithmetic (``first_ids``) over the newcomers."""
    from spark_jobs.engines.arrow.dictionaries import first_ids

    out = {}
    for group, (counts, first) in first_ids(plan, histograms, minimum).items():
        column, _ = plan.column_range(group)
        out[group] = (counts, first + previous_sizes[CAT_COLUMNS[column]] - 1)
    return out


def check_old_entries(plan: GroupPlan, survey_rows, previous_sizes: dict[str, int]) -> None:
    """The Arrow engine's survey rows, per column: see ``check_old_ids``."""
    found = {}
    for j, column in enumerate(CAT_COLUMNS):
        groups = range(plan.first[j], plan.first[j] + len(plan.bounds[j]))
        rows = [survey_rows[g] for g in groups if g in survey_rows]
        found[column] = (sum(r["old"] for r in rows), max([r["old_max"] for r in rows], default=0))
    check_old_ids(found, previous_sizes)
