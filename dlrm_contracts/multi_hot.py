"""One-hot ids -> the multi-hot rows of MLPerf DLRMv2, value for value as its reference makes them.

The reference (mlcommons/training, ``recommendation_v2/torchrec_dlrm``: ``multi_hot.py`` and
``scripts/materialize_synthetic_multihot_dataset.py``) materializes its multi-hot dataset so:

* One lookup table per column, ``table_size`` rows of ``k`` ids (``k`` = the column's multi-hot
  size). Row ``r`` is ``r`` itself (the one-hot id stays the first id), then ``k - 1`` ids drawn
  from [0, table_size).
* The draws come from numpy's *legacy* global generator (``RandomState``, Mersenne Twister),
  seeded once with 0, then ``randint(0, table_size, size=(table_size, k - 1))`` for each
  column in order (``pareto``: ``pareto(0.25, ...)`` cast to int32, modulo the table size). A
  column with ``k == 1`` draws nothing.
* A one-hot id ``x`` of the column becomes row ``x % table_size`` of its table, stored as int32.

One stream runs through all 26 columns, so a column's table depends on the sizes of the
columns before it; and ``randint`` rejects draws above the range's bit mask, so a draw takes a
varying number of the generator's words and a column cannot be skipped to: the stream is
replayed from the start, in chunks (memory stays at one chunk beside the tables). We replay it
with numpy's own legacy generator, whose streams numpy keeps fixed across versions (NEP 19),
so nothing here re-implements the generator. Everything is a pure function of the table
sizes, the multi-hot sizes, the seed and the distribution: converters and the trainer's
scoring compute the same rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Sequence

import numpy as np

from dlrm_contracts.binary_format import (
    MULTI_HOT_DISTRIBUTION_KEY,
    MULTI_HOT_SEED_KEY,
    DatasetInfo,
    multi_hot_sizes,
)
from dlrm_contracts.schema import NUM_CATEGORICAL

# The reference seeds numpy's global generator with 0 for every rank.
DEFAULT_SEED = 0
# The reference's two choices (its --multi_hot_distribution_type); MLPerf uses uniform.
DISTRIBUTIONS: tuple[str, ...] = ("uniform", "pareto")
PARETO_SHAPE = 0.25  # the reference's ``a``
IDS_DTYPE = np.dtype(np.int32)  # the reference's tables are int32 (``.int()``)
# Draws per call to the generator: bounds the int64/float64 temporaries (128 MB).
CHUNK_DRAWS = 1 << 24


class MultiHotError(ValueError):
    """Multi-hot settings that cannot be materialized (the message says which)."""


@dataclass(frozen=True)
class MultiHotSpec:
    """Everything the multi-hot rows depend on.

    ``table_sizes``: the 26 tables' rows (the reference's ``num_embeddings_per_feature``);
    ``sizes``: ids per row of each column (1 = one-hot)."""

    table_sizes: tuple[int, ...]
    sizes: tuple[int, ...]
    seed: int = DEFAULT_SEED
    distribution: str = "uniform"

    def __post_init__(self) -> None:
        object.__setattr__(self, "table_sizes", tuple(int(t) for t in self.table_sizes))
        object.__setattr__(self, "sizes", tuple(int(k) for k in self.sizes))
        if len(self.table_sizes) != len(self.sizes):
            raise MultiHotError(f"{len(self.table_sizes)} table sizes but {len(self.sizes)} multi-hot sizes")
        if any(t < 1 for t in self.table_sizes):
            raise MultiHotError(f"table sizes must be >= 1: {list(self.table_sizes)}")
        if any(k < 1 for k in self.sizes):
            raise MultiHotError(f"multi-hot sizes must be >= 1: {list(self.sizes)}")
        if self.distribution not in DISTRIBUTIONS:
            raise MultiHotError(
                f"multi-hot distribution {self.distribution!r} is not one of {list(DISTRIBUTIONS)}"
            )
        if not 0 <= self.seed < 2**32:
            raise MultiHotError(f"multi-hot seed {self.seed} is outside [0, 2**32)")

    @property
    def is_one_hot(self) -> bool:
        return all(k == 1 for k in self.sizes)

    def table_bytes(self, column: int) -> int:
        """Memory of one column's lookup table (none for a one-hot column)."""
        k = self.sizes[column]
        return 0 if k == 1 else self.table_sizes[column] * k * IDS_DTYPE.itemsize


def _draws(rng: np.random.RandomState, table_size: int, count: int, distribution: str) -> np.ndarray:
    """The next ``count`` draws of the stream for a table of ``table_size`` rows, exactly the
    reference's calls (int64 is the default integer of its ``randint`` on Linux; the word
    stream depends on it)."""
    if distribution == "uniform":
        return rng.randint(0, table_size, size=count, dtype=np.int64)
    with np.errstate(invalid="ignore"):  # the cast of huge draws is the reference's too
        return rng.pareto(a=PARETO_SHAPE, size=count).astype(np.int32) % table_size


def _skip(rng: np.random.RandomState, table_size: int, count: int, distribution: str) -> None:
    """Advance the stream past ``count`` draws of a column whose table is not wanted."""
    for start in range(0, count, CHUNK_DRAWS):
        _draws(rng, table_size, min(CHUNK_DRAWS, count - start), distribution)


