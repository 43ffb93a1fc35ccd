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
    interaction: str = "dot"  # "dot" or "dcn" (train.interaction)
    dcn_layers: int = 0  # low-rank cross layers (dcn only)
    dcn_rank: int = 0  # their rank (dcn only)

    def meta(self) -> dict:
        """The dims as checkpoints record them. ``wide`` and the DCN's shape appear only when
        on, so a dot model without the term keeps the meta of the models saved before those
        settings existed (and a DCN checkpoint is never restored into a dot model, nor the
        reverse: the dims differ)."""
        out = {
            "embedding_dim": self.embedding_dim,
            "bottom_mlp": list(self.bottom_mlp),
            "top_mlp": list(self.top_mlp),
        }
        if self.wide:
            out["wide"] = True
        if self.interaction != "dot":
            out.update(interaction=self.interaction, dcn_layers=self.dcn_layers, dcn_rank=self.dcn_rank)
        return out

    @classmethod
    def from_meta(cls, meta: dict) -> "ModelDims":
        return cls(
            int(meta["embedding_dim"]),
            tuple(meta["bottom_mlp"]),
            tuple(meta["top_mlp"]),
            bool(meta.get("wide", False)),
            str(meta.get("interaction", "dot")),
            int(meta.get("dcn_layers", 0)),
            int(meta.get("dcn_rank", 0)),
        )

    def top_input(self, features: int) -> int:
        """Width of the top MLP's input for ``features`` vectors of the embedding dim (the
        bottom MLP's output first): the dot interaction's bottom output + pairwise dots, or
        the cross layers' output, as wide as their input (the concatenation)."""
        if self.interaction == "dcn":
            return features * self.embedding_dim
        return self.embedding_dim + features * (features - 1) // 2


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
    if config.interaction == "dcn":
        return ModelDims(dim, bottom, top, config.wide, "dcn", config.dcn_layers, config.dcn_rank)
    return ModelDims(dim, bottom, top, config.wide)


def dense_parameters(
    dims: ModelDims, num_numerical: int = NUM_NUMERICAL, num_tables: int = NUM_CATEGORICAL
) -> int:
    """Weights and biases of the two MLPs and of the cross layers (the dot interaction has
    none; each cross layer has two low-rank kernels and a bias over the concatenation)."""
    features = num_tables + 1
    widths = [num_numerical, *dims.bottom_mlp]
    top_in = dims.top_input(features)
    widths_top = [top_in, *dims.top_mlp]
    count = 0
    for layer in (widths, widths_top):
        count += sum(a * b + b for a, b in zip(layer[:-1], layer[1:]))
    if dims.interaction == "dcn":
        count += dims.dcn_layers * (2 * top_in * dims.dcn_rank + top_in)
    return count
