"""One writer per workdir, whichever entry point it is, and no write through a planted link.

Every command that writes a workdir (the pipeline, ``python -m spark_jobs``, ``python -m
converters convert|rethreshold``, every mode of ``python -m trainer``, ``python -m
trainer.score``) takes ``DIR/.pipeline.lock`` (dlrm_contracts.lock): a second one ends with
exit 3 naming the holder, having touched nothing. The holder's own children (the pipeline's
stages, horovodrun's ranks) run under its lock through the token they inherit.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dlrm_contracts.errors import ExitCode
from dlrm_contracts.lock import LOCK_TOKEN_ENV

REPO = Path(__file__).resolve().parent.parent

# Holds the workdir's lock as the pipeline does, then runs the command given (if any) as its
# child, printing the child's exit code and output, and waits for its stdin to close.
HOLDER = textwrap.dedent("""
    import json, subprocess, sys
    from dlrm_contracts.lock import workdir_lock
    with workdir_lock(sys.argv[1], "pipeline"):
        print("held", flush=True)
        if len(sys.argv) > 2:
            child = subprocess.run(sys.argv[2:], capture_output=True, text=True)
            print(json.dumps({"code": child.returncode, "out": child.stdout,
                              "err": child.stderr}), flush=True)
        sys.stdin.read()
""")


def _env(**extra) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != LOCK_TOKEN_ENV}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    return {**env, **extra}


class Holder:
    """Another process holding the workdir's lock for the length of the ``with`` block."""

    def __init__(self, workdir: Path, *child: str):
        self.workdir, self.child = workdir, list(child)

    def __enter__(self) -> "Holder":
        self.proc = subprocess.Popen(
            [sys.executable, "-c", HOLDER, str(self.workdir), *self.child],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=_env(),
        )
        assert self.proc.stdout.readline().strip() == "held"
        return self

    def child_result(self) -> dict:
        return json.loads(self.proc.stdout.readline())

    def __exit__(self, *exc) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=120)


def _workdir_in_use(tmp_path: Path) -> tuple[Path, dict[Path, bytes]]:
    """A workdir with outputs each entry point would delete or replace, and their bytes."""
    workdir = tmp_path / "w"
    kept = {
        workdir / "binary" / "dataset.json": b'{"kept": 1}',
        workdir / "parquet" / "dictionary_index" / "index.json": b'{"kept": 2}',
        workdir / "parquet" / ".splits-staging" / "train" / "part-0.parquet": b"kept 3",
        workdir / "checkpoints" / "step-000000001" / "meta.json": b'{"step": 1}',
        workdir / "scores" / "day.parquet": b"kept 4",
        workdir / "export" / "1" / "saved_model.pb": b"kept 5",
    }
    for path, content in kept.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "day_0").write_text("0" + "\t" * 39 + "\n")
    return workdir, kept


def _commands(workdir: Path, tmp_path: Path) -> dict[str, list[str]]:
    python = sys.executable
    return {
        "spark_jobs": [
            python,
            "-m",
            "spark_jobs",
            "--input",
            str(tmp_path / "raw"),
            "--workdir",
            str(workdir),
        ],
        "converters convert": [python, "-m", "converters", "convert", "--workdir", str(workdir)],
        "converters rethreshold": [
            python,
            "-m",
            "converters",
            "rethreshold",
            "--source",
            str(workdir / "binary"),
            "--counts",
            str(workdir / "counts"),
            "--frequency-threshold",
            "5",
            "--output",
            str(workdir / "binary.derived"),
        ],
        "trainer train": [
            python,
            "-m",
            "trainer",
            "--dataset",
            str(workdir / "binary"),
            "--workdir",
            str(workdir),
        ],
        "trainer eval": [
            python,
            "-m",
            "trainer",
            "--mode",
            "eval",
            "--dataset",
            str(workdir / "binary"),
            "--workdir",
            str(workdir),
        ],
        "trainer export": [
            python,
            "-m",
            "trainer",
            "--mode",
            "export",
            "--dataset",
            str(workdir / "binary"),
            "--workdir",
            str(workdir),
        ],
        "trainer.score": [
            python,
            "-m",
            "trainer.score",
            "--model",
            str(workdir / "export"),
            "--out",
            str(workdir / "scores"),
            "--input",
            str(tmp_path / "raw" / "day_0"),
        ],
    }


ENTRY_POINTS = [
    "spark_jobs",
    "converters convert",
    "converters rethreshold",
    "trainer train",
    "trainer eval",
    "trainer export",
    "trainer.score",
]


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_a_second_writer_of_a_workdir_ends_with_exit_3_naming_the_holder(tmp_path, entry):
    workdir, kept = _workdir_in_use(tmp_path)
    with Holder(workdir) as holder:
        proc = subprocess.run(
            _commands(workdir, tmp_path)[entry], capture_output=True, text=True, env=_env(), timeout=600
        )
    assert proc.returncode == ExitCode.LOCKED, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert f'"pid": {holder.proc.pid}' in errors[0] and str(workdir) in errors[0], errors
    assert {path: path.read_bytes() for path in kept} == kept  # nothing touched


