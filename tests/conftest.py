"""Shared test fixtures: paths to the repo, the shared real sample, the venv's tools, the one
Spark session; and the test tiers (pyproject's markers; ``./run_tests.sh --quick`` runs the
unit tier, every test not marked spark, horovod or slow)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
REAL_SAMPLE = REPO.parent / "shared" / "data" / "criteo_real_sample.tsv"

# The benchmark scripts are not a package; their tests import them by name.
sys.path.insert(0, str(REPO / "bench"))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that takes the Spark session is of the spark tier whether or not its module says
    so, so that the quick tier never starts a JVM."""
    for item in items:
        if "spark" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.spark)


@pytest.fixture(scope="session")
def spark():
    """The one local Spark session of the run (tests/spark_fixtures.py)."""
    from spark_fixtures import spark_session

    return spark_session()


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


@pytest.fixture(scope="session")
def moto_s3(tmp_path_factory):
    """A real S3-compatible server (moto) on loopback for the whole session, with AWS_* in
    this process's environment pointing at it (tests/object_store.py); ``moto_s3.bucket()``
    gives a test its own bucket."""
    from tests.object_store import restore_environment, set_environment, start_moto, stop_moto
    server = start_moto(tmp_path_factory.mktemp("moto") / "moto.log")
    previous = set_environment(server)
    try:
        yield server
    finally:
        restore_environment(previous)
        stop_moto(server)
