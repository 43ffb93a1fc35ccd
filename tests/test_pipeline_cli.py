"""Flag handling of the pipeline CLI (no stages run: these fail or stop before the lock)."""

import subprocess
import sys

import pytest

from pipeline.cli import apply_flags, build_parser, host_slots, main, validate
from pipeline.config import PipelineConfig
from pipeline.errors import ExitCode, PipelineError


def flags(*argv):
    return apply_flags(PipelineConfig(), build_parser().parse_args(["run", *argv]))


def test_hosts_without_np_uses_every_slot():
    assert flags("--hosts", "node1:4,node2:4").launch.np == 8
    assert flags("--hosts", "node1:4,node2:4", "--np", "6").launch.np == 6
    assert host_slots("a,b:3") == 4


def test_np_beyond_the_host_slots_is_refused():
    with pytest.raises(PipelineError, match="more than the 4 slots"):
        validate(flags("--hosts", "a:2,b:2", "--np", "5"))


def test_flags_override_config_sections():
    config = flags("--frequency-threshold", "15,C3:3", "--spark-master", "spark://m:7077",
                   "--max-steps", "7", "--stages", "preprocess,convert", "--gpu", "--force")
    assert config.preprocess.frequency_threshold == "15,C3:3"
    assert config.spark.master == "spark://m:7077" and config.spark.gpu
    assert config.train.max_steps == 7 and config.force
    assert config.stages == ["preprocess", "convert"]


@pytest.mark.parametrize("argv, words", [
    (["--stages", "preprocess,bogus"], "unknown stage"),
    (["--frequency-threshold", "5,C99:1"], "unknown column"),
    (["--np", "0"], "at least 1"),
])
def test_bad_flags_exit_with_the_usage_code(argv, words, tmp_path, capsys):
    assert main(["--workdir", str(tmp_path), *argv]) == ExitCode.USAGE
    assert words in capsys.readouterr().err


def test_show_config_prints_every_section():
    out = subprocess.run([sys.executable, "-m", "pipeline", "show-config"], capture_output=True,
                         text=True, check=True).stdout
    for section in ("generator:", "spark:", "preprocess:", "convert:", "train:", "launch:"):
        assert section in out
