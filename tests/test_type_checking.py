"""The type checker's strict part (pyproject's [tool.mypy]) covers what it says, and catches an
engine that drifts from the Engine protocol.

The drift case copies the five packages and pyproject.toml to a temporary tree, changes one
parameter of one engine's method and runs mypy on spark_jobs/engine_conformance.py there: it must
fail and name the method. The same command on an unchanged copy must pass.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("dlrm_contracts", "pipeline", "spark_jobs", "converters", "trainer")
MYPY = Path(sys.executable).parent / "mypy"
STRICT = ("dlrm_contracts.*", "spark_jobs.engine", "spark_jobs.engine_conformance")


def _overrides() -> list[dict]:
    with open(ROOT / "pyproject.toml", "rb") as fh:
        return tomllib.load(fh)["tool"]["mypy"]["overrides"]


def test_the_contracts_and_the_engine_protocol_are_strict_with_no_exception():
    overrides = _overrides()
    strict = [o for o in overrides if set(STRICT) <= set(o["module"])]
    assert len(strict) == 1, "one block holds dlrm_contracts, the Protocol and its conformance check"
    for flag in ("disallow_untyped_defs", "disallow_any_generics", "warn_return_any", "check_untyped_defs"):
        assert strict[0].get(flag) is True, flag
    # no later block may loosen or skip one of them (a later override wins in mypy)
    for override in overrides:
        if override is strict[0]:
            continue
        named = [m for m in override["module"] if m.startswith("dlrm_contracts") or m in STRICT]
        assert not named, f"{named} loosened by {override}"


def _mypy(tree: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(MYPY), "--no-incremental", "--cache-dir", "/dev/null", "spark_jobs/engine_conformance.py"],
        cwd=tree,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.parametrize("drifted", [False, True], ids=["unchanged", "drifted"])
def test_an_engine_method_that_drifts_from_the_protocol_fails_the_type_check(tmp_path, drifted):
    for package in PACKAGES:
        shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    if drifted:  # the SQL engine's write_splits takes its days as a list, the protocol a set
        engine = tmp_path / "spark_jobs/engines/sql/engine.py"
        text = engine.read_text()
        assert text.count("        days: set[int] | None = None,\n") == 1
        engine.write_text(
            text.replace(
                "        days: set[int] | None = None,\n", "        days: list[int] | None = None,\n"
            )
        )
    result = _mypy(tmp_path)
    output = result.stdout + result.stderr
    if not drifted:
        assert result.returncode == 0, output
        return
    assert result.returncode == 1, output
    assert "engine_conformance.py" in output and '"SqlEngine" have conflicts' in output, output
    assert "def write_splits(" in output and "days: list[int] | None" in output, output
