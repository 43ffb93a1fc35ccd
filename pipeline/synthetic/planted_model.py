"""The planted click model: the true click probability of every synthetic row.

logit = intercept
      + Σ_c  a_c · w_c(rank_c) · decay(rank_c)                 (26 categorical main effects)
      + Σ_j  b_j · tanh((log(x_j + 3) - centre_j) / sd_j)      (13 integer effects; own weight
                                                                  when missing)
      + Σ_p  a_p · w_p(rank_c1, rank_c2) · decay(rank_c1) · decay(rank_c2)   (a few pairs)

``w`` are standard normals drawn by hashing (seed, column, rank), so no table of millions of
weights is ever stored. ``decay(r) = (1 + (r - 1) / DECAY_RANK) ** -0.5`` makes frequent
values carry most of the signal: a model that sees a value a few hundred times can learn
its weight, a value seen once carries little that could not be learnt anyway. The
intercept is solved so that the mean click probability equals ``click_rate``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.config import GeneratorConfig
from pipeline.schema import CAT_COLUMNS
from pipeline.synthetic import hashing
from pipeline.synthetic.shape import ColumnShapes, Features, sample_features

# Ranks up to about this carry (nearly) full weight; beyond, weights shrink as rank^-1/2.
DECAY_RANK = 50.0
# Main-effect scale of a categorical column is CATEGORICAL_SCALE · (0.5 + U[0, 1)).
CATEGORICAL_SCALE = 0.24
# Integer effect sizes are ±INTEGER_SCALE · (0.5 + U[0, 1)).
INTEGER_SCALE = 0.2
# Pairwise interactions (0-based categorical indices): small and mid-sized columns, so a
# DLRM's dot-product interactions can learn them from a few hundred thousand rows.
INTERACTION_PAIRS: tuple[tuple[int, int], ...] = ((5, 8), (12, 16), (18, 24), (15, 25), (7, 17))
INTERACTION_SCALE = 0.35
# Main effects of ranks 0..HEAD_RANKS are tabulated once (the same formula, evaluated ahead):
# with Zipf frequencies most rows fall in the head, so most lookups skip the hash.
HEAD_RANKS = 4096
# Rows of the seeded sample on which the intercept is calibrated.
CALIBRATION_ROWS = 1 << 17

_PURPOSE_CATEGORICAL, _PURPOSE_INTEGER, _PURPOSE_PAIR, _PURPOSE_CALIBRATE = 1, 2, 3, 4


def decay(ranks: np.ndarray) -> np.ndarray:
    """Weight multiplier by rank; missing (rank 0) counts as a frequent value."""
    return 1.0 / np.sqrt(1.0 + np.maximum(ranks - 1, 0) / DECAY_RANK)


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


@dataclass(frozen=True)
class IntegerEffect:
    coefficient: float
    centre: float
    scale: float
    missing_weight: float


@dataclass(frozen=True)
class PlantedModel:
    seed: int
    categorical_salts: tuple[int, ...]
    categorical_amplitudes: tuple[float, ...]
    integer_effects: tuple[IntegerEffect, ...]
    pair_salts: tuple[int, ...]
    pair_amplitudes: tuple[float, ...]
    intercept: float
    head_effects: tuple[np.ndarray, ...] = ()  # per column: main effect of ranks 0..HEAD_RANKS

    @classmethod
    def build(cls, config: GeneratorConfig, shapes: ColumnShapes) -> "PlantedModel":
        """Draw the model from the seed, then calibrate its intercept to the click rate."""
        if not 0.0 < config.click_rate < 1.0:
            raise ValueError(f"click_rate must be in (0, 1), got {config.click_rate}")
        seed, strength = config.seed, config.signal_strength
        cat_salts = tuple(hashing.salt(seed, _PURPOSE_CATEGORICAL, c)
                          for c in range(len(shapes.cardinalities)))
        cat_amps = tuple(strength * CATEGORICAL_SCALE * (0.5 + hashing.hash_uniform(1, s))
                         for s in cat_salts)
        int_effects = []
        for j, shape in enumerate(shapes.integers):
            s = hashing.salt(seed, _PURPOSE_INTEGER, j)
            sign = 1.0 if hashing.hash_uniform(1, s) < 0.5 else -1.0
            int_effects.append(IntegerEffect(
                coefficient=strength * sign * INTEGER_SCALE * (0.5 + hashing.hash_uniform(2, s)),
                centre=float(np.log(shape.median + 3.0)),
                scale=max(shape.log_sd, 0.5),
                missing_weight=strength * INTEGER_SCALE * (2 * hashing.hash_uniform(3, s) - 1)))
        pair_salts = tuple(hashing.salt(seed, _PURPOSE_PAIR, p) for p in range(len(INTERACTION_PAIRS)))
        pair_amps = tuple(strength * INTERACTION_SCALE * (0.5 + hashing.hash_uniform(1, s))
                          for s in pair_salts)
        heads = tuple(_hashed_main_effect(np.arange(min(size, HEAD_RANKS) + 1), salt, amp)
                      for size, salt, amp in zip(shapes.cardinalities, cat_salts, cat_amps))
        parts = (seed, cat_salts, cat_amps, tuple(int_effects), pair_salts, pair_amps)
        model = cls(*parts, intercept=0.0, head_effects=heads)
        rng = np.random.default_rng(
            np.random.SeedSequence(seed, spawn_key=(_PURPOSE_CALIBRATE,)))
        sample = sample_features(rng, CALIBRATION_ROWS, shapes)
        intercept = solve_intercept(model.logits(sample), config.click_rate)
        return cls(*parts, intercept=intercept, head_effects=heads)

    def main_effect(self, column: int, ranks: np.ndarray) -> np.ndarray:
        """a_c · w_c(rank) · decay(rank): from the head table, hashing only the tail."""
        head = self.head_effects[column]
        effect = head[np.minimum(ranks, head.size - 1)]
        tail = ranks >= head.size
        if tail.any():
            effect[tail] = _hashed_main_effect(ranks[tail], self.categorical_salts[column],
                                               self.categorical_amplitudes[column])
        return effect

    def logits(self, features: Features) -> np.ndarray:
        """The true logit of every row (float64)."""
        out = np.full(features.rows, self.intercept)
        for c in range(len(self.categorical_salts)):
            out += self.main_effect(c, features.cat_ranks[c])
        for j, effect in enumerate(self.integer_effects):
            x = features.int_values[j]
            t = np.where(x > -3, np.log(np.maximum(x, -2) + 3.0), 0.0)
            term = effect.coefficient * np.tanh((t - effect.centre) / effect.scale)
            out += np.where(features.int_missing[j], effect.missing_weight, term)
        for (c1, c2), salt, amp in zip(INTERACTION_PAIRS, self.pair_salts, self.pair_amplitudes):
            keys = (features.cat_ranks[c1].astype(np.uint64) << np.uint64(32)) | \
                features.cat_ranks[c2].astype(np.uint64)
            both = decay(features.cat_ranks[c1]) * decay(features.cat_ranks[c2])
            out += amp * hashing.hash_normal(keys, salt) * both
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
                for (a, b), amp in zip(INTERACTION_PAIRS, self.pair_amplitudes)],
        }


def _hashed_main_effect(ranks: np.ndarray, salt: int, amplitude: float) -> np.ndarray:
    return amplitude * hashing.hash_normal(ranks, salt) * decay(ranks)


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
