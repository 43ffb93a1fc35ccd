"""Whole-batch reads of the split binary dataset, exactly what each rank needs, prefetched.

Every file of a split is memory-mapped; a batch is one contiguous slice per file converted in a
single numpy call (float16 -> float32, int8/16/32 -> int32), so no Python runs per row. In
hybrid-parallel mode a rank reads the categorical files of the tables it owns for the whole
global batch and only its own slice of the labels (and of the numericals when the bottom MLP is
data parallel; the rank that owns a model-parallel bottom MLP reads them for the whole batch).

A multi-hot column (``multi_hot_sizes`` in ``dataset.json``: k ids per row, row-major) reads as
int32 [batch, k]; a one-hot column as [batch]. The model pools a row's k embeddings by sum.

A dataset written at threshold T can be read at a higher threshold T': ids are ordered by count,
so the values kept at T' are the ids 1..k'(T') and every id above k' becomes 0 (``clamp``).

This module imports numpy only (no TensorFlow), so the loader can be tested and benchmarked
alone.
"""

from __future__ import annotations

from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from dlrm_contracts.binary_format import (
    LABEL_DTYPE,
    LABEL_FILE,
    NUM_NUMERICAL,
    NUMERICAL_DTYPE,
    MULTI_HOT_KEYS,
    NUMERICAL_FILE,
    DatasetError,
    cat_file,
    multi_hot_sizes,
    read_info,
)
from dlrm_contracts.dataset_identity import dataset_identity
from dlrm_contracts.id_modes import recorded_or_default
from dlrm_contracts.layout import DATASET_JSON, counts_beside
from dlrm_contracts.schema import NUM_CATEGORICAL
from dlrm_contracts.table_sizes import new_table_sizes, written_threshold_spec
from dlrm_contracts.thresholds import ThresholdSpec, parse_threshold_spec
from dlrm_contracts.verify import verify_dataset
from trainer.train_days import train_segments

__all__ = [
    "DatasetError",
    "BinaryDataset",
    "RankView",
    "Batch",
    "SplitReader",
    "open_dataset",
    "clamp_limits",
    "batch_starts",
    "prefetch",
]


@dataclass(frozen=True)
class BinaryDataset:
    """A checked split binary dataset and the table sizes the model is built with."""

    path: Path
    rows: dict[str, int]
    written_table_sizes: tuple[int, ...]
    table_sizes: tuple[int, ...]  # after clamping to a higher threshold; else the written ones
    cat_dtypes: tuple[np.dtype, ...]
    # What a checkpoint trained on it records (dlrm_contracts.dataset_identity): the export
    # serves it only with the dictionaries it was made from.
    identity: dict = field(default_factory=dict, compare=False)
    # (day, first row, end row) of the train split's days (stable ids' datasets list them in
    # dataset.json); None: no days listed. What train.days: new selects rows by.
    train_days: tuple[tuple[int, int, int], ...] | None = field(default=None, compare=False)
    # ids per row of each categorical column (1 = one-hot; dataset.json "multi_hot_sizes")
    multi_hot_sizes: tuple[int, ...] = (1,) * NUM_CATEGORICAL
    # dataset.json's record of the materialization (sizes, seed, distribution; empty when
    # one-hot): what a checkpoint keeps so that the export turns raw values into the same rows
    multi_hot_record: dict = field(default_factory=dict, compare=False)

    @property
    def multi_hot(self) -> bool:
        return any(k > 1 for k in self.multi_hot_sizes)

    @property
    def clamp(self) -> tuple[int | None, ...]:
        """Largest id kept per table when read at a higher threshold (None = no clamping)."""
        return tuple(
            None if new == old else new - 1 for new, old in zip(self.table_sizes, self.written_table_sizes)
        )


def clamp_limits(
    written_sizes: Sequence[int],
    written_threshold: str | None,
    counts_dir: str | Path,
    threshold: ThresholdSpec,
) -> tuple[int, ...]:
    """Table sizes at ``threshold``, read off the counts histogram.

    The rule of dlrm_contracts.table_sizes, which rethreshold uses too, so that reading at T' equals rethresholding to T':
    it also checks that the counts belong to this dataset and refuses a lower threshold.
    """
    base = written_threshold_spec(written_threshold, Path(counts_dir))
    return tuple(new_table_sizes(counts_dir, base, threshold, tuple(written_sizes)))


