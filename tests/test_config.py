import dataclasses

import pytest

from dlrm_contracts.config import (
    TRAIN_EXTENT_SETTINGS,
    TRAIN_SETTING_KINDS,
    ConfigError,
    PipelineConfig,
    PreprocessConfig,
    TrainConfig,
    changed_settings,
    config_from_dict,
    config_to_dict,
    load_config,
    train_model_settings,
    with_overrides,
)


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

    config = config_from_dict(
        {
            "preprocess": {"frequency_threshold": " 15, c20:40, C3:3 ,C5:15"},
            "train": {"frequency_threshold": 20},
        }
    )
    assert config.preprocess.frequency_threshold == ThresholdSpec(15, {"C3": 3, "C20": 40})
    assert config.train.frequency_threshold == ThresholdSpec(20)
    plain = config_to_dict(config)
    assert plain["preprocess"]["frequency_threshold"] == "15,C3:3,C20:40"
    assert plain["train"]["frequency_threshold"] == "20"
    assert config_from_dict(plain) == config


@pytest.mark.parametrize(
    "make",
    [
        lambda bad: config_from_dict({"preprocess": {"frequency_threshold": bad}}),
        lambda bad: with_overrides(PreprocessConfig(), {"frequency_threshold": bad}),
        lambda bad: PreprocessConfig(frequency_threshold=bad),
    ],
    ids=["yaml", "flags", "code"],
)
def test_a_bad_threshold_fails_where_the_config_is_made_with_one_message(make):
    with pytest.raises(ConfigError) as caught:
        make("15,C99:3")
    assert str(caught.value) == (
        "preprocess.frequency_threshold: override 'C99:3': unknown column 'C99' (C1..C26)"
    )


def test_every_train_setting_is_declared_as_model_or_run():
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    assert set(TRAIN_SETTING_KINDS) == fields, (
        "classify each train setting in dlrm_contracts/config.py TRAIN_SETTING_KINDS: "
        f"missing {sorted(fields - set(TRAIN_SETTING_KINDS))}, "
        f"unknown {sorted(set(TRAIN_SETTING_KINDS) - fields)}"
    )
    assert set(TRAIN_SETTING_KINDS.values()) == {"model", "run"}
    assert all(TRAIN_SETTING_KINDS[name] == "run" for name in TRAIN_EXTENT_SETTINGS)
    # the examples of each kind
    for name in (
        "log_every",
        "prefetch_batches",
        "intra_op_threads",
        "inter_op_threads",
        "eval_batch_size",
        "checkpoint_every",
        "keep_checkpoints",
        "epochs",
        "max_steps",
        "verify_dataset",
    ):
        assert TRAIN_SETTING_KINDS[name] == "run", name
    for name in (
        "preset",
        "optimizer",
        "learning_rate",
        "decay_steps",
        "seed",
        "shuffle_batches",
        "batch_size",
        "frequency_threshold",
    ):
        assert TRAIN_SETTING_KINDS[name] == "model", name


def test_changed_settings_names_only_the_model_settings_that_differ():
    base = TrainConfig()
    harmless = dataclasses.replace(
        base, log_every=3, epochs=99, max_steps=5, keep_checkpoints=9, prefetch_batches=1, eval_batch_size=64
    )
    assert changed_settings(train_model_settings(base), train_model_settings(harmless)) == []
    other = dataclasses.replace(base, learning_rate=0.5, seed=1)
    assert changed_settings(train_model_settings(base), train_model_settings(other)) == [
        "train.learning_rate 0.045 -> 0.5",
        "train.seed 12345 -> 1",
    ]
    # a setting an older record lacks counts as its default, so adding one sets nothing aside
    older = {k: v for k, v in train_model_settings(base).items() if k != "days"}
    assert changed_settings(older, train_model_settings(base)) == []
