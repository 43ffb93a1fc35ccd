"""The pipeline's view of a running stage: its progress shown, its CPU counted.

Every stage has a channel file, ``logs/<stage>.progress.jsonl``: a child finds its path in
``CRITEO_DLRM_PROGRESS_FILE``, a stage run in this process writes it through
``dlrm_contracts.progress.channel``. A :class:`StageWatch` follows that file twice a second and
feeds the run's :class:`~dlrm_contracts.progress_display.Display`: a bar on a terminal, and a
plain line every ``progress.interval_s`` seconds in the run's log (and on stderr when it is not
a terminal), also while the stage reports nothing (start-up, a stage without reports), so a
log never goes quiet for longer. The file stays after the run: the record the ETA is checked
from.

It also counts the stage's CPU seconds on this machine: this process's own, plus its
descendants', from samples process by process while they run and the kernel's figure for the
children that ended (see :class:`CpuMeter`).
"""

from __future__ import annotations

import logging
import resource
import sys
import threading
import time
from contextlib import ExitStack
from pathlib import Path

import psutil

from dlrm_contracts.config import ProgressConfig
from dlrm_contracts.errors import ExitCode
from dlrm_contracts.progress import PROGRESS_FILE_ENV, ChannelReader, Progress, channel
from dlrm_contracts.progress_display import Display

log = logging.getLogger("pipeline")
TICK_SECONDS = 0.5
CPU_SAMPLE_SECONDS = 2.0  # cheap, and a JVM or a rank lives far longer
# A log record carrying this attribute is a progress line: the console leaves it out while a
# bar is on screen (the log file keeps it).
PROGRESS_RECORD = "progress_line"


def channel_path(logs: Path, stage: str) -> Path:
    return logs / f"{stage}.progress.jsonl"


def _log_line(text: str) -> None:
    log.info("%s", text, extra={PROGRESS_RECORD: True})


def make_display(settings: ProgressConfig) -> Display:
    """The run's display: a bar per stage on a terminal, lines to the log (and so to stderr
    when it is not a terminal, where the console handler lets them through)."""
    return Display(sys.stderr, settings, emit=_log_line, bar=settings.bar and sys.stderr.isatty())


class ConsoleFilter(logging.Filter):
    """On the console, progress lines are left out when the display draws a bar instead."""

    def __init__(self, display_has_bar: bool):
        super().__init__()
        self.display_has_bar = display_has_bar

    def filter(self, record: logging.LogRecord) -> bool:
        return not (self.display_has_bar and getattr(record, PROGRESS_RECORD, False))


class BarAwareStreamHandler(logging.StreamHandler):
    """Writes around an open tqdm bar (clears it, writes, redraws) instead of through it."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            from tqdm import tqdm

            tqdm.write(self.format(record), file=self.stream)
        except Exception:  # noqa: BLE001 — logging's own way of reporting a handler's failure
            self.handleError(record)


Key = tuple[int, float]  # (pid, start time): a process, even after its pid is reused


class CpuMeter:
    """CPU seconds used on this machine since it was made, by this process and its descendants.

    Parts that never overlap: this process; the descendants running at the end (their CPU
    since the meter was made); this process's own children that ended meanwhile, which the
    kernel adds to its RUSAGE_CHILDREN when they are waited for, with what their own waited
    children used (so a child that lives between two samples still counts); and the deeper
    descendants that ended under a parent still running (a Python worker under a Spark JVM),
    whose last sample is all there is of them."""

    def __init__(self):
        self._me = psutil.Process()
        self._own = self._own_seconds()
        self._waited = self._children_seconds()
        self._last: dict[Key, tuple[float, int]] = {}  # the last sample: CPU seconds, parent pid
        # Descendants already running (a test's Spark JVM, say) count from now, not from birth.
        self._before = self._descendants()
        self._last.update(self._before)

    def _own_seconds(self) -> float:
        t = self._me.cpu_times()
        return t.user + t.system

    @staticmethod
    def _children_seconds() -> float:
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        return usage.ru_utime + usage.ru_stime

    def _descendants(self) -> dict[Key, tuple[float, int]]:
        """Every descendant running now: its CPU seconds and its parent's pid."""
        found = {}
        for child in self._me.children(recursive=True):
            try:
                with child.oneshot():
                    t = child.cpu_times()
                    found[(child.pid, child.create_time())] = (t.user + t.system, child.ppid())
            except psutil.Error:
                continue
        return found

    def sample(self) -> None:
        self._last.update(self._descendants())

    def seconds(self) -> float:
        running = self._descendants()
        self._last.update(running)

        def since_start(key: Key) -> float:
            return self._last[key][0] - self._before.get(key, (0.0, 0))[0]

        ended = {key: parent for key, (_, parent) in self._last.items() if key not in running}
        own_ended = {key for key, parent in ended.items() if parent == self._me.pid}
        own_ended_pids = {pid for pid, _ in own_ended}
        # Own children already running at the start are in RUSAGE_CHILDREN whole, from birth.
        reaped = (
            self._children_seconds()
            - self._waited
            - sum(self._before[k][0] for k in own_ended & self._before.keys())
        )
        # Under a parent that has ended too, a descendant is in that parent's account already.
        orphaned = sum(
            since_start(key)
            for key, parent in ended.items()
            if key not in own_ended and parent not in own_ended_pids
        )
        still_running = sum(since_start(key) for key in running)
        return round(self._own_seconds() - self._own + still_running + max(reaped, 0.0) + orphaned, 2)


class StageWatch:
    """``with StageWatch(stage, logs, display) as watch:`` run the stage; ``watch.env()`` for
    a child; ``watch.cpu_seconds`` afterwards."""

    def __init__(self, stage: str, logs: Path, display: Display, started: float | None = None):
        self.stage = stage
        self.started = time.time() if started is None else started
        self.path = channel_path(logs, stage)
        self.display = display
        self.cpu_seconds: float | None = None
        self.latest: Progress | None = None
        self._reader = ChannelReader(self.path, stage)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"watch-{stage}", daemon=True)
        self._channel = ExitStack()
        self._cpu: CpuMeter  # from the stage's start (__enter__)

    def env(self) -> dict[str, str]:
        return {PROGRESS_FILE_ENV: str(self.path)}

    def __enter__(self) -> StageWatch:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.write_bytes(b"")  # this run's reports only
        except OSError as exc:
            log.warning(
                "progress channel %s cannot be written (%s): no progress for this "
                "stage beyond its elapsed time",
                self.path,
                exc.strerror or exc,
            )
        self._cpu = CpuMeter()
        self.display.start(self.stage, self.started)
        self._channel.enter_context(channel(self.path))  # stages run in this process report here too
        self._thread.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self._channel.close()
        self._read()
        self.cpu_seconds = self._cpu.seconds()
        interrupted = isinstance(exc, KeyboardInterrupt) or getattr(exc, "code", None) == ExitCode.INTERRUPTED
        outcome = None if exc_type is None else "interrupted" if interrupted else "failed"
        self.display.finish(outcome)

    def _run(self) -> None:
        last_sample = time.time()
        # wakes twice a second, and exactly when a line is due: lines keep their interval
        while not self._stop.wait(min(TICK_SECONDS, self.display.seconds_to_next_line())):
            self._read()
            if time.time() - last_sample >= CPU_SAMPLE_SECONDS:
                last_sample = time.time()
                try:
                    self._cpu.sample()
                except psutil.Error:
                    pass
            self.display.tick()

    def _read(self) -> None:
        """The channel's new records, in order, to the display."""
        for progress in self._reader.read():
            self.latest = progress
            self.display.update(progress)