def open_dataset(
    path: str | Path,
    *,
    threshold: ThresholdSpec | str | None = None,
    counts_dir: str | Path | None = None,
    verify: str = "quick",
) -> BinaryDataset:
    """Check a split binary dataset, then describe it for the trainer.

    Args:
        path: the dataset directory (converters' output).
        threshold: read the dataset at this higher threshold spec: ids past the new table
            sizes read as 0, as if it had been rethresholded (same rule as
            ``converters.rethreshold``). None = as written. The trainer passes its config's
            parsed spec; text (a caller without a config) is parsed here.
        counts_dir: the count histogram's directory, needed with ``threshold``; None =
            ``counts`` beside the dataset.
        verify: "quick" (metadata and file sizes), "full" (every value too) or "none".

    Returns:
        Rows per split, the written and the effective table sizes, the id dtypes.

    Raises:
        DatasetError: not a dataset, it fails the check, or the threshold is below the
            written one or the counts do not belong to it.
    """
    path = Path(path)
    if not (path / DATASET_JSON).exists():
        raise DatasetError(f"{path} is not a split binary dataset (no {DATASET_JSON})")
    if verify not in ("quick", "full", "none"):
        raise ValueError(f"verify must be quick, full or none, not {verify!r}")
    if verify != "none":
        verify_dataset(path, full=verify == "full")
    info = read_info(path)
    written = tuple(int(t) for t in info.table_sizes)
    sizes = written
    if threshold is not None:
        threshold = parse_threshold_spec(threshold)
        mode = recorded_or_default(info.extra)
        recorded = info.threshold_spec
        own = parse_threshold_spec(recorded) if recorded is not None and not mode.raisable else None
        refusal = mode.threshold_refusal(threshold, own)
        if refusal is not None:
            raise DatasetError(f"{path} has {refusal}; unset train.frequency_threshold")
        counts = Path(counts_dir) if counts_dir else counts_beside(path)
        if any(k > 1 for k in multi_hot_sizes(info)) and (
            info.threshold_spec is None or threshold != parse_threshold_spec(info.threshold_spec)
        ):
            # a multi-hot row's ids are drawn over every table's size: clamping ids is not
            # what the rows at the new sizes are (converters rethreshold draws them again)
            raise DatasetError(
                f"{path} has multi-hot columns, which cannot be read at "
                f"threshold {threshold}, only at its own "
                f"({info.threshold_spec}): rethreshold it with `python -m "
                "converters rethreshold`, which draws the rows at the new "
                "table sizes"
            )
        sizes = clamp_limits(written, info.threshold_spec, counts, threshold)
    try:
        days = train_segments(info.extra, int(info.splits.get("train", 0)))
    except (TypeError, KeyError, ValueError) as exc:
        raise DatasetError(
            f"{path / DATASET_JSON}: its train segments are damaged "
            f"({type(exc).__name__}: {exc}); convert the dataset again"
        ) from None
    return BinaryDataset(
        path,
        dict(info.splits),
        written,
        sizes,
        tuple(np.dtype(d).newbyteorder("<") for d in info.cat_dtypes),
        dataset_identity(info, threshold),
        None if days is None else tuple(days),
        multi_hot_sizes(info),
        {k: info.extra[k] for k in MULTI_HOT_KEYS if k in info.extra},
    )


@dataclass(frozen=True)
class RankView:
    """What one rank reads of every global batch."""

    world: int
    rank: int
    tables: tuple[int, ...]  # categorical columns read for the whole global batch
    numerical: str  # "local" (own slice), "global" (whole batch) or "none"

    def local_range(self, global_batch: int) -> tuple[int, int]:
        local = global_batch // self.world
        return self.rank * local, (self.rank + 1) * local


def single_process_view() -> RankView:
    return RankView(1, 0, tuple(range(NUM_CATEGORICAL)), "local")


@dataclass
class Batch:
    """One global batch as this rank sees it; rows past ``valid`` are zero padding."""

    step: int
    categorical: list[np.ndarray]  # int32 [global batch] (or [global batch, k]) per table
    numerical: np.ndarray  # float32 [local or global batch, 13], or [0, 13]
    label: np.ndarray  # float32 [local batch]
    valid: int


