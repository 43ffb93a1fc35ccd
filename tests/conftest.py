"""Shared test fixtures: paths to the repo, the shared real sample, the venv's tools, the one
Spark session; and the test tiers (pyproject's markers; ``./run_tests.sh --quick`` runs the
unit tier, every test not marked spark, horovod or slow)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
REAL_SAMPLE = REPO.parent / "shared" / "data" / "criteo_real_sample.tsv"

# The Spark driver JVMs the tests start in other processes (python -m spark_jobs, spark-submit,
# the pipeline's preprocess stage) compile with C1 only, as the shared session's does
# (tests/spark_fixtures.py): on the tests' tiny inputs C2 costs more CPU than it saves.
os.environ.setdefault("SPARK_SUBMIT_OPTS", "-XX:TieredStopAtLevel=1")

# The benchmark scripts are not a package; their tests import them by name.
sys.path.insert(0, str(REPO / "bench"))


# Modules whose tests train models or run pipeline stages end to end (TensorFlow, the
# converter, several processes): the slow tier as a whole, whatever their own markers say.
SLOW_MODULES = {
    "test_bench_quality.py",
    "test_checkpoint_runs.py",
    "test_export_superset.py",
    "test_hardening.py",
    "test_served_versions.py",
    "test_train_new_days.py",
    "test_trainer_dcn.py",
    "test_trainer_single.py",
    "test_trainer_warm_start.py",
}
# Single tests of that kind in modules of quick ones.
SLOW_TESTS = {
    "test_multi_hot.py::test_pipeline_convert_stage_with_multi_hot_and_the_reference_layout",
    "test_generator.py::test_memory_does_not_grow_with_rows",
    "test_disk.py::test_preflight_refuses_a_workdir_too_small_before_any_stage",
    "test_disk.py::test_full_disk_from_the_start_logs_to_stderr_and_still_prints_the_summary",
    "test_calibration.py::test_a_calibration_that_cannot_run_leaves_the_rates_with_a_warning",
    "test_calibration.py::test_the_calibration_is_measured_once_and_reused",
    "test_object_store.py::test_stage_in_copies_once_checks_checksums_and_recopies_a_damaged_copy",
    "test_object_store.py::test_a_dataset_converted_to_a_url_and_staged_in_equals_the_local_one_byte_for_byte",
}


HEAVY_TIERS = ("spark", "horovod", "slow")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The tiers ``./run_tests.sh --quick`` leaves out: a test that takes the Spark session is
    of the spark tier whether or not its module says so (the quick tier never starts a JVM),
    and the tests above are of the slow tier. Under pytest-xdist, the heavy files first."""
    for item in items:
        if "spark" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.spark)
        module = item.path.name
        if module in SLOW_MODULES or f"{module}::{item.originalname}" in SLOW_TESTS:
            item.add_marker(pytest.mark.slow)
    if getattr(config, "workerinput", None) is not None:
        heavy_files_first(items)


def heavy_files_first(items: list[pytest.Item]) -> None:
    """Files in order of their recorded cost (tests/suite_costs.py), longest first, each file's
    tests kept together and in their order; a file the record does not know is costed by its
    count of spark, horovod and slow tests. ./run_tests.sh gives each of its workers whole
    files (--dist loadfile, so a module's fixtures run once), the next file in this order to
    whichever worker is free: a long file handed out last would keep one worker busy while the
    other sits idle. Every worker collects the same order (xdist checks)."""
    from suite_costs import SECONDS_PER_HEAVY_TEST, recorded_costs

    recorded = recorded_costs()
    heavy: dict[Path, int] = {}
    for item in items:
        counted = any(item.get_closest_marker(tier) for tier in HEAVY_TIERS)
        heavy[item.path] = heavy.get(item.path, 0) + counted
    cost = {path: recorded.get(path.name, SECONDS_PER_HEAVY_TEST * n) for path, n in heavy.items()}
    items.sort(key=lambda item: -cost[item.path])  # stable: ties keep the collected order


@pytest.fixture(scope="session")
def spark():
    """The one local Spark session of the run (tests/spark_fixtures.py)."""
    from spark_fixtures import spark_session

    return spark_session()


@pytest.fixture(scope="session")
def small_dataset(tmp_path_factory) -> Path:
    """The trainer tests' planted binary dataset (trainer_helpers.SMALL_ROWS, seed 11), written
    once per session: the tests only read it."""
    from trainer.synthetic import write_planted_dataset
    from trainer_helpers import SMALL_ROWS

    path = tmp_path_factory.mktemp("small") / "binary"
    write_planted_dataset(path, SMALL_ROWS, seed=11)
    return path


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
