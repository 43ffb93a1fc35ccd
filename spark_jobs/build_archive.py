"""``python -m spark_jobs.build_archive``: build the Spark driver JVM's class-data archive for this
environment unless it is there (scripts/install.sh runs it), or print the one a job would use.

The archive is what the driver JVM of one small preprocess job loaded, dumped at the JVM's exit
(spark_jobs/class_archive.py says how jobs use it; docs/spark_jobs.md, "Start-up").
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

from spark_jobs.class_archive import (
    PREFIX,
    QUIET,
    archive_name,
    current_key,
    default_directory,
    select_archive,
)


def build(directory: Path | None = None, timeout: int = 900) -> Path | None:
    """This environment's archive in ``directory``, built unless it is there (None when there
    is nothing to key it by); archives of other keys there are then removed.

    The warm-up job runs in a process of its own, so that its output stays out of the
    caller's; its JVM dumps under a temporary name, renamed into place once that JVM has ended
    well: a truncated archive can crash the JVM that maps it."""
    directory = directory or default_directory()
    key = current_key()
    if key is None:
        return None
    target = directory / archive_name(key)
    if target.is_file():
        return target
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="class-archive-", dir=directory) as work:
        dumped = Path(work) / "dump.jsa"
        proc = subprocess.run(
            [sys.executable, "-m", "spark_jobs.build_archive", "warm-up", str(dumped), work],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if proc.returncode != 0 or not dumped.is_file():
            raise RuntimeError(
                f"the warm-up job exited {proc.returncode} without an archive:\n{proc.stderr[-3000:]}"
            )
        os.replace(dumped, target)
    for stale in directory.glob(f"{PREFIX}*.jsa"):
        if stale != target:
            stale.unlink(missing_ok=True)
    return target


def _warm_up_days(directory: Path) -> Path:
    """Two small days of Criteo lines (label, 13 integers, 26 hex categoricals)."""
    raw = directory / "raw"
    raw.mkdir()
    for day in range(2):
        lines = []
        for row in range(400):
            ints = [str((row * 7 + j) % 50) if (row + j) % 5 else "" for j in range(13)]
            cats = [f"{(row % (j + 3)) * 2654435761 % 2**32:08x}" for j in range(26)]
            lines.append("\t".join([str(row % 2), *ints, *cats]))
        (raw / f"day_{day}").write_text("\n".join(lines) + "\n")
    return raw


def warm_up(dump: Path, directory: Path) -> None:
    """One preprocess job whose driver JVM dumps the classes it loaded to ``dump`` when it
    exits; this returns once that JVM has exited (closing its stdin ends it, as pyspark's
    gateway does when Python goes)."""
    from pyspark import SparkContext

    from dlrm_contracts.config import PreprocessConfig, SparkConfig
    from spark_jobs.preprocess import run_preprocess

    # The optimising JIT's work is not archived: without it the warm-up costs less.
    os.environ["SPARK_SUBMIT_OPTS"] = (
        f"-XX:ArchiveClassesAtExit={shlex.quote(str(dump))} {QUIET} -XX:TieredStopAtLevel=1"
    )
    spark = SparkConfig(master="local[2]", driver_memory="1g", class_archive="off")
    run_preprocess(_warm_up_days(directory), directory / "work", spark, PreprocessConfig())
    gateway = SparkContext._gateway
    context = SparkContext._active_spark_context
    assert gateway is not None and context is not None, "the warm-up job left no Spark gateway"
    context.stop()
    gateway.shutdown()
    gateway.proc.stdin.close()
    gateway.proc.wait(timeout=600)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m spark_jobs.build_archive",
        description="The Spark driver JVM's class-data archive (docs/spark_jobs.md, 'Start-up').",
    )
    parser.add_argument("--dir", type=Path, default=None, help="where it goes (default: the venv's share/)")
    parser.add_argument("--path", action="store_true", help="only print the archive a job would use")
    commands = parser.add_subparsers(dest="command")
    warm = commands.add_parser("warm-up", help=argparse.SUPPRESS)
    warm.add_argument("dump", type=Path)
    warm.add_argument("work", type=Path)
    args = parser.parse_args(argv)
    if args.command == "warm-up":
        warm_up(args.dump, args.work)
        return 0
    key = current_key()
    existing = select_archive("auto", args.dir, key) if key else None
    if existing or args.path:
        print(existing or "none")
        return 0 if existing else 1
    if key:
        print("build_archive: building the Spark driver's class-data archive (once)", file=sys.stderr)
    try:
        archive = build(args.dir)
    except (OSError, RuntimeError, subprocess.SubprocessError) as error:
        print(f"build_archive: not built: {error}", file=sys.stderr)
        return 1
    print(archive or "none: no java or no PySpark jars to key an archive by")
    return 0 if archive else 1


if __name__ == "__main__":
    sys.exit(main())
