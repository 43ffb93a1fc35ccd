"""The import layering of pyproject's [tool.importlinter] holds, and lint-imports catches a break.

Each planted case copies the five packages and pyproject.toml to a temporary tree, adds one
wrong import to one module and runs the same ``lint-imports`` there: it must fail and name the
broken contract. The real tree must pass.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("dlrm_contracts", "pipeline", "spark_jobs", "converters", "trainer")
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"
LAYERS = "pipeline above the three wings"


def lint_imports(tree: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"], cwd=tree, env=env, capture_output=True, text=True, timeout=120
    )


def test_the_tree_keeps_every_contract():
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


@pytest.mark.parametrize(
    "module, planted, contract",
    [
        ("spark_jobs/cli.py", "import trainer.cli", LAYERS),  # wings are independent
        ("converters/cli.py", "import pipeline.runner", LAYERS),  # a wing above the pipeline
        ("dlrm_contracts/schema.py", "import converters.convert", LAYERS),  # contracts at the bottom
        ("trainer/data.py", "import pyspark", "trainer imports no pyspark"),
        (
            "spark_jobs/engines/sql/parse.py",
            "import tensorflow",
            "spark_jobs imports no tensorflow or horovod",
        ),
        ("converters/convert.py", "import horovod", "converters imports no pyspark, tensorflow"),
        ("dlrm_contracts/config.py", "import pyspark.sql", "dlrm_contracts imports no pyspark"),
        # inside spark_jobs: the engines are independent, the shared modules import neither
        (
            "spark_jobs/engines/arrow/engine.py",
            "import spark_jobs.engines.sql.parse",
            "the Arrow and SQL engines do not import each other",
        ),
        (
            "spark_jobs/stats.py",
            "import spark_jobs.engines.arrow.chunks",
            "spark_jobs: entry points above the job",
        ),
        ("spark_jobs/progress.py", "import spark_jobs.preprocess", "spark_jobs: entry points above the job"),
    ],
)
def test_a_planted_wrong_import_breaks_its_contract(tmp_path, module, planted, contract):
    tree = tmp_path / "tree"
    for package in PACKAGES:
        shutil.copytree(ROOT / package, tree / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tree / "pyproject.toml")
    assert lint_imports(tree).returncode == 0  # the copy alone is sound
    with open(tree / module, "a", encoding="utf-8") as fh:
        fh.write(f"\n{planted}  # planted by the test\n")
    result = lint_imports(tree)
    assert result.returncode != 0, result.stdout
    broken = [line for line in result.stdout.splitlines() if line.endswith("BROKEN")]
    assert broken, result.stdout
    assert contract in result.stdout.replace("\n", " "), result.stdout
