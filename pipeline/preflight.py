"""Preflight: will this run fit? Disk, memory and time, stated before any stage runs.

It costs seconds, never a Spark job: rows come from the raw files' sizes and the bytes per line
of a sample read from the start of each file (or from the data-quality report of an earlier
count over the same files); disk needs from measured bytes per row (docs/sizing.md); table
sizes, and so embedding memory and checkpoints, from the count histogram when one exists; time
from measured per-core rates (bench/README.md). Each need is set against what is there: free
space on the workdir's filesystem and on ``spark.local.dir``, the machine's memory, and the
output a stage already left (a stage that is done needs nothing new).

A shortfall refuses the run up front with exit 4 and one line; ``--force`` runs anyway.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dlrm_contracts.binary_format import cat_dtype
from dlrm_contracts.config import OPTIMIZER_STATE_FACTOR, PipelineConfig
from dlrm_contracts.errors import ExitCode, PipelineError
from dlrm_contracts.layout import DATASET_JSON, WorkdirLayout, histogram_path
from dlrm_contracts.schema import CAT_COLUMNS, NUM_INTEGER
from dlrm_contracts.table_sizes import read_histogram
from pipeline.diskspace import free_bytes, human, same_filesystem
from pipeline.fingerprint import input_fingerprint
from pipeline.hosts import horovodrun_hosts
from pipeline.manifest import ManifestStore, read_record
from spark_jobs.errors import PreprocessInputError
from spark_jobs.inputs import UnreadableSample, bytes_per_line, discover_days
from spark_jobs.session import local_cores
from trainer.dims import PRESETS, dense_parameters, model_dims
from trainer.placement import plan_placement


def preflight_failed(shortfall: str) -> PipelineError:
    return PipelineError(f"preflight: {shortfall} (--force runs anyway)", ExitCode.INPUT_DATA,
                         kind="preflight")


# ---------------------------------------------------------------- small readers
_JVM_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)b?\s*$", re.IGNORECASE)


def jvm_bytes(size: str | None) -> int | None:
    """'12g' -> bytes (JVM size syntax: k, m, g, t; no unit = bytes)."""
    match = _JVM_SIZE.match(str(size or ""))
    if not match:
        return None
    scale = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}[match.group(2).lower()]
    return int(float(match.group(1)) * scale)


def memory_info() -> dict[str, int]:
    """MemTotal and MemAvailable in bytes (Linux); sysconf's total elsewhere."""
    info: dict[str, int] = {}
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                if key in ("MemTotal", "MemAvailable"):
                    info[key] = int(value.split()[0]) * 1024
    except OSError:
        pass
    if "MemTotal" not in info:
        info["MemTotal"] = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    info.setdefault("MemAvailable", info["MemTotal"])
    return info


def tree_bytes(path: Path) -> int:
    """Bytes of the files under ``path`` (what an artifact already occupies)."""
    path = Path(path)
    if path.is_file():
        return path.stat().st_size
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                continue
    return total


def spark_local_dirs(config: PipelineConfig) -> list[Path]:
    """Where a local Spark job writes its shuffle files, in Spark's own order of precedence.

    Empty for a cluster master: the executors' own disks take the shuffle there.
    """
    if not config.spark.master.startswith("local"):
        return []
    conf = config.spark.conf or {}
    value = (os.environ.get("SPARK_LOCAL_DIRS") or conf.get("spark.local.dir")
             or config.spark.local_dir or tempfile.gettempdir())
    return [Path(p) for p in str(value).split(",") if p]


# ---------------------------------------------------------------- the estimate
@dataclass
class Estimate:
    lines: list[str] = field(default_factory=list)
    shortfalls: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)

    def say(self, text: str) -> None:
        self.lines.append(text)


