"""The preflight's arithmetic: what a run needs of disk, memory and time, as plain figures.

Kept apart from the sentences ``pipeline.preflight`` prints about them, so the rule for each
figure (which stages grow the workdir, when the Spark shuffle counts against it, how a rank's
tables are reckoned) can be read and changed without the prose around it, and a figure can be
tested or reused (``before_train``) without parsing text. Every rate or size per row comes from
``config.preflight`` (docs/sizing.md), so a figure is changed in one place.
"""

from __future__ import annotations

import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

from dlrm_contracts.binary_format import cat_dtype
from dlrm_contracts.config import PipelineConfig
from dlrm_contracts.layout import WorkdirLayout
from dlrm_contracts.schema import CAT_COLUMNS, NUM_INTEGER
from pipeline.calibration import Speed
from pipeline.diskspace import free_bytes, same_filesystem
from pipeline.hosts import horovodrun_hosts
from spark_jobs.session import local_cores
from trainer.dims import PRESETS, dense_parameters, model_dims
from trainer.placement import plan_placement

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
    value = (
        os.environ.get("SPARK_LOCAL_DIRS")
        or conf.get("spark.local.dir")
        or config.spark.local_dir
        or tempfile.gettempdir()
    )
    return [Path(p) for p in str(value).split(",") if p]


def _binary_bytes_per_row(sizes: list[int] | None, config: PipelineConfig) -> float:
    """The binary dataset's bytes per row (k ids per row of a multi-hot column), plus the
    reference's multi-hot layout when convert.formats asks for it (int32 ids, float32 dense,
    int32 label) and TorchRec's one-hot layout (float32 dense, int64 ids, int32 label)."""
    ids = config.convert.multi_hot_sizes or [1] * len(CAT_COLUMNS)
    mlperf = (4 * sum(ids) + 4 * NUM_INTEGER + 4) if "mlperf_multihot" in config.convert.formats else 0
    torchrec = (4 * NUM_INTEGER + 8 * len(CAT_COLUMNS) + 4) if "torchrec" in config.convert.formats else 0
    if sizes is None:
        extra_ids = sum(ids) - len(ids)  # the bound's 4 bytes per id, for the ids beyond one
        return config.preflight.binary_bytes_per_row_bound + 4 * extra_ids + mlperf + torchrec
    return (
        1 + 2 * NUM_INTEGER + sum(cat_dtype(s).itemsize * k for s, k in zip(sizes, ids)) + mlperf + torchrec
    )


def _dims(config: PipelineConfig):
    dims = model_dims(config.train)
    return dims, dense_parameters(dims)


def checkpoint_bytes(config: PipelineConfig, sizes: list[int], state_factor: int) -> float:
    """The checkpoints kept plus the one being written: every weight and its optimizer state."""
    dims, dense = _dims(config)
    one = (sum(sizes) * (dims.embedding_dim + dims.wide) + dense) * 4 * state_factor
    return one * (config.train.keep_checkpoints + 1)


def ranks_here(config: PipelineConfig) -> int:
    """Ranks this machine runs (all of them without --hosts)."""
    if not config.launch.hosts:
        return config.launch.np

    local = {"localhost", "127.0.0.1", os.uname().nodename}
    slots = [item.split(":") for item in horovodrun_hosts(config.launch.hosts, config.launch.np).split(",")]
    return sum(int(s[1]) if len(s) > 1 else 1 for s in slots if s[0] in local)


# ---------------------------------------------------------------- disk
@dataclass(frozen=True)
class StageGrowth:
    """What one stage of the run adds to the workdir for good, and for a while as it runs."""

    stage: str
    artifacts: tuple[str, ...]  # the outputs whose size is known
    added: float
    transient: float


@dataclass(frozen=True)
class DiskNeeds:
    """The workdir's growth over the run, its peak, and the Spark shuffle's own disk."""

    full: dict[str, float]  # each artifact's size once made
    existing: dict[str, int]  # what each occupies now (a stage that is done needs nothing new)
    stages: list[StageGrowth]  # the run's stages whose outputs are known, in run order
    parquet_freed: float | None  # lean mode: the parquet deleted after convert; None = kept
    checkpoints_unknown: bool  # train runs but the tables (so the checkpoints) are not known
    tables_known: bool
    peak: float
    peak_at: str
    free: int
    headroom: float
    shuffle: float  # bytes of Spark shuffle; 0 without the preprocess stage
    partials: float  # the count phase's partial files on the workdir (Arrow engine)
    shuffle_dir: Path | None  # None: a cluster master's executors hold it
    shuffle_on_workdir: bool
    shuffle_free: int | None  # free bytes of shuffle_dir when it is another filesystem
    superseded: int = 0  # bytes of earlier runs' checkpoints set aside (superseded/)

    @property
    def workdir_short(self) -> bool:
        return self.peak > self.free * (1 - self.headroom)

    @property
    def shuffle_short(self) -> bool:
        return self.shuffle_free is not None and self.shuffle > self.shuffle_free * (1 - self.headroom)


