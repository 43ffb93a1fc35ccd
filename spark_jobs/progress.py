"""The preprocess job's progress: its phase, Spark tasks done, rows/s and the job's fraction.

The job's entry point (spark_jobs/cli.py) makes a :class:`PreprocessProgress` and hands it to
``run_preprocess``; called as a library, the job reports to :data:`NO_PROGRESS`. A thread
beside the session polls Spark's status tracker once a second, and the job says when a phase
starts (``phase(name)``, from preprocess's stage timer). The Spark stages that become
active during a phase count for it. A phase's fraction is its tasks done over those planned:
the input's tasks (one per chunk for the Arrow engine, per file split for the SQL engine) for
the count and the transform, then the transform's one write task per train file; the count's
small stages after its reading go by time (``_Phase``). Rows read are estimated from the
reading tasks done and the input's rows (each file's size over the bytes per line of its
start; once counted, the count). The job's fraction weighs the phases by
``progress.preprocess_phase_shares`` and never goes back.

With stable ids a run reads only part of the window: the count reads the days whose statistics
are not stored, the transform the days that are new or changed role. The job says which once
it knows (``planned``, before the phase reads): the phase then plans on those days' tasks,
rows and names, and its share of the job shrinks with the bytes it reads (the count's merge,
which still covers the window's stored counts, keeps its part), so the bar and its ETA follow
the work that is done, not the window.

Spark's own console bar stays off (``spark.ui.showConsoleProgress``, spark_jobs.session).
Progress never fails the job: a poll that fails is skipped.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from dlrm_contracts.byte_units import human_bytes
from dlrm_contracts.config import PreprocessConfig, ProgressConfig
from dlrm_contracts.layout import WorkdirLayout
from dlrm_contracts.progress import Reporter, open_reporter
from spark_jobs.inputs import DayFile, bytes_per_line, discover_days
from spark_jobs.splits import train_files

POLL_SECONDS = 1.0


class NoProgress:
    """What the job tells its progress, and where nothing listens (run_preprocess called as a
    library, a test): the job reports through one of these, given to it by its caller."""

    def planned(self, name: str, days: list[int], train_days: list[int] | None = None) -> None:
        """The days phase ``name`` reads (stable ids: a part of the window); for the transform,
        also those of them written to train, each into its own files (``train_days``)."""

    def phase(self, name: str) -> None:
        """A phase of the job starts (preprocess's stage timer says so)."""


NO_PROGRESS = NoProgress()


@dataclass(frozen=True)
class _Plan:
    """The days a phase reads, when the job said (else every day of the window)."""

    days: tuple[int, ...]
    train_days: tuple[int, ...] | None


@dataclass
class _Phase:
    """One phase's Spark tasks and how far that puts it.

    The count and the transform first read the input, one task per chunk (``read_tasks``),
    then do the rest: the transform one task per train file (``after_tasks``); the count
    sums, writes and collects in small stages whose number the plan does not know, so their
    progress is the time since the reading ended over the time they should take
    (``progress.preprocess_read_shares`` of the phase is reading). A phase without a plan (the
    dictionaries) goes by its tasks done of those Spark has shown. A running task counts as
    half done: the fraction moves by whole tasks otherwise, and lags by half a wave of them.
    """

    name: str
    detail: str
    read_tasks: int
    after_tasks: int
    rows: float | None  # rows the phase reads
    started: float
    stages: dict[int, tuple[int, int, int]] = field(default_factory=dict)  # id -> (tasks, done, running)
    finished: set[int] = field(default_factory=set)
    read_done_at: float | None = None

    def tasks(self) -> tuple[int, int]:
        """(done, total): the total is the plan, or what Spark showed when that is more."""
        done = sum(d for _, d, _ in self.stages.values())
        seen = sum(n for n, _, _ in self.stages.values())
        return done, max(self.read_tasks + self.after_tasks, seen)

    def work_done(self) -> float:
        """Tasks done, a running one counting half."""
        return sum(d + 0.5 * r for _, d, r in self.stages.values())

    def read_fraction(self) -> float:
        done, _ = self.tasks()
        return min(1.0, done / self.read_tasks) if self.read_tasks else 0.0

    def fraction(self, read_share: float, now: float) -> float:
        """Below 1 while the phase runs (1 only when the next one starts)."""
        _, total = self.tasks()
        done = self.work_done()
        if not self.read_tasks:
            return min(0.99, done / total) if total else 0.0
        if self.read_fraction() < 1.0:
            return read_share * min(1.0, done / self.read_tasks)
        if self.read_done_at is None:
            self.read_done_at = now
        if self.after_tasks:
            after = (done - self.read_tasks) / self.after_tasks
        else:
            reading = max(1e-3, self.read_done_at - self.started)
            after = (now - self.read_done_at) / (reading * (1 - read_share) / read_share)
        return min(0.99, read_share + (1 - read_share) * max(0.0, after))


class PreprocessProgress(NoProgress):
    """``with PreprocessProgress(...) as progress: run_preprocess(..., progress=progress)``:
    reports the job's progress while the thread polls Spark."""

    def __init__(
        self,
        input_dir: str | Path,
        workdir: str | Path,
        cfg: PreprocessConfig,
        settings: ProgressConfig,
        input_tasks: Callable[[list[DayFile]], int],
        sample_bytes: int,
        reporter: Reporter | None = None,
    ):
        self.cfg = cfg
        # a mode that writes no dictionaries (capped ids) has no such phase: its share would
        # keep the job's fraction below 1
        self.shares = {
            name: share
            for name, share in settings.preprocess_phase_shares.items()
            if cfg.mode.dictionaries_dir is not None or name != "dictionaries"
        }
        self.read_shares = settings.preprocess_read_shares
        self.input_tasks = input_tasks  # the engine's tasks reading these days (its plan)
        self.sample_bytes = sample_bytes
        self.layout = WorkdirLayout.at(workdir)
        self.input_dir = input_dir
        self.reporter = reporter or open_reporter("preprocess", settings=settings)
        self.days: list[DayFile] = []
        self.input_rows: float | None = None
        self._day_rows: dict[int, float] = {}  # estimated from each file's size
        self._day_bytes: dict[int, int] = {}
        self._plans: dict[str, _Plan] = {}
        self._current: _Phase | None = None
        self._finished_share = 0.0
        self._finished: set[str] = set()
        self._owner: dict[int, _Phase] = {}
        self._fraction = 0.0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="preprocess-progress", daemon=True)

    # -------------------------------------------------------------- lifetime
    def __enter__(self) -> PreprocessProgress:
        try:
            self.days = discover_days(self.input_dir, self.cfg.window_days, self.cfg.input_link_roots)
            self._day_bytes = {d.day: d.size() for d in self.days}
            self._day_rows = {
                d.day: self._day_bytes[d.day] / bytes_per_line(d.path, self.sample_bytes) for d in self.days
            }
            self.input_rows = sum(self._day_rows.values())
        except Exception:  # noqa: BLE001 — the job itself reports bad input, with its own code
            self.days, self.input_rows, self._day_rows, self._day_bytes = [], None, {}, {}
        self.reporter.report(phase="session", detail="starting Spark", force=True)
        self._thread.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        if exc_type is None:
            with self._lock:
                self._fraction = 1.0
                self.reporter.report(fraction=1.0, force=True)
        self.reporter.close(ok=exc_type is None)

    def _run(self) -> None:
        while not self._stop.wait(POLL_SECONDS):
            try:
                self._poll()
            except Exception:  # noqa: BLE001 — a gateway going away, a stage gone from the store
                pass

    # -------------------------------------------------------------- phases
    def planned(self, name: str, days: list[int], train_days: list[int] | None = None) -> None:
        """The job's plan of a phase; the phase already running is planned again at once."""
        with self._lock:
            self._plans[name] = _Plan(
                tuple(sorted(days)), None if train_days is None else tuple(sorted(train_days))
            )
            current = self._current
            if current is not None and current.name == name:
                current.read_tasks, current.after_tasks = self._planned_tasks(name)
                current.rows, current.detail = self._phase_rows(name), self._detail(name)
                self._send(current, force=True)

    def _phase_days(self, name: str) -> list[DayFile]:
        plan = self._plans.get(name)
        return self.days if plan is None else [d for d in self.days if d.day in plan.days]

    def _share(self, name: str) -> float:
        """The phase's share of the job: the configured one, shrunk with the part of the
        window's bytes it reads when the job planned it on some days only."""
        share = self.shares.get(name, 0.0)
        if name not in self._plans or not self.days:
            return share
        window = sum(self._day_bytes.values())
        read = sum(self._day_bytes.get(d.day, 0) for d in self._phase_days(name))
        part = read / window if window else 1.0
        if name == "count":  # its merge still sums the window's stored counts
            reading = self.read_shares.get(name, 1.0)
            return share * (reading * part + 1 - reading)
        return share * part

    def phase(self, name: str) -> None:
        try:
            self._poll(catch_up=True)  # stages that ran between the last poll and now are this phase's
        except Exception:  # noqa: BLE001 — as in _run: progress never fails the job
            pass
        with self._lock:
            self._end_current()
            read, after = self._planned_tasks(name)
            self._current = _Phase(name, self._detail(name), read, after, self._phase_rows(name), time.time())
            self._send(self._current)

    def _end_current(self) -> None:
        if self._current is not None and self._current.name not in self._finished:
            self._finished.add(self._current.name)
            self._finished_share += self._share(self._current.name)

    @staticmethod
    def _days_text(days: list[DayFile]) -> str:
        if not days:
            return "no day"
        if len(days) == 1:
            return f"day {days[0].day}"
        numbers = [d.day for d in days]
        if numbers == list(range(numbers[0], numbers[-1] + 1)):
            return f"days {numbers[0]}-{numbers[-1]}"
        return "days " + ", ".join(str(n) for n in numbers)

    def _detail(self, name: str) -> str:
        if not self.days:
            return ""
        if name == "count":
            days = self._phase_days(name)
            size = sum(self._day_bytes.get(d.day, 0) for d in days)
            return f"{self._days_text(days)}, {human_bytes(size)}"
        if name == "dictionaries":
            chosen = self.days[:-1] if self.cfg.dictionary_days == "train" else self.days
            return f"from {self._days_text(chosen)}"
        if name == "transform":
            days, last = self._phase_days(name), self.days[-1]
            train = [d for d in days if d.day != last.day]
            text = f"train {self._days_text(train)}" if train else "no train day"
            return text + (f", test/validation day {last.day}" if last in days else "")
        return ""

    def _planned_tasks(self, name: str) -> tuple[int, int]:
        """(tasks reading the input, tasks after them) of the phase."""
        if not self.days or name not in ("count", "transform"):
            return 0, 0
        days = self._phase_days(name)
        read = self.input_tasks(days) if days else 0
        if name == "count":
            return read, 0
        plan = self._plans.get(name)
        if plan is None or plan.train_days is None:  # one write of the window's train rows
            return read, train_files(self.cfg, int(self._counted_train_rows() or 0))
        # stable ids: each train day transformed is written into files of its own
        valid = self._valid_rows_by_day()
        return read, sum(train_files(self.cfg, int(valid.get(day) or 0)) for day in plan.train_days)

    def _counted(self) -> list[dict] | None:
        """The count's rows per day (data_quality.json, written by the count phase)."""
        try:
            report = json.loads(self.layout.data_quality.read_text())
            return sorted(report["days"], key=lambda d: d["day"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def _valid_rows_by_day(self) -> dict[int, float]:
        """Each day's valid rows: counted, or estimated from its file before the count (one
        read of the count's report for all of them)."""
        counted = {d["day"]: d["rows_read"] - d["rows_rejected"] for d in self._counted() or []}
        return {**self._day_rows, **counted}

    def _counted_train_rows(self) -> float | None:
        days = self._counted()
        if days is None:
            return self.input_rows * (1 - 1 / len(self.days)) if self.input_rows else None
        return sum(d["rows_read"] - d["rows_rejected"] for d in days[:-1])

    def _phase_rows(self, name: str) -> float | None:
        if name not in ("count", "transform") or not self.days:
            return None
        wanted = {d.day for d in self._phase_days(name)}
        counted = self._counted() if name == "transform" else None
        if counted:
            return sum(d["rows_read"] for d in counted if d["day"] in wanted)
        return sum(rows for day, rows in self._day_rows.items() if day in wanted)

    # -------------------------------------------------------------- polling
    def _poll(self, catch_up: bool = False) -> None:
        """The current phase's stages from Spark's status tracker. ``catch_up`` (when a phase
        ends): also the stages that started and finished between two polls, which the active
        list never showed (a short phase can run all its jobs within one poll)."""
        from pyspark import SparkContext

        context = SparkContext._active_spark_context
        if context is None:
            return
        tracker = context.statusTracker()
        active = set(tracker.getActiveStageIds())
        seen = set(active)
        if catch_up:
            for job_id in tracker.getJobIdsForGroup():
                job = tracker.getJobInfo(job_id)
                seen.update(job.stageIds if job is not None else ())
        with self._lock:
            current = self._current
            if current is None:
                return
            for stage_id in seen - set(self._owner):
                self._owner[stage_id] = current
            open_ids = [s for s, p in self._owner.items() if p is current and s not in current.finished]
        for stage_id in open_ids:
            info = tracker.getStageInfo(stage_id)
            if info is None:
                continue
            with self._lock:
                current.stages[stage_id] = (info.numTasks, info.numCompletedTasks, info.numActiveTasks)
                if stage_id not in active:
                    current.finished.add(stage_id)
        with self._lock:
            if current is self._current:
                self._send(current, force=catch_up)  # a phase's last state is never throttled away

    @staticmethod
    def _rows_read(phase: _Phase) -> float | None:
        """Rows read so far while the phase reads (after that, no rate to show)."""
        read = phase.read_fraction()
        return None if phase.rows is None or read >= 1.0 else read * phase.rows

    def _send(self, current: _Phase, force: bool = False) -> None:
        """The current phase's state to the reporter (under the lock)."""
        # a phase that reads no input (the dictionaries) has no read share: 1.0 is never used
        within = current.fraction(self.read_shares.get(current.name, 1.0), time.time())
        total_share = sum(self._share(name) for name in self.shares)
        share = 0.0 if current.name in self._finished else self._share(current.name)
        if total_share > 0:
            self._fraction = max(
                self._fraction, min(1.0, (self._finished_share + share * within) / total_share)
            )
        done, total = current.tasks()
        self.reporter.report(
            phase=current.name,
            detail=current.detail,
            done=done,
            total=total or None,
            unit="tasks",
            estimated=True,
            rows=self._rows_read(current),
            fraction=self._fraction,
            force=force,
        )
