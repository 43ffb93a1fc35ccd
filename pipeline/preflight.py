"""Preflight: will this run fit? Disk, memory and time, stated before any stage runs.

It costs seconds, never a Spark job: rows come from the raw files' sizes and the bytes per line
of a sample read from the start of each file (or from the data-quality report of an earlier
count over the same files); disk needs from bytes per row (``config.preflight``, docs/sizing.md);
table sizes, and so embedding memory and checkpoints, from the count histogram when one exists;
time from per-core rates (``config.preflight``, scaled to this machine's cores by
``pipeline.calibration``). Each need is set against what is there: free
space on the workdir's filesystem and on ``spark.local.dir``, the machine's memory, and the
output a stage already left (a stage that is done needs nothing new).

A shortfall refuses the run up front with exit 4 and one line; ``--force`` runs anyway.
The figures are worked out in ``pipeline.preflight_needs``; this module gathers the inputs,
puts the figures into the sentences the run prints, and decides.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dlrm_contracts.byte_units import human_bytes
from dlrm_contracts.config import OPTIMIZER_STATE_FACTOR, PipelineConfig, column_caps
from dlrm_contracts.errors import ExitCode, PipelineError
from dlrm_contracts.layout import DATASET_JSON, WorkdirLayout, histogram_path
from dlrm_contracts.schema import CAT_COLUMNS
from dlrm_contracts.table_sizes import read_histogram
from pipeline import calibration
from pipeline.calibration import Speed
from pipeline.diskspace import free_bytes
from pipeline.fingerprint import input_fingerprint
from pipeline.manifest import ManifestStore, read_record
from pipeline.preflight_needs import (
    DiskNeeds,
    DriverMemory,
    MemoryNeeds,
    StageTime,
    TimeNeeds,
    checkpoint_bytes,
    disk_needs,
    memory_needs,
    other_load,
    spark_local_dirs,
    time_needs,
    tree_bytes,
)
from spark_jobs.errors import PreprocessInputError
from spark_jobs.inputs import UnreadableSample, bytes_per_line, discover_days

__all__ = [
    "Estimate",
    "before_train",
    "check",
    "estimate",
    "preflight_failed",
    "report",
    "spark_local_dirs",
    "verdict",
]


def preflight_failed(shortfall: str) -> PipelineError:
    return PipelineError(
        f"preflight: {shortfall} (--force runs anyway)", ExitCode.INPUT_DATA, kind="preflight"
    )


# ---------------------------------------------------------------- the estimate
@dataclass
class Estimate:
    lines: list[str] = field(default_factory=list)
    shortfalls: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)

    def say(self, text: str) -> None:
        self.lines.append(text)


def _input_rows(
    config: PipelineConfig, layout: WorkdirLayout, est: Estimate, generated: bool
) -> tuple[int | None, int | None, int]:
    """(rows, rows of the last day, raw bytes); rows None when they cannot be told."""
    preflight = config.preflight
    if generated:
        g = config.generator
        days = min(g.days, config.preprocess.window_days or g.days)  # the window's days
        rows = days * g.rows_per_day
        raw_bytes = int(g.days * g.rows_per_day * preflight.generated_bytes_per_row)
        window = f"; the newest {days} (preprocess.window_days): {rows:,} rows" if days < g.days else ""
        est.say(
            f"input: generated, {g.days} days x {g.rows_per_day:,} rows = "
            f"{g.days * g.rows_per_day:,} rows (~{human_bytes(raw_bytes)} of text, written to the "
            f"workdir){window}"
        )
        return rows, g.rows_per_day, raw_bytes

    raw = Path(config.input).resolve()
    try:
        days = discover_days(raw, config.preprocess.window_days, config.preprocess.input_link_roots)
    except PreprocessInputError as exc:
        est.say(f"input: {exc} (the preprocess stage will refuse it)")
        return None, None, 0
    raw_bytes = sum(d.path.stat().st_size for d in days)
    counted = _counted_rows(layout, raw, days)
    if counted is not None:
        rows, last = counted
        est.say(
            f"input: {len(days)} day files, {human_bytes(raw_bytes)}, {rows:,} rows "
            "(counted by the last preprocess run)"
        )
        return rows, last, raw_bytes
    per_day = []
    for day in days:
        try:
            per_line = bytes_per_line(day.path, preflight.sample_bytes)
        except UnreadableSample as exc:
            # The Spark job refuses it with exit 5 naming the file
            # (spark_jobs.engines.arrow.chunks); the preflight says so and sizes the run from the
            # other days.
            est.say(f"input: {exc}: the preprocess stage will refuse it")
            per_line = 0.0
        per_day.append(int(round(day.path.stat().st_size / per_line)) if per_line else 0)
    rows = sum(per_day)
    est.say(
        f"input: {len(days)} day files, {human_bytes(raw_bytes)}, ~{rows:,} rows (estimated "
        f"from bytes per line of the first {human_bytes(preflight.sample_bytes)} of each file)"
    )
    return rows, per_day[-1], raw_bytes


def _counted_rows(layout: WorkdirLayout, raw: Path, days) -> tuple[int, int] | None:
    """Rows per day from the data-quality report, when it was made from these very files."""
    manifest = ManifestStore(layout.manifests).load("preprocess") or {}
    quality = read_record(layout.data_quality) or {}
    now = input_fingerprint(raw)
    if manifest.get("inputs", {}).get("raw") != now:
        return None
    per_day = {d.get("file"): d.get("rows_read") for d in quality.get("days", [])}
    if [d.name for d in days] != list(per_day) or None in per_day.values():
        return None
    counts = [int(per_day[d.name]) for d in days]
    return sum(counts), counts[-1]


def _table_sizes(config: PipelineConfig, layout: WorkdirLayout) -> list[int] | None:
    """The tables at the configured threshold, from the counts' histogram. With stable ids a
    table also keeps the ids of values that left the window or became rare, so it is at least
    the last run's size (``parquet/model_size.json``): the larger of the two, short only by the
    newcomers of days not counted yet. Capped ids (``preprocess.ids: modulo``, or contiguous
    with caps): the caps; contiguous ids without caps: not known before their pass (None)."""
    if config.preprocess.caps is not None:
        return list(column_caps(config.preprocess).values())
    if not config.preprocess.mode.counts_values:  # contiguous without caps: sized by its pass
        return None
    if not histogram_path(layout.counts).is_file():
        return None
    sizes = read_histogram(layout.counts).table_sizes(config.preprocess.frequency_threshold)
    out = [int(sizes[c]) for c in CAT_COLUMNS]
    if config.preprocess.mode.grows_tables and layout.parquet_model_size.is_file():
        previous = json.loads(layout.parquet_model_size.read_text())
        out = [max(n, int(previous.get(c, 0))) for n, c in zip(out, CAT_COLUMNS)]
    return out


# ---------------------------------------------------------------- the figures, in words
def _say_disk(est: Estimate, root: Path, needs: DiskNeeds | None) -> None:
    if needs is None:
        est.say("disk: not estimated (no rows)")
        return
    full, existing = needs.full, needs.existing
    for growth in needs.stages:
        est.say(
            f"disk: {growth.stage:<10} + {human_bytes(growth.added)}"
            + (
                f" (+ {human_bytes(growth.transient)} while it runs: the count's partial files, "
                "then Spark's shuffle)"
                if growth.transient
                else ""
            )
            + "".join(
                f"; {a} {human_bytes(full[a])}"
                + (f", {human_bytes(existing[a])} there" if existing[a] else "")
                + (
                    " (at most: 4-byte ids until the counts exist)"
                    if a == "binary" and not needs.tables_known
                    else ""
                )
                for a in growth.artifacts
            )
        )
        if growth.stage == "convert" and needs.parquet_freed is not None:
            est.say(
                f"disk: convert    - {human_bytes(needs.parquet_freed)} parquet removed after it "
                "(preprocess.keep_parquet: false)"
            )
    if needs.checkpoints_unknown:
        est.say("disk: train      checkpoints not known until the counts exist (after preprocess)")
    if needs.superseded:
        est.say(_superseded_words(needs.superseded, root))
    peak, peak_at, free = needs.peak, needs.peak_at, needs.free
    est.facts.update(workdir_peak_bytes=int(peak), workdir_free_bytes=free)
    est.say(
        f"disk: workdir {root}: needs up to {human_bytes(peak)} more (peak during {peak_at}), {human_bytes(free)} free"
    )
    if needs.workdir_short:
        est.shortfalls.append(
            f"the workdir {root} needs {human_bytes(peak)} more disk (peak "
            f"during {peak_at}) but its filesystem has {human_bytes(free)} free"
        )
    shuffle, shuffle_dir = needs.shuffle, needs.shuffle_dir
    if needs.shuffle_free is not None:
        est.say(
            f"disk: spark.local.dir {shuffle_dir}: Spark shuffle ~{human_bytes(shuffle)}, "
            f"{human_bytes(needs.shuffle_free)} free"
        )
        if needs.shuffle_short:
            est.shortfalls.append(
                f"spark.local.dir {shuffle_dir} needs ~{human_bytes(shuffle)} for "
                f"Spark's shuffle but has {human_bytes(needs.shuffle_free)} free"
            )
    elif shuffle and shuffle_dir is None:
        est.say(
            f"disk: Spark shuffle ~{human_bytes(shuffle)} on the executors' local disks "
            "(cluster master: not checked here)"
        )


def _superseded_words(size: int, root: Path) -> str:
    folder = WorkdirLayout.at(root).superseded
    return (
        f"disk: checkpoints set aside (earlier runs, never deleted) hold {human_bytes(size)} in "
        f"{folder}: remove them with: rm -r {folder}"
    )


def _say_memory(est: Estimate, needs: MemoryNeeds) -> None:
    if needs.driver is not None:
        _say_driver(est, needs.driver)
    if not needs.trains:
        return
    if not needs.tables_known:
        est.say(
            "memory: embedding tables per rank not known until the counts exist "
            "(after preprocess; then `./run_pipeline.sh plan`)"
        )
        return
    ranks = needs.ranks
    if ranks is None:
        est.shortfalls.append(f"no table placement over {needs.world} ranks: {needs.placement_error}")
        return
    if ranks.budget is None:
        est.say(
            f"memory: embedding tables per rank: fullest {human_bytes(ranks.fullest)} (planner, "
            f"{needs.world} ranks); the ranks run on other hosts: set "
            "preflight.rank_memory_gib to check it"
        )
        return
    if ranks.configured_gib is not None:
        where = f"preflight.rank_memory_gib {ranks.configured_gib:g} GiB per rank"
    else:
        where = f"this machine's {human_bytes(ranks.total)} / {ranks.ranks_here} ranks"
    est.facts["embedding_bytes_per_rank"] = ranks.per_rank
    est.say(
        f"memory: embedding tables{' + optimizer state' if needs.state_factor > 1 else ''} "
        f"per rank (planner, {needs.world} ranks, dim {ranks.embedding_dim}): fullest "
        f"{human_bytes(ranks.fullest)}, least {human_bytes(min(ranks.per_rank))}; {where}, "
        f"{ranks.reserve_gib:g} GiB of it kept for TensorFlow"
    )
    if ranks.short:
        est.shortfalls.append(
            f"the fullest rank needs {human_bytes(ranks.fullest)} for its tables but "
            f"has {human_bytes(max(0, ranks.usable))} ({where} less the reserve)"
        )


def _say_driver(est: Estimate, driver: DriverMemory) -> None:
    if driver.local:
        est.say(
            f"memory: Spark driver (local: runs every task) {driver.driver_memory} "
            f"configured; this machine has {human_bytes(driver.total)}, {human_bytes(driver.available)} "
            "available"
        )
        # A warning, not a refusal: the JVM takes its heap as it needs it, so a small input
        # runs under a large setting; a large one would be killed when the heap fills.
        if driver.more_than_available:
            est.warnings.append(
                f"spark.driver_memory {driver.driver_memory} is more than the "
                f"{human_bytes(driver.available)} of memory available now: a large "
                "input would fail when the heap fills"
            )
    else:
        est.say(
            f"memory: Spark driver {driver.driver_memory}, executors "
            f"{driver.executor_memory or 'Spark default'} configured (the cluster manager "
            "checks what its workers offer)"
        )


def _say_time(est: Estimate, needs: TimeNeeds | None, config: PipelineConfig) -> None:
    if needs is None:
        return
    if needs.cluster_core_hours is not None:
        est.say(
            "time: preprocess on the cluster: its cores are not known here "
            f"(~{needs.cluster_core_hours:,.1f} core-hours)"
        )
    for part in needs.stages:
        figure = f"~{_duration(part.expected)}"
        if part.likely is not None:
            figure += f", at most ~{_duration(part.seconds)}"
        est.say(f"time: {part.stage:<10} {figure} ({_how(part, needs)})")
    if needs.stages:
        load = (
            f"; the load average {needs.load:.1f} leaves a stage {needs.share:.0%} of the cores or more"
            if needs.share < 1 and needs.load is not None
            else ""
        )
        est.say(
            f"time: total      ~{_duration(needs.expected_total)} ({needs.speed.source}"
            f"{load}; GPUs and load that changes differ)"
        )
    preflight = config.preflight
    est.facts["seconds"] = {part.stage: round(part.expected, 1) for part in needs.stages}
    est.facts["seconds_total"] = round(needs.expected_total, 1)
    # A scheduler's time limit, from the bound; none when a stage's time is not known here.
    est.facts["timeout_s"] = (
        None
        if needs.cluster_core_hours is not None or not needs.stages
        else round(max(preflight.timeout_floor_s, preflight.timeout_factor * needs.total))
    )


def _how(part: StageTime, needs: TimeNeeds) -> str:
    """What a stage's time is reckoned on, and what bounds it."""
    if part.stage == "preprocess":
        return f"{part.cores} local cores"
    if part.stage == "convert":
        return f"{part.cores} workers"
    if part.stage == "eval":
        return f"{part.cores} cores, CPU"
    how = f"{part.cores} cores of this machine, CPU"
    if needs.epochs is not None:
        how += f", {needs.epochs} epochs at most"
        if needs.early_stopping and part.likely is not None:
            how += "; early stopping usually ends it sooner: preflight.early_stopping_epochs"
    return how


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def estimate(config: PipelineConfig) -> Estimate:
    """Every figure of the preflight, and the shortfalls among them."""
    layout = WorkdirLayout.at(config.workdir)
    est = Estimate()
    generated = not config.input and "generate" in config.stages
    rows, test_rows, raw_bytes = (None, None, 0)
    if config.input or generated:
        rows, test_rows, raw_bytes = _input_rows(config, layout, est, generated)
    elif layout.raw.exists():
        rows, test_rows, raw_bytes = _input_rows(
            dataclasses.replace(config, input=str(layout.raw)), layout, est, False
        )
    est.facts.update(rows=rows, raw_bytes=raw_bytes)
    try:
        sizes = _table_sizes(config, layout)
    except (OSError, ValueError) as exc:
        est.say(f"tables: counts unreadable ({exc})")
        sizes = None
    if sizes is not None and config.preprocess.caps is not None:
        est.say(f"tables: {sum(sizes):,} embedding rows (the caps of preprocess.caps)")
    elif sizes is not None:
        est.say(
            f"tables: {sum(sizes):,} embedding rows at threshold "
            f"{config.preprocess.frequency_threshold} (from the counts)"
        )
    state_factor = OPTIMIZER_STATE_FACTOR[config.train.optimizer]
    _say_disk(
        est,
        layout.root,
        None if rows is None else disk_needs(config, layout, rows, raw_bytes, generated, sizes, state_factor),
    )
    _say_memory(est, memory_needs(config, sizes, state_factor))
    _say_time(est, None if rows is None else _time_needs(config, rows, test_rows, est), config)
    return est