def test_the_holders_children_run_under_its_lock_and_no_one_else_does(tmp_path):
    workdir = tmp_path / "w"
    probe = [
        sys.executable,
        "-c",
        "import sys; from dlrm_contracts.lock import workdir_lock\n"
        f"with workdir_lock({str(workdir)!r}, 'child') as lock: print(lock.guest)",
    ]
    with Holder(workdir, *probe) as holder:
        child = holder.child_result()
        assert child["code"] == 0 and child["out"].strip() == "True", child
        # the same command from outside, and one with another holder's token: refused
        for env in (_env(), _env(**{LOCK_TOKEN_ENV: "0" * 32})):
            outside = subprocess.run(probe, capture_output=True, text=True, env=env)
            assert outside.returncode != 0 and "in use by another pipeline run" in outside.stderr
    # the holder is gone: a token left in an environment is no lock, the lock is taken as usual
    after = subprocess.run(probe, capture_output=True, text=True, env=_env(**{LOCK_TOKEN_ENV: "0" * 32}))
    assert after.returncode == 0 and after.stdout.strip() == "False", after.stderr


def test_the_pipeline_refuses_a_workdir_a_wing_holds(tmp_path):
    """The lock is the same whichever entry point holds it: a pipeline run against a
    spark_jobs (or any wing) at work on the workdir is refused too."""
    workdir, _kept = _workdir_in_use(tmp_path)
    with Holder(workdir) as holder:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "pipeline",
                "--workdir",
                str(workdir),
                "--input",
                str(tmp_path / "raw"),
                "--stages",
                "preprocess",
            ],
            capture_output=True,
            text=True,
            env=_env(),
        )
    assert proc.returncode == ExitCode.LOCKED, proc.stderr[-2000:]
    assert f'"pid": {holder.proc.pid}' in proc.stderr


# ---------------------------------------------------------------- planted links


def _plant(link: Path, tmp_path: Path) -> Path:
    """A symbolic link at ``link`` to a file outside the workdir; returns the target."""
    target = tmp_path / "elsewhere" / link.name
    target.parent.mkdir(exist_ok=True)
    target.write_text("not the workdir's\n")
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(target)
    return target


@pytest.mark.parametrize("command", ["pipeline", "spark_jobs"])
def test_a_link_planted_at_the_lock_file_is_refused_and_its_target_untouched(tmp_path, command):
    workdir, _kept = _workdir_in_use(tmp_path)
    target = _plant(workdir / ".pipeline.lock", tmp_path)
    argv = (
        [
            sys.executable,
            "-m",
            "pipeline",
            "--workdir",
            str(workdir),
            "--input",
            str(tmp_path / "raw"),
            "--stages",
            "preprocess",
        ]
        if command == "pipeline"
        else _commands(workdir, tmp_path)["spark_jobs"]
    )
    proc = subprocess.run(argv, capture_output=True, text=True, env=_env())
    assert proc.returncode == ExitCode.USAGE, proc.stderr[-2000:]
    assert "symbolic link" in proc.stderr and "Traceback" not in proc.stderr
    assert target.read_text() == "not the workdir's\n"


def test_a_run_never_writes_through_links_planted_at_the_files_it_writes(tmp_path):
    """history.jsonl (appended) is refused with a warning naming it; summary.json, the
    effective config and the report (written whole) replace the link; no target changes."""
    workdir, _kept = _workdir_in_use(tmp_path)
    names = ["manifests/history.jsonl", "summary.json", "manifests/effective_config.yaml", "report/report.md"]
    targets = {name: _plant(workdir / name, tmp_path) for name in names}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipeline",
            "--workdir",
            str(workdir),
            "--input",
            str(tmp_path / "raw"),
            "--stages",
            "eval",
        ],
        capture_output=True,
        text=True,
        env=_env(),
    )
    assert proc.returncode == ExitCode.DATASET_INVALID, proc.stderr[-2000:]
    assert "history.jsonl is a symbolic link" in proc.stderr, proc.stderr[-2000:]
    for name, target in targets.items():
        assert target.read_text() == "not the workdir's\n", name
    for name in names[1:]:
        assert not (workdir / name).is_symlink() and (workdir / name).is_file(), name
    assert json.loads((workdir / "summary.json").read_text())["status"].startswith("failed")


def test_appended_logs_and_metrics_refuse_a_planted_link(tmp_path):
    from pipeline.processes import StageLog
    from trainer.metrics import MetricsLog

    stage_target = _plant(tmp_path / "logs" / "train.log", tmp_path)
    metrics_target = _plant(tmp_path / "logs" / "metrics.jsonl", tmp_path)
    sink = StageLog(tmp_path / "logs" / "train.log")
    sink.write("a line\n")
    sink.close()
    with pytest.raises(OSError, match="symbolic link"):
        MetricsLog(tmp_path / "logs" / "metrics.jsonl").write({"step": 1})
    assert stage_target.read_text() == metrics_target.read_text() == "not the workdir's\n"


# The pipeline's own children (its preprocess stage's ``python -m spark_jobs``, its train
# stage's horovodrun ranks) running under its lock: tests/test_pipeline.py's end-to-end run,
# test_the_pipeline_runs_its_wings_under_its_own_lock.


def test_a_wing_writing_through_a_planted_link_ends_with_one_line_and_exit_2(capsys, tmp_path):
    """A link refused inside a wing (the trainer's metrics.jsonl) is the user's to remove:
    exit 2 naming it, no traceback."""
    from dlrm_contracts.errors import run_cli
    from trainer.metrics import MetricsLog

    target = _plant(tmp_path / "logs" / "metrics.jsonl", tmp_path)
    code = run_cli("trainer", lambda: MetricsLog(tmp_path / "logs" / "metrics.jsonl").write({"step": 1}))
    err = capsys.readouterr().err
    assert code == ExitCode.USAGE and "Traceback" not in err, err
    assert err.count("\n") == 1 and "metrics.jsonl is a symbolic link" in err, err
    assert target.read_text() == "not the workdir's\n"
