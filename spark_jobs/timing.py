"""Wall and CPU seconds of the preprocess job's phases, as ``preprocess.json`` records them.

CPU time is counted over this process and its descendants, which in local mode is the whole
job (the JVM with every executor thread, and the Python workers): the figure the benchmarks
report per million rows (bench/bench_spark.py, bench/bench_arrow_read.py use it too).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from spark_jobs.progress import NO_PROGRESS, NoProgress


def process_tree_cpu_seconds() -> float:
    """CPU seconds used so far by this process and its descendants: in local mode the JVM (every
    executor thread) and the Python workers, i.e. what the job costs on this machine."""
    import psutil

    me = psutil.Process()
    total = 0.0
    for process in [me, *me.children(recursive=True)]:
        try:
            t = process.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
        except psutil.Error:  # ended meanwhile: its parent's children_* will hold it
            pass
    return total


class StageTimer:
    """Wall and CPU seconds per phase (CPU of this machine's processes only: on a cluster the
    executors' CPU is elsewhere). Entering a phase also announces it to the job's ``progress``,
    which the stages also tell what they plan to read (the timer is what they all hold)."""

    def __init__(self, progress: NoProgress = NO_PROGRESS) -> None:
        self.progress = progress
        self.seconds: dict[str, float] = {}
        self.cpu_seconds: dict[str, float] = {}

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        self.progress.phase(name)
        start, cpu = time.perf_counter(), process_tree_cpu_seconds()
        try:
            yield
        finally:
            self.seconds[name] = round(self.seconds.get(name, 0.0) + time.perf_counter() - start, 3)
            self.cpu_seconds[name] = round(
                self.cpu_seconds.get(name, 0.0) + process_tree_cpu_seconds() - cpu, 3
            )
