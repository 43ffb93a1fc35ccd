"""Where a long stage is: the record every tool reports, the channel it goes by, its ETA.

Producers (the Spark job's status-tracker thread, the converters, the trainer's rank 0, the
scorer) describe where they are as :class:`Progress` records: the fraction of the stage's work
done (in units roughly proportional to time, so that an ETA can be drawn from it), the phase,
tasks or steps done of total, rows done and the latest metrics. A :class:`Reporter` sends them,
at most one a second, to one sink:

- under the pipeline, a JSON line appended to the stage's channel file, named by
  ``CRITEO_DLRM_PROGRESS_FILE`` in a child's environment (or set with :func:`channel` for a
  stage that runs inside the pipeline's own process), which the pipeline follows with a
  :class:`ChannelReader`;
- run on its own, the display of :mod:`dlrm_contracts.progress_display` on stderr.

The ETA (:class:`StageEstimate`) is the mean rate of the fraction since the first report, so
the start-up before it (a JVM, TensorFlow) does not count; every reader of the records (the
pipeline, a standalone tool, bench/bench_progress.py) draws it the same way from here.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

from dlrm_contracts.config import ProgressConfig

# Set by the pipeline in a child's environment: the file its progress records go to.
PROGRESS_FILE_ENV = "CRITEO_DLRM_PROGRESS_FILE"


@dataclass
class Progress:
    """One report of where a stage is; one JSON line on the channel."""

    stage: str
    fraction: float | None = None  # of the whole stage's work, roughly proportional to time
    phase: str = ""  # count, transform, train, eval test, ...
    detail: str = ""  # e.g. which days
    done: float | None = None  # within the phase, in `unit`
    total: float | None = None
    unit: str = ""
    rows: float | None = None  # rows (samples, lines) of the phase done so far
    rows_unit: str = "rows"
    estimated: bool = False  # rows (and done) estimated, not counted
    metrics: dict[str, Any] = field(default_factory=dict)  # shown as "name value": loss, AUC
    time: float = field(default_factory=time.time)

    def to_line(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"), allow_nan=False, default=str) + "\n"

    @classmethod
    def from_line(cls, line: str) -> Progress | None:
        """The record of one channel line; None for anything else (a foreign or torn line)."""
        try:
            data = json.loads(line)
        except ValueError:
            return None
        if not isinstance(data, dict) or not isinstance(data.get("stage"), str):
            return None
        known = {f.name for f in fields(cls)}
        try:
            return cls(**{k: v for k, v in data.items() if k in known})
        except TypeError:
            return None


# ---------------------------------------------------------------- the channel
class Sink(Protocol):
    def send(self, progress: Progress) -> None: ...


class NullSink:
    def send(self, progress: Progress) -> None:
        pass


class ChannelWriter:
    """Appends records to a channel file, one whole line per write (O_APPEND), so the reader
    never sees two records interleaved. Progress never fails a stage: a write that fails (a
    full disk) turns the channel off with one warning."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        self._failed = False

    def send(self, progress: Progress) -> None:
        if self._failed:
            return
        try:
            # never through a link planted at the channel's name (dlrm_contracts.atomic)
            fd = os.open(
                self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644
            )
            try:
                os.write(fd, progress.to_line().encode())
            finally:
                os.close(fd)
        except (OSError, ValueError) as exc:
            self._failed = True
            print(
                f"progress: channel {self.path} cannot be written ({exc}); progress reports stop",
                file=sys.stderr,
                flush=True,
            )


class ChannelReader:
    """Follows a channel file: each :meth:`read` returns the records of ``stage`` whole since
    the last one, in order (a line still being written waits for the next read)."""

    def __init__(self, path: str | os.PathLike[str], stage: str):
        self.path = Path(path)
        self.stage = stage
        self._offset = 0
        self._partial = b""

    def read(self) -> list[Progress]:
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self._offset)
                data = fh.read()
        except OSError:
            return []
        self._offset += len(data)
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        records = (Progress.from_line(line.decode("utf-8", "replace")) for line in lines)
        return [p for p in records if p is not None and p.stage == self.stage]


_channel_override: Path | None = None


@contextmanager
def channel(path: str | os.PathLike[str]) -> Iterator[None]:
    """Within this block, reporters of this process write to ``path`` (a stage the pipeline
    runs in its own process: its reports take the same road as a child's)."""
    global _channel_override
    previous, _channel_override = _channel_override, Path(path)
    try:
        yield
    finally:
        _channel_override = previous


def channel_sink() -> ChannelWriter | None:
    """The pipeline's channel of this process (set by :func:`channel` or in the environment),
    or None when the tool runs on its own."""
    path = _channel_override or os.environ.get(PROGRESS_FILE_ENV)
    return ChannelWriter(path) if path else None


def default_sink(settings: ProgressConfig | None = None) -> Sink:
    """The channel when there is one (the pipeline's), else a display on stderr."""
    sink = channel_sink()
    if sink is not None:
        return sink
    # imported here: a tool under the pipeline never loads the terminal display
    from dlrm_contracts.progress_display import standalone_sink

    return standalone_sink(settings or ProgressConfig())


