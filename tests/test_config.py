import pytest

from dlrm_contracts.config import (ConfigError, PipelineConfig, config_from_dict, config_to_dict,
                                   load_config)


def test_yaml_sections_override_defaults(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("workdir: /tmp/w\nspark:\n  master: spark://h:7077\ntrain:\n  batch_size: 128\n")
    config = load_config(path)
    assert config.workdir == "/tmp/w"
    assert config.spark.master == "spark://h:7077"
    assert config.train.batch_size == 128
    assert config.preprocess.frequency_threshold == PipelineConfig().preprocess.frequency_threshold


def test_unknown_keys_are_refused_with_the_known_ones_listed():
    with pytest.raises(ConfigError, match="unknown setting.*bogus"):
        config_from_dict({"spark": {"bogus": 1}})


def test_round_trip_through_dict():
    config = PipelineConfig()
    assert config_from_dict(config_to_dict(config)) == config
