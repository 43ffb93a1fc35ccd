"""The Spark driver JVM's class-data archive (spark_jobs/class_archive.py): its key, which
archive a job maps, the options it gets, and that a real JVM stays silent when it refuses one.

A job started with the install's archive gives the same output as without: the suite's own
Spark JVMs run with it when the install has built it (the shared session of
tests/spark_fixtures.py and every `python -m spark_jobs` the tests start).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from dlrm_contracts.config import ConfigError, SparkConfig
from spark_jobs.class_archive import (
    QUIET,
    archive_key,
    archive_name,
    java_binary,
    java_options,
    java_version,
    jars_listing,
    select_archive,
    spark_home,
    with_archive,
)
from spark_jobs.session import JVM_OPTIONS, spark_settings

VERSION = 'openjdk version "17.0.15" 2025-04-15\nOpenJDK 64-Bit Server VM (build 17.0.15+6, mixed mode)'


def _spark_home(tmp_path: Path, jars: dict[str, bytes]) -> Path:
    home = tmp_path / "spark"
    (home / "jars").mkdir(parents=True)
    for name, content in jars.items():
        (home / "jars" / name).write_bytes(content)
    return home


def test_the_key_follows_the_java_build_and_each_jar(tmp_path):
    home = _spark_home(tmp_path, {"spark-core.jar": b"core", "scala-library.jar": b"scala"})
    key = archive_key("/usr/bin/java", VERSION, home, jars_listing(home))
    assert key == archive_key("/usr/bin/java", VERSION, home, jars_listing(home))
    assert key != archive_key(
        "/usr/bin/java", VERSION.replace("17.0.15+6", "17.0.16+8"), home, jars_listing(home)
    )
    assert key != archive_key("/opt/jdk/bin/java", VERSION, home, jars_listing(home))

    jar = home / "jars" / "spark-core.jar"
    jar.write_bytes(b"core, rebuilt")  # another size
    resized = archive_key("/usr/bin/java", VERSION, home, jars_listing(home))
    assert resized != key
    os.utime(jar, ns=(jar.stat().st_atime_ns, jar.stat().st_mtime_ns + 10**9))  # same size, touched
    assert archive_key("/usr/bin/java", VERSION, home, jars_listing(home)) not in (key, resized)
    (home / "jars" / "extra.jar").write_bytes(b"x")
    assert len(jars_listing(home)) == 3


def test_the_key_is_the_same_through_a_symbolic_link_to_the_jars(tmp_path):
    home = _spark_home(tmp_path, {"spark-core.jar": b"core"})
    link = tmp_path / "linked-spark"
    link.symlink_to(home)
    assert archive_key("java", VERSION, link, jars_listing(link)) == archive_key(
        "java", VERSION, home, jars_listing(home)
    )


def test_java_version_leaves_out_what_the_environment_adds():
    java = java_binary()
    assert java is not None
    plain = java_version(java)
    assert plain and "sharing" not in plain
    os.environ["JAVA_TOOL_OPTIONS"] = "-Dsome.property=1"
    try:
        assert java_version(java) == plain
    finally:
        del os.environ["JAVA_TOOL_OPTIONS"]


def test_java_binary_is_the_one_spark_class_runs(tmp_path):
    assert java_binary({"JAVA_HOME": "/opt/jdk-17", "PATH": ""}) == "/opt/jdk-17/bin/java"
    assert java_binary({"PATH": str(tmp_path)}) is None
    fake = tmp_path / "java"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    assert java_binary({"PATH": str(tmp_path)}) == str(fake)


def test_which_archive_a_job_maps(tmp_path):
    archives = tmp_path / "share"
    archives.mkdir()
    mine = archives / archive_name("abc123")
    assert select_archive("auto", archives, key="abc123") is None  # not built: no option at all
    mine.write_bytes(b"archive")
    (archives / archive_name("other")).write_bytes(b"another JVM's")
    assert select_archive("auto", archives, key="abc123") == mine
    assert select_archive("off", archives, key="abc123") is None
    named = tmp_path / "mine.jsa"
    assert select_archive(str(named), archives, key="abc123") is None
    named.write_bytes(b"archive")
    assert select_archive(str(named), archives, key="abc123") == named


def test_the_driver_gets_the_archive_after_its_own_options(tmp_path, monkeypatch):
    settings = spark_settings(SparkConfig())
    assert with_archive(settings, "off") == settings
    assert with_archive(settings, str(tmp_path / "missing.jsa")) == settings
    archive = tmp_path / "dir with space" / "a.jsa"
    archive.parent.mkdir()
    archive.write_bytes(b"archive")
    changed = with_archive(settings, str(archive))
    assert changed["spark.driver.extraJavaOptions"] == (
        f"{JVM_OPTIONS} -XX:SharedArchiveFile='{archive}' -Xlog:cds*=off"
    )
    assert changed["spark.executor.extraJavaOptions"] == JVM_OPTIONS  # other machines' paths
    assert {k: v for k, v in changed.items() if k != "spark.driver.extraJavaOptions"} == {
        k: v for k, v in settings.items() if k != "spark.driver.extraJavaOptions"
    }
    user = with_archive({"spark.master": "local[2]"}, str(archive))
    assert user["spark.driver.extraJavaOptions"] == java_options(archive)


def test_the_setting_is_auto_by_default_and_never_empty():
    assert SparkConfig().class_archive == "auto"
    with pytest.raises(ConfigError, match="spark.class_archive"):
        SparkConfig(class_archive=" ")


def test_build_keeps_an_archive_that_is_there(tmp_path, monkeypatch):
    import spark_jobs.build_archive as build_archive
    from spark_jobs.build_archive import build

    monkeypatch.setattr(build_archive, "current_key", lambda: "abc123")
    present = tmp_path / archive_name("abc123")
    present.write_bytes(b"built before")
    assert build(tmp_path) == present
    assert present.read_bytes() == b"built before"


# ---------------------------------------------------------------- a real JVM


def _launcher(classpath: str, *options: str, cwd: Path) -> str:
    """Spark's launcher (the small first JVM of every spark-submit) from one jar, away from
    its install (it loads its classes, then gives up on finding Spark's jars): its output and
    exit code with ``options``."""
    java = java_binary()
    assert java is not None
    main = ["org.apache.spark.launcher.Main", "org.apache.spark.deploy.SparkSubmit", "pyspark-shell"]
    proc = subprocess.run(
        [java, *options, "-cp", classpath, *main],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        env={**os.environ, "SPARK_HOME": str(cwd)},
        check=False,
    )
    return f"{proc.stdout}{proc.stderr}exit {proc.returncode}"


@pytest.fixture(scope="module")
def small_archive(tmp_path_factory) -> Path:
    """A dynamic archive of the classes Spark's launcher loads from a/launcher.jar (a copy of
    PySpark's); b/launcher.jar is another copy, another classpath."""
    work = tmp_path_factory.mktemp("cds")
    jar = next((spark_home() / "jars").glob("spark-launcher_*.jar"))
    for name in ("a", "b"):
        (work / name).mkdir()
        shutil.copy2(jar, work / name / "launcher.jar")
    archive = work / "small.jsa"
    _launcher("a/launcher.jar", f"-XX:ArchiveClassesAtExit={archive}", QUIET, cwd=work)
    assert archive.stat().st_size > 0
    return archive


def test_a_matching_archive_is_mapped(small_archive):
    options = java_options(small_archive).split()
    loaded = _launcher("a/launcher.jar", *options, "-Xlog:class+load", cwd=small_archive.parent)
    assert "org.apache.spark.launcher.Main source: shared objects file (top)" in loaded


@pytest.mark.parametrize("kind", ["other classpath", "not an archive"])
def test_a_refused_archive_is_silent(small_archive, kind):
    work = small_archive.parent
    archive, classpath = small_archive, "b/launcher.jar"
    if kind == "not an archive":
        archive, classpath = work / "garbage.jsa", "a/launcher.jar"
        archive.write_bytes(os.urandom(4096))
    plain = _launcher(classpath, cwd=work)
    loud = _launcher(classpath, f"-XX:SharedArchiveFile={archive}", cwd=work)
    quiet = _launcher(classpath, *java_options(archive).split(), cwd=work)
    if kind == "other classpath":
        assert "[warning][cds" in loud  # what QUIET keeps off the job's output
    assert quiet == plain
