"""One configured generator: shapes + planted model + value hashes, and how a chunk is made.

A chunk is the unit of work and of randomness: chunk ``i`` of day ``d`` draws from its own
random stream, seeded by (seed, d, i) alone. So chunks can be produced in any order by any
number of processes and the concatenated output is always the same bytes.
"""

from __future__ import annotations

import gzip
from dataclasses import dataclass

import numpy as np

from dlrm_contracts.config import GeneratorConfig
from pipeline.synthetic import hashing
from pipeline.synthetic.bayes_auc import SparseCounts
from pipeline.synthetic.planted_model import PlantedModel, sigmoid
from pipeline.synthetic.render import render_lines
from pipeline.synthetic.shape import ColumnShapes, Features, drift_ranks, sample_features

_PURPOSE_VALUES, _PURPOSE_CHUNK = 5, 6


@dataclass
class Chunk:
    """One generated block of rows, ready to append to its day file."""

    day: int
    index: int
    rows: int
    clicks: int
    payload: bytes  # text lines, or one gzip member when compressing; b"" once in a file
    counts: SparseCounts
    size: int = 0  # bytes of the payload
    part_file: str | None = None  # where a pool worker left the payload

    def spill(self, path: str) -> "Chunk":
        """Move the payload into ``path``: a pool worker hands over a file name instead of
        pickling megabytes through a pipe, and the writer splices the file in kernel-side."""
        with open(path, "wb") as fh:
            fh.write(self.payload)
        self.part_file, self.payload = path, b""
        return self


@dataclass(frozen=True)
class SyntheticSource:
    seed: int
    shapes: ColumnShapes
    model: PlantedModel
    value_salts: tuple[int, ...]  # 32-bit, per categorical column
    chunk_rows: int
    gzip_level: int | None  # None: plain text

    @classmethod
    def from_config(cls, config: GeneratorConfig) -> "SyntheticSource":
        shapes = ColumnShapes.from_config(config)
        model = PlantedModel.build(config, shapes)
        salts = tuple(
            hashing.salt(config.seed, _PURPOSE_VALUES, c) & 0xFFFFFFFF
            for c in range(len(shapes.cardinalities))
        )
        return cls(
            config.seed, shapes, model, salts, config.chunk_rows, config.gzip_level if config.gzip else None
        )

    def chunk_sizes(self, rows_per_day: int) -> list[int]:
        full, rest = divmod(rows_per_day, self.chunk_rows)
        return [self.chunk_rows] * full + ([rest] if rest else [])

    def rng(self, day: int, index: int) -> np.random.Generator:
        return np.random.default_rng(
            np.random.SeedSequence(self.seed, spawn_key=(_PURPOSE_CHUNK, day, index))
        )

    def sample(self, day: int, index: int, rows: int) -> tuple[Features, np.ndarray, np.ndarray]:
        """(features, true logits, labels) of one chunk: the part tests can reproduce."""
        rng = self.rng(day, index)
        features = sample_features(rng, rows, self.shapes)
        drift_ranks(features.cat_ranks, self.shapes, day)
        logits = self.model.logits(features)
        labels = (rng.random(rows) < sigmoid(logits)).astype(np.int8)
        return features, logits, labels

    def hex_values(self, features: Features) -> np.ndarray:
        """(26, rows) uint32: the value each categorical rank is written as."""
        return np.stack(
            [hashing.rank_to_value(ranks, salt) for ranks, salt in zip(features.cat_ranks, self.value_salts)]
        )

    def make_chunk(self, day: int, index: int, rows: int) -> Chunk:
        features, logits, labels = self.sample(day, index, rows)
        payload = render_lines(labels, features, self.hex_values(features))
        if self.gzip_level is not None:
            payload = gzip.compress(payload, compresslevel=self.gzip_level, mtime=0)
        return Chunk(
            day, index, rows, int(labels.sum()), payload, SparseCounts.of(logits, labels), size=len(payload)
        )

    def features_from_fields(
        self, int_values: np.ndarray, int_missing: np.ndarray, cat_values: np.ndarray, cat_missing: np.ndarray
    ) -> Features:
        """Rebuild sampled features from parsed file fields (hex values → ranks).

        ``cat_values`` is (26, rows) uint32, ``int_*`` are (13, rows). Lets anyone recompute
        the planted probability of a written row: ``model.probabilities(features)``.
        """
        ranks = np.stack([hashing.value_to_rank(v, salt) for v, salt in zip(cat_values, self.value_salts)])
        ranks[cat_missing] = 0
        return Features(np.asarray(int_values, np.int64), np.asarray(int_missing, bool), ranks)
