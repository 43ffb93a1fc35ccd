"""The model's dimensions: presets and overrides, without TensorFlow.

Kept apart from :mod:`trainer.model` so that the pipeline's preflight can size the embedding
tables and checkpoints in a process that never imports TensorFlow.
"""

from __future__ import annotations

from dataclasses import dataclass

from dlrm_contracts.binary_format import NUM_NUMERICAL
from dlrm_contracts.config import ConfigError, TrainConfig
from dlrm_contracts.schema import NUM_CATEGORICAL


@dataclass(frozen=True)
class ModelDims:
    embedding_dim: int
    bottom_mlp: tuple[int, ...]
    top_mlp: tuple[int, ...]
    wide: bool = False  # one scalar weight per id of every table, summed into the logit

    def meta(self) -> dict:
        """The dims as checkpoints record them. ``wide`` appears only when on, so a model
        without it keeps the meta of the models saved before the setting existed."""
        out = {"embedding_dim": self.embedding_dim, "bottom_mlp": list(self.bottom_mlp),
               "top_mlp": list(self.top_mlp)}
        if self.wide:
            out["wide"] = True
        return out

    @classmethod
    def from_meta(cls, meta: dict) -> "ModelDims":
        return cls(int(meta["embedding_dim"]), tuple(meta["bottom_mlp"]), tuple(meta["top_mlp"]),
                   bool(meta.get("wide", False)))


PRESETS = {
    "default": ModelDims(128, (512, 256, 128), (1024, 1024, 512, 256, 1)),
    "small": ModelDims(16, (64, 32, 16), (128, 64, 1)),
}


def model_dims(config: TrainConfig) -> ModelDims:
    if config.preset not in PRESETS:
        raise ConfigError(f"unknown model preset {config.preset!r}; known: {sorted(PRESETS)}")
    base = PRESETS[config.preset]
    dim = config.embedding_dim or base.embedding_dim
    bottom = tuple(config.bottom_mlp or base.bottom_mlp)
    if config.embedding_dim and not config.bottom_mlp:
        bottom = bottom[:-1] + (dim,)
    top = tuple(config.top_mlp or base.top_mlp)
    if bottom[-1] != dim:
        raise ConfigError(f"the bottom MLP must end in the embedding dim {dim}, not {bottom[-1]}")
    if top[-1] != 1:
        raise ConfigError(f"the top MLP must end in one logit, not {top[-1]}")
    return ModelDims(dim, bottom, top, config.wide)


def dense_parameters(dims: ModelDims, num_numerical: int = NUM_NUMERICAL,
                     num_tables: int = NUM_CATEGORICAL) -> int:
    """Weights and biases of the two MLPs (the interaction has none)."""
    features = num_tables + 1
    widths = [num_numerical, *dims.bottom_mlp]
    top_in = dims.embedding_dim + features * (features - 1) // 2
    widths_top = [top_in, *dims.top_mlp]
    count = 0
    for layer in (widths, widths_top):
        count += sum(a * b + b for a, b in zip(layer[:-1], layer[1:]))
    return count