def _fill(rng: np.random.RandomState, table: np.ndarray, distribution: str) -> None:
    """Fill a (rows, k) table: the row number, then k - 1 draws per row, row-major."""
    rows, k = table.shape
    table[:, 0] = np.arange(rows, dtype=IDS_DTYPE)
    step = max(1, CHUNK_DRAWS // (k - 1))
    for start in range(0, rows, step):
        stop = min(rows, start + step)
        table[start:stop, 1:] = _draws(rng, rows, (stop - start) * (k - 1), distribution).reshape(
            stop - start, k - 1
        )


def iter_tables(
    spec: MultiHotSpec,
    columns: Iterable[int] | None = None,
    allocate: Callable[..., np.ndarray] | None = None,
) -> Iterator[tuple[int, np.ndarray]]:
    """The lookup tables of the wanted multi-hot columns (default: all with k > 1), in column
    order, from one pass over the generator's stream.

    ``allocate(column, shape, dtype)`` gives the array to fill (default ``np.empty``), e.g. a
    memory map on disk when the tables exceed memory."""
    wanted = set(range(len(spec.sizes)) if columns is None else columns)
    last = max((c for c in wanted if spec.sizes[c] > 1), default=-1)
    rng = np.random.RandomState(spec.seed)
    for column in range(last + 1):
        rows, k = spec.table_sizes[column], spec.sizes[column]
        if k == 1:
            continue
        if column not in wanted:
            _skip(rng, rows, rows * (k - 1), spec.distribution)
            continue
        table = (allocate or (lambda _c, shape, dtype: np.empty(shape, dtype)))(column, (rows, k), IDS_DTYPE)
        _fill(rng, table, spec.distribution)
        yield column, table


def lookup_table(spec: MultiHotSpec, column: int) -> np.ndarray:
    """One column's (table_size, k) int32 lookup table (replays the stream before it)."""
    if spec.sizes[column] == 1:
        return np.arange(spec.table_sizes[column], dtype=IDS_DTYPE)[:, np.newaxis]
    return next(iter_tables(spec, [column]))[1]


def materialize(ids: np.ndarray, table: np.ndarray) -> np.ndarray:
    """The multi-hot rows (len(ids), k) of one-hot ``ids``: row ``id % table_size`` of the
    column's table, as the reference looks them up, in the table's dtype (int32 as built)."""
    index = np.asarray(ids).astype(np.int64, copy=False) % len(table)
    return np.take(table, index, axis=0)


def materialize_one_hot(ids: np.ndarray, table_size: int) -> np.ndarray:
    """A k = 1 column's rows without a table: (len(ids), 1) int32 ``id % table_size``."""
    index = np.asarray(ids).astype(np.int64, copy=False) % table_size
    return index.astype(IDS_DTYPE).reshape(-1, 1)


class Materializer:
    """A spec's lookup tables, built once, for many blocks of one-hot ids (scoring a stream of
    raw lines: the same rows the converters wrote for the dataset the model trained on)."""

    def __init__(self, spec: MultiHotSpec):
        self.spec = spec
        self.tables = dict(iter_tables(spec))

    def column(self, column: int, ids: np.ndarray) -> np.ndarray:
        """One column's (len(ids), k) int32 rows."""
        table = self.tables.get(column)
        return (
            materialize(ids, table)
            if table is not None
            else materialize_one_hot(ids, self.spec.table_sizes[column])
        )

    def __call__(self, ids: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Every column's rows for one block of one-hot ids (one array of ids per column)."""
        if len(ids) != len(self.spec.sizes):
            raise MultiHotError(f"{len(ids)} columns of ids for {len(self.spec.sizes)} tables")
        return [self.column(c, col) for c, col in enumerate(ids)]


def materialize_all(spec: MultiHotSpec, ids: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Every column's multi-hot rows for one block of one-hot ids (one array per column):
    what the reference writes into one day's ``.npz``. Builds the tables, so it suits small
    tables (tests, scoring a few rows); converters keep the tables across blocks."""
    return Materializer(spec)(ids)


def check_sizes(sizes: Sequence[int] | None, where: str = "multi_hot_sizes") -> tuple[int, ...]:
    """A list of 26 ints >= 1 (None = one-hot everywhere), else a MultiHotError naming it."""
    if sizes is None:
        return (1,) * NUM_CATEGORICAL
    values = list(sizes)
    if len(values) != NUM_CATEGORICAL or any(
        not isinstance(k, (int, np.integer)) or isinstance(k, bool) or k < 1 for k in values
    ):
        raise MultiHotError(f"{where} must list {NUM_CATEGORICAL} integers >= 1, not {values!r}")
    return tuple(int(k) for k in values)


def spec_of_dataset(info: DatasetInfo) -> MultiHotSpec | None:
    """The materialization a split binary dataset was written with (``DatasetInfo``); None
    for a one-hot dataset. Scoring uses it to turn a raw line's ids into the same rows."""
    sizes = multi_hot_sizes(info)
    if all(k == 1 for k in sizes):
        return None
    return MultiHotSpec(
        tuple(info.table_sizes),
        sizes,
        int(info.extra.get(MULTI_HOT_SEED_KEY, DEFAULT_SEED)),
        str(info.extra.get(MULTI_HOT_DISTRIBUTION_KEY, "uniform")),
    )
