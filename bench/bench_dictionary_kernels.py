"""Benchmark of the Arrow engine's per-value kernels, in one process, at dictionary sizes from
a few thousand to tens of millions of kept values: why the index is a hash table probed by a
compiled kernel, and what a dictionary group's write costs per value.

    .venv/bin/python bench/bench_dictionary_kernels.py [--sizes 5000,100000,2270000,20000000]

It prints nanoseconds per value for:
- what the index's checks cost: the driver's seal of the index (each range file hashed) and a
  worker's open (index.json and the files checked, each mapped range hashed);
- lookups of a batch of 64k values of one column (the transform's unit of work): the
  project's index (``spark_jobs.engines.arrow.dictionary_index``: open addressing, numba probe), a numpy
  ``searchsorted`` over the sorted values (the vectorised floor without a compiled kernel),
  and pandas ``Index.get_indexer`` (a hash table built by pandas); ids checked equal;
- counting one chunk's column of 256k values: the project's sort-based ``count_values``
  against pandas ``value_counts``;
- merging a value group's partial counts: ``merge_counts`` (one sort of packed keys) against
  the argsort and two gathers it replaced;
- one value group's dictionary write with everything after the barrier, step by step (ids,
  hex strings, parquet, index region): the design the staged parts below replaced;
- a merge group's read of one partial count file (``spark_jobs.engines.arrow.partial_files``), per (group,
  file): the merge reads groups x files slices, so this is the term that grows as rows squared;
- the design in use (``spark_jobs.engines.arrow.dictionary_parts``): the merge stages the group's part and
  index region before the ids are known, and after the barrier only the ids are filled in,
  in place. The (value, id, count) format of the parts is the same.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from dlrm_contracts.hex_text import format_hex  # noqa: E402
from spark_jobs.engines.arrow import dictionary_index, dictionary_parts, partial_files  # noqa: E402
from spark_jobs.engines.arrow.dictionaries import assign_ids  # noqa: E402
from spark_jobs.engines.arrow.kernels import build_region, warm_up  # noqa: E402
from spark_jobs.engines.arrow.value_counts import Counts, count_values, merge_counts  # noqa: E402

BATCH = 65_536


def best_seconds(fn, repeat: int = 5) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def dictionary(rng, kept: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sorted distinct uint32 values, their ids (a permutation of 1..kept), and a universe of
    values of which a sixth are not kept (rare or unseen)."""
    universe = np.unique(rng.integers(0, 2**32, int(kept * 1.25) + 8, dtype=np.uint64)).astype(np.uint32)
    values = np.sort(rng.choice(universe, kept, replace=False))
    ids = (rng.permutation(kept) + 1).astype(np.int32)
    return values, ids, universe


def index_of(directory: Path, values: np.ndarray, ids: np.ndarray) -> dictionary_index.DictionaryIndex:
    layout = dictionary_index.ColumnLayout.of(np.zeros(1, np.uint32), [len(values)])
    dictionary_index.create_index(directory, {"C1": layout})
    dictionary_index.write_region(str(directory), "C1", 0, int(layout.sizes[0]), values, ids)
    dictionary_index.seal_index(directory)
    return dictionary_index.DictionaryIndex(str(directory), ("C1",))


def lookups(rng, kept: int) -> str:
    import pandas as pd

    values, ids, universe = dictionary(rng, kept)
    query = rng.choice(universe, BATCH).astype(np.int64)
    with tempfile.TemporaryDirectory() as tmp:
        index = index_of(Path(tmp) / "index", values, ids)
        out = np.empty((1, BATCH), np.int32)
        ours = best_seconds(lambda: index.lookup_into(query[None, :], out))
        expected = out[0].copy()

        def by_searchsorted():
            position = np.minimum(np.searchsorted(values, query), len(values) - 1)
            return np.where(values[position] == query, ids[position], 0)

        pandas_index = pd.Index(values.astype(np.int64))
        ids0 = np.concatenate([[0], ids])
        pandas_index.get_indexer(query[:1])  # builds its hash table once, outside the timing
        searched = best_seconds(by_searchsorted)
        hashed = best_seconds(lambda: ids0[pandas_index.get_indexer(query) + 1])
        assert (by_searchsorted() == expected).all()
        assert (ids0[pandas_index.get_indexer(query) + 1] == expected).all()
        size = dictionary_index.index_bytes(Path(tmp) / "index")
    per = lambda s: s / BATCH * 1e9  # noqa: E731
    return (
        f"{kept:>12,} kept: index {per(ours):6.1f} ns, numpy searchsorted {per(searched):6.1f} ns, "
        f"pandas get_indexer {per(hashed):6.1f} ns per lookup; index {size / kept:.2f} B/value"
    )