def _input_rows(config: PipelineConfig, layout: WorkdirLayout, est: Estimate,
                generated: bool) -> tuple[int | None, int | None, int]:
    """(rows, rows of the last day, raw bytes); rows None when they cannot be told."""
    pre = config.preflight
    if generated:
        g = config.generator
        days = min(g.days, config.preprocess.window_days or g.days)  # the window's days
        rows = days * g.rows_per_day
        raw_bytes = int(g.days * g.rows_per_day * pre.generated_bytes_per_row)
        window = (f"; the newest {days} (preprocess.window_days): {rows:,} rows"
                  if days < g.days else "")
        est.say(f"input: generated, {g.days} days x {g.rows_per_day:,} rows = "
                f"{g.days * g.rows_per_day:,} rows (~{human(raw_bytes)} of text, written to the "
                f"workdir){window}")
        return rows, g.rows_per_day, raw_bytes

    raw = Path(config.input).resolve()
    try:
        days = discover_days(raw, config.preprocess.window_days)
    except PreprocessInputError as exc:
        est.say(f"input: {exc} (the preprocess stage will refuse it)")
        return None, None, 0
    raw_bytes = sum(d.path.stat().st_size for d in days)
    counted = _counted_rows(layout, raw, days)
    if counted is not None:
        rows, last = counted
        est.say(f"input: {len(days)} day files, {human(raw_bytes)}, {rows:,} rows "
                "(counted by the last preprocess run)")
        return rows, last, raw_bytes
    per_day = []
    for day in days:
        try:
            per_line = bytes_per_line(day.path, pre.sample_bytes)
        except UnreadableSample as exc:
            # The Spark job refuses it with exit 5 naming the file (spark_jobs.chunks); the
            # preflight says so and sizes the run from the other days.
            est.say(f"input: {exc}: the preprocess stage will refuse it")
            per_line = 0.0
        per_day.append(int(round(day.path.stat().st_size / per_line)) if per_line else 0)
    rows = sum(per_day)
    est.say(f"input: {len(days)} day files, {human(raw_bytes)}, ~{rows:,} rows (estimated "
            f"from bytes per line of the first {human(pre.sample_bytes)} of each file)")
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
    newcomers of days not counted yet."""
    if not histogram_path(layout.counts).is_file():
        return None
    sizes = read_histogram(layout.counts).table_sizes(
        config.preprocess.frequency_threshold)
    out = [int(sizes[c]) for c in CAT_COLUMNS]
    if config.preprocess.ids == "stable" and layout.parquet_model_size.is_file():
        previous = json.loads(layout.parquet_model_size.read_text())
        out = [max(n, int(previous.get(c, 0))) for n, c in zip(out, CAT_COLUMNS)]
    return out


def _binary_bytes_per_row(sizes: list[int] | None, config: PipelineConfig) -> float:
    if sizes is None:
        return config.preflight.binary_bytes_per_row_bound

    return 1 + 2 * NUM_INTEGER + sum(cat_dtype(s).itemsize for s in sizes)


def _dims(config: PipelineConfig):
    dims = model_dims(config.train)
    return dims, dense_parameters(dims)


def _ranks_here(config: PipelineConfig) -> int:
    """Ranks this machine runs (all of them without --hosts)."""
    if not config.launch.hosts:
        return config.launch.np

    local = {"localhost", "127.0.0.1", os.uname().nodename}
    slots = [item.split(":") for item in horovodrun_hosts(config.launch.hosts,
                                                          config.launch.np).split(",")]
    return sum(int(s[1]) if len(s) > 1 else 1 for s in slots if s[0] in local)


# ---------------------------------------------------------------- the checks
def _disk(config: PipelineConfig, layout: WorkdirLayout, est: Estimate, rows: int | None,
          raw_bytes: int, generated: bool, sizes: list[int] | None, state_factor: int) -> None:
    pre, wanted = config.preflight, set(config.stages)
    if rows is None:
        est.say("disk: not estimated (no rows)")
        return
    existing = {name: tree_bytes(path) if path.exists() else 0 for name, path in
                (("raw", layout.raw), ("counts", layout.counts), ("parquet", layout.parquet),
                 ("binary", layout.binary), ("checkpoints", layout.checkpoints))}
    full = {"raw": raw_bytes if generated else 0, "counts": rows * pre.counts_bytes_per_row,
            "parquet": rows * pre.parquet_bytes_per_row,
            "binary": rows * _binary_bytes_per_row(sizes, config)}
    if sizes is not None:
        dims, dense = _dims(config)
        one = (sum(sizes) * (dims.embedding_dim + dims.wide) + dense) * 4 * state_factor
        full["checkpoints"] = one * (config.train.keep_checkpoints + 1)  # + the one being written
    new = {k: max(0.0, v - existing[k]) for k, v in full.items()}
    shuffle = rows * pre.shuffle_bytes_per_row if "preprocess" in wanted else 0.0
    local_dirs = spark_local_dirs(config)
    shuffle_dir = local_dirs[0] if local_dirs else None
    shuffle_on_workdir = shuffle_dir is not None and same_filesystem(shuffle_dir, layout.root)
    # The workdir's use over the run, stage by stage; the peak is what must fit.
    steps = [("generate", ["raw"], 0.0), ("preprocess", ["counts", "parquet"],
                                          shuffle if shuffle_on_workdir else 0.0),
             ("convert", ["binary"], 0.0), ("train", ["checkpoints"], 0.0)]
    grown, peak, peak_at = 0.0, 0.0, "-"
    for stage, artifacts, transient in steps:
        if stage not in wanted or (stage == "generate" and not generated):
            continue
        grown += sum(new.get(a, 0.0) for a in artifacts)
        if grown + transient > peak:
            peak, peak_at = grown + transient, stage
        if not any(a in full for a in artifacts):
            continue
        est.say(f"disk: {stage:<10} + {human(sum(new.get(a, 0.0) for a in artifacts))}"
                + (f" (+ {human(transient)} Spark shuffle while it runs)" if transient else "")
                + "".join(f"; {a} {human(full[a])}" + (f", {human(existing[a])} there"
                                                       if existing[a] else "")
                          + (" (at most: 4-byte ids until the counts exist)"
                             if a == "binary" and sizes is None else "")
                          for a in artifacts if a in full))
        if stage == "convert" and not config.preprocess.keep_parquet:
            grown -= full["parquet"]
            est.say(f"disk: convert    - {human(full['parquet'])} parquet removed after it "
                    "(preprocess.keep_parquet: false)")
    if "train" in wanted and "checkpoints" not in full:
        est.say("disk: train      checkpoints not known until the counts exist (after preprocess)")
    free = free_bytes(layout.root)
    est.facts.update(workdir_peak_bytes=int(peak), workdir_free_bytes=free)
    est.say(f"disk: workdir {layout.root}: needs up to {human(peak)} more (peak during "
            f"{peak_at}), {human(free)} free")
    if peak > free * (1 - pre.disk_headroom):
        est.shortfalls.append(f"the workdir {layout.root} needs {human(peak)} more disk (peak "
                              f"during {peak_at}) but its filesystem has {human(free)} free")
    if shuffle and shuffle_dir is not None and not shuffle_on_workdir:
        free_local = free_bytes(shuffle_dir)
        est.say(f"disk: spark.local.dir {shuffle_dir}: Spark shuffle ~{human(shuffle)}, "
                f"{human(free_local)} free")
        if shuffle > free_local * (1 - pre.disk_headroom):
            est.shortfalls.append(f"spark.local.dir {shuffle_dir} needs ~{human(shuffle)} for "
                                  f"Spark's shuffle but has {human(free_local)} free")
    elif shuffle and shuffle_dir is None:
        est.say(f"disk: Spark shuffle ~{human(shuffle)} on the executors' local disks "
                "(cluster master: not checked here)")


def _memory(config: PipelineConfig, est: Estimate, sizes: list[int] | None,
            state_factor: int) -> None:
    mem = memory_info()
    total, available = mem["MemTotal"], mem["MemAvailable"]
    wanted = set(config.stages)
    if "preprocess" in wanted:
        driver = jvm_bytes(config.spark.driver_memory)
        if config.spark.master.startswith("local"):
            est.say(f"memory: Spark driver (local: runs every task) {config.spark.driver_memory} "
                    f"configured; this machine has {human(total)}, {human(available)} available")
            # A warning, not a refusal: the JVM takes its heap as it needs it, so a small input
            # runs under a large setting; a large one would be killed when the heap fills.
            if driver is not None and driver > available:
                est.warnings.append(f"spark.driver_memory {config.spark.driver_memory} is more "
                                    f"than the {human(available)} of memory available now: a "
                                    "large input would fail when the heap fills")
        else:
            est.say(f"memory: Spark driver {config.spark.driver_memory}, executors "
                    f"{config.spark.executor_memory or 'Spark default'} configured (the cluster "
                    "manager checks what its workers offer)")
    if not ({"train", "eval"} & wanted):
        return
    if sizes is None:
        est.say("memory: embedding tables per rank not known until the counts exist "
                "(after preprocess; then `./run_pipeline.sh plan`)")
        return

    dims, _dense = _dims(config)
    world = config.launch.np
    try:
        split_bytes = config.train.column_split_threshold_mb * 2**20
        placement = plan_placement(sizes, dims.embedding_dim, world,
                                   split_threshold_bytes=split_bytes,
                                   force_split=config.train.force_column_split)
    except ValueError as exc:
        est.shortfalls.append(f"no table placement over {world} ranks: {exc}")
        return
    # + a table's wide weights (one column) on the rank holding its column 0
    per_rank = [sum(p.rows * (p.width + (dims.wide and p.col_start == 0)) for p in pieces)
                * 4 * state_factor for pieces in placement.pieces]
    fullest = max(per_rank)
    if config.preflight.rank_memory_gib is not None:
        budget = config.preflight.rank_memory_gib * 2**30
        where = f"preflight.rank_memory_gib {config.preflight.rank_memory_gib:g} GiB per rank"
    elif _ranks_here(config) == 0:
        est.say(f"memory: embedding tables per rank: fullest {human(fullest)} (planner, "
                f"{world} ranks); the ranks run on other hosts: set preflight.rank_memory_gib "
                "to check it")
        return
    else:
        here = _ranks_here(config)
        budget = total / here
        where = f"this machine's {human(total)} / {here} ranks"
    usable = budget - config.preflight.rank_reserve_gib * 2**30
    est.facts["embedding_bytes_per_rank"] = per_rank
    est.say(f"memory: embedding tables{' + optimizer state' if state_factor > 1 else ''} per rank "
            f"(planner, {world} ranks, dim {dims.embedding_dim}): fullest {human(fullest)}, "
            f"least {human(min(per_rank))}; {where}, {config.preflight.rank_reserve_gib:g} GiB "
            "of it kept for TensorFlow")
    if fullest > usable:
        est.shortfalls.append(f"the fullest rank needs {human(fullest)} for its tables but has "
                              f"{human(max(0, usable))} ({where} less the reserve)")


def _time(config: PipelineConfig, est: Estimate, rows: int | None, test_rows: int | None) -> None:
    if rows is None:
        return
    pre, wanted = config.preflight, set(config.stages)
    cores = os.cpu_count() or 1
    spark_cores = local_cores(config.spark.master)
    parts = []
    if "preprocess" in wanted:
        if spark_cores:
            parts.append(("preprocess", rows / (pre.spark_rows_per_core_s * spark_cores),
                          f"{spark_cores} local cores"))
        else:
            est.say("time: preprocess on the cluster: its cores are not known here "
                    f"(~{rows / pre.spark_rows_per_core_s / 3600:,.1f} core-hours)")
    if "convert" in wanted:
        workers = max(1, min(cores, config.convert.workers))
        parts.append(("convert", rows / (pre.convert_rows_per_core_s * workers),
                      f"{workers} workers"))
    train_rows = rows - (test_rows or 0)
    if {"train", "eval"} & wanted:
        dims, dense = _dims(config)
        # The rates are the default model's: scale by the dense part's size.
        scale = dense_parameters(PRESETS["default"]) / max(1, dense)
        rate = (pre.train_samples_per_core_s_bf16 if config.train.amp
                else pre.train_samples_per_core_s) * scale
        if config.train.max_steps:
            samples = config.train.max_steps * config.train.batch_size
        else:
            samples = train_rows * config.train.epochs
        used = cores  # the ranks on one machine share its cores (intra-op threads = cores / ranks)
        if "train" in wanted:
            how = f"{used} cores of this machine, CPU"
            if not config.train.max_steps:
                how += f", {config.train.epochs} epochs"
                if config.train.early_stopping_patience:
                    how += " at most: early stopping usually ends it sooner"
            parts.append(("train", samples / (rate * used), how))
        if "eval" in wanted and test_rows:
            parts.append(("eval", test_rows / (rate * pre.eval_speedup * used),
                          f"{used} cores, CPU"))
    parts = [(stage, seconds + (pre.spark_startup_s if stage == "preprocess" else
                                pre.trainer_startup_s if stage in ("train", "eval") else 0.0), how)
             for stage, seconds, how in parts]
    for stage, seconds, how in parts:
        est.say(f"time: {stage:<10} ~{_duration(seconds)} ({how}; measured per-core rates)")
    if parts:
        est.say(f"time: total      ~{_duration(sum(s for _, s, _ in parts))} (GPU training, "
                "other CPUs and other loads differ: an order of magnitude, not a promise)")
    est.facts["seconds"] = {stage: round(seconds, 1) for stage, seconds, _ in parts}


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
            dataclasses.replace(config, input=str(layout.raw)), layout, est, False)
    est.facts.update(rows=rows, raw_bytes=raw_bytes)
    try:
        sizes = _table_sizes(config, layout)
    except (OSError, ValueError) as exc:
        est.say(f"tables: counts unreadable ({exc})")
        sizes = None
    if sizes is not None:
        est.say(f"tables: {sum(sizes):,} embedding rows at threshold "
                f"{config.preprocess.frequency_threshold} (from the counts)")
    state_factor = OPTIMIZER_STATE_FACTOR[config.train.optimizer]
    _disk(config, layout, est, rows, raw_bytes, generated, sizes, state_factor)
    _memory(config, est, sizes, state_factor)
    _time(config, est, rows, test_rows)
    return est


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
        _memory(dataclasses.replace(config, stages=["train"]), est, sizes, state_factor)
        dims, dense = _dims(config)
        one = (sum(sizes) * (dims.embedding_dim + dims.wide) + dense) * 4 * state_factor
        need = one * (config.train.keep_checkpoints + 1)
        there = tree_bytes(layout.checkpoints) if layout.checkpoints.exists() else 0
        free = free_bytes(layout.checkpoints)
        est.say(f"disk: checkpoints {human(need)} ({config.train.keep_checkpoints} kept + the one "
                f"being written), {human(there)} there, {human(free)} free")
        if need - there > free * (1 - config.preflight.disk_headroom):
            est.shortfalls.append(f"the checkpoints need {human(need - there)} more disk in "
                                  f"{layout.checkpoints} but its filesystem has {human(free)} free")
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
