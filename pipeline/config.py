"""Every setting of the product, typed, in one place.

A run's configuration is a :class:`PipelineConfig`: defaults here, then a YAML file
(``--config FILE``, same section and key names as below), then command-line flags. Each wing
(spark_jobs, converters, trainer, the generator) takes its own section, so no module keeps
constants of its own. ``config_to_dict`` gives the plain form written into manifests.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

STAGES: tuple[str, ...] = ("generate", "preprocess", "convert", "train", "eval")


@dataclass
class GeneratorConfig:
    """Synthetic Criteo-format data (the embedded default input and the benchmark input)."""

    days: int = 4
    rows_per_day: int = 50_000
    seed: int = 20240601
    # Per-column cardinalities are the Criteo Terabyte ones multiplied by this factor
    # (clamped to at least the small columns' true sizes and to a sane ceiling).
    cardinality_scale: float = 0.0005
    zipf_exponent: float = 1.1
    click_rate: float = 0.03
    gzip: bool = False
    workers: int = 2


@dataclass
class SparkConfig:
    """How the Spark session is made: local by default, any cluster with ``master``."""

    master: str = "local[2]"
    driver_memory: str = "12g"
    executor_memory: str | None = None
    app_name: str = "criteo-dlrm-preprocess"
    conf: dict[str, str] = field(default_factory=dict)
    conf_file: str | None = None
    gpu: bool = False
    local_dir: str | None = None


@dataclass
class PreprocessConfig:
    """Counting, dictionaries and the transform to parquet."""

    frequency_threshold: str = "2"
    shuffle_seed: int = 12345
    max_reject_rate: float = 0.01
    # Output parquet files per split; 0 means 'as many as Spark chooses'.
    output_files: int = 0


@dataclass
class ConvertConfig:
    """Parquet → split binary dataset, and the no-Spark threshold raise."""

    workers: int = 2
    batch_rows: int = 131_072
    progress: bool = True


@dataclass
class TrainConfig:
    """The DLRM and its training loop."""

    preset: str = "small"  # "default" = the seed's dimensions; "small" suits a 2-core CPU
    embedding_dim: int | None = None
    bottom_mlp: list[int] | None = None
    top_mlp: list[int] | None = None
    batch_size: int = 4096
    epochs: int = 1
    max_steps: int | None = None
    optimizer: str = "sgd"
    learning_rate: float = 0.5
    warmup_steps: int = 100
    decay_start_step: int | None = None
    decay_steps: int | None = None
    evals_per_epoch: int = 1
    amp: bool = False
    xla: bool = False
    bottom_mlp_data_parallel: bool = True
    seed: int = 12345
    checkpoint_every: int = 0


@dataclass
class LaunchConfig:
    """How the trainer is started: one process, or horovodrun over ranks and hosts."""

    np: int = 2
    hosts: str | None = None


@dataclass
class PipelineConfig:
    input: str | None = None
    workdir: str = "workdir"
    stages: list[str] = field(default_factory=lambda: list(STAGES))
    force: bool = False
    generator: GeneratorConfig = field(default_factory=GeneratorConfig)
    spark: SparkConfig = field(default_factory=SparkConfig)
    preprocess: PreprocessConfig = field(default_factory=PreprocessConfig)
    convert: ConvertConfig = field(default_factory=ConvertConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    launch: LaunchConfig = field(default_factory=LaunchConfig)


class ConfigError(ValueError):
    """A configuration file or override that does not fit the schema above."""


def _build(cls: type, data: dict[str, Any], where: str) -> Any:
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping, got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(f"{where}: unknown setting(s) {', '.join(unknown)}; "
                          f"known: {', '.join(sorted(fields))}")
    kwargs = {}
    for name, value in data.items():
        default = getattr(cls(), name)
        if dataclasses.is_dataclass(default):
            kwargs[name] = _build(type(default), value or {}, f"{where}.{name}")
        else:
            kwargs[name] = value
    return cls(**kwargs)


def config_from_dict(data: dict[str, Any]) -> PipelineConfig:
    return _build(PipelineConfig, data or {}, "config")


def load_config(path: str | Path | None) -> PipelineConfig:
    """Defaults, updated by the YAML file at ``path`` when given."""
    if path is None:
        return PipelineConfig()
    import yaml

    with open(path, encoding="utf-8") as fh:
        return config_from_dict(yaml.safe_load(fh) or {})


def config_to_dict(config: Any) -> dict[str, Any]:
    return dataclasses.asdict(config)