def sealing_and_opening(rng, kept: int) -> str:
    """What the index's checks cost (``spark_jobs.engines.arrow.index_checks``): the driver's
    seal (every range file read and hashed, once a run) and a worker's open (index.json and the
    files checked, the ranges mapped, every range's slots hashed against its checksum, once a
    worker and run), for one column of ``kept`` values in ranges of at most 2.27M, the files in
    the page cache."""
    values, ids, _ = dictionary(rng, kept)
    ranges = -(-kept // 2_270_000)
    cut = np.linspace(0, kept, ranges + 1).astype(np.int64)
    bounds = np.concatenate([[0], values[cut[1:-1]]]).astype(np.uint32)
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp) / "index"
        layout = dictionary_index.ColumnLayout.of(bounds, np.diff(cut))
        dictionary_index.create_index(directory, {"C1": layout})
        for r in range(ranges):
            dictionary_index.write_region(
                str(directory),
                "C1",
                r,
                int(layout.sizes[r]),
                values[cut[r] : cut[r + 1]],
                ids[cut[r] : cut[r + 1]],
            )
        seal = best_seconds(lambda: dictionary_index.seal_index(directory), 3)
        opened = best_seconds(lambda: dictionary_index.DictionaryIndex(str(directory), ("C1",)), 3)
        size = dictionary_index.index_bytes(directory)
    return (
        f"{kept:>12,} kept ({size / 1e6:,.0f} MB, {ranges} ranges): seal {seal:.3f} s "
        f"({size / seal / 1e9:.1f} GB/s), a worker's open {opened:.3f} s "
        f"({size / opened / 1e9:.1f} GB/s, {opened / kept * 1e9:.1f} ns per kept value)"
    )


def counting(rng, distinct: int) -> str:
    import pandas as pd

    chunk = rng.integers(0, distinct, 262_144).astype(np.int64)
    ours = best_seconds(lambda: count_values(chunk))
    theirs = best_seconds(lambda: pd.Series(chunk).value_counts(sort=False))
    return (
        f"{distinct:>12,} possible values: count_values {ours / len(chunk) * 1e9:5.1f} ns, "
        f"pandas value_counts {theirs / len(chunk) * 1e9:5.1f} ns per value"
    )


def merging(rng, distinct: int, parts: int = 40) -> str:
    """A value group's merge: ``parts`` partial counts (sorted runs) of a column with
    ``distinct`` possible values summed, by ``merge_counts`` (one sort of packed
    value-count keys) and by the argsort and two gathers it replaced; results checked equal."""
    runs = [
        Counts(
            np.unique(rng.integers(0, distinct, 60_000)).astype(np.uint32),
            rng.integers(1, 4, 60_000).astype(np.uint32),
        )
        for _ in range(parts)
    ]
    runs = [Counts(r.values, r.counts[: len(r.values)]) for r in runs]
    entries = sum(len(r) for r in runs)

    def by_argsort():
        values = np.concatenate([r.values for r in runs])
        counts = np.concatenate([r.counts.astype(np.int64) for r in runs])
        order = np.argsort(values, kind="stable")
        values, counts = values[order], counts[order]
        starts = np.flatnonzero(np.concatenate([[True], values[1:] != values[:-1]]))
        return Counts(values[starts], np.add.reduceat(counts, starts))

    ours, theirs = merge_counts(runs), by_argsort()
    assert np.array_equal(ours.values, theirs.values) and np.array_equal(ours.counts, theirs.counts)
    a = b = float("inf")
    for _ in range(5):  # alternated: a drifting machine treats both alike
        a = min(a, best_seconds(lambda: merge_counts(runs), 1))
        b = min(b, best_seconds(by_argsort, 1))
    return (
        f"{entries:>12,} entries of {distinct:,} possible values: merge_counts "
        f"{a / entries * 1e9:5.1f} ns, argsort and gathers {b / entries * 1e9:5.1f} ns per entry"
    )


def group_write(rng, kept: int) -> str:
    import pyarrow as pa
    import pyarrow.parquet as pq

    values, _, _ = dictionary(rng, kept)
    counts = rng.poisson(4, kept).astype(np.int64) + 2
    classes = np.unique(counts)
    firsts = np.arange(len(classes), dtype=np.int64) * kept + 1
    steps = {}
    steps["ids"] = best_seconds(lambda: assign_ids(values, counts, classes, firsts), 3)
    ids = assign_ids(values, counts, classes, firsts).astype(np.int32)
    steps["hex strings"] = best_seconds(lambda: format_hex(values), 3)
    table = pa.table({"value": format_hex(values), "id": pa.array(ids), "count": pa.array(counts)})
    with tempfile.TemporaryDirectory() as tmp:
        steps["parquet"] = best_seconds(
            lambda: pq.write_table(
                table, f"{tmp}/part.parquet", compression="snappy", use_dictionary=["count"]
            ),
            3,
        )
        slots = dictionary_index.region_slots(kept)  # an empty region each time: a full one never ends
        steps["index region"] = best_seconds(lambda: build_region(values, ids, np.zeros(slots, np.uint64)), 3)
    total = sum(steps.values())
    parts = ", ".join(f"{k} {v / kept * 1e9:.0f}" for k, v in steps.items())
    return f"{kept:>12,} kept: {total / kept * 1e9:.0f} ns per value ({parts})"


