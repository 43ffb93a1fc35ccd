"""Bad configs, bad input and damaged workdirs, tried as a new user (and a disk) would: each
case ends with one line, a documented exit code and the JSON summary, never a traceback and
never ``ok`` over an output that differs from what its stage wrote; nothing outside the
workdir is touched. The Spark and serving cases are in test_spark_quality.py and
test_serving.py; these need no Spark (the workdirs are made from parquet written here).
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dlrm_contracts.errors import ExitCode
from tests.pipeline_helpers import same_tree

REPO = Path(__file__).resolve().parent.parent


def run_pipeline(cwd: Path, *args: str, timeout: int = 600):
    """(process, JSON summary or None) of ``python -m pipeline ARGS`` run from ``cwd``."""
    proc = subprocess.run([sys.executable, "-m", "pipeline", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=cwd,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    lines = proc.stdout.strip().splitlines()
    summary = json.loads(lines[-1]) if lines and lines[-1].startswith("{") else None
    return proc, summary


def assert_refused(proc, summary, code: ExitCode, *words: str) -> None:
    """One known failure: its code, its words on stderr, no traceback, the summary last."""
    assert proc.returncode == code, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert summary is not None and summary["status"].startswith("failed"), proc.stdout[-2000:]
    for word in words:
        assert word in proc.stderr, (word, proc.stderr[-3000:])


def files_under(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in root.rglob("*") if p.is_file()}


# ------------------------------------------------------------------ config files and workdirs
@pytest.mark.parametrize("content", [b"spark:\n  master: \"\xff\xfe\"\n", b"\xff\xfe\x00\x01"])
def test_a_config_file_that_is_not_utf8_is_one_line_and_exit_2(tmp_path, content):
    config = tmp_path / "latin1.yaml"
    config.write_bytes(content)
    before = files_under(tmp_path)
    proc, summary = run_pipeline(tmp_path, "--config", str(config), "--workdir", str(tmp_path / "w"))
    assert_refused(proc, summary, ExitCode.USAGE, "latin1.yaml", "UTF-8")
    assert summary == {"status": "failed: usage", "error": summary["error"], "stages": {}}
    assert files_under(tmp_path) == before  # no workdir, nothing else


@contextlib.contextmanager
def read_only(path: Path):
    """``path`` made read-only for this test's processes: immutable when they run as root
    (root ignores permission bits), mode 0555 otherwise."""
    if os.geteuid() == 0:
        subprocess.run(["chattr", "+i", str(path)], check=True)
        try:
            yield
        finally:
            subprocess.run(["chattr", "-i", str(path)], check=True)
    else:
        mode = path.stat().st_mode
        path.chmod(0o555)
        try:
            yield
        finally:
            path.chmod(mode)


@pytest.mark.parametrize("lock_exists", [False, True])
def test_a_read_only_workdir_is_one_line_and_exit_2_with_a_summary(tmp_path, lock_exists):
    workdir = tmp_path / "w"
    (workdir / "logs").mkdir(parents=True)
    if lock_exists:
        (workdir / ".pipeline.lock").write_text("")
    before = files_under(tmp_path)
    with read_only(workdir):
        proc, summary = run_pipeline(tmp_path, "--workdir", str(workdir), "--stages", "generate")
    assert_refused(proc, summary, ExitCode.USAGE, str(workdir), "cannot be")
    assert summary["status"] == "failed: usage"
    assert files_under(tmp_path) == before


def test_a_read_only_output_inside_the_workdir_is_one_line_and_exit_2(tmp_path):
    """The workdir is writable but the generated data's directory is not (a read-only mount,
    a different owner): the stage fails with one line naming it, not a traceback."""
    workdir = tmp_path / "w"
    raw = workdir / "raw"
    raw.mkdir(parents=True)
    (raw / "day_0").write_text("")
    config = tmp_path / "c.yaml"
    config.write_text("generator: {days: 2, rows_per_day: 100}\npreflight: {enabled: false}\n")
    with read_only(raw):
        proc, summary = run_pipeline(tmp_path, "--workdir", str(workdir), "--config", str(config),
                                     "--stages", "generate")
    assert_refused(proc, summary, ExitCode.USAGE, "raw", "cannot be written")
    assert summary["stages"]["generate"]["action"] == "failed"


# ------------------------------------------------------------------ settings
@pytest.mark.parametrize("value", [0, -2, 5, 2**63])
def test_export_missing_integer_must_read_as_missing(tmp_path, value):
    """Any integer <= -3 is served as missing (log transform gives 0, as Spark writes);
    0 would silently serve log(3) for every missing field."""
    config = tmp_path / "c.yaml"
    config.write_text(f"export:\n  missing_integer: {value}\n")
    proc, summary = run_pipeline(tmp_path, "--config", str(config), "--workdir", str(tmp_path / "w"),
                                 "--stages", "export")
    assert_refused(proc, summary, ExitCode.USAGE, "missing_integer")
    assert not (tmp_path / "w").exists()


# ------------------------------------------------------------------ damaged day files
def _day_lines(rows: int, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    lines = []
    for _ in range(rows):
        ints = [str(v) for v in rng.integers(0, 50, 13)]
        cats = ["%08x" % v for v in rng.integers(0, 40, 26)]
        lines.append("\t".join([str(rng.integers(0, 2))] + ints + cats))
    return ("\n".join(lines) + "\n").encode()


def damaged_gzip_days(raw: Path) -> dict[str, Path]:
    """day_0.gz intact, day_1.gz cut at two thirds, day_2.gz with a gzip header and garbage
    after it (a file with no gzip header is refused earlier, by the input check)."""
    raw.mkdir(parents=True)
    for day in range(3):
        (raw / f"day_{day}.gz").write_bytes(gzip.compress(_day_lines(3000, day)))
    truncated = raw / "day_1.gz"
    truncated.write_bytes(truncated.read_bytes()[: truncated.stat().st_size * 2 // 3])
    corrupt = raw / "day_2.gz"
    data = bytearray(corrupt.read_bytes())
    data[20:4000] = b"\xff" * 3980
    corrupt.write_bytes(bytes(data))
    return {"truncated": truncated, "corrupt": corrupt}


def test_preflight_names_damaged_gzip_days_instead_of_a_traceback(tmp_path):
    damaged = damaged_gzip_days(tmp_path / "raw")
    proc = subprocess.run([sys.executable, "-m", "pipeline", "preflight", "--input",
                           str(tmp_path / "raw"), "--workdir", str(tmp_path / "w")],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    for path in damaged.values():
        line = next(l for l in proc.stdout.splitlines() if str(path) in l)
        assert "not a readable gzip file" in line and "will refuse it" in line, line
    assert "truncated" in proc.stdout and "corrupt" in proc.stdout and json.loads(proc.stdout.splitlines()[-1])["status"] == "ok"


@pytest.mark.spark
@pytest.mark.slow
def test_a_damaged_gzip_day_fails_preprocess_with_exit_5_naming_it(tmp_path):
    """The preflight notes the damage and sizes the run from the rest; the Spark job then
    refuses the file (exit 5, one line naming it), before any output is marked done."""
    damaged = damaged_gzip_days(tmp_path / "raw")
    config = tmp_path / "c.yaml"
    config.write_text("spark: {driver_memory: 1g}\n")
    proc, summary = run_pipeline(tmp_path, "--input", str(tmp_path / "raw"), "--workdir",
                                 str(tmp_path / "w"), "--config", str(config),
                                 "--stages", "preprocess")
    assert_refused(proc, summary, ExitCode.PREPROCESS, "will refuse it")
    headline = next(l for l in proc.stderr.splitlines() if "preprocess failed" in l)
    assert any(path.name in headline for path in damaged.values()), headline
    assert summary["stages"]["preprocess"]["action"] == "failed"
    assert not (tmp_path / "w" / "manifests" / "preprocess.done").exists()