def _arrow_engine(config: PipelineConfig) -> bool:
    """Whether preprocess runs the Arrow engine (``auto``: unless the RAPIDS profile is on)."""
    engine = config.preprocess.engine
    return engine == "arrow" or (engine == "auto" and not config.spark.gpu)


def disk_needs(
    config: PipelineConfig,
    layout: WorkdirLayout,
    rows: int,
    raw_bytes: int,
    generated: bool,
    sizes: list[int] | None,
    state_factor: int,
) -> DiskNeeds:
    """The workdir's use stage by stage; the peak (with what preprocess holds while it runs:
    the count phase's partial files, then the shuffle when it shares the workdir's filesystem)
    is what must fit."""
    preflight, wanted, root = config.preflight, set(config.stages), layout.root
    existing = {
        name: tree_bytes(path) if path.exists() else 0
        for name, path in (
            ("raw", layout.raw),
            ("counts", layout.counts),
            ("parquet", layout.parquet),
            ("binary", layout.binary),
            ("checkpoints", layout.checkpoints),
        )
    }
    # earlier runs set aside are not the checkpoints this run writes over: they stay
    superseded = tree_bytes(layout.superseded) if layout.superseded.exists() else 0
    existing["checkpoints"] -= superseded
    full = {
        "raw": raw_bytes if generated else 0,
        "counts": rows * preflight.counts_bytes_per_row,
        "parquet": rows * preflight.parquet_bytes_per_row,
        "binary": rows * _binary_bytes_per_row(sizes, config),
    }
    if sizes is not None:
        full["checkpoints"] = checkpoint_bytes(config, sizes, state_factor)
    new = {k: max(0.0, v - existing[k]) for k, v in full.items()}
    shuffle = rows * preflight.shuffle_bytes_per_row if "preprocess" in wanted else 0.0
    local_dirs = spark_local_dirs(config)
    shuffle_dir = local_dirs[0] if local_dirs else None
    shuffle_on_workdir = shuffle_dir is not None and same_filesystem(shuffle_dir, root)
    partials = (
        rows * preflight.partial_bytes_per_row if "preprocess" in wanted and _arrow_engine(config) else 0.0
    )
    # the partial files are gone before the transform's shuffle is written
    transient = max(partials, shuffle if shuffle_on_workdir else 0.0)
    steps = [
        ("generate", ("raw",), 0.0),
        ("preprocess", ("counts", "parquet"), transient),
        ("convert", ("binary",), 0.0),
        ("train", ("checkpoints",), 0.0),
    ]
    parquet_freed = None if config.preprocess.keep_parquet else full["parquet"]
    grown, peak, peak_at, stages = 0.0, 0.0, "-", []
    for stage, artifacts, transient in steps:
        if stage not in wanted or (stage == "generate" and not generated):
            continue
        added = sum(new.get(a, 0.0) for a in artifacts)
        grown += added
        if grown + transient > peak:
            peak, peak_at = grown + transient, stage
        known = tuple(a for a in artifacts if a in full)
        if not known:
            continue
        stages.append(StageGrowth(stage, known, added, transient))
        if stage == "convert" and parquet_freed is not None:
            grown -= parquet_freed
    own_disk = shuffle and shuffle_dir is not None and not shuffle_on_workdir
    return DiskNeeds(
        full=full,
        existing=existing,
        stages=stages,
        parquet_freed=parquet_freed,
        checkpoints_unknown="train" in wanted and "checkpoints" not in full,
        superseded=superseded,
        tables_known=sizes is not None,
        peak=peak,
        peak_at=peak_at,
        free=free_bytes(root),
        headroom=preflight.disk_headroom,
        shuffle=shuffle,
        partials=partials,
        shuffle_dir=shuffle_dir,
        shuffle_on_workdir=shuffle_on_workdir,
        shuffle_free=free_bytes(shuffle_dir) if own_disk and shuffle_dir is not None else None,
    )


# ---------------------------------------------------------------- memory
@dataclass(frozen=True)
class DriverMemory:
    """The Spark driver's configured heap against this machine (it runs every task in local
    mode; on a cluster the cluster manager checks its workers)."""

    local: bool
    driver_memory: str
    executor_memory: str | None
    driver_bytes: int | None
    total: int
    available: int

    @property
    def more_than_available(self) -> bool:
        return self.local and self.driver_bytes is not None and self.driver_bytes > self.available


