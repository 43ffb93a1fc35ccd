"""The shared rules of dlrm_contracts: one exit-code map, atomic writes, config range checks."""

from __future__ import annotations

import errno
import os
import subprocess
import sys

import pytest

from dlrm_contracts.atomic import atomic_file, read_json, remove_stale_temporaries, write_json_atomic
from dlrm_contracts.binary_format import DatasetError
from dlrm_contracts.config import ConfigError, ConvertConfig, GeneratorConfig, TrainConfig, with_overrides
from dlrm_contracts.errors import ExitCode, PipelineError, UsageError, exit_code_of, failing_as, run_cli
from dlrm_contracts.table_sizes import LowerThresholdError
from dlrm_contracts.thresholds import ThresholdSpecError


@pytest.mark.parametrize(
    "error, code",
    [
        (UsageError("bad flag"), ExitCode.USAGE),
        (ConfigError("train.batch_size"), ExitCode.USAGE),
        (ThresholdSpecError("C99"), ExitCode.USAGE),
        (DatasetError("cat_3.bin is short"), ExitCode.DATASET_INVALID),
        (LowerThresholdError("needs a Spark rerun"), ExitCode.CONVERT),
        (PipelineError("locked", ExitCode.LOCKED), ExitCode.LOCKED),
        (OSError(errno.ENOSPC, "No space left on device"), ExitCode.DISK_FULL),
        (OSError(errno.EACCES, "Permission denied"), ExitCode.USAGE),  # a path the user must fix
        (OSError(errno.EROFS, "Read-only file system"), ExitCode.USAGE),
        (  # an object store's endpoint that does not answer (pyarrow's S3 client)
            OSError(
                "When getting information for key 'x' in bucket 'b': AWS Error NETWORK_CONNECTION "
                "during HeadObject operation: curlCode: 7, Could not connect to server"
            ),
            ExitCode.USAGE,
        ),
        (  # no credentials for Azure (pyarrow's Azure client)
            RuntimeError(
                "Unknown error: Check for Hierarchical Namespace support failed: "
                "N5Azure4Core11Credentials23AuthenticationExceptionE: Failed to get token\nSee more"
            ),
            ExitCode.USAGE,
        ),
        (ValueError("a bug"), ExitCode.FAILED),
        (KeyError("a bug"), ExitCode.FAILED),
        (KeyboardInterrupt(), ExitCode.INTERRUPTED),
    ],
)
def test_one_map_from_failure_to_exit_code(error, code):
    assert exit_code_of(error) == code


def test_run_cli_prints_a_known_failure_on_one_line_and_a_bug_with_its_traceback(capsys):
    def refuse():
        raise UsageError("--np must be at least 1")

    assert run_cli("tool", refuse) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert err == "tool: error: --np must be at least 1\n"

    def crash():
        return {}["missing"]

    assert run_cli("tool", crash) == ExitCode.FAILED
    err = capsys.readouterr().err
    assert "Traceback" in err and "KeyError" in err and "a bug" in err


def test_failing_as_gives_a_steps_known_failures_its_code_and_lets_bugs_through():
    with pytest.raises(PipelineError) as known:
        with failing_as(ExitCode.CONVERT, DatasetError, what="convert failed"):
            raise DatasetError("part-0.parquet is truncated")
    assert known.value.code == ExitCode.CONVERT
    assert str(known.value) == "convert failed: part-0.parquet is truncated"
    with pytest.raises(ZeroDivisionError):
        with failing_as(ExitCode.CONVERT, DatasetError):
            1 / 0


def test_a_bug_in_a_wing_cli_is_exit_1_with_its_traceback(tmp_path):
    """A converter that crashes is a bug (exit 1, traceback), not 'convert failed' (6)."""
    code = (
        "import sys, converters.convert as c, converters.cli as cli\n"
        "def broken(*args, **kwargs):\n"
        "    raise RuntimeError('a bug in the converter')\n"
        "c.convert_parquet = broken\n"
        f"sys.exit(cli.main(['convert', '--parquet', {str(tmp_path)!r}, "
        f"'--output', {str(tmp_path / 'out')!r}]))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == ExitCode.FAILED, proc.stderr
    assert "Traceback" in proc.stderr and "a bug in the converter" in proc.stderr


def test_atomic_file_leaves_the_old_file_or_the_new_one(tmp_path):
    path = tmp_path / "summary.json"
    write_json_atomic(path, {"b": 1, "a": 2})
    assert path.read_text() == '{\n  "a": 2,\n  "b": 1\n}\n'
    with pytest.raises(RuntimeError):
        with atomic_file(path) as temporary:
            temporary.write_text("half")
            raise RuntimeError("killed mid-write")
    assert read_json(path) == {"a": 2, "b": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.json"]
    write_json_atomic(path, {"b": 1, "a": 2}, sort_keys=False)
    assert list(read_json(path)) == ["b", "a"]


def test_temporaries_of_a_dead_writer_are_removed_and_a_live_ones_kept(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    final = tmp_path / "histogram.parquet"
    stale = tmp_path / f".histogram.parquet.tmp-{dead.pid}-0badcafe"
    live = tmp_path / f".histogram.parquet.tmp-{os.getpid()}-cafecafe"
    stale.write_text("left by a killed run")
    live.write_text("being written")
    assert remove_stale_temporaries(final) == [stale]
    assert live.exists() and not stale.exists()


@pytest.mark.parametrize(
    "section, changes, words",
    [
        (TrainConfig(), {"batch_size": 0}, "batch sizes must be at least 1"),
        (TrainConfig(), {"optimizer": "lamb"}, "train.optimizer 'lamb'"),
        (TrainConfig(), {"verify_dataset": "some"}, "train.verify_dataset"),
        (ConvertConfig(), {"batch_rows": 0}, "batch rows must be at least 1"),
        (GeneratorConfig(), {"click_rate": 1.5}, "click_rate must be in (0, 1)"),
        (TrainConfig(), {"max_steps": "ten"}, "max_steps: 'ten' is not a valid"),
        (TrainConfig(), {"bogus": 1}, "unknown setting(s) bogus"),
    ],
)
def test_overrides_are_checked_by_the_section_itself(section, changes, words):
    with pytest.raises(ConfigError) as refused:
        with_overrides(section, changes)
    assert words in str(refused.value) and refused.value.code == ExitCode.USAGE


def test_an_override_of_none_is_not_given():
    config = with_overrides(TrainConfig(epochs=5), {"epochs": None, "max_steps": 7})
    assert (config.epochs, config.max_steps) == (5, 7)
