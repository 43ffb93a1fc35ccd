"""How a stage's progress is shown: a tqdm bar with the ETA on a terminal, plain lines elsewhere.

A :class:`Display` shows one stage at a time from its :class:`~dlrm_contracts.progress.Progress`
records: a bar on a terminal, and a plain line every ``progress.interval_s`` seconds through
``emit`` otherwise (a cron or Airflow log, the run's log file). The pipeline gives it the
records it reads from a stage's channel (pipeline/progress.py); a tool run on its own
(``python -m converters``, ``python -m spark_jobs``, ``python -m trainer.score``) gets one on
its stderr through :func:`standalone_sink`. That second use is why this lives in the
contracts: the wings draw it themselves when no pipeline runs them, and they may not import
the pipeline.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import IO, Any

from dlrm_contracts.config import ProgressConfig
from dlrm_contracts.progress import Progress, StageEstimate


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


# ---------------------------------------------------------------- text
def line(estimate: StageEstimate, now: float | None = None, quiet_after_s: float = 90.0) -> str:
    """The plain line: stage, percent, phase, done of total, rate, metrics, elapsed, ETA."""
    now = time.time() if now is None else now
    head = estimate.stage
    p = estimate.latest
    if p is not None and p.fraction is not None:
        head += f" {100 * min(1.0, p.fraction):3.0f}%"
    return " · ".join([head, *_body(estimate, now, quiet_after_s), *_eta(estimate, now)])


def status(estimate: StageEstimate, now: float | None = None, quiet_after_s: float = 90.0) -> str:
    """A bar's text: the ETA first, so that a narrow terminal cuts the details instead."""
    now = time.time() if now is None else now
    return " · ".join([*_eta(estimate, now), *_body(estimate, now, quiet_after_s)])


def _eta(estimate: StageEstimate, now: float) -> list[str]:
    eta = estimate.eta(now)
    return [] if eta is None else [f"ETA {duration(eta)}"]


def _body(estimate: StageEstimate, now: float, quiet_after_s: float) -> list[str]:
    p = estimate.latest
    parts = ["running"] if p is None else _phase_parts(estimate, p)
    parts.append(f"elapsed {duration(now - estimate.started)}")
    if p is not None and estimate.silent_for(now) > quiet_after_s:
        parts.append(f"no report for {duration(estimate.silent_for(now))}")
    return parts


def _phase_parts(estimate: StageEstimate, p: Progress) -> list[str]:
    parts = []
    label = p.phase if p.phase != estimate.stage else ""  # convert's one phase is convert
    phase = " ".join(x for x in (label, f"({p.detail})" if p.detail else "") if x)
    if p.done is not None:
        approx = "~" if p.estimated and p.unit not in ("tasks", "steps") else ""
        of = f"/{_number(p.total)}" if p.total else ""
        phase = f"{phase} {approx}{_number(p.done)}{of} {p.unit}".strip()
    if phase:
        parts.append(phase)
    rate = estimate.rate() if p.rows else None  # nothing done yet: no rate to speak of
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
        self.quiet_after_s = max(90.0, 3 * settings.interval_s)
        self._lock = threading.RLock()
        self._estimate: StageEstimate | None = None
        self._bar: Any = None  # a _status_bar(), while a stage is shown on a terminal
        self._next_line = 0.0
        self._last_refresh = 0.0

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
            estimate, now = self._shown(), time.time()
            first = estimate.latest is None
            if estimate.update(progress, now) and progress.phase and not first:
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

    def _shown(self) -> StageEstimate:
        assert self._estimate is not None, "a stage is shown (start() came first)"
        return self._estimate

    def _line(self, now: float) -> None:
        if self.emit is not None:
            self.emit(line(self._shown(), now, self.quiet_after_s))

    def _refresh(self, now: float, force: bool = False) -> None:
        if self._bar is None or (not force and now - self._last_refresh < 0.5):
            return
        self._last_refresh = now
        p = self._shown().latest
        if p is not None and p.fraction is not None:
            self._bar.bar_format = "{desc} {percentage:3.0f}%|{bar:20}| {status}"
            self._bar.n = int(1000 * min(1.0, max(0.0, p.fraction)))
        self._bar.status = status(self._shown(), now, self.quiet_after_s)
        self._bar.refresh()


def _terminal_size(stream: IO[str] | None) -> dict[str, Any]:
    """tqdm's size settings: follow the terminal, or fixed ones for a terminal that reports no
    size (a pseudo-terminal nobody sized, where tqdm would draw nothing)."""
    try:
        size = os.get_terminal_size(stream.fileno())  # type: ignore[union-attr]
    except (OSError, ValueError, AttributeError):
        size = os.terminal_size((0, 0))
    if size.columns > 0 and size.lines > 0:
        return {"dynamic_ncols": True}
    return {"ncols": size.columns or 120, "nrows": size.lines or 40}


@functools.cache
def _status_bar() -> type:
    """tqdm with a free text field, ``{status}``, for the bar format (tqdm's own postfix
    comes with a leading comma)."""
    from tqdm import tqdm

    class StatusBar(tqdm):  # type: ignore[misc]  # tqdm ships no types: its class is Any here
        status = ""

        @property
        def format_dict(self) -> dict[str, Any]:
            return {**super().format_dict, "status": self.status}

    return StatusBar


# ---------------------------------------------------------------- a tool on its own
class DisplaySink:
    """A standalone tool's sink: its own display on stderr."""

    def __init__(self, display: Display):
        self.display = display

    def send(self, progress: Progress) -> None:
        self.display.update(progress)

    def close(self, ok: bool = True) -> None:
        """A last line of how far it got, unless it failed (its error line comes next)."""
        self.display.finish(last_line=ok)


def standalone_sink(settings: ProgressConfig) -> DisplaySink:
    """A tool run on its own: a bar on a terminal, plain lines on stderr otherwise."""
    bar = settings.bar and sys.stderr.isatty()
    return DisplaySink(Display(sys.stderr, settings, None if bar else _print_to_stderr, bar=bar))


def _print_to_stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)
