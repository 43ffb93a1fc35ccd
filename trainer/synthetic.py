"""Small split binary datasets with a planted signal, written with numpy (tests, benchmarks).

The click probability depends on one numerical, on the main effect of one categorical column
and, most strongly, on a *pairwise interaction* of two categorical columns: the product of a
random ±1 sign per id of column A and per id of column B. That product has no main effect, so
a logistic regression on one-hot ids cannot see it, while a DLRM's dot interaction of the two
embeddings can: the learning test relies on that gap. The files follow docs/architecture.md
exactly (dlrm_contracts.binary_format names every file and dtype).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dlrm_contracts.binary_format import (
    CHECKSUMS_KEY,
    LABEL_FILE,
    NUMERICAL_FILE,
    cat_dtype,
    cat_file,
    describe,
    file_checksum,
    file_key,
    multi_hot_extra,
    write_json,
)
from dlrm_contracts.multi_hot import Materializer, MultiHotSpec
from dlrm_contracts.layout import DATASET_JSON, MODEL_SIZE_JSON, SUCCESS
from dlrm_contracts.schema import CAT_COLUMNS, NUM_CATEGORICAL, NUM_INTEGER, SPLITS

# Varied sizes: int8, int16 and int32 files all occur.
# fmt: off
DEFAULT_TABLE_SIZES = (
    3, 20, 20, 50, 200, 1000, 40_000, 7, 100, 300, 128, 129, 2,
    60, 500, 5000, 33_000, 10, 30, 90, 400, 15, 250, 700, 4, 1500,
)
# fmt: on
INTERACTING = (1, 2)  # C2 x C3 carry the planted interaction
MAIN_EFFECT = 3  # C4 carries a main effect


@dataclass(frozen=True)
class PlantedSignal:
    sign_a: np.ndarray
    sign_b: np.ndarray
    effect: np.ndarray
    strength: float
    bias: float

    def logit(self, numerical: np.ndarray, cats: list[np.ndarray]) -> np.ndarray:
        a, b = INTERACTING
        return (
            self.strength * self.sign_a[cats[a]] * self.sign_b[cats[b]]
            + self.effect[cats[MAIN_EFFECT]]
            + 0.8 * numerical[:, 0]
            + self.bias
        )


def _ids(rng: np.random.Generator, size: int, rows: int) -> np.ndarray:
    """Skewed ids 0..size-1 (small ids frequent, as after count-ordered dictionaries)."""
    u = rng.random(rows)
    return np.minimum((size * u**2).astype(np.int64), size - 1)


def write_split(
    folder: Path,
    label: np.ndarray,
    numerical: np.ndarray,
    cats: list[np.ndarray],
    table_sizes: tuple[int, ...],
) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    label.astype("<u1").tofile(folder / LABEL_FILE)
    numerical.astype("<f2").tofile(folder / NUMERICAL_FILE)
    for i, (ids, size) in enumerate(zip(cats, table_sizes)):
        ids.astype(cat_dtype(size)).tofile(folder / cat_file(i))


# With a signal seed, the planted effects are drawn for this many ids whatever the table
# sizes, so that datasets whose tables grew (later days, stable ids) share one signal.
SIGNAL_IDS = 4096


def planted_signal(table_sizes: tuple[int, ...], seed: int, strength: float, stable: bool) -> PlantedSignal:
    """The planted effects; ``stable``: id i's effect does not depend on the table sizes."""
    rng = np.random.default_rng(seed)
    a, b = INTERACTING
    sizes = [table_sizes[a], table_sizes[b], table_sizes[MAIN_EFFECT]]
    if stable:
        assert max(sizes) <= SIGNAL_IDS, f"planted columns hold at most {SIGNAL_IDS} ids"
        drawn = [
            rng.choice([-1.0, 1.0], SIGNAL_IDS),
            rng.choice([-1.0, 1.0], SIGNAL_IDS),
            rng.normal(0.0, 0.8, SIGNAL_IDS),
        ]
        sign_a, sign_b, effect = (d[:n] for d, n in zip(drawn, sizes))
        return PlantedSignal(sign_a, sign_b, effect, strength, -1.0)
    return PlantedSignal(
        rng.choice([-1.0, 1.0], sizes[0]),
        rng.choice([-1.0, 1.0], sizes[1]),
        rng.normal(0.0, 0.8, sizes[2]),
        strength,
        -1.0,
    )


def write_planted_dataset(
    path: str | Path,
    rows: dict[str, int],
    *,
    seed: int = 0,
    table_sizes: tuple[int, ...] = DEFAULT_TABLE_SIZES,
    strength: float = 3.0,
    threshold_spec: str = "1",
    signal_seed: int | None = None,
    extra: dict | None = None,
    multi_hot_sizes: tuple[int, ...] | None = None,
) -> PlantedSignal:
    """Write a complete dataset (with ``_SUCCESS``) at ``path``; returns the planted signal.

    ``signal_seed``: draw the signal from it, independently of ``seed`` (which then draws the
    rows only) and of the table sizes: the days of one stream whose tables grow. ``extra``:
    more dataset.json keys (a dictionaries fingerprint, as convert records it).
    ``multi_hot_sizes``: k ids per row for each column, materialized from the one-hot ids as
    the converters do (dlrm_contracts.multi_hot, seed 0, uniform; [rows, k] row-major,
    recorded in dataset.json); a row's first id is its one-hot id, which carries the signal.
    """
    path = Path(path)
    assert len(table_sizes) == NUM_CATEGORICAL
    signal = planted_signal(
        table_sizes, seed if signal_seed is None else signal_seed, strength, stable=signal_seed is not None
    )
    multi_hot = (
        Materializer(MultiHotSpec(table_sizes, tuple(multi_hot_sizes)))
        if multi_hot_sizes is not None and any(k > 1 for k in multi_hot_sizes)
        else None
    )
    for split in SPLITS:
        n = rows.get(split, 0)
        split_rng = np.random.default_rng([seed, SPLITS.index(split) + 1])
        numerical = split_rng.normal(0.0, 1.0, (n, NUM_INTEGER)).astype(np.float16)
        cats = [_ids(split_rng, size, n) for size in table_sizes]
        p = 1.0 / (1.0 + np.exp(-signal.logit(numerical.astype(np.float32), cats)))
        label = (split_rng.random(n) < p).astype(np.uint8)
        if multi_hot is not None:
            cats = [rows[:, 0] if k == 1 else rows for rows, k in zip(multi_hot(cats), multi_hot.spec.sizes)]
        write_split(path / split, label, numerical, cats, table_sizes)
    # recorded as convert records them, so the dataset can be derived from (rethreshold)
    checksums = {
        file_key(split, f.name): file_checksum(f)
        for split in SPLITS
        for f in sorted((path / split).iterdir())
    }
    if multi_hot is not None:
        extra = {
            **(extra or {}),
            **multi_hot_extra(multi_hot.spec.sizes, multi_hot.spec.seed, multi_hot.spec.distribution),
        }
    info = describe(
        path,
        {s: rows.get(s, 0) for s in SPLITS},
        list(table_sizes),
        threshold_spec,
        f"synthetic-planted-seed{seed}",
        {**(extra or {}), CHECKSUMS_KEY: checksums},
    )
    write_json(path / DATASET_JSON, info.to_json())
    write_json(path / MODEL_SIZE_JSON, dict(zip(CAT_COLUMNS, table_sizes)))
    (path / SUCCESS).write_text("")
    return signal
