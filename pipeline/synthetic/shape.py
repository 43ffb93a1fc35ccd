"""What the synthetic columns look like: cardinalities, missing rates, value frequencies.

The numbers here describe *Criteo*, not a user setting, so they are data of this module and
the knobs that scale them (``cardinality_scale``, ``zipf_exponent``, ...) live in
``dlrm_contracts.config.GeneratorConfig``. Sources: the per-column unique counts of the Terabyte
logs (``criteo_terabyte_facts.md``) and the per-column missing rates and integer ranges of
real rows (the shared 200-row sample; the same layout as the Kaggle and Terabyte logs).

Values are sampled by *rank*: rank 1 is a column's most frequent value, rank ``k`` the k-th;
rank 0 stands for "missing". Ranks follow a bounded continuous Zipf (Pareto) law sampled by
inverse CDF, so no per-value table is ever stored and a column of 300 million values costs
the same as one of 3.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dlrm_contracts.config import GeneratorConfig
from dlrm_contracts.schema import CAT_COLUMNS, INT_COLUMNS

# Unique values per categorical column over all 24 Terabyte days (C1 .. C26).
TERABYTE_CARDINALITIES: tuple[int, ...] = (
    227605432,
    39060,
    17295,
    7424,
    20265,
    3,
    7122,
    1543,
    63,
    130229467,
    3067956,
    405282,
    10,
    2209,
    11938,
    155,
    4,
    976,
    14,
    292775614,
    40790948,
    187188510,
    590152,
    12973,
    108,
    36,
)

# Share of rows where the categorical column is empty (C1 .. C26). A few columns are rarely
# missing (~3%), one group is missing together about 44% of the time, C22 mostly missing:
# the pattern of the real logs.
CATEGORICAL_MISSING_RATES: tuple[float, ...] = (
    0.0,
    0.0,
    0.034,
    0.034,
    0.0,
    0.12,
    0.0,
    0.0,
    0.0,
    0.0,
    0.0,
    0.034,
    0.0,
    0.0,
    0.0,
    0.034,
    0.0,
    0.0,
    0.44,
    0.44,
    0.034,
    0.76,
    0.0,
    0.034,
    0.44,
    0.44,
)


# Columns that are empty on the same rows in the real logs (their missing indicators are
# perfectly correlated in real rows); each group's columns share one missing rate.
MISSING_TOGETHER: tuple[tuple[str, ...], ...] = (("I1", "I10"), ("I4", "I13"), ("C19", "C20", "C25", "C26"))


@dataclass(frozen=True)
class IntegerShape:
    """One integer column: missing, else negative (-1/-2/-3), zero, or a log-normal count.

    The positive part is ``max(1, round(exp(N(log(median), log_sd))))``: counts in the real
    logs are heavy tailed (I5 spans 0 .. hundreds of thousands), which a log-normal mimics.
    """

    missing: float
    zero: float  # share of present values that are 0
    median: float  # of the positive part
    log_sd: float
    negative: tuple[float, float, float] = (0.0, 0.0, 0.0)  # shares of -1, -2, -3


# I1 .. I13, estimated from real rows (missing share, zeros, median and spread of log x).
INTEGER_SHAPES: tuple[IntegerShape, ...] = (
    IntegerShape(missing=0.45, zero=0.36, median=3, log_sd=1.3),
    IntegerShape(missing=0.0, zero=0.17, median=21, log_sd=2.2, negative=(0.09, 0.004, 0.001)),
    IntegerShape(missing=0.21, zero=0.01, median=7, log_sd=1.4),
    IntegerShape(missing=0.22, zero=0.03, median=5.5, log_sd=1.1),
    IntegerShape(missing=0.03, zero=0.02, median=2766, log_sd=3.1),
    IntegerShape(missing=0.22, zero=0.07, median=28, log_sd=1.6),
    IntegerShape(missing=0.04, zero=0.24, median=6, log_sd=1.5),
    IntegerShape(missing=0.005, zero=0.15, median=9, log_sd=1.1),
    IntegerShape(missing=0.04, zero=0.02, median=42, log_sd=1.6),
    IntegerShape(missing=0.45, zero=0.36, median=1, log_sd=0.3),
    IntegerShape(missing=0.04, zero=0.24, median=2, log_sd=1.0),
    IntegerShape(missing=0.77, zero=0.82, median=1, log_sd=0.6),
    IntegerShape(missing=0.22, zero=0.05, median=5, log_sd=1.15),
)

# Integers above this are clipped: far beyond anything in the logs, and safe for int32 readers.
INTEGER_CEILING = 1_000_000_000
# Ranks are hashed bijectively into 32-bit values; capping them at 2**31 - 1 also keeps every
# rank (and any id a consumer derives from it) within int32.
MAX_CARDINALITY = 2**31 - 1
# Between the floor and the linear scale, sizes are compressed as floor · (true/floor)^this:
# monotone, so the columns keep the Terabyte logs' order of sizes.
MID_SIZE_EXPONENT = 0.25


def scaled_cardinality(true_size: int, scale: float, floor: int) -> int:
    """A column's vocabulary size at ``scale``.

    Columns up to ``floor`` values keep their true size (C6 = 3 stays 3). Big tables shrink
    by the factor (C20: 293M → 586k at 0.002). In between, where the linear scale would
    squash a 39k column to 78 values, the size is ``floor · (true/floor)^¼`` (39k → ~2.5k),
    whichever of the two is larger. Never above the true size (for scale ≤ 1) nor
    ``MAX_CARDINALITY``.
    """
    linear = true_size * scale
    if true_size <= floor:
        compressed = float(true_size)
    else:
        compressed = floor * (true_size / floor) ** MID_SIZE_EXPONENT
    size = max(int(round(max(linear, compressed))), 1)
    if scale <= 1:
        size = min(size, true_size)
    return min(size, MAX_CARDINALITY)


@dataclass(frozen=True)
class ColumnShapes:
    """Everything the sampler needs about the 39 feature columns for one configuration."""

    cardinalities: tuple[int, ...]
    categorical_missing: tuple[float, ...]
    integers: tuple[IntegerShape, ...]
    zipf_exponent: float
    uniform: tuple[bool, ...] = (False,) * len(CAT_COLUMNS)  # drawn uniformly, not by Zipf
    drift: tuple[float, ...] = (0.0,) * len(CAT_COLUMNS)  # popularity moved per day (fraction)

    @classmethod
    def from_config(cls, config: GeneratorConfig) -> "ColumnShapes":
        sizes = tuple(
            config.uniform_columns.get(c)
            or scaled_cardinality(t, config.cardinality_scale, config.cardinality_floor)
            for c, t in zip(CAT_COLUMNS, TERABYTE_CARDINALITIES)
        )
        uniform = tuple(c in config.uniform_columns for c in CAT_COLUMNS)
        drift = tuple(float(config.drift_columns.get(c, 0.0)) for c in CAT_COLUMNS)
        return cls(sizes, CATEGORICAL_MISSING_RATES, INTEGER_SHAPES, config.zipf_exponent, uniform, drift)

    def describe(self) -> dict:
        """The plain form written into generator_meta.json."""
        described = {
            "cardinalities": dict(zip(CAT_COLUMNS, self.cardinalities)),
            "categorical_missing_rates": dict(zip(CAT_COLUMNS, self.categorical_missing)),
            "integer_shapes": {
                name: {
                    "missing": s.missing,
                    "zero": s.zero,
                    "median": s.median,
                    "log_sd": s.log_sd,
                    "negative_-1_-2_-3": list(s.negative),
                }
                for name, s in zip(INT_COLUMNS, self.integers)
            },
            "missing_together": [list(group) for group in MISSING_TOGETHER],
            "zipf_exponent": self.zipf_exponent,
            "uniform_columns": [c for c, u in zip(CAT_COLUMNS, self.uniform) if u],
        }
        if any(self.drift):  # only then: a drift-free workdir's record is unchanged
            described["drift_columns"] = {c: d for c, d in zip(CAT_COLUMNS, self.drift) if d}
        return described


def zipf_ranks(u: np.ndarray, size: int, exponent: float) -> np.ndarray:
    """Map uniforms in [0, 1) to ranks 1..size with P(rank = k) ∝ ∫_k^{k+1} x^-exponent dx.

    A bounded continuous Zipf law floored to integers: closed-form inverse CDF, so sampling
    is a few vector operations and needs no table of the vocabulary.
    """
    if size <= 1:
        return np.ones(u.shape, dtype=np.int64)
    a = 1.0 - exponent
    top = float(size + 1)
    if abs(a) < 1e-9:
        x = np.exp(u * np.log(top))
    else:
        # x = (1 - u (1 - top^a))^(1/a), written with log1p/expm1 for accuracy near a = 0.
        x = np.exp(np.log1p(u * np.expm1(a * np.log(top))) / a)
    return np.clip(x.astype(np.int64), 1, size)


def sample_categorical_ranks(
    rng: np.random.Generator, rows: int, size: int, exponent: float, uniform: bool = False
) -> np.ndarray:
    """Ranks 1..size of one categorical column for ``rows`` rows (missing applied later)."""
    u = rng.random(rows)
    if uniform:
        return np.minimum((u * size).astype(np.int64), size - 1) + 1
    return zipf_ranks(u, size, exponent)


def sample_integers(rng: np.random.Generator, rows: int, shape: IntegerShape) -> np.ndarray:
    """Values of one integer column (missing applied later)."""
    positive = np.rint(np.exp(np.log(shape.median) + shape.log_sd * rng.standard_normal(rows)))
    values = np.clip(positive, 1, INTEGER_CEILING).astype(np.int64)
    u = rng.random(rows)
    edge = 0.0
    for k, share in enumerate(shape.negative, start=1):  # -1, -2, -3
        if share > 0:
            values[(u >= edge) & (u < edge + share)] = -k
        edge += share
    values[(u >= edge) & (u < edge + shape.zero)] = 0
    return values


def sample_missing(rng: np.random.Generator, rows: int, shapes: "ColumnShapes") -> np.ndarray:
    """(39, rows) bool in I1..I13, C1..C26 order: which fields are empty.

    Columns of a MISSING_TOGETHER group share one draw, so they are empty on the same rows.
    """
    rates = [s.missing for s in shapes.integers] + list(shapes.categorical_missing)
    names = list(INT_COLUMNS) + list(CAT_COLUMNS)
    group_of = {name: g for g, group in enumerate(MISSING_TOGETHER) for name in group}
    shared: dict[int, np.ndarray] = {}
    missing = np.zeros((len(names), rows), bool)
    for i, (name, rate) in enumerate(zip(names, rates)):
        if rate <= 0:
            continue
        if name in group_of:
            g = group_of[name]
            if g not in shared:
                shared[g] = rng.random(rows)
            draw = shared[g]
        else:
            draw = rng.random(rows)
        missing[i] = draw < rate
    return missing


@dataclass
class Features:
    """The 39 feature columns of a block of rows, as sampled (before formatting)."""

    int_values: np.ndarray  # (13, rows) int64
    int_missing: np.ndarray  # (13, rows) bool
    cat_ranks: np.ndarray  # (26, rows) int64, 0 = missing

    @property
    def rows(self) -> int:
        return self.cat_ranks.shape[1]


def drift_ranks(cat_ranks: np.ndarray, shapes: ColumnShapes, day: int) -> None:
    """Day ``day``'s drift, in place: a drifting column's popularity rank r (1 = the most
    frequent) stands for value r + shift, the shift growing by the column's rate times its
    size each day (wrapping around). The model sees the value, so each value keeps its effect
    on the label while the frequent values change."""
    for j, (rate, size) in enumerate(zip(shapes.drift, shapes.cardinalities)):
        shift = int(round(day * rate * size)) % size
        if shift:
            present = cat_ranks[j] > 0
            cat_ranks[j, present] = (cat_ranks[j, present] - 1 + shift) % size + 1


def sample_features(rng: np.random.Generator, rows: int, shapes: ColumnShapes) -> Features:
    """Draw ``rows`` rows of all columns (integers, categoricals, then missing fields)."""
    int_values = np.stack([sample_integers(rng, rows, shape) for shape in shapes.integers])
    cat_ranks = np.stack(
        [
            sample_categorical_ranks(rng, rows, size, shapes.zipf_exponent, uniform)
            for size, uniform in zip(shapes.cardinalities, shapes.uniform)
        ]
    )
    missing = sample_missing(rng, rows, shapes)
    int_missing = missing[: len(shapes.integers)]
    cat_ranks[missing[len(shapes.integers) :]] = 0
    return Features(int_values, int_missing, cat_ranks)
