"""Where a long stage is: one record format, one channel, one way to show it.

Producers (the Spark job's status-tracker thread, the converters, the trainer's rank 0, the
scorer) describe where they are as :class:`Progress` records: the fraction of the stage's work
done (in units roughly proportional to time, so that an ETA can be drawn from it), the phase,
tasks or steps done of total, rows done and the latest metrics. A :class:`Reporter` sends them,
at most one a second, to one sink:

- under the pipeline, a JSON line appended to the stage's channel file, named by
  ``CRITEO_DLRM_PROGRESS_FILE`` in a child's environment (or set with :func:`channel` for a
  stage that runs inside the pipeline's own process); the pipeline follows that file and shows
  every stage the same way, whatever tool runs it;
- run on its own, a :class:`Display` on stderr.

A :class:`Display` shows one stage at a time: a tqdm bar with the ETA on a terminal, and a
plain line every ``progress.interval_s`` seconds through ``emit`` otherwise (a cron or Airflow
log, the run's log file). The ETA comes from :class:`StageEstimate`: the mean rate of the
fraction since the first report, so the start-up before it (a JVM, TensorFlow) does not count.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import IO, Any, Callable, Iterator, Protocol

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


class Sink(Protocol):
    def send(self, progress: Progress) -> None: ...


class NullSink:
    def send(self, progress: Progress) -> None:
        pass


class ChannelWriter:
    """Appends records to a channel file, one whole line per write (O_APPEND), so the reader
    never sees two records interleaved. Progress never fails a stage: a write that fails (a
    full disk) turns the channel off with one warning."""

    def __init__(self, path: str | os.PathLike):
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


# ---------------------------------------------------------------- estimates and text
def duration(seconds: float) -> str:
    """1m05s, 2h03m: short enough for a bar."""
    seconds = max(0, int(round(seconds)))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def _number(value: float) -> str:
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}"


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

    def line(self, now: float | None = None, quiet_after_s: float = 90.0) -> str:
        """The plain line: stage, percent, phase, done of total, rate, metrics, elapsed, ETA."""
        now = time.time() if now is None else now
        head = self.stage
        p = self.latest
        if p is not None and p.fraction is not None:
            head += f" {100 * min(1.0, p.fraction):3.0f}%"
        eta = self.eta(now)
        return " · ".join(
            [head, *self._body(now, quiet_after_s), *([f"ETA {duration(eta)}"] if eta is not None else [])]
        )

    def status(self, now: float | None = None, quiet_after_s: float = 90.0) -> str:
        """A bar's text: the ETA first, so that a narrow terminal cuts the details instead."""
        now = time.time() if now is None else now
        eta = self.eta(now)
        return " · ".join(
            [*([f"ETA {duration(eta)}"] if eta is not None else []), *self._body(now, quiet_after_s)]
        )

    def _body(self, now: float, quiet_after_s: float) -> list[str]:
        p = self.latest
        parts = ["running"] if p is None else self._phase_parts(p)
        parts.append(f"elapsed {duration(now - self.started)}")
        if p is not None and self.silent_for(now) > quiet_after_s:
            parts.append(f"no report for {duration(self.silent_for(now))}")
        return parts

    def _phase_parts(self, p: Progress) -> list[str]:
        parts = []
        label = p.phase if p.phase != self.stage else ""  # convert's one phase is convert
        phase = " ".join(x for x in (label, f"({p.detail})" if p.detail else "") if x)
        if p.done is not None:
            approx = "~" if p.estimated and p.unit not in ("tasks", "steps") else ""
            of = f"/{_number(p.total)}" if p.total else ""
            phase = f"{phase} {approx}{_number(p.done)}{of} {p.unit}".strip()
        if phase:
            parts.append(phase)
        rate = self.rate() if p.rows else None  # nothing done yet: no rate to speak of
        if rate is not None:
            parts.append(f"{'~' if p.estimated else ''}{_number(rate)} {p.rows_unit}/s")
        for key, value in p.metrics.items():
            if value is not None:
                shown = f"{value:.5g}" if isinstance(value, float) else str(value)
                parts.append(f"{key} {shown}")
        return parts