def _time_needs(config: PipelineConfig, rows: int, test_rows: int | None, est: Estimate) -> TimeNeeds:
    """The time at this machine's calibrated speed and under its current load."""
    timed = {"preprocess", "convert", "train", "eval"} & set(config.stages)
    speed = calibration.speed(config.preflight, est.warnings.append) if timed else Speed()
    return time_needs(config, rows, test_rows, speed=speed, load=other_load())


def report(config: PipelineConfig, emit) -> Estimate:
    """Print the estimate through ``emit``. A preflight that cannot read something says so and
    lets the run go: the stages report their own errors better."""
    try:
        est = estimate(config)
    except (OSError, ValueError) as exc:
        emit(f"preflight incomplete: {exc}")
        return Estimate()
    for line in est.lines:
        emit(f"preflight {line}")
    for warning in est.warnings:
        emit(f"preflight warning: {warning}")
    return est


def verdict(est: Estimate, config: PipelineConfig, emit) -> None:
    """The one-line refusal on a shortfall, unless ``config.force``."""
    if not est.shortfalls:
        return
    if not config.force:
        raise preflight_failed("; ".join(est.shortfalls))
    for shortfall in est.shortfalls:
        emit(f"preflight shortfall ignored (--force): {shortfall}")


def before_train(config: PipelineConfig, emit) -> None:
    """What the first preflight could not tell before the counts existed: the tables per rank
    and the checkpoints' disk, from the binary dataset the train stage is about to read."""
    layout = WorkdirLayout.at(config.workdir)
    info = read_record(layout.binary / DATASET_JSON) or {}
    sizes = info.get("table_sizes")
    if not isinstance(sizes, list) or len(sizes) != len(CAT_COLUMNS):
        return
    est = Estimate()
    state_factor = OPTIMIZER_STATE_FACTOR[config.train.optimizer]
    try:
        _say_memory(est, memory_needs(dataclasses.replace(config, stages=["train"]), sizes, state_factor))
        need = checkpoint_bytes(config, sizes, state_factor)
        aside = tree_bytes(layout.superseded) if layout.superseded.exists() else 0
        there = (tree_bytes(layout.checkpoints) if layout.checkpoints.exists() else 0) - aside
        free = free_bytes(layout.checkpoints)
        est.say(
            f"disk: checkpoints {human_bytes(need)} ({config.train.keep_checkpoints} kept + the one "
            f"being written), {human_bytes(there)} there, {human_bytes(free)} free"
        )
        if aside:
            est.say(_superseded_words(aside, layout.root))
        if need - there > free * (1 - config.preflight.disk_headroom):
            est.shortfalls.append(
                f"the checkpoints need {human_bytes(need - there)} more disk in "
                f"{layout.checkpoints} but its filesystem has {human_bytes(free)} free"
            )
    except (OSError, ValueError) as exc:
        emit(f"preflight (before train) incomplete: {exc}")
        return
    for line in est.lines:
        emit(f"preflight (before train) {line}")
    verdict(est, config, emit)


def check(config: PipelineConfig, emit) -> Estimate:
    est = report(config, emit)
    verdict(est, config, emit)
    return est
