"""Every flag of the entry points that take settings lands somewhere: its destination is a field
of the config section the CLI overrides with ``flag_overrides`` (which silently skips any other
name), or one of the CLI's own run arguments listed here. A flag added with a misspelt ``dest``
fails this test instead of being ignored at run time."""

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
    return build_parser(), _fields(c.SparkConfig, c.PreprocessConfig), {
        "": {"config", "input", "workdir", "retransform"}}


def _converters():
    from converters.cli import build_parser
    options = {"config", "json"}
    return build_parser(), _fields(c.ConvertConfig), {
        "": {"command"},
        "convert": options | {"workdir", "parquet", "output", "threshold_spec"},
        "verify": {"dataset", "quick", "json"},
        "rethreshold": options | {"source", "output", "frequency_threshold", "counts", "workdir"},
        "mlperf-multihot": options | {"dataset", "output"},
        "plan": {"config", "spec", "thresholds", "counts", "workdir", "embedding_dim",
                 "dtype_bytes", "json"},
    }


def _trainer():
    from trainer.cli import parser
    return parser(), _fields(c.TrainConfig), {"": {"config", "dataset", "workdir", "mode"}}


def _generator():
    from pipeline.generate import _parser
    return _parser(), _fields(c.GeneratorConfig), {"": {"config", "out", "uniform_column",
                                                          "drift_column"}}


@pytest.mark.parametrize("cli", [_spark, _converters, _trainer, _generator],
                         ids=["spark_jobs", "converters", "trainer", "generate"])
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
