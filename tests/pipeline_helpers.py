"""Helpers of the tests that run the pipeline's CLI end to end (test_pipeline, test_disk)."""

from __future__ import annotations

import filecmp
import json
import subprocess
import sys
from pathlib import Path


def pipeline_cmd(workdir: Path, config: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "pipeline", "--workdir", str(workdir), "--config", str(config),
            *args]


def run(workdir: Path, config: Path, *args: str, timeout: int = 900):
    """(the finished process, its JSON summary or None): the summary is stdout's last line."""
    proc = subprocess.run(pipeline_cmd(workdir, config, *args), capture_output=True, text=True,
                          timeout=timeout)
    lines = proc.stdout.strip().splitlines()
    summary = json.loads(lines[-1]) if lines and lines[-1].startswith("{") else None
    return proc, summary


def same_tree(left: Path, right: Path, ignore: tuple[str, ...] = ()) -> list[str]:
    """Relative paths whose bytes differ (or exist on one side only) between two trees."""
    def files(root: Path) -> set[str]:
        return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()
                and not any(part in ignore for part in p.relative_to(root).parts)}

    names_left, names_right = files(left), files(right)
    differ = sorted(names_left ^ names_right)
    differ += [name for name in sorted(names_left & names_right)
               if not filecmp.cmp(left / name, right / name, shallow=False)]
    return differ