# ---------------------------------------------------------------- display
class Display:
    """Shows one stage at a time: a tqdm bar on a terminal, plain lines through ``emit``.

    Plain lines go out when a phase starts (not the first) and on a fixed grid of
    ``interval_s`` seconds from the stage's start (``tick`` must be called then: the pipeline's
    watcher wakes for each point of the grid and twice a second besides; a standalone tool's
    reports call it). ``emit`` is None where nobody wants lines (a terminal with a bar, when
    run standalone). A stage that reported and then says nothing for three intervals (at
    least 90 s) gets "no report for ..." in its lines.
    """

    def __init__(
        self, stream: IO[str] | None, settings: ProgressConfig, emit: Callable[[str], None] | None, bar: bool
    ):
        self.stream = stream
        self.settings = settings
        self.emit = emit
        self.use_bar = bar and stream is not None
        self._lock = threading.RLock()
        self._estimate: StageEstimate | None = None
        self._bar = None
        self._next_line = 0.0
        self._last_refresh = 0.0

    @classmethod
    def for_stderr(cls, settings: ProgressConfig) -> Display:
        """A standalone tool's display: a bar on a terminal, plain lines on stderr otherwise."""
        tty = sys.stderr.isatty()
        return cls(
            sys.stderr, settings, None if tty and settings.bar else _print_to_stderr, bar=tty and settings.bar
        )

    def start(self, stage: str, started: float | None = None) -> None:
        with self._lock:
            self.finish()
            self._estimate = StageEstimate(stage, started, self.settings.rate_window_s)
            self._next_line = self._estimate.started + self.settings.interval_s
            if self.use_bar:
                self._bar = _status_bar()(
                    total=1000,
                    desc=stage,
                    file=self.stream,
                    bar_format="{desc}: {status}",
                    leave=True,
                    mininterval=0,
                    **_terminal_size(self.stream),
                )
                self._refresh(time.time(), force=True)

    def update(self, progress: Progress) -> None:
        with self._lock:
            if self._estimate is None or self._estimate.stage != progress.stage:
                self.start(progress.stage)
            now = time.time()
            first = self._estimate.latest is None
            if self._estimate.update(progress, now) and progress.phase and not first:
                self._line(now)  # a new phase is worth a line of its own
            self.tick(now)

    def seconds_to_next_line(self, now: float | None = None) -> float:
        """How long until the next line is due (a caller's tick can wait exactly that long)."""
        with self._lock:
            if self._estimate is None:
                return self.settings.interval_s
            return max(0.0, self._next_line - (time.time() if now is None else now))

    def tick(self, now: float | None = None) -> None:
        with self._lock:
            if self._estimate is None:
                return
            now = time.time() if now is None else now
            if now >= self._next_line:
                self._line(now)
                # the next point of the grid still ahead (a stalled caller skips, never bunches)
                missed = int((now - self._next_line) // self.settings.interval_s) + 1
                self._next_line += missed * self.settings.interval_s
            self._refresh(now)

    def finish(self, outcome: str | None = None, last_line: bool = False) -> None:
        """Close the stage's bar (its last state stays on screen); ``last_line``: end with a
        line of the last state (a standalone tool, whose caller says nothing after it)."""
        with self._lock:
            if last_line and self._estimate is not None and self._estimate.latest is not None:
                self._line(time.time())
            if self._bar is not None:
                self._refresh(time.time(), force=True)  # the last report, however recent
                if outcome:
                    self._bar.status = f"{self._bar.status} · {outcome}"
                self._bar.close()
                self._bar = None
            self._estimate = None

    @property
    def _quiet_after(self) -> float:
        return max(90.0, 3 * self.settings.interval_s)

    def _line(self, now: float) -> None:
        if self.emit is not None:
            self.emit(self._estimate.line(now, self._quiet_after))

    def _status(self, now: float) -> str:
        return self._estimate.status(now, self._quiet_after)

    def _refresh(self, now: float, force: bool = False) -> None:
        if self._bar is None or (not force and now - self._last_refresh < 0.5):
            return
        self._last_refresh = now
        p = self._estimate.latest
        if p is not None and p.fraction is not None:
            self._bar.bar_format = "{desc} {percentage:3.0f}%|{bar:20}| {status}"
            self._bar.n = int(1000 * min(1.0, max(0.0, p.fraction)))
        self._bar.status = self._status(now)
        self._bar.refresh()


def _terminal_size(stream: IO[str]) -> dict[str, Any]:
    """tqdm's size settings: follow the terminal, or fixed ones for a terminal that reports no
    size (a pseudo-terminal nobody sized, where tqdm would draw nothing)."""
    try:
        size = os.get_terminal_size(stream.fileno())
    except (OSError, ValueError, AttributeError):
        size = os.terminal_size((0, 0))
    if size.columns > 0 and size.lines > 0:
        return {"dynamic_ncols": True}
    return {"ncols": size.columns or 120, "nrows": size.lines or 40}


_STATUS_BAR = None


def _status_bar():
    """tqdm with a free text field, ``{status}``, for the bar format (tqdm's own postfix
    comes with a leading comma)."""
    global _STATUS_BAR
    if _STATUS_BAR is None:
        from tqdm import tqdm

        class StatusBar(tqdm):
            status = ""

            @property
            def format_dict(self):
                return {**super().format_dict, "status": self.status}

        _STATUS_BAR = StatusBar
    return _STATUS_BAR


def _print_to_stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


class DisplaySink:
    """A standalone tool's sink: its own display on stderr."""

    def __init__(self, display: Display):
        self.display = display

    def send(self, progress: Progress) -> None:
        self.display.update(progress)

    def close(self, ok: bool = True) -> None:
        """A last line of how far it got, unless it failed (its error line comes next)."""
        self.display.finish(last_line=ok)


# ---------------------------------------------------------------- producers
_channel_override: Path | None = None


@contextmanager
def channel(path: str | os.PathLike) -> Iterator[None]:
    """Within this block, reporters of this process write to ``path`` (a stage the pipeline
    runs in its own process: its reports take the same road as a child's)."""
    global _channel_override
    previous, _channel_override = _channel_override, Path(path)
    try:
        yield
    finally:
        _channel_override = previous


def default_sink(settings: ProgressConfig | None = None) -> Sink:
    """The channel when there is one (the pipeline's), else a display on stderr."""
    path = _channel_override or os.environ.get(PROGRESS_FILE_ENV)
    if path:
        return ChannelWriter(path)
    return DisplaySink(Display.for_stderr(settings or ProgressConfig()))


class Reporter:
    """A producer's handle on its stage: keeps the latest state and sends it to the sink at
    most once every ``min_gap_s`` (a new phase, and ``force``, are sent at once)."""

    def __init__(self, stage: str, sink: Sink, min_gap_s: float = 1.0):
        self.state = Progress(stage)
        self.sink = sink
        self.min_gap_s = min_gap_s
        self._sent = 0.0
        self._lock = threading.Lock()

    def report(self, force: bool = False, **changes: Any) -> None:
        with self._lock:
            new_phase = "phase" in changes and changes["phase"] != self.state.phase
            for name, value in changes.items():
                setattr(self.state, name, value)
            now = time.time()
            if force or new_phase or now - self._sent >= self.min_gap_s:
                self.state.time = now
                self._sent = now
                sent = {**asdict(self.state), "metrics": dict(self.state.metrics)}
                self.sink.send(Progress(**sent))

    def close(self, ok: bool = True) -> None:
        close = getattr(self.sink, "close", None)
        if close is not None:
            close(ok)

    def __enter__(self) -> Reporter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
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
