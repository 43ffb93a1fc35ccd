"""Horovod really built against TensorFlow with Gloo: collectives checked on two real ranks,
and Horovod's own build report, from one launch (horovod_scripts/collectives_check.py)."""

import json
import subprocess
from pathlib import Path

import pytest
from trainer_helpers import horovod_env

pytestmark = pytest.mark.horovod
SCRIPT = Path(__file__).parent / "horovod_scripts" / "collectives_check.py"


@pytest.fixture(scope="module")
def launch(venv_bin):
    """The two ranks' JSON reports, by rank, and horovodrun's exit code and output."""
    proc = subprocess.run(
        [
            str(venv_bin / "horovodrun"),
            "-np",
            "2",
            "-H",
            "localhost:2",
            "--gloo",
            str(venv_bin / "python"),
            str(SCRIPT),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=horovod_env(),
    )
    reports = [
        json.loads(line[line.index("{") :])
        for line in proc.stdout.splitlines()
        if '"rank"' in line and "{" in line
    ]
    return proc, {r["rank"]: r for r in reports}


def test_check_build_reports_tensorflow_and_gloo(launch):
    """What ``horovodrun --check-build`` prints (Horovod's own check_build, run by rank 0)."""
    proc, reports = launch
    assert 0 in reports, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = reports[0]["check_build"]
    assert "[X] TensorFlow" in out
    assert "[X] Gloo" in out


def test_alltoall_allreduce_and_gradient_tape_on_two_ranks(launch):
    proc, reports = launch
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert sorted(reports) == [0, 1]
    assert all(r["ok"] and r["size"] == 2 for r in reports.values())
