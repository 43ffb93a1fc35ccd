"""The Spark driver JVM's class-data archive (Java's dynamic AppCDS): its key, where it lives,
when a job uses it, and how it is built.

A JVM that starts Spark loads, parses and verifies some 12,000 classes from Spark's ~280 jars
before the job does anything, and it does so again in every job. A class-data archive holds
those classes already parsed and verified, as the JVM dumped them at the exit of one earlier
run (``-XX:ArchiveClassesAtExit``); a later JVM maps the file instead (``-XX:SharedArchiveFile``).
It changes how classes are loaded, never what they do: results and output are the same.

The JVM checks an archive itself and refuses one made by another JVM build or over other jars,
then starts as it would have without it. Two things it does not check make the rules here: a
named file that is missing or unreadable also switches off the JDK's own base archive (so the
option is given only for a file that is there and made for this JVM and these jars, by its
key), and a truncated file can crash it (so an archive is written under a temporary name and
renamed into place whole). Its messages about archives (``[cds]`` log tags) would land on the
job's stdout; ``-Xlog:cds*=off`` keeps them off, whatever happens to the archive.

``spark.class_archive`` (dlrm_contracts.config.SparkConfig): ``auto`` uses the archive of this
environment's key when it exists, ``off`` none, anything else is the path of an archive to use
when it exists. scripts/install.sh builds it once: ``python -m spark_jobs.build_archive``
(docs/spark_jobs.md, "Start-up: the class-data archive").
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

# Raised when the warm-up job below changes, so that installed archives are rebuilt from it.
RECIPE = "1"
QUIET = "-Xlog:cds*=off"
PREFIX = "spark-driver-"


def default_directory() -> Path:
    """Where the install keeps archives: inside the environment (the venv) whose PySpark they
    were made for, so a new environment starts without stale ones."""
    return Path(sys.prefix) / "share" / "criteo-dlrm"


def java_binary(environment: dict[str, str] | None = None) -> str | None:
    """The java that Spark's launcher runs (spark-class): $JAVA_HOME/bin/java, else the PATH's."""
    env: Mapping[str, str] = os.environ if environment is None else environment
    java_home = env.get("JAVA_HOME")
    if java_home:
        return str(Path(java_home) / "bin" / "java")
    return shutil.which("java", path=env.get("PATH"))


def spark_home() -> Path:
    """PySpark's SPARK_HOME, found as pyspark finds it (the SPARK_HOME variable, else the
    installed package)."""
    from pyspark.find_spark_home import _find_spark_home

    return Path(_find_spark_home())


def java_version(java: str) -> str:
    """``java -version``'s text without lines that depend on this start (``Picked up
    JAVA_TOOL_OPTIONS``) rather than on the JVM's build; with -Xshare:off, whose ", sharing"
    would otherwise come and go."""
    proc = subprocess.run(
        [java, "-Xshare:off", "-version"], capture_output=True, text=True, timeout=60, check=False
    )
    lines = (proc.stderr + proc.stdout).splitlines()
    return "\n".join(line for line in lines if line.strip() and not line.startswith("Picked up"))


def jars_listing(home: Path) -> list[str]:
    """Each jar's name, size and modification time: what the JVM compares an archive's jars by."""
    listing = []
    for jar in sorted((home / "jars").glob("*.jar")):
        st = jar.stat()
        listing.append(f"{jar.name} {st.st_size} {st.st_mtime_ns}")
    return listing


def archive_key(java_path: str, version: str, home: Path, listing: list[str]) -> str:
    """The key of an archive for this JVM build and these jars: a change of either is
    another archive (the JVM would refuse the old one)."""
    parts = [RECIPE, os.path.realpath(java_path), version, os.path.realpath(home), *listing]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def current_key() -> str | None:
    """This environment's key; None without a java or a PySpark with jars to key by."""
    java = java_binary()
    if java is None:
        return None
    try:
        home = spark_home()
        listing = jars_listing(home)
        version = java_version(java)
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    if not listing or not version:
        return None
    return archive_key(java, version, home, listing)


def archive_name(key: str) -> str:
    return f"{PREFIX}{key}.jsa"


def select_archive(setting: str, directory: Path | None = None, key: str | None = None) -> Path | None:
    """The archive a job's driver JVM maps for ``spark.class_archive``, or None.

    ``off``: none. ``auto``: this environment's keyed archive in ``directory`` (the install's by
    default) when it exists. Anything else names an archive, used when it exists (the JVM
    still refuses it silently if it was made for another JVM or other jars)."""
    if setting == "off":
        return None
    if setting != "auto":
        path = Path(setting).expanduser()
        return path if path.is_file() else None
    key = key or current_key()
    if key is None:
        return None
    path = (directory or default_directory()) / archive_name(key)
    return path if path.is_file() else None


def java_options(archive: Path | None) -> str:
    """The JVM options that map ``archive`` and keep its messages off the job's output."""
    if archive is None:
        return ""
    return f"-XX:SharedArchiveFile={shlex.quote(str(archive))} {QUIET}"


def with_archive(settings: dict[str, str], setting: str, directory: Path | None = None) -> dict[str, str]:
    """``settings`` with the archive's options added to the driver's JVM options (after the
    ones already there), when there is an archive to use."""
    options = java_options(select_archive(setting, directory))
    if not options:
        return settings
    current = settings.get("spark.driver.extraJavaOptions", "")
    return {**settings, "spark.driver.extraJavaOptions": f"{current} {options}".strip()}
