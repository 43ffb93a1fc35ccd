"""Shared test fixtures: paths to the repo, the shared real sample, and the venv's tools."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
REAL_SAMPLE = REPO.parent / "shared" / "data" / "criteo_real_sample.tsv"


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


@pytest.fixture(scope="session")
def real_sample() -> Path:
    if not REAL_SAMPLE.exists():
        pytest.fail(f"the shared real Criteo sample is missing at {REAL_SAMPLE}")
    return REAL_SAMPLE


@pytest.fixture(scope="session")
def venv_bin() -> Path:
    """Directory of the interpreter running the tests (holds horovodrun, spark-submit)."""
    return Path(sys.executable).parent
