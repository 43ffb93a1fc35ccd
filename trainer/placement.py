"""Which rank holds which embedding table, or which column slice of a table.

Tables are placed greedily, largest first, each on the rank with the least embedding memory so
far (rows x columns). A table larger than ``split_threshold_bytes`` (or named in
``force_split``) is split column-wise: rank j holds columns j*d/N..(j+1)*d/N of every row, so
no rank ever holds the whole of it. The placement is a pure function of the table sizes and the
settings, so every rank computes the same one without talking to the others.

The ranks exchange embeddings in "rank order": rank s sends the columns of its pieces (and the
bottom-MLP output if it owns the bottom MLP), in its piece order. ``feature_columns`` maps that
layout back to the model's feature order: [bottom MLP output], C1, C2, ..., C26.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dlrm_contracts.config import ConfigError
from dlrm_contracts.schema import CAT_COLUMNS

BOTTOM = -1  # the "table" index of the bottom-MLP output when it travels with the embeddings


@dataclass(frozen=True, order=True)
class Piece:
    """Columns [col_start, col_end) of table ``table`` (all rows)."""

    table: int
    col_start: int
    col_end: int
    rows: int

    @property
    def width(self) -> int:
        return self.col_end - self.col_start

    @property
    def name(self) -> str:
        return f"{CAT_COLUMNS[self.table]}[{self.col_start}:{self.col_end}]"


@dataclass(frozen=True)
class Placement:
    world: int
    dim: int
    pieces: tuple[tuple[Piece, ...], ...]  # per rank, sorted by (table, columns)
    bottom_owner: int | None  # rank computing the bottom MLP for the whole batch; None = all

    def tables_of(self, rank: int) -> tuple[int, ...]:
        return tuple(sorted({p.table for p in self.pieces[rank]}))

    def sent_width(self, rank: int) -> int:
        """Columns rank ``rank`` contributes per sample to the exchange."""
        own_bottom = self.dim if self.bottom_owner == rank else 0
        return own_bottom + sum(p.width for p in self.pieces[rank])

    def exchanged_features(self) -> int:
        return len(CAT_COLUMNS) + (0 if self.bottom_owner is None else 1)

    def feature_columns(self) -> np.ndarray:
        """Index into the rank-order exchange layout giving [bottom?] C1..C26, d columns each."""
        position: dict[tuple[int, int], int] = {}
        offset = 0
        for rank in range(self.world):
            if self.bottom_owner == rank:
                for c in range(self.dim):
                    position[(BOTTOM, c)] = offset + c
                offset += self.dim
            for piece in self.pieces[rank]:
                for c in range(piece.col_start, piece.col_end):
                    position[(piece.table, c)] = offset + c - piece.col_start
                offset += piece.width
        order = ([BOTTOM] if self.bottom_owner is not None else []) + list(range(len(CAT_COLUMNS)))
        return np.array([position[(t, c)] for t in order for c in range(self.dim)], np.int32)

    def describe(self) -> dict:
        return {
            "world": self.world,
            "dim": self.dim,
            "bottom_owner": self.bottom_owner,
            "ranks": [
                {
                    "pieces": [p.name for p in self.pieces[r]],
                    "embedding_mb": round(sum(p.rows * p.width for p in self.pieces[r]) * 4 / 2**20, 3),
                }
                for r in range(self.world)
            ],
        }


def column_ranges(dim: int, parts: int) -> list[tuple[int, int]]:
    bounds = np.linspace(0, dim, parts + 1).round().astype(int)
    return [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]


def plan_placement(
    table_sizes: list[int] | tuple[int, ...],
    dim: int,
    world: int,
    *,
    bottom_data_parallel: bool = True,
    split_threshold_bytes: float = float("inf"),
    force_split: tuple[str, ...] | list[str] = (),
    bytes_per_value: int = 4,
) -> Placement:
    """Balance tables over ``world`` ranks; split the too-large ones column-wise."""
    if world < 1:
        raise ValueError("world size must be at least 1")
    unknown = sorted(set(force_split) - set(CAT_COLUMNS))
    if unknown:
        raise ConfigError(f"force_column_split names unknown columns {unknown}")
    load = [0] * world
    owned: list[list[Piece]] = [[] for _ in range(world)]
    whole = []
    for table, rows in enumerate(table_sizes):
        too_big = rows * dim * bytes_per_value > split_threshold_bytes
        if world > 1 and (too_big or CAT_COLUMNS[table] in force_split):
            for rank, (a, b) in enumerate(column_ranges(dim, world)):
                owned[rank].append(Piece(table, a, b, int(rows)))
                load[rank] += rows * (b - a)
        else:
            whole.append(Piece(table, 0, dim, int(rows)))
    for piece in sorted(whole, key=lambda p: (-p.rows, p.table)):
        rank = min(range(world), key=lambda r: (load[r], r))
        owned[rank].append(piece)
        load[rank] += piece.rows * piece.width
    idle = [r for r in range(world) if not owned[r]]
    if idle:
        raise ConfigError(
            f"{world} ranks but rank(s) {idle} would hold no table: use fewer ranks "
            "or split tables column-wise (force_column_split)"
        )
    return Placement(world, dim, tuple(tuple(sorted(p)) for p in owned), None if bottom_data_parallel else 0)
