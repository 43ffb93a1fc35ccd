"""Helpers of the tests that run the pipeline's CLI end to end (test_pipeline, test_disk)."""

from __future__ import annotations

import filecmp
import json
import subprocess
import sys
from pathlib import Path


def pipeline_cmd(workdir: Path, config: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "pipeline", "--workdir", str(workdir), "--config", str(config), *args]


def run(workdir: Path, config: Path, *args: str, timeout: int = 900):
    """(the finished process, its JSON summary or None): the summary is stdout's last line."""
    proc = subprocess.run(
        pipeline_cmd(workdir, config, *args), capture_output=True, text=True, timeout=timeout
    )
    lines = proc.stdout.strip().splitlines()
    summary = json.loads(lines[-1]) if lines and lines[-1].startswith("{") else None
    return proc, summary


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
