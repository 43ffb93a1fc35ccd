"""Spark's Python daemon (``pyspark.daemon``) with the Arrow engine's compiled loops loaded
before it forks the Python workers, and pyspark imported from its installed package.

Without it, every worker imports numba and loads the loops' machine code from its cache itself,
once per run and worker: the same work spent again by every worker. Forked from a daemon that
did it once, the workers start with them in memory. Local mode only (``spark_jobs.session``): a
cluster's executors start their daemon before the job's code reaches them.

Spark puts ``pyspark.zip`` and py4j's zip first on a worker's ``PYTHONPATH``. Imported from
there, pyspark costs every task: Python 3.11's zipimport re-reads a zip's whole directory once
per package imported from it whenever the import caches are invalidated, and pyspark's worker
invalidates them at the start of every task (~50-100 ms of CPU a task for pyspark's 1,200
files); and each module the zip holds is compiled from source by each worker (the zip has no
bytecode). When the same release is installed as a package, the daemon and its workers import
it from there (``prefer_installed_packages``).

Spark also puts its core jar on that path (5,000 Java classes, no Python). The same re-read
at every task's start costs as much again, for an archive no import can use: the daemon drops
from its path every Java archive that holds no Python module (``drop_archives_without_python``).
"""

from __future__ import annotations

import importlib.machinery
import os
import sys
import zipfile

# The zips Spark puts on a worker's path, and the file that names each one's release.
_SPARK_ZIPS = {"pyspark": "pyspark/version.py", "py4j": "py4j/version.py"}


def _zip_package(entry: str) -> str | None:
    """The package a path entry is Spark's zip of (``pyspark.zip``, ``py4j-<v>-src.zip``), if any."""
    name = os.path.basename(entry)
    if name == "pyspark.zip":
        return "pyspark"
    if name.startswith("py4j-") and name.endswith("-src.zip"):
        return "py4j"
    return None


def _same_release_installed(entry: str, package: str, path: list[str]) -> bool:
    """Whether ``package`` is importable from a directory on ``path`` with the release file
    the zip holds, byte for byte (another Spark's zip stays: its workers must match its JVM)."""
    spec = importlib.machinery.PathFinder.find_spec(package, path)
    if spec is None or not spec.submodule_search_locations:
        return False
    installed = os.path.join(os.path.dirname(list(spec.submodule_search_locations)[0]), _SPARK_ZIPS[package])
    try:
        with zipfile.ZipFile(entry) as archive, open(installed, "rb") as own:
            return archive.read(_SPARK_ZIPS[package]) == own.read()
    except (OSError, KeyError, zipfile.BadZipFile):
        return False


def _leave_path(entries: list[str]) -> None:
    """Remove ``entries`` from ``sys.path`` and their importers from the import cache."""
    for entry in entries:
        sys.path.remove(entry)
        sys.path_importer_cache.pop(entry, None)


def prefer_installed_packages() -> list[str]:
    """Drop Spark's zips from ``sys.path`` where the same release is installed; the entries
    dropped. Called before pyspark is imported."""
    directories = [p for p in sys.path if not p.endswith(".zip")]
    dropped = [
        entry
        for entry in sys.path
        if (package := _zip_package(entry)) and _same_release_installed(entry, package, directories)
    ]
    _leave_path(dropped)
    return dropped


def _holds_python(archive: str) -> bool:
    """Whether a zip or jar on the path holds a Python module (zipimport could import it)."""
    try:
        with zipfile.ZipFile(archive) as opened:
            return any(name.endswith((".py", ".pyc")) for name in opened.namelist())
    except (OSError, zipfile.BadZipFile):
        return False


def drop_archives_without_python() -> list[str]:
    """Drop from ``sys.path`` the Java archives (``.jar``) that hold no Python module; the
    entries dropped. Nothing is importable from them, and each costs every task a re-read."""
    dropped = [entry for entry in sys.path if entry.endswith(".jar") and not _holds_python(entry)]
    _leave_path(dropped)
    return dropped


# What every worker of a run imports before its first batch: pyspark's worker and its Arrow
# serializers, pandas (pyarrow imports it to convert a column), and the engine's task modules.
# Imported once here, the forked workers find them loaded.
_WORKER_MODULES = (
    "pyspark.worker",
    "pyspark.sql.pandas.serializers",
    "pandas",
    "pyarrow.parquet",
    "spark_jobs.engines.arrow.tasks",
    "spark_jobs.engines.arrow.split_writer",
)


def _preload() -> None:
    """What the forked workers inherit: the modules each one imports, then the compiled loops.
    A module that fails here is left to the workers, and does not keep the loops unloaded."""
    for module in _WORKER_MODULES:
        try:
            importlib.import_module(module)
        except Exception:  # noqa: BLE001 - a worker that needs it raises the error itself
            pass
    _load_kernels()


def _load_kernels() -> None:
    try:
        from spark_jobs.engines.arrow.kernels import warm_up

        warm_up()
    except Exception:  # noqa: BLE001 - the workers then load them on first use, as on a cluster
        pass


if __name__ == "__main__":
    prefer_installed_packages()
    drop_archives_without_python()
    from pyspark import daemon

    _preload()
    daemon.manager()