class SplitReader:
    """Memory maps of one split; ``read`` returns a zero-padded global batch for a rank.

    ``ranges`` restricts it to those row ranges of the split, read as one run of rows in their
    order (train.days: new trains only the new days' ranges); batch starts index that run.
    """

    def __init__(self, dataset: BinaryDataset, split: str, ranges: Sequence[tuple[int, int]] | None = None):
        self.dataset = dataset
        self.split = split
        total = dataset.rows[split]
        self._ranges = tuple((int(a), int(b)) for a, b in ranges) if ranges is not None else ((0, total),)
        if any(not 0 <= a <= b <= total for a, b in self._ranges):
            raise DatasetError(f"row ranges {self._ranges} are outside the {split} split's {total} rows")
        lengths = [b - a for a, b in self._ranges]
        self._firsts = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])
        self.rows = int(self._firsts[-1])
        folder = dataset.path / split
        self._label = self._map(folder / LABEL_FILE, LABEL_DTYPE, (total,))
        self._numerical = self._map(folder / NUMERICAL_FILE, NUMERICAL_DTYPE, (total, NUM_NUMERICAL))
        self._cats = [
            self._map(folder / cat_file(i), dt, (total,) if k == 1 else (total, k))
            for i, (dt, k) in enumerate(zip(dataset.cat_dtypes, dataset.multi_hot_sizes))
        ]
        self._clamp = dataset.clamp

    @staticmethod
    def _map(file: Path, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
        if shape[0] == 0:
            return np.empty(shape, dtype)
        return np.memmap(file, dtype=dtype, mode="r", shape=shape)

    def _pieces(self, start: int, stop: int) -> Iterator[tuple[int, int, int]]:
        """(first file row, end file row, offset in the batch) of rows [start, stop) of the
        run: one piece per range it crosses (one for the whole split)."""
        stop = min(stop, self.rows)
        for (lo, _), first, end in zip(self._ranges, self._firsts[:-1], self._firsts[1:]):
            a, b = max(start, int(first)), min(stop, int(end))
            if a < b:
                yield lo + a - int(first), lo + b - int(first), a - start

    def _slice(self, array: np.ndarray, start: int, stop: int, dtype, length: int) -> np.ndarray:
        """Rows [start, stop) converted to ``dtype`` and zero padded to ``length`` rows."""
        out = np.zeros((length,) + array.shape[1:], dtype=dtype)
        for lo, hi, at in self._pieces(start, stop):
            out[at : at + hi - lo] = array[lo:hi]
        return out

    def file_row(self, row: int) -> int:
        """The split's row number of row ``row`` of the run (for messages)."""
        index = int(np.searchsorted(self._firsts, row, side="right")) - 1
        index = min(max(index, 0), len(self._ranges) - 1)
        return self._ranges[index][0] + row - int(self._firsts[index])

    def categorical(self, table: int, start: int, length: int) -> np.ndarray:
        """int32 ids of rows [start, start + length): [length], or [length, k] multi-hot."""
        ids = self._slice(self._cats[table], start, start + length, np.int32, length)
        size = self.dataset.written_table_sizes[table]
        if ids.size and (ids.min() < 0 or ids.max() >= size):
            # The quick dataset check reads no values; an id outside its table would otherwise
            # fail deep inside TensorFlow (CPU) or be read as zeros (GPU gather).
            flat = int(np.argmax(((ids < 0) | (ids >= size)).ravel()))
            bad = flat // max(1, ids[:1].size)
            raise DatasetError(
                f"{self.dataset.path / self.split / cat_file(table)}: id "
                f"{int(ids.ravel()[flat])} at row {self.file_row(start + bad)} "
                f"is outside its table of "
                f"size {size}: the dataset is damaged; rebuild it with --stages "
                "convert --force (`python -m converters verify "
                f"{self.dataset.path}` finds every such value)"
            )
        limit = self._clamp[table]
        if limit is not None:
            ids[ids > limit] = 0
        return ids

    def read(self, view: RankView, step: int, start: int, global_batch: int) -> Batch:
        lo, hi = view.local_range(global_batch)
        label = self._slice(self._label, start + lo, start + hi, np.float32, hi - lo)
        if view.numerical == "local":
            numerical = self._slice(self._numerical, start + lo, start + hi, np.float32, hi - lo)
        elif view.numerical == "global":
            numerical = self._slice(self._numerical, start, start + global_batch, np.float32, global_batch)
        else:
            numerical = np.zeros((0, NUM_NUMERICAL), np.float32)
        cats = [self.categorical(t, start, global_batch) for t in view.tables]
        valid = max(0, min(global_batch, self.rows - start))
        return Batch(step, cats, numerical, label, valid)


def batch_starts(
    rows: int,
    global_batch: int,
    *,
    epoch: int = 0,
    seed: int = 0,
    shuffle: bool = False,
    drop_remainder: bool = True,
) -> np.ndarray:
    """First row of every batch of an epoch, in the order they are trained on.

    The order is a pure function of (seed, epoch), so step s of a run always reads the same
    rows: a resumed run continues at exactly the next batch.
    """
    full = rows // global_batch
    count = full if drop_remainder else -(-rows // global_batch)
    starts = np.arange(count, dtype=np.int64) * global_batch
    if shuffle:
        starts = starts[np.random.default_rng([seed, epoch]).permutation(count)]
    return starts


def prefetch(
    reader: SplitReader,
    view: RankView,
    plan: Sequence[tuple[int, int]],
    global_batch: int,
    depth: int = 4,
    workers: int = 2,
) -> Iterator[Batch]:
    """Yield ``reader.read`` for each (step, start) of ``plan`` in order, ``depth`` ahead.

    numpy copies release the GIL, so reads overlap the training step running in TensorFlow.
    """
    pending: deque = deque()
    items = iter(plan)
    with ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="loader") as pool:
        try:
            for step, start in items:
                pending.append(pool.submit(reader.read, view, step, start, global_batch))
                if len(pending) >= max(1, depth):
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        finally:
            for future in pending:
                future.cancel()
