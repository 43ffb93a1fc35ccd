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


def prefer_installed_packages() -> list[str]:
    """Drop Spark's zips from ``sys.path`` where the same release is installed; the entries
    dropped. Called before pyspark is imported."""
    directories = [p for p in sys.path if not p.endswith(".zip")]
    dropped = [
        entry
        for entry in sys.path
        if (package := _zip_package(entry)) and _same_release_installed(entry, package, directories)
    ]
    for entry in dropped:
        sys.path.remove(entry)
        sys.path_importer_cache.pop(entry, None)
    return dropped


def _load_kernels() -> None:
    try:
        from spark_jobs.engines.arrow.kernels import warm_up

        warm_up()
    except Exception:  # noqa: BLE001 - the workers then load them on first use, as on a cluster
        pass


if __name__ == "__main__":
    prefer_installed_packages()
    from pyspark import daemon

    _load_kernels()
    daemon.manager()
