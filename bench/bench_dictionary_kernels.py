"""Benchmark of the Arrow engine's per-value kernels, in one process, at dictionary sizes from
a few thousand to tens of millions of kept values: why the index is a hash table probed by a
compiled kernel, and what a dictionary group's write costs per value.

    .venv/bin/python bench/bench_dictionary_kernels.py [--sizes 5000,100000,2270000,20000000]

It prints nanoseconds per value for:
- lookups of a batch of 64k values of one column (the transform's unit of work): the
  project's index (``spark_jobs.dictionary_index``: open addressing, numba probe), a numpy
  ``searchsorted`` over the sorted values (the vectorised floor without a compiled kernel),
  and pandas ``Index.get_indexer`` (a hash table built by pandas); ids checked equal;
- counting one chunk's column of 256k values: the project's sort-based ``count_values``
  against pandas ``value_counts``;
- one value group's dictionary write, step by step (ids, hex strings, parquet, index region);
- the same group under another design, where the merge (before the ids are known) writes the
  group's rows and index region with group-local ranks, and only the ids are applied after the
  barrier: what would remain of the dictionaries phase per value. Its catch: a dictionary part
  then holds ranks, not ids, so the reference's (value, id, count) rows need a second file.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numba
import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from spark_jobs import dictionary_index  # noqa: E402
from spark_jobs.arrow_dictionaries import assign_ids  # noqa: E402
from spark_jobs.fastparse import format_hex  # noqa: E402
from spark_jobs.kernels import build_region, warm_up  # noqa: E402
from spark_jobs.value_counts import count_values  # noqa: E402

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
        pandas_index.get_indexer(query[:1])    # builds its hash table once, outside the timing
        searched = best_seconds(by_searchsorted)
        hashed = best_seconds(lambda: ids0[pandas_index.get_indexer(query) + 1])
        assert (by_searchsorted() == expected).all()
        assert (ids0[pandas_index.get_indexer(query) + 1] == expected).all()
        size = dictionary_index.index_bytes(Path(tmp) / "index")
    per = lambda s: s / BATCH * 1e9  # noqa: E731
    return (f"{kept:>12,} kept: index {per(ours):6.1f} ns, numpy searchsorted {per(searched):6.1f} ns, "
            f"pandas get_indexer {per(hashed):6.1f} ns per lookup; index {size / kept:.2f} B/value")


def counting(rng, distinct: int) -> str:
    import pandas as pd

    chunk = rng.integers(0, distinct, 262_144).astype(np.int64)
    ours = best_seconds(lambda: count_values(chunk))
    theirs = best_seconds(lambda: pd.Series(chunk).value_counts(sort=False))
    return (f"{distinct:>12,} possible values: count_values {ours / len(chunk) * 1e9:5.1f} ns, "
            f"pandas value_counts {theirs / len(chunk) * 1e9:5.1f} ns per value")


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
        steps["parquet"] = best_seconds(lambda: pq.write_table(
            table, f"{tmp}/part.parquet", compression="snappy", use_dictionary=["count"]), 3)
        slots = dictionary_index.region_slots(kept)   # an empty region each time: a full one never ends
        steps["index region"] = best_seconds(
            lambda: build_region(values, ids, np.zeros(slots, np.uint64)), 3)
    total = sum(steps.values())
    parts = ", ".join(f"{k} {v / kept * 1e9:.0f}" for k, v in steps.items())
    return f"{kept:>12,} kept: {total / kept * 1e9:.0f} ns per value ({parts})"


@numba.njit(cache=False, nogil=True)
def _ranks_to_ids(region, rank_to_id):
    """Each filled slot's group-local rank (high 32 bits) replaced by its id."""
    for s in range(region.shape[0]):
        slot = region[s]
        if slot != 0:
            rank = np.int64(slot >> np.uint64(32)) - 1
            region[s] = (slot & np.uint64(0xFFFFFFFF)) | (np.uint64(rank_to_id[rank]) << np.uint64(32))


def group_ids_after_barrier(rng, kept: int) -> str:
    """The other design's dictionaries phase for one group: ranks (in count-descending,
    value-ascending order) → ids from the class offsets, applied to the index region built by
    the merge, and the ids written as a file of their own beside the merge's rows."""
    values, _, _ = dictionary(rng, kept)
    counts = rng.poisson(4, kept).astype(np.int64) + 2
    order = np.lexsort((values, -counts))
    ranks = np.empty(kept, np.int32)
    ranks[order] = np.arange(1, kept + 1, dtype=np.int32)
    classes, sizes = np.unique(-counts, return_counts=True)        # count descending
    class_first = np.arange(len(classes), dtype=np.int64) * kept + 1  # as if interleaved with other groups
    slots = dictionary_index.region_slots(kept)
    built = np.zeros(slots, np.uint64)
    build_region(values, ranks, built)
    steps = {}

    def rank_to_id():
        starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        return (np.arange(kept, dtype=np.int64) + np.repeat(class_first - starts, sizes)).astype(np.int32)
    steps["ids of ranks"] = best_seconds(rank_to_id, 3)
    mapping = rank_to_id()
    _ranks_to_ids(built.copy(), mapping)
    steps["index ids"] = best_seconds(lambda: _ranks_to_ids(built.copy(), mapping), 3)
    steps["index ids"] -= best_seconds(lambda: built.copy(), 3)    # the copy is the timing's own
    with tempfile.TemporaryDirectory() as tmp:
        steps["ids file"] = best_seconds(lambda: np.save(f"{tmp}/ids.npy", mapping), 3)
    total = sum(steps.values())
    parts = ", ".join(f"{k} {v / kept * 1e9:.1f}" for k, v in steps.items())
    return f"{kept:>12,} kept: {total / kept * 1e9:.1f} ns per value ({parts})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="5000,100000,2270000,20000000")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    rng = np.random.default_rng(2026)
    warm_up()
    print(f"lookups, batches of {BATCH:,} values of one column:")
    for kept in sizes:
        print("  " + lookups(rng, kept), flush=True)
    print("counting a chunk's column of 262,144 values:")
    for distinct in sizes:
        print("  " + counting(rng, distinct), flush=True)
    print("one value group's dictionary write:")
    for kept in (k for k in sizes if k <= 2_500_000):
        print("  " + group_write(rng, kept), flush=True)
    print("the other design: one value group's ids applied after the barrier:")
    for kept in (k for k in sizes if k <= 2_500_000):
        print("  " + group_ids_after_barrier(rng, kept), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