# ---------------------------------------------------------------- producers
class Reporter:
    """A producer's handle on its stage: keeps the latest state and sends it to the sink at
    most once every ``min_gap_s`` (a new phase, and ``force``, are sent at once). Closing sends
    a state the gap held back, so the stage's last report is always its last state (a bar
    that ends at 97% of a stage that finished would be a lie)."""

    def __init__(self, stage: str, sink: Sink, min_gap_s: float = 1.0):
        self.state = Progress(stage)
        self.sink = sink
        self.min_gap_s = min_gap_s
        self._sent = 0.0
        self._held_back = False
        self._lock = threading.Lock()

    def report(self, force: bool = False, **changes: Any) -> None:
        with self._lock:
            new_phase = "phase" in changes and changes["phase"] != self.state.phase
            for name, value in changes.items():
                setattr(self.state, name, value)
            now = time.time()
            self._held_back = not (force or new_phase or now - self._sent >= self.min_gap_s)
            if not self._held_back:
                self._send(now)

    def _send(self, now: float) -> None:
        self.state.time = self._sent = now
        self.sink.send(dataclasses.replace(self.state, metrics=dict(self.state.metrics)))

    def close(self, ok: bool = True) -> None:
        with self._lock:
            if self._held_back:
                self._held_back = False
                self._send(time.time())
        close = getattr(self.sink, "close", None)
        if close is not None:
            close(ok)

    def __enter__(self) -> Reporter:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close(ok=exc_type is None)


def open_reporter(stage: str, enabled: bool = True, settings: ProgressConfig | None = None) -> Reporter:
    """The reporter of ``stage``: the channel, a display on stderr, or nothing (disabled)."""
    return Reporter(stage, default_sink(settings) if enabled else NullSink())


class RowCounter:
    """Rows done of a known total: the fraction of a one-phase stage (convert, rethreshold)."""

    def __init__(self, reporter: Reporter, total: float | None, unit: str):
        self.reporter, self.total, self.unit, self.done = reporter, total, unit, 0.0

    def update(self, n: float = 1) -> None:
        self.done += n
        fraction = self.done / self.total if self.total else None
        self.reporter.report(
            done=self.done, total=self.total, rows=self.done, fraction=fraction, force=fraction == 1.0
        )


@contextmanager
def counting(
    stage: str,
    total: float | None,
    unit: str = "rows",
    phase: str = "",
    enabled: bool = True,
    settings: ProgressConfig | None = None,
    rows_unit: str | None = None,
) -> Iterator[RowCounter]:
    """``with counting("convert", rows) as bar: ... bar.update(n)`` reports rows done of
    ``total`` (and, standalone on a terminal, draws the bar)."""
    with open_reporter(stage, enabled, settings) as reporter:
        reporter.report(
            phase=phase,
            unit=unit,
            rows_unit=rows_unit or unit,
            total=total,
            done=0,
            rows=0,
            fraction=0.0 if total else None,
            force=True,
        )
        yield RowCounter(reporter, total, unit)


# ---------------------------------------------------------------- the estimate
class StageEstimate:
    """The ETA and rate of one stage from its reports.

    ETA: the mean rate of the fraction since the first report that had one (so the start-up
    before it is left out), applied to what is left. Rate: rows of the current phase over the
    last ``rate_window_s`` seconds (a phase change starts the window again).
    """

    def __init__(self, stage: str, started: float | None = None, rate_window_s: float = 60.0):
        self.stage = stage
        self.started = time.time() if started is None else started
        self.rate_window_s = rate_window_s
        self.latest: Progress | None = None
        self.received_at: float | None = None  # our clock: when the latest report came
        self._origin: tuple[float, float] | None = None  # (time, fraction) of the first report
        self._rows: deque[tuple[float, float]] = deque()

    def update(self, progress: Progress, now: float | None = None) -> bool:
        """Take a report; True when it starts a new phase."""
        previous = self.latest
        new_phase = previous is None or previous.phase != progress.phase
        self.latest, self.received_at = progress, time.time() if now is None else now
        if progress.fraction is not None:
            went_back = (
                self._origin is not None
                and previous is not None
                and previous.fraction is not None
                and progress.fraction < previous.fraction
            )
            if self._origin is None or went_back:
                self._origin = (progress.time, progress.fraction)
        if new_phase or progress.rows is None or (self._rows and progress.rows < self._rows[-1][1]):
            self._rows.clear()
        if progress.rows is not None:
            self._rows.append((progress.time, progress.rows))
            while len(self._rows) > 2 and self._rows[1][0] <= progress.time - self.rate_window_s:
                self._rows.popleft()
        return new_phase

    def eta(self, now: float | None = None) -> float | None:
        """Seconds left, or None while there is no rate to go by."""
        p = self.latest
        if p is None or p.fraction is None or self._origin is None:
            return None
        t0, f0 = self._origin
        if p.fraction >= 1.0:
            return 0.0
        if p.fraction <= f0 or p.time <= t0:
            return None
        per_second = (p.fraction - f0) / (p.time - t0)
        now = time.time() if now is None else now
        return max(0.0, (1.0 - p.fraction) / per_second - max(0.0, now - p.time))

    def rate(self) -> float | None:
        """Rows per second of the current phase, lately."""
        if len(self._rows) < 2:
            return None
        (t0, r0), (t1, r1) = self._rows[0], self._rows[-1]
        return (r1 - r0) / (t1 - t0) if t1 > t0 else None

    def silent_for(self, now: float) -> float:
        return now - (self.received_at if self.received_at is not None else self.started)