@dataclass(frozen=True)
class RankMemory:
    """Embedding tables (and optimizer state) per rank, as the planner places them, against the
    memory a rank has: ``preflight.rank_memory_gib`` or this machine's share."""

    embedding_dim: int
    per_rank: list[int]
    budget: float | None  # None: every rank runs on other hosts and no budget is set
    configured_gib: float | None  # the budget came from preflight.rank_memory_gib
    ranks_here: int
    total: int
    reserve_gib: float

    @property
    def fullest(self) -> int:
        return max(self.per_rank)

    @property
    def usable(self) -> float:
        return (self.budget or 0.0) - self.reserve_gib * 2**30

    @property
    def short(self) -> bool:
        return self.budget is not None and self.fullest > self.usable


@dataclass(frozen=True)
class MemoryNeeds:
    driver: DriverMemory | None  # None: no preprocess stage
    world: int  # ranks of the run
    trains: bool  # train or eval is among the stages
    tables_known: bool
    state_factor: int
    ranks: RankMemory | None  # None: tables not known, or no placement
    placement_error: str | None


def memory_needs(config: PipelineConfig, sizes: list[int] | None, state_factor: int) -> MemoryNeeds:
    mem = memory_info()
    total, available = mem["MemTotal"], mem["MemAvailable"]
    wanted = set(config.stages)
    driver = None
    if "preprocess" in wanted:
        driver = DriverMemory(
            local=config.spark.master.startswith("local"),
            driver_memory=config.spark.driver_memory,
            executor_memory=config.spark.executor_memory,
            driver_bytes=jvm_bytes(config.spark.driver_memory),
            total=total,
            available=available,
        )
    trains = bool({"train", "eval"} & wanted)
    ranks, error = None, None
    if trains and sizes is not None:
        try:
            per_rank = _bytes_per_rank(config, sizes, state_factor)
        except ValueError as exc:  # the planner's reason no placement fits
            error = str(exc)
        else:
            ranks = _rank_memory(config, per_rank, total)
    return MemoryNeeds(driver, config.launch.np, trains, sizes is not None, state_factor, ranks, error)


def _bytes_per_rank(config: PipelineConfig, sizes: list[int], state_factor: int) -> list[int]:
    dims, _dense = _dims(config)
    placement = plan_placement(
        sizes,
        dims.embedding_dim,
        config.launch.np,
        split_threshold_bytes=config.train.column_split_threshold_mb * 2**20,
        force_split=config.train.force_column_split,
    )
    # + a table's wide weights (one column) on the rank holding its column 0
    return [
        sum(p.rows * (p.width + (dims.wide and p.col_start == 0)) for p in pieces) * 4 * state_factor
        for pieces in placement.pieces
    ]


def _rank_memory(config: PipelineConfig, per_rank: list[int], total: int) -> RankMemory:
    configured = config.preflight.rank_memory_gib
    here = ranks_here(config) if configured is None else 0
    if configured is not None:
        budget: float | None = configured * 2**30
    else:
        budget = total / here if here else None
    return RankMemory(
        embedding_dim=model_dims(config.train).embedding_dim,
        per_rank=per_rank,
        budget=budget,
        configured_gib=configured,
        ranks_here=here,
        total=total,
        reserve_gib=config.preflight.rank_reserve_gib,
    )


# ---------------------------------------------------------------- time
@dataclass(frozen=True)
class StageTime:
    stage: str
    seconds: float  # the most it should take: at the calibrated rates, with the stage's start-up
    cores: int  # local cores (preprocess), convert workers, or this machine's cores
    likely: float | None = None  # what it usually takes, when less (early stopping)

    @property
    def expected(self) -> float:
        return self.seconds if self.likely is None else self.likely


@dataclass(frozen=True)
class TimeNeeds:
    stages: list[StageTime]
    cluster_core_hours: float | None  # preprocess on a cluster: its cores are not known here
    epochs: int | None  # what bounds training; None when max_steps does
    early_stopping: bool
    speed: Speed = Speed()
    share: float = 1.0  # of the cores, the least other jobs' load leaves a stage
    load: float | None = None  # the 1-minute load average the shares came from

    @property
    def total(self) -> float:
        return sum(s.seconds for s in self.stages)

    @property
    def expected_total(self) -> float:
        return sum(s.expected for s in self.stages)


def core_share(threads: float, load: float | None) -> float:
    """The share of the cores a stage keeping ``threads`` threads busy gets beside ``load``
    other runnable ones: the kernel shares the cores among runnable threads, not processes,
    so a stage with more threads than cores takes more of a loaded machine."""
    if not load or load <= 0:
        return 1.0
    return min(1.0, threads / (threads + load))


def other_load() -> float | None:
    """The 1-minute load average less the preflight's own process; None where unknown."""
    try:
        return max(0.0, os.getloadavg()[0] - 1.0)
    except OSError:
        return None


