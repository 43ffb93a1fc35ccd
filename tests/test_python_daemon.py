"""The local daemon's choice of where pyspark is imported from (spark_jobs/engines/arrow/
python_daemon.py): Spark's zips are dropped from the path only for the release installed."""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path

import pyspark

from spark_jobs.engines.arrow import python_daemon

SPARK_LIB = Path(pyspark.__file__).parent / "python" / "lib"


def _spark_zips() -> list[str]:
    return sorted(str(p) for p in SPARK_LIB.glob("*.zip"))


def test_spark_s_zips_of_the_installed_release_are_dropped(monkeypatch):
    zips = _spark_zips()
    assert len(zips) == 2  # pyspark.zip and py4j-<version>-src.zip, as Spark puts them first
    monkeypatch.setattr(sys, "path", [*zips, *sys.path])
    assert sorted(python_daemon.prefer_installed_packages()) == zips
    assert not any(p in sys.path for p in zips)
    assert not any(p in sys.path_importer_cache for p in zips)


def test_another_release_s_zip_stays(tmp_path, monkeypatch):
    """A zip of another Spark (SPARK_HOME elsewhere) is what its JVM expects: kept."""
    other = tmp_path / "pyspark.zip"
    with zipfile.ZipFile(other, "w") as archive:
        archive.writestr("pyspark/__init__.py", "")
        archive.writestr("pyspark/version.py", '__version__: str = "3.0.0"\n')
    unrelated = tmp_path / "mine.zip"
    with zipfile.ZipFile(unrelated, "w") as archive:
        archive.writestr("mine/__init__.py", "")
    monkeypatch.setattr(sys, "path", [str(other), str(unrelated), *sys.path])
    assert python_daemon.prefer_installed_packages() == []
    assert sys.path[:2] == [str(other), str(unrelated)]
