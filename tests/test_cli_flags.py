"""Every flag of the entry points that take settings lands somewhere: its destination is a field
of the config section the CLI overrides with ``flag_overrides`` (which silently skips any other
name), or one of the CLI's own run arguments listed here. A flag added with a misspelt ``dest``
fails this test instead of being ignored at run time.

The CLIs with settings flags are all here: spark_jobs, converters, trainer, pipeline.generate
and the pipeline's own. ``python -m trainer.score`` takes only run arguments (model, input,
output, the YAML file) and ``pipeline.cluster_auth`` only the cluster daemons' own flags."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from dlrm_contracts import config as c


def _destinations(parser: argparse.ArgumentParser) -> dict[str, set[str]]:
    """Destinations by (sub)command; subcommands' parsers are walked too."""
    found: dict[str, set[str]] = {"": set()}
    for action in parser._actions:  # argparse keeps no public list of a parser's actions
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found[name] = set().union(*_destinations(sub).values())
            found[""].add(action.dest)
        elif action.dest != "help":
            found[""].add(action.dest)
    return found


def _fields(*sections) -> set[str]:
    return {f.name for section in sections for f in dataclasses.fields(section)}


def _spark():
    from spark_jobs.cli import build_parser

    return (
        build_parser(),
        _fields(c.SparkConfig, c.PreprocessConfig),
        {"": {"config", "input", "workdir", "retransform"}},
    )


def _converters():
    from converters.cli import build_parser

    options = {"config", "json"}
    return (
        build_parser(),
        _fields(c.ConvertConfig),
        {
            "": {"command"},
            "convert": options | {"workdir", "parquet", "output", "threshold_spec", "frequency_threshold"},
            "verify": {"dataset", "quick", "json"},
            "rethreshold": options | {"source", "output", "frequency_threshold", "counts", "workdir"},
            "mlperf-multihot": options | {"dataset", "output"},
            "stage-in": {"source", "target", "json"},
            "plan": {
                "config",
                "spec",
                "thresholds",
                "counts",
                "workdir",
                "embedding_dim",
                "dtype_bytes",
                "json",
            },
        },
    )


def _trainer():
    from trainer.cli import parser

    return parser(), _fields(c.TrainConfig), {"": {"config", "dataset", "workdir", "mode"}}


def _generator():
    from pipeline.generate import _parser

    return _parser(), _fields(c.GeneratorConfig), {"": {"config", "out", "uniform_column", "drift_column"}}


@pytest.mark.parametrize(
    "cli",
    [_spark, _converters, _trainer, _generator],
    ids=["spark_jobs", "converters", "trainer", "generate"],
)
def test_every_flag_is_a_setting_or_a_named_run_argument(cli):
    parser, settings, run_arguments = cli()
    for command, destinations in _destinations(parser).items():
        allowed = run_arguments.get(command, set())
        strays = sorted(d for d in destinations if d not in settings and d not in allowed)
        assert not strays, f"{command or 'top level'}: flags {strays} reach no config field"


def test_a_misspelt_destination_is_caught():
    parser, settings, run_arguments = _trainer()
    parser.add_argument("--verify-datset", dest="verify_datset")
    strays = _destinations(parser)[""] - settings - run_arguments[""]
    assert strays == {"verify_datset"}


# The pipeline's CLI maps its flags by hand (pipeline.cli.apply_flags) rather than by name, so
# its check is by effect: each flag of `run` and `preflight`, given alone, changes the config.
PIPELINE_RUN_ARGUMENTS = {"config"}  # read before the flags: the YAML file itself
PIPELINE_SAMPLES = {"hosts": "node1:2,node2:2", "stages": "train", "np": "3"}


def _pipeline_changes(argv: list[str]) -> bool:
    from pipeline.cli import apply_flags, build_parser

    base = c.PipelineConfig()
    return apply_flags(base, build_parser().parse_args(argv)) != base


@pytest.mark.parametrize("command", ["run", "preflight"])
def test_every_flag_of_the_pipeline_changes_its_config(command):
    from pipeline.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    actions = [
        a for a in sub.choices[command]._actions if a.dest != "help" and a.dest not in PIPELINE_RUN_ARGUMENTS
    ]
    assert len(actions) > 10
    inert = []
    for action in actions:
        argv = [command, action.option_strings[-1]]
        if action.nargs != 0:  # a flag with a value (store_true takes none)
            argv.append(PIPELINE_SAMPLES.get(action.dest, "7"))
        if not _pipeline_changes(argv):
            inert.append(action.option_strings[-1])
    assert not inert, f"pipeline {command}: flags {inert} reach no config field"


def test_a_pipeline_flag_that_apply_flags_ignores_is_caught(monkeypatch):
    from pipeline import cli

    build = cli.build_parser

    def with_a_stray_flag():
        parser = build()
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        sub.choices["run"].add_argument("--eval-every")
        return parser

    monkeypatch.setattr(cli, "build_parser", with_a_stray_flag)
    assert not _pipeline_changes(["run", "--eval-every", "7"])
    assert _pipeline_changes(["run", "--max-steps", "7"])
