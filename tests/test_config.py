import pytest

from dlrm_contracts.config import (ConfigError, PipelineConfig, PreprocessConfig, config_from_dict,
                                   config_to_dict, load_config, with_overrides)


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


def test_the_threshold_is_parsed_once_and_written_back_canonical():
    from dlrm_contracts.thresholds import ThresholdSpec

    config = config_from_dict({"preprocess": {"frequency_threshold": " 15, c20:40, C3:3 ,C5:15"},
                               "train": {"frequency_threshold": 20}})
    assert config.preprocess.frequency_threshold == ThresholdSpec(15, {"C3": 3, "C20": 40})
    assert config.train.frequency_threshold == ThresholdSpec(20)
    plain = config_to_dict(config)
    assert plain["preprocess"]["frequency_threshold"] == "15,C3:3,C20:40"
    assert plain["train"]["frequency_threshold"] == "20"
    assert config_from_dict(plain) == config


@pytest.mark.parametrize("make", [
    lambda bad: config_from_dict({"preprocess": {"frequency_threshold": bad}}),
    lambda bad: with_overrides(PreprocessConfig(), {"frequency_threshold": bad}),
    lambda bad: PreprocessConfig(frequency_threshold=bad),
], ids=["yaml", "flags", "code"])
def test_a_bad_threshold_fails_where_the_config_is_made_with_one_message(make):
    with pytest.raises(ConfigError) as caught:
        make("15,C99:3")
    assert str(caught.value) == ("preprocess.frequency_threshold: override 'C99:3': unknown "
                                 "column 'C99' (C1..C26)")
