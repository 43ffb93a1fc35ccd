"""The shipped Criteo Terabyte configs (configs/*.yaml): every key known, the reference's values.

The expected values are written out here, from the reference's (NVIDIA DLRM for TensorFlow 2)
defaults, not read from the files: a config drifting from the reference fails.
"""

from __future__ import annotations


import pytest
import yaml

from dlrm_contracts.config import PipelineConfig, load_config
from dlrm_contracts.thresholds import parse_threshold_spec
from pipeline.hosts import horovodrun_hosts
from tests.config_helpers import CONFIGS, MLPERF, unknown_keys

# The reference's one-epoch Terabyte recipe, shared by all three configs.
REFERENCE_TRAIN = {
    "preset": "default",
    "batch_size": 65_536,
    "optimizer": "sgd",
    "learning_rate": 24.0,
    "warmup_steps": 8_000,
    "decay_start_step": 48_000,
    "decay_steps": 24_000,
    "decay_power": 2.0,
    "epochs": 1,
    "amp": True,
    "embedding_dim": None,
    "bottom_mlp": None,
    "top_mlp": None,
    "max_steps": None,
    "learning_rate_scaling": "none",
    "early_stopping_patience": 0,
    "evals_per_epoch": 1,
}
EXPECTED = {
    "criteo_terabyte_1gpu.yaml": {"threshold": "15", "np": 1},
    "criteo_terabyte_8gpu.yaml": {"threshold": "3", "np": 8},
    "criteo_terabyte_cpu_cluster.yaml": {"threshold": "15", "np": 8},
}


def test_every_shipped_config_is_tested():
    # the MLPerf DLRMv2 configs have their own reference: tests/test_mlperf_configs.py
    assert sorted(p.name for p in CONFIGS.glob("criteo_terabyte_*.yaml")) == sorted(EXPECTED)

    assert sorted(p.name for p in CONFIGS.glob("*.yaml")) == sorted([*EXPECTED, *MLPERF])


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_every_key_is_a_setting_the_pipeline_knows(name):
    data = yaml.safe_load((CONFIGS / name).read_text())
    assert unknown_keys(data, PipelineConfig, "config") == []
    load_config(CONFIGS / name)  # also type-checks every value


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_hyperparameters_equal_the_reference(name):
    config = load_config(CONFIGS / name)
    expected = EXPECTED[name]
    assert parse_threshold_spec(config.preprocess.frequency_threshold) == parse_threshold_spec(
        expected["threshold"]
    )
    for key, value in REFERENCE_TRAIN.items():
        assert getattr(config.train, key) == value, key
    assert config.launch.np == expected["np"]
    if config.launch.hosts:
        horovodrun_hosts(config.launch.hosts, config.launch.np)  # a host list that fits np
    # The schedule as the trainer computes it: warm-up to 24, flat, then decay to 0 by 72,000.
    from trainer.optim import learning_rate

    assert learning_rate(0, config.train) == pytest.approx(24.0 / 8000)
    assert learning_rate(7_999, config.train) == pytest.approx(24.0)
    assert learning_rate(48_000, config.train) == pytest.approx(24.0)
    assert learning_rate(60_000, config.train) == pytest.approx(24.0 * 0.5**2)
    assert learning_rate(72_000, config.train) == 0.0


def test_each_config_names_its_hardware_and_the_published_result():
    for name in EXPECTED:
        text = (CONFIGS / name).read_text()
        assert "0.8025" in text, name
        assert ("GPU" in text) if "gpu" in name else ("CPU" in text), name


def test_the_cpu_cluster_config_trains_in_bfloat16_on_a_spark_cluster():
    config = load_config(CONFIGS / "criteo_terabyte_cpu_cluster.yaml")
    assert config.spark.master.startswith("spark://")
    assert config.spark.executor_memory and not config.spark.gpu
    assert config.train.amp  # bfloat16 on CPUs that have it (trainer.loop.compute_dtype)