def group_staged_then_filled(rng, kept: int) -> str:
    """The design in use: the merge stages the group's part and index region
    (``dictionary_parts.stage_group``: everything but the ids), and after the barrier only the
    ids are filled in (``fill_group``: 4 bytes per row in the part, the region's slots)."""
    values, _, _ = dictionary(rng, kept)
    counts = rng.poisson(4, kept).astype(np.int64) + 2
    totals = Counts(values, counts)
    classes = np.unique(counts)
    class_first = np.arange(len(classes), dtype=np.int64) * kept + 1  # as if among other groups
    slots = dictionary_index.region_slots(kept)
    with tempfile.TemporaryDirectory() as tmp:
        index_dir = Path(tmp) / "index"
        layout = dictionary_index.ColumnLayout.of(np.zeros(1, np.uint32), [kept])
        dictionary_index.create_index(index_dir, {"C1": layout})
        stage = best_seconds(lambda: dictionary_parts.stage_group(tmp, 0, totals, classes, 1), 3)

        def fill():
            dictionary_parts.stage_group(tmp, 0, totals, classes, 1)  # a fresh part each time
            start = time.perf_counter()
            fill_ids = dictionary_parts.GroupFill(0, "C1", 0, slots, classes, class_first)
            dictionary_parts.fill_group(tmp, fill_ids, Path(tmp) / "part.parquet", str(index_dir))
            return time.perf_counter() - start

        filled = min(fill() for _ in range(3))
    return (
        f"{kept:>12,} kept: staged in the merge {stage / kept * 1e9:.0f} ns, "
        f"filled after the barrier {filled / kept * 1e9:.1f} ns per value"
    )


def partial_reads(rng, files: int = 200, segment_values: int = 200_000, groups: int = 20) -> str:
    """Per (group, file): a value range of one column read from each of ``files`` partial files
    of 26 segments of ``segment_values`` values, as a merge task reads them (each file's table
    and fences read once per task)."""
    with tempfile.TemporaryDirectory() as tmp:
        paths = []
        for f in range(files):
            segments = []
            for column in range(26):
                values = np.unique(rng.integers(0, 2**32, segment_values, dtype=np.uint64)).astype(np.uint32)
                segments.append((0, column, Counts(values, np.ones(len(values), np.uint32))))
            paths.append(f"{tmp}/{f:05d}{partial_files.SUFFIX}")
            partial_files.write(paths[-1], segments)
        width = 2**32 // 4000  # a group's share of a column: ~4000 groups in all
        layouts: dict = {}
        partial_files.read_range(paths, 0, 0, width, layouts)  # the task's first group
        start, cpu = time.perf_counter(), time.process_time()
        for g in range(1, groups + 1):
            partial_files.read_range(paths, g % 26, g * width, (g + 1) * width, layouts)
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    visits = groups * files
    return (
        f"{files} files of 26 x {segment_values:,} values: {wall / visits * 1e6:.1f} us "
        f"({cpu / visits * 1e6:.1f} CPU-us) per (group, file)"
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="5000,100000,2270000,20000000")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    rng = np.random.default_rng(2026)
    warm_up()
    print(f"lookups, batches of {BATCH:,} values of one column:")
    for kept in sizes:
        print("  " + lookups(rng, kept), flush=True)
    print("the index's checks: the driver's seal and a worker's open, files in the page cache:")
    for kept in sizes:
        print("  " + sealing_and_opening(rng, kept), flush=True)
    print("counting a chunk's column of 262,144 values:")
    for distinct in sizes:
        print("  " + counting(rng, distinct), flush=True)
    print("merging a value group's 40 partial counts:")
    for distinct in (k for k in sizes if k >= 100_000):
        print("  " + merging(rng, distinct), flush=True)
    print("a merge group's read of one partial count file:")
    print("  " + partial_reads(rng), flush=True)
    print("one value group's dictionary write, all after the barrier (the design until 2026-11-25):")
    for kept in (k for k in sizes if k <= 2_500_000):
        print("  " + group_write(rng, kept), flush=True)
    print("the design in use: one value group staged in the merge, its ids filled after the barrier:")
    for kept in (k for k in sizes if k <= 2_500_000):
        print("  " + group_staged_then_filled(rng, kept), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
