"""configs/mlperf_dlrmv2_*.yaml: every key known, MLPerf DLRMv2's values, and the preflight's
sizing of them (capped tables known before any day is read, multi-hot bytes counted).

The expected values are written out here from the reference (mlcommons/training,
recommendation_v2/torchrec_dlrm: its README's run command and dlrm_main.py's constants), not
read from the files: a config drifting from the reference fails.
"""

from __future__ import annotations

import dataclasses

import pytest
import yaml

from dlrm_contracts.config import PipelineConfig, load_config
from pipeline.hosts import horovodrun_hosts
from pipeline.preflight_needs import _binary_bytes_per_row, memory_needs
from bench_capped_ids_anchor import CAPS  # MLPerf DLRMv2's published caps
from tests.config_helpers import CONFIGS, MLPERF, MLPERF_MULTI_HOT, unknown_keys

REFERENCE = {
    "preset": "default",
    "embedding_dim": None,
    "bottom_mlp": None,
    "top_mlp": None,
    "wide": False,
    "interaction": "dcn",
    "dcn_layers": 3,
    "dcn_rank": 512,
    "optimizer": "adagrad",
    "learning_rate": 0.005,
    "learning_rate_scaling": "none",
    "adagrad_initial_accumulator": 0.0,
    "adagrad_epsilon": 1e-8,
    "warmup_steps": 0,
    "batch_size": 65_536,
    "epochs": 1,
    "early_stopping_patience": 0,
    "amp": False,
}


@pytest.mark.parametrize("name", sorted(MLPERF))
def test_every_key_is_known_and_the_values_are_the_references(name):
    data = yaml.safe_load((CONFIGS / name).read_text())
    assert unknown_keys(data, PipelineConfig, "config") == []
    config = load_config(CONFIGS / name)
    assert config.preprocess.ids == "modulo" and config.preprocess.caps == CAPS
    assert config.convert.multi_hot_sizes == MLPERF_MULTI_HOT
    for key, value in REFERENCE.items():
        assert getattr(config.train, key) == value, key
    from trainer.dims import model_dims

    dims = model_dims(config.train)
    assert (dims.embedding_dim, list(dims.bottom_mlp), list(dims.top_mlp)) == (
        128,
        [512, 256, 128],
        [1024, 1024, 512, 256, 1],
    )
    assert config.launch.np == MLPERF[name]["np"]
    if config.launch.hosts:
        horovodrun_hosts(config.launch.hosts, config.launch.np)
    text = (CONFIGS / name).read_text()
    assert "0.80275" in text and MLPERF[name]["hardware"] in text


def test_the_preflight_sizes_capped_tables_and_multi_hot_rows():
    config = dataclasses.replace(load_config(CONFIGS / "mlperf_dlrmv2_8gpu.yaml"), stages=["train"])
    needs = memory_needs(config, CAPS, state_factor=2)
    per_rank = needs.ranks.per_rank
    total = sum(CAPS) * 128 * 4 * 2  # float32 weights + Adagrad's accumulator
    assert sum(per_rank) == total and len(per_rank) == 8
    assert max(per_rank) < 80 * 2**30 - 6 * 2**30 and not needs.ranks.short
    # 214 ids a row, int32 where the cap passes 2**15 (int16, int8 below), + label + float16 x 13
    widths = [4 if c > 2**15 else 2 if c > 2**7 else 1 for c in CAPS]
    assert _binary_bytes_per_row(CAPS, config) == 1 + 26 + sum(
        w * k for w, k in zip(widths, MLPERF_MULTI_HOT)
    )
    one_hot = dataclasses.replace(config, convert=dataclasses.replace(config.convert, multi_hot_sizes=None))
    assert _binary_bytes_per_row(CAPS, one_hot) == 1 + 26 + sum(widths)


def test_capped_tables_are_known_before_any_count(tmp_path):
    from dlrm_contracts.layout import WorkdirLayout
    from pipeline.preflight import _table_sizes

    config = load_config(CONFIGS / "mlperf_dlrmv2_cpu_cluster.yaml")
    assert _table_sizes(config, WorkdirLayout.at(tmp_path)) == CAPS  # no counts/ there
