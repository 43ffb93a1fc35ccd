"""Horovod really built against TensorFlow with Gloo: collectives checked on two real ranks."""

import json
import subprocess
from pathlib import Path

import pytest
from trainer_helpers import horovod_env

pytestmark = pytest.mark.horovod
SCRIPT = Path(__file__).parent / "horovod_scripts" / "collectives_check.py"


def test_check_build_reports_tensorflow_and_gloo(venv_bin):
    out = subprocess.run(
        [str(venv_bin / "horovodrun"), "--check-build"],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    ).stdout
    assert "[X] TensorFlow" in out
    assert "[X] Gloo" in out


def test_alltoall_allreduce_and_gradient_tape_on_two_ranks(venv_bin):
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
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    reports = [
        json.loads(line[line.index("{") :])
        for line in proc.stdout.splitlines()
        if '"rank"' in line and "{" in line
    ]
    assert sorted(r["rank"] for r in reports) == [0, 1]
    assert all(r["ok"] and r["size"] == 2 for r in reports)
