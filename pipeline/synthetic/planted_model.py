"""The planted click model: the true click probability of every synthetic row.

logit = intercept
      + Σ_c  a_c · w_c(rank_c) · decay(rank_c)                 (26 categorical main effects)
      + Σ_j  b_j · tanh((log(x_j + 3) - centre_j) / sd_j)      (13 integer effects; own weight
                                                                  when missing)
      + Σ_p  a_p · w_p(rank_c1, rank_c2) · decay(rank_c1) · decay(rank_c2)   (a few pairs)

``w`` are standard normals drawn by hashing (seed, column, rank), so no table of millions of
weights is ever stored. ``decay(r) = 1 / (1 + (r - 1) / DECAY_RANK)`` makes frequent values
carry most of the signal: a model that sees a value a few hundred times can learn its
weight, while a value seen a handful of times (with 3% clicks, no click at all) carries
little that could not be learnt anyway. The
intercept is solved so that the mean click probability equals ``click_rate``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dlrm_contracts.config import GeneratorConfig
from dlrm_contracts.schema import CAT_COLUMNS
from pipeline.synthetic import hashing
from pipeline.synthetic.shape import ColumnShapes, Features, sample_features

# Ranks up to about this carry (nearly) full weight; beyond, weights shrink as 1/rank.
DECAY_RANK = 10.0
# Root mean square, over the columns, of each column's contribution to the logit (its
# standard deviation over rows); the columns' relative sizes are drawn from the seed.
CATEGORICAL_SCALE = 0.2
INTEGER_SCALE = 0.14
# Pairwise interactions (0-based categorical indices): small and mid-sized columns, so a
# DLRM's dot-product interactions can learn them from a few hundred thousand rows.
INTERACTION_PAIRS: tuple[tuple[int, int], ...] = ((5, 8), (12, 16), (18, 24), (15, 25), (7, 17))
INTERACTION_SCALE = 0.3  # the same for the interaction pairs
# Main effects of ranks 0..HEAD_RANKS are tabulated once (the same formula, evaluated ahead):
# with Zipf frequencies most rows fall in the head, so most lookups skip the hash.
HEAD_RANKS = 4096
# Rows of the seeded sample on which the intercept is calibrated.
CALIBRATION_ROWS = 1 << 17

_PURPOSE_CATEGORICAL, _PURPOSE_INTEGER, _PURPOSE_PAIR, _PURPOSE_CALIBRATE = 1, 2, 3, 4
_PURPOSE_SPREAD = 7  # (5 and 6 are the value salts and chunk streams of source.py)


def decay(ranks: np.ndarray) -> np.ndarray:
    """Weight multiplier by rank; missing (rank 0) counts as a frequent value."""
    return 1.0 / (1.0 + np.maximum(ranks - 1, 0) / DECAY_RANK)


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


@dataclass(frozen=True)
class IntegerEffect:
    coefficient: float
    centre: float
    scale: float
    missing_weight: float

    def term(self, values: np.ndarray, missing: np.ndarray) -> np.ndarray:
        t = np.where(values > -3, np.log(np.maximum(values, -2) + 3.0), 0.0)
        return np.where(
            missing, self.missing_weight, self.coefficient * np.tanh((t - self.centre) / self.scale)
        )

    def scaled(self, factor: float) -> "IntegerEffect":
        return IntegerEffect(self.coefficient * factor, self.centre, self.scale, self.missing_weight * factor)


@dataclass(frozen=True)
class PlantedModel:
    seed: int
    categorical_salts: tuple[int, ...]
    categorical_amplitudes: tuple[float, ...]
    integer_effects: tuple[IntegerEffect, ...]
    pair_salts: tuple[int, ...]
    pair_amplitudes: tuple[float, ...]
    intercept: float = 0.0
    head_effects: tuple[np.ndarray, ...] = ()  # per column: main effect of ranks 0..HEAD_RANKS

    @classmethod
    def build(cls, config: GeneratorConfig, shapes: ColumnShapes) -> "PlantedModel":
        """Draw the model from the seed, give every term its target spread, then calibrate
        the intercept to the click rate.

        Each term gets a target standard deviation over rows (see :func:`_spreads`) and is
        scaled to it on a seeded calibration sample. So the logit's spread, hence the Bayes
        AUC, is nearly the same for every seed: otherwise a 3-value column's luck of the
        draw would move it by several points.
        """
        seed = config.seed
        cat_salts = tuple(
            hashing.salt(seed, _PURPOSE_CATEGORICAL, c) for c in range(len(shapes.cardinalities))
        )
        pair_salts = tuple(hashing.salt(seed, _PURPOSE_PAIR, p) for p in range(len(INTERACTION_PAIRS)))
        int_salts = tuple(hashing.salt(seed, _PURPOSE_INTEGER, j) for j in range(len(shapes.integers)))
        unit_ints = tuple(
            IntegerEffect(
                coefficient=1.0 if hashing.hash_uniform(1, s) < 0.5 else -1.0,
                centre=float(np.log(shape.median + 3.0)),
                scale=max(shape.log_sd, 0.5),
                missing_weight=2 * hashing.hash_uniform(3, s) - 1,
            )
            for shape, s in zip(shapes.integers, int_salts)
        )
        rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(_PURPOSE_CALIBRATE,)))
        sample = sample_features(rng, CALIBRATION_ROWS, shapes)

        strength = config.signal_strength
        cat_targets = _spreads(CATEGORICAL_SCALE * strength, cat_salts)
        int_targets = _spreads(INTEGER_SCALE * strength, int_salts)
        pair_targets = _spreads(INTERACTION_SCALE * strength, pair_salts)
        unit = cls(seed, cat_salts, (1.0,) * len(cat_salts), unit_ints, pair_salts, (1.0,) * len(pair_salts))
        cat_amps = tuple(
            _normalise(t, unit.main_effect(c, sample.cat_ranks[c])) for c, t in enumerate(cat_targets)
        )
        int_effects = tuple(
            e.scaled(_normalise(t, e.term(sample.int_values[j], sample.int_missing[j])))
            for j, (e, t) in enumerate(zip(unit_ints, int_targets))
        )
        pair_amps = tuple(
            _normalise(t, unit.pair_effect(p, sample.cat_ranks)) for p, t in enumerate(pair_targets)
        )
        heads = tuple(
            hashed_main_effect(np.arange(min(size, HEAD_RANKS) + 1), salt, amp)
            for size, salt, amp in zip(shapes.cardinalities, cat_salts, cat_amps)
        )
        parts = (seed, cat_salts, cat_amps, int_effects, pair_salts, pair_amps)
        model = cls(*parts, head_effects=heads)
        intercept = solve_intercept(model.logits(sample), config.click_rate)
        return cls(*parts, intercept=intercept, head_effects=heads)

    def main_effect(self, column: int, ranks: np.ndarray) -> np.ndarray:
        """a_c · w_c(rank) · decay(rank): from the head table, hashing only the tail."""
        salt, amp = self.categorical_salts[column], self.categorical_amplitudes[column]
        if not self.head_effects:
            return hashed_main_effect(ranks, salt, amp)
        head = self.head_effects[column]
        effect = head[np.minimum(ranks, head.size - 1)]
        tail = ranks >= head.size
        if tail.any():
            effect[tail] = hashed_main_effect(ranks[tail], salt, amp)
        return effect

    def pair_effect(self, pair: int, cat_ranks: np.ndarray) -> np.ndarray:
        """a_p · w_p(r1, r2) · decay(r1) · decay(r2) for one interaction pair."""
        c1, c2 = INTERACTION_PAIRS[pair]
        weights = hashing.hash_normal(_pair_keys(cat_ranks, pair), self.pair_salts[pair])
        return self.pair_amplitudes[pair] * weights * decay(cat_ranks[c1]) * decay(cat_ranks[c2])

    def logits(self, features: Features) -> np.ndarray:
        """The true logit of every row (float64)."""
        out = np.full(features.rows, self.intercept)
        for c in range(len(self.categorical_salts)):
            out += self.main_effect(c, features.cat_ranks[c])
        for j, effect in enumerate(self.integer_effects):
            out += effect.term(features.int_values[j], features.int_missing[j])
        for p in range(len(self.pair_salts)):
            out += self.pair_effect(p, features.cat_ranks)
        return out

    def probabilities(self, features: Features) -> np.ndarray:
        return sigmoid(self.logits(features))

    def describe(self) -> dict:
        """The plain form written into generator_meta.json."""
        return {
            "intercept": self.intercept,
            "decay_rank": DECAY_RANK,
            "categorical_amplitudes": dict(zip(CAT_COLUMNS, self.categorical_amplitudes)),
            "integer_effects": [vars(e) for e in self.integer_effects],
            "interaction_pairs": [
                {"columns": [CAT_COLUMNS[a], CAT_COLUMNS[b]], "amplitude": amp}
                for (a, b), amp in zip(INTERACTION_PAIRS, self.pair_amplitudes)
            ],
        }


def hashed_main_effect(ranks: np.ndarray, salt: int, amplitude: float) -> np.ndarray:
    """The planted effect of the values of given ranks: a seeded hash, decaying with the rank."""
    return amplitude * hashing.hash_normal(ranks, salt) * decay(ranks)


def _pair_keys(cat_ranks: np.ndarray, pair: int) -> np.ndarray:
    c1, c2 = INTERACTION_PAIRS[pair]
    return (cat_ranks[c1].astype(np.uint64) << np.uint64(32)) | cat_ranks[c2].astype(np.uint64)


def _spreads(scale: float, salts: tuple[int, ...]) -> list[float]:
    """Target standard deviations of a group of terms: seeded relative sizes
    (0.5 + U[0, 1)), rescaled so their root mean square is exactly ``scale``."""
    # A salt of its own: the term's salt also hashes its per-rank weights.
    raw = np.array([0.5 + hashing.hash_uniform(0, hashing.salt(s, _PURPOSE_SPREAD)) for s in salts])
    return list(scale * raw / np.sqrt(np.mean(raw**2))) if raw.size else []


def _normalise(target_sd: float, unit_term: np.ndarray) -> float:
    """The factor giving ``unit_term`` (a term drawn at amplitude 1) the standard deviation
    ``target_sd``; 0 for a term that does not vary (a one-value column)."""
    sd = float(unit_term.std())
    return target_sd / sd if sd > 1e-12 else 0.0


def solve_intercept(logits_without_intercept: np.ndarray, click_rate: float) -> float:
    """The b with mean(sigmoid(b + z)) == click_rate (bisection; the mean is monotone in b)."""
    lo, hi = -30.0, 30.0
    for _ in range(80):
        mid = 0.5 * (lo + hi)
        if sigmoid(mid + logits_without_intercept).mean() < click_rate:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)
