"""The local daemon's choice of where pyspark is imported from (spark_jobs/engines/arrow/
python_daemon.py): Spark's zips are dropped from the path only for the release installed."""

from __future__ import annotations

import subprocess
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


def test_java_archives_without_python_are_dropped_and_others_stay(tmp_path, monkeypatch):
    """Spark's core jar (Java classes only) leaves the path; a jar or zip holding Python stays:
    zipimport could import from it."""
    core = next((Path(pyspark.__file__).parent / "jars").glob("spark-core_*.jar"))
    with_python = tmp_path / "with_python.jar"
    with zipfile.ZipFile(with_python, "w") as archive:
        archive.writestr("shipped/__init__.py", "")
    classes_only = tmp_path / "classes.jar"
    with zipfile.ZipFile(classes_only, "w") as archive:
        archive.writestr("org/example/Main.class", b"\xca\xfe\xba\xbe")
    missing = tmp_path / "missing.jar"
    entries = [str(core), str(with_python), str(classes_only), str(missing)]
    monkeypatch.setattr(sys, "path", [*entries, *sys.path])
    assert python_daemon.drop_archives_without_python() == [str(core), str(classes_only), str(missing)]
    assert str(with_python) in sys.path
    assert not any(p in sys.path for p in (str(core), str(classes_only), str(missing)))


def test_the_daemon_loads_every_module_its_workers_import_before_forking():
    """What the daemon runs before ``daemon.manager()`` forks: each module its workers would
    import, in a fresh interpreter (a failed import there is silent by design, so a wrong
    name in the list would go unseen)."""
    probe = (
        "import sys\n"
        "from spark_jobs.engines.arrow import python_daemon as d\n"
        "before = [m for m in d._WORKER_MODULES if m in sys.modules]\n"
        "d._preload()\n"
        "print(before, [m for m in d._WORKER_MODULES if m not in sys.modules])\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "[] []", out.stdout