def train_core_seconds_per_sample(config: PipelineConfig) -> float:
    """A trained sample's core-seconds on the reference machine: a part that does not depend
    on the model's size, and the rest of the default model's per-sample time scaled by the
    configured dense part's size."""
    preflight = config.preflight
    _, dense = _dims(config)
    default = 1.0 / (
        preflight.train_samples_per_core_s_bf16 if config.train.amp else preflight.train_samples_per_core_s
    )
    overhead = min(preflight.train_overhead_us_per_sample * 1e-6, default)
    return overhead + (default - overhead) * dense / dense_parameters(PRESETS["default"])


def time_needs(
    config: PipelineConfig,
    rows: int,
    test_rows: int | None,
    speed: Speed = Speed(),
    load: float | None = None,
) -> TimeNeeds:
    """Each stage's time at the reference rates scaled by this machine's ``speed`` and by the
    share of its cores that ``load`` (other jobs' runnable threads) leaves."""
    preflight, wanted = config.preflight, set(config.stages)
    cores = os.cpu_count() or 1
    spark_cores = local_cores(config.spark.master)
    load = load if preflight.account_load else None
    parts: list[tuple[str, float, int, float | None]] = []
    cluster_core_hours = None
    startup = {
        "preprocess": preflight.spark_startup_s / speed.parse,
        "convert": preflight.convert_startup_s / speed.convert,
        "train": preflight.trainer_startup_s / speed.train,
        "eval": preflight.trainer_startup_s / speed.train,
    }
    if "preprocess" in wanted:
        rate = preflight.spark_rows_per_core_s * speed.parse
        if spark_cores:
            parts.append(("preprocess", rows / (rate * spark_cores), spark_cores, None))
        else:
            cluster_core_hours = rows / rate / 3600
    if "convert" in wanted:
        workers = max(1, min(cores, config.convert.workers))
        rate = preflight.convert_rows_per_core_s * speed.convert
        parts.append(("convert", rows / (rate * workers), workers, None))
    train_rows = rows - (test_rows or 0)
    if {"train", "eval"} & wanted:
        per_sample = train_core_seconds_per_sample(config) / speed.train
        used = cores  # the ranks on one machine share its cores (intra-op threads = cores / ranks)
        if "train" in wanted:
            bound, likely = _training_seconds(config, train_rows, test_rows or 0, per_sample / used)
            parts.append(("train", bound, used, likely))
        # After a train stage, eval adopts the figures the trainer ends with (no launch)
        # unless --force asks for a fresh evaluation.
        if "eval" in wanted and test_rows and ("train" not in wanted or config.force):
            parts.append(("eval", test_rows * per_sample / (preflight.eval_speedup * used), used, None))
    stages, shares = [], [1.0]
    for stage, seconds, n, likely in parts:
        fixed = startup.get(stage, 0.0)
        # the trainer's ranks keep more threads busy than cores (intra- and inter-op pools,
        # the input pipeline): preflight.train_threads_per_core
        threads = n * preflight.train_threads_per_core if stage in ("train", "eval") else n
        share = core_share(threads, load)
        shares.append(share)
        stages.append(
            StageTime(
                stage, (seconds + fixed) / share, n, None if likely is None else (likely + fixed) / share
            )
        )
    return TimeNeeds(
        stages=stages,
        cluster_core_hours=cluster_core_hours,
        epochs=None if config.train.max_steps else config.train.epochs,
        early_stopping=bool(config.train.early_stopping_patience),
        speed=speed,
        share=min(shares),
        load=load,
    )


def _training_seconds(
    config: PipelineConfig, train_rows: int, test_rows: int, seconds_per_sample: float
) -> tuple[float, float | None]:
    """(the bound, the likely time) of the train stage: its steps (max_steps or every epoch;
    with early stopping, about ``preflight.early_stopping_epochs`` epochs when fewer), the
    validation passes along the way (``evals_per_epoch`` an epoch, at least one; with early
    stopping the last step's too), and the closing evaluation of the test and validation
    splits (the newest day's rows, forward only)."""
    train, preflight = config.train, config.preflight
    every = train_rows / max(1, train.evals_per_epoch)

    def seconds(samples: float) -> float:
        passes = int(samples // every) if every else 0
        passes += bool(train.early_stopping_patience)
        evaluated = passes * test_rows / 2 + test_rows
        return (samples + evaluated / preflight.eval_speedup) * seconds_per_sample

    if train.max_steps:
        return seconds(train.max_steps * train.batch_size), None
    bound = seconds(train_rows * train.epochs)
    likely_epochs = preflight.early_stopping_epochs
    if train.early_stopping_patience and likely_epochs < train.epochs:
        return bound, seconds(train_rows * likely_epochs)
    return bound, None
