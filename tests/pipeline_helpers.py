"""Helpers of the tests that run the pipeline's CLI end to end (test_pipeline, test_disk,
test_hardening)."""

from __future__ import annotations

import contextlib
import filecmp
import io
import json
import subprocess
import sys
import traceback
from pathlib import Path


def pipeline_cmd(workdir: Path, config: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "pipeline", *pipeline_args(workdir, config, *args)]


def pipeline_args(workdir: Path, config: Path, *args: str) -> list[str]:
    return ["--workdir", str(workdir), "--config", str(config), *args]


def run(workdir: Path, config: Path, *args: str, timeout: int = 900):
    """(the finished process, its JSON summary or None): the summary is stdout's last line."""
    proc = subprocess.run(
        pipeline_cmd(workdir, config, *args), capture_output=True, text=True, timeout=timeout
    )
    lines = proc.stdout.strip().splitlines()
    summary = json.loads(lines[-1]) if lines and lines[-1].startswith("{") else None
    return proc, summary


def run_in_process(cwd: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict | None]:
    """(the finished "process", its JSON summary or None) of ``python -m pipeline ARGS`` run as
    its ``__main__`` runs it, in this process from ``cwd``: main's exit code and what it printed
    on stdout and stderr; an exception out of main is its traceback and exit 1, as the
    interpreter gives it. For the cases whose subject is the pipeline's decision (a refused
    setting, a damaged workdir, a convert stage), not its process: no interpreter start and no
    imports per run. The runner's signal handlers are not installed in this process (the tests'
    own stay), and its log handlers are closed after the run."""
    from pipeline import runner
    from pipeline.cli import main

    out, err = io.StringIO(), io.StringIO()
    install = runner.install_signal_handlers
    runner.install_signal_handlers = lambda: None
    try:
        with contextlib.chdir(cwd), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(list(args))
            except SystemExit as stop:  # argparse's --help or bad flags outside ``run``
                code = stop.code if isinstance(stop.code, int) else 1
            except Exception:  # noqa: BLE001 — what the interpreter does with it: its traceback, exit 1
                traceback.print_exc()
                code = 1
    finally:
        runner.install_signal_handlers = install
        for handler in list(runner.log.handlers):
            runner.log.removeHandler(handler)
            handler.close()
    proc = subprocess.CompletedProcess(
        ["python", "-m", "pipeline", *args], code, out.getvalue(), err.getvalue()
    )
    lines = proc.stdout.strip().splitlines()
    return proc, json.loads(lines[-1]) if lines and lines[-1].startswith("{") else None


def run_here(workdir: Path, config: Path, *args: str):
    """``run``'s command run in this process (run_in_process), from the workdir's parent."""
    return run_in_process(Path(workdir).parent, *pipeline_args(workdir, config, *args))


def same_tree(left: Path, right: Path, ignore: tuple[str, ...] = ()) -> list[str]:
    """Relative paths whose bytes differ (or exist on one side only) between two trees."""

    def files(root: Path) -> set[str]:
        return {
            str(p.relative_to(root))
            for p in root.rglob("*")
            if p.is_file() and not any(part in ignore for part in p.relative_to(root).parts)
        }

    names_left, names_right = files(left), files(right)
    differ = sorted(names_left ^ names_right)
    differ += [
        name
        for name in sorted(names_left & names_right)
        if not filecmp.cmp(left / name, right / name, shallow=False)
    ]
    return differ


def fake_spark_submit(tmp_path: Path, extra: str = "") -> Path:
    """A stand-in SPARK_HOME whose ``spark-submit`` prints its arguments (then runs ``extra``),
    and a stand-in python that names it: what docker/spark-cluster/submit.sh runs, without a
    cluster. Returns the python's path."""
    spark_home = tmp_path / "spark"
    (spark_home / "bin").mkdir(parents=True)
    (spark_home / "bin" / "spark-submit").write_text('#!/usr/bin/env bash\nprintf "%s\\n" "$@"\n' + extra)
    (spark_home / "bin" / "spark-submit").chmod(0o755)
    python = tmp_path / "python"
    python.write_text(f"#!/usr/bin/env bash\necho {spark_home}\n")
    python.chmod(0o755)
    return python
