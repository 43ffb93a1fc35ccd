"""Every setting of the product, typed, in one place.

A run's configuration is a :class:`PipelineConfig`: defaults here, then a YAML file
(``--config FILE``, same section and key names as below), then command-line flags. Each wing
(spark_jobs, converters, trainer, the generator) takes its own section, so no module keeps
constants of its own. ``config_to_dict`` gives the plain form written into manifests.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeGuard, TypeVar

from dlrm_contracts.errors import UsageError
from dlrm_contracts.id_modes import ID_MODE_NAMES, IdMode, id_mode
from dlrm_contracts.security import refuse_secret_settings, refuse_secret_values
from dlrm_contracts.schema import CAT_COLUMNS
from dlrm_contracts.thresholds import ThresholdSpec, ThresholdSpecError, parse_threshold_spec

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

# A settings section: one of the dataclasses below.
Section = TypeVar("Section", bound="DataclassInstance")

# The choices of string settings, checked by the sections' __post_init__.
PREPROCESS_ENGINES: tuple[str, ...] = ("auto", "arrow", "sql")
ARROW_EXCHANGES: tuple[str, ...] = ("auto", "files", "local", "shuffle")
DICTIONARY_DAYS: tuple[str, ...] = ("all", "train")
ID_MODES: tuple[str, ...] = ID_MODE_NAMES  # dlrm_contracts.id_modes
# The largest cap of preprocess.caps: the splits hold int32 ids, so the highest id (cap - 1)
# is 2**31 - 1.
MAX_CAP = 2**31  # dlrm_contracts.binary_format.MAX_TABLE_SIZE
OPTIMIZERS: tuple[str, ...] = ("adagrad", "sgd", "adam")
LEARNING_RATE_SCALINGS: tuple[str, ...] = ("sqrt", "linear", "none")
ROW_L2_SCALINGS: tuple[str, ...] = ("none", "inverse_frequency")
# Copies of every variable an optimizer keeps: the value, + Adagrad's accumulator, + Adam's two
# moments (what the preflight sizes a rank's tables with).
OPTIMIZER_STATE_FACTOR: dict[str, int] = {"sgd": 1, "adagrad": 2, "adam": 3}
DATASET_CHECKS: tuple[str, ...] = ("quick", "full", "none")
# Where a training run starts (train.init) and what a warm start keeps of the optimizer.
TRAIN_INITS: tuple[str, ...] = ("scratch", "previous")
INIT_OPTIMIZERS: tuple[str, ...] = ("continue", "restart")
TRAIN_DAYS: tuple[str, ...] = ("window", "new")  # train.days: the rows a run trains on
# What convert writes (convert.formats): our split binary dataset (always), TorchRec's per-day
# .npy files, the MLPerf DLRMv2 reference's multi-hot layout (docs/converters.md).
CONVERT_FORMATS: tuple[str, ...] = ("binary", "torchrec", "mlperf_multihot")
MULTI_HOT_DISTRIBUTIONS: tuple[str, ...] = ("uniform", "pareto")  # dlrm_contracts.multi_hot's
# train.interaction: the seed's pairwise dot products, or DCNv2's low-rank cross layers (MLPerf
# DLRMv2, trainer/model.py)
INTERACTIONS: tuple[str, ...] = ("dot", "dcn")

# The largest integer the log transform maps to 0 (log(x + 3) is taken only for x > -3).
MISSING_INTEGER_MAX = -3

MODEL_PRESETS: tuple[str, ...] = ("default", "small")  # trainer/dims.py's
PARQUET_CODECS: tuple[str, ...] = ("snappy", "zstd", "gzip", "none", "uncompressed")
SPARK_LOG_LEVELS: tuple[str, ...] = ("ALL", "DEBUG", "ERROR", "FATAL", "INFO", "OFF", "TRACE", "WARN")

STAGES: tuple[str, ...] = ("generate", "preprocess", "convert", "train", "eval", "export", "score")
# What a run without --stages does: export and score are asked for by name (score needs
# --score-input; export is only wanted where the model is served).
DEFAULT_STAGES: tuple[str, ...] = ("generate", "preprocess", "convert", "train", "eval")


@dataclass
class GeneratorConfig:
    """Synthetic Criteo-format data (the embedded default input and the benchmark input).

    The output bytes depend on every field here except ``workers``.
    """

    days: int = 4
    rows_per_day: int = 50_000
    seed: int = 20240601
    # Per-column vocabularies are the Criteo Terabyte ones multiplied by this factor; columns
    # up to cardinality_floor values keep their true size (C6 = 3), mid-sized ones are
    # compressed to floor * (true/floor)^(1/4) if that is larger (C2: 39060 -> 2500), so the
    # order of sizes is kept. At 0.002, C20 (293M) becomes 586k: at 4 x 2M rows the largest
    # tables see 1.5-3.5 x 10^5 distinct values, a few percent of the rows, as in the real logs.
    cardinality_scale: float = 0.002
    cardinality_floor: int = 1000
    zipf_exponent: float = 1.1
    click_rate: float = 0.03
    # Multiplies every planted effect (0 = labels independent of the features).
    signal_strength: float = 1.0
    gzip: bool = False
    gzip_level: int = 1  # the fastest: higher levels shrink this data little for much more CPU
    # Rows per independently seeded block; part of the output's identity, like the seed.
    chunk_rows: int = 65_536
    workers: int = 2
    # Columns drawn uniformly over this many values instead of the Zipf law over their scaled
    # Terabyte vocabulary, e.g. {C1: 2500000}: every value about equally rare, so thresholding
    # keeps millions of values per column, as the Terabyte's big columns do at threshold 15
    # (the preprocessing benchmark's high-cardinality input).
    uniform_columns: dict[str, int] = field(default_factory=dict)
    # Drift across days, e.g. {C3: 0.05}: each day the column's popularity order moves on by
    # that fraction of its values, so values fade and newcomers become frequent day by day, as
    # in the real logs, while each value keeps its effect on the label (what warm-started daily
    # training is judged on). Empty: every day draws from day 0's distribution.
    drift_columns: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Checked before the output directory is touched: a rerun with a typo must not delete
        # the previous output. Salts are derived from the seed's low 64 bits, so a larger seed
        # would share the planted model and hex values of seed % 2**64.
        _check(0 <= self.seed < 2**64, f"seed must be in 0 .. 2**64 - 1, got {self.seed}")
        for name in ("days", "rows_per_day", "workers", "chunk_rows", "cardinality_floor"):
            _check(getattr(self, name) >= 1, f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("cardinality_scale", "zipf_exponent"):
            value = getattr(self, name)
            _check(0 < value < math.inf, f"{name} must be a finite number > 0, got {value}")
        _check(
            math.isfinite(self.signal_strength), f"signal_strength must be finite, got {self.signal_strength}"
        )
        _check(0.0 < self.click_rate < 1.0, f"click_rate must be in (0, 1), got {self.click_rate}")
        _check(not self.gzip or 0 <= self.gzip_level <= 9, f"gzip_level must be 0..9, got {self.gzip_level}")
        for column, size in self.uniform_columns.items():
            _check(column in CAT_COLUMNS, f"uniform_columns: {column!r} is not one of C1..C26")
            _check(
                isinstance(size, int) and 1 <= size <= 2**31 - 1,
                f"uniform_columns: {column} needs a whole number of values in 1 .. 2**31 - 1, got {size!r}",
            )
        for column, rate in self.drift_columns.items():
            _check(column in CAT_COLUMNS, f"drift_columns: {column!r} is not one of C1..C26")
            _check(
                isinstance(rate, (int, float)) and 0.0 <= rate <= 1.0,
                f"drift_columns: {column} needs a fraction of its values per day in 0 .. 1, got {rate!r}",
            )


@dataclass
class SparkConfig:
    """How the Spark session is made: local by default, any cluster with ``master``."""

    master: str = "local[2]"
    driver_memory: str = "12g"
    executor_memory: str | None = None
    app_name: str = "criteo-dlrm-preprocess"
    conf: dict[str, str] = field(default_factory=dict)
    conf_file: str | None = None
    gpu: bool = False
    local_dir: str | None = None
    # spark.sql.shuffle.partitions; 0 = automatic (a few per core in local mode, Spark's own
    # default on a cluster). Adaptive execution coalesces small shuffle partitions either way.
    shuffle_partitions: int = 0
    # Spark's log level: ERROR keeps the CLI output to our own progress lines.
    log_level: str = "ERROR"
    # --gpu (RAPIDS accelerator): the plugin jar path is read from this environment variable.
    gpu_jar_env: str = "SPARK_RAPIDS_PLUGIN_JAR"
    # GPU discovery script (Spark's examples/src/main/scripts/getGpusResources.sh); None = the
    # one under $SPARK_HOME when it exists.
    gpu_discovery_script: str | None = None
    gpu_per_executor: int = 1
    gpu_tasks_per_gpu: int = 4
    gpu_concurrent_tasks: int = 2
    gpu_pinned_pool_size: str = "2g"
    # Security (docs/cluster.md §2.2). The *path* of a file (mode 0600) holding an authenticated
    # cluster's shared secret; set, the job turns on spark.authenticate and hands the secret
    # to its JVM itself. The secret is never a setting: settings are recorded in manifests.
    auth_secret_file: str | None = None
    rpc_encryption: bool = True  # spark.network.crypto.enabled, with auth_secret_file
    io_encryption: bool = False  # spark.io.encryption.enabled: shuffle and spill files
    # The address the driver's RPC endpoint and web UI bind to (SPARK_LOCAL_IP); None = Spark's
    # choice, which for the UI is every interface.
    bind_address: str | None = None
    ui_admin_users: list[str] = field(default_factory=list)  # spark.admin.acls
    ui_view_users: list[str] = field(default_factory=list)  # spark.ui.view.acls
    ui_kill_enabled: bool = False  # spark.ui.killEnabled: kill buttons on the web UI
    # True (--insecure): run off loopback without authentication or RPC encryption, and let
    # the driver's web UI listen off loopback without an authentication filter. Every deploy
    # mode refuses that otherwise (spark_jobs/session.py deploy_security, docs/cluster.md).
    insecure: bool = False
    # A directory (or URL: hdfs://, s3a://) for Spark's event log, which the Spark History
    # Server reads (spark.eventLog.enabled/dir); None = no event log. A local directory is
    # created when missing.
    event_log_dir: str | None = None
    # The driver JVM's class-data archive, which spares each job's JVM most of its start-up
    # (spark_jobs/class_archive.py, docs/spark_jobs.md): auto = the one the install built for
    # this Java and these Spark jars, when it exists; off; or the path of an archive.
    class_archive: str = "auto"

    def __post_init__(self) -> None:
        _check_limits(self)
        # Settings are recorded (effective_config.yaml) and reach the JVM's command line: a
        # secret among them (by name or in a value), or a URL with a password anywhere in this
        # section (an event-log URL), is refused here, before anything is written or started.
        refuse_secret_settings(self.conf or {}, "spark.conf")
        refuse_secret_values(config_to_dict(self), "spark")
        odd = {k: v for k, v in (self.conf or {}).items() if not isinstance(v, (str, int, float))}
        _check(not odd, f"spark.conf: each value must be a string or a number, got {odd}")
        _check(
            isinstance(self.class_archive, str) and bool(self.class_archive.strip()),
            f"spark.class_archive must be auto, off or the path of an archive, got {self.class_archive!r}",
        )


@dataclass
class PreprocessConfig:
    """Counting, dictionaries and the transform to parquet."""

    # The spec, parsed once: YAML and flags give text (``15,C3:3``, or a number), made a
    # ThresholdSpec here, so a bad spec fails at load with one message and every stage reads
    # the same value; written back (effective_config.yaml, show-config) in canonical form.
    frequency_threshold: ThresholdSpec = field(default_factory=lambda: ThresholdSpec(2))
    shuffle_seed: int = 12345
    max_reject_rate: float = 0.01
    # Train parquet files (train rows are hash-partitioned by their seeded key into this many
    # files, so the order depends on it); 0 = one file per `train_rows_per_file` rows. Never
    # derived from Spark settings, so a cluster and a laptop write the same order.
    # Test and validation files follow the read partitions (their order is the line order).
    # With ids: stable each train day is transformed alone, so these count files per day.
    output_files: int = 0
    train_rows_per_file: int = 1_000_000
    # SQL engine: dictionaries with at most this many kept values are broadcast to the
    # transform; larger ones are joined with a shuffle and never collected to the driver. (The
    # Arrow engine joins nothing: every column is looked up in its memory-mapped index.)
    broadcast_max_values: int = 2_000_000
    # parquet compression of the splits (snappy, zstd, none).
    compression: str = "snappy"
    # How the count and transform passes parse lines; both write the same bytes.
    # "arrow": numpy over whole blocks of lines in Python tasks (mapInArrow); the CPU engine.
    # "sql": Spark SQL expressions only; what the RAPIDS accelerator can run on GPUs.
    # "auto": sql with spark.gpu, arrow otherwise.
    engine: str = "auto"
    # Arrow engine: a task reads this many MB of a plain day file (a .gz day is one task),
    # parsing it in blocks of arrow_block_kb of text (small enough to stay in the CPU cache).
    arrow_chunk_mb: int = 256
    arrow_block_kb: int = 1024
    # Arrow engine, a day file behind a URL: its reads grow from 8 MB to this many MB, the next
    # one fetched while the task parses the current one, so a task holds at most twice this.
    # On S3 the reads are pieces of one streamed GET per chunk (one request whatever this
    # size); on GCS, Azure and HDFS each read is a ranged request (a chunk of 256 MB: 7).
    arrow_remote_read_mb: int = 64
    # Arrow engine, a day file behind a URL: the count pass keeps the bytes it read on the
    # executor's local disk (Spark's local directory), and the transform reads that copy
    # instead of the store (any task without one, on another node say, reads the store). At
    # most this many MB of copies per node (0: none); each copy goes once transformed
    # (docs/cluster.md §2.0.2).
    arrow_input_copy_mb: int = 32768
    # A line longer than this many bytes (without its '\n' and a trailing '\r') is rejected as
    # line_too_long, by both engines, before any field is read; the rejects keep at most this
    # many bytes of any rejected line (and its full length). The longest valid Criteo line
    # without zero-padded integers is 510 bytes (13 integers of 20 characters, 26 categoricals
    # of 8, 39 tabs, the label, a '\r'), so 4 KiB rejects no real line while a line with no
    # '\n' (a truncated or foreign file, a decompression bomb) costs the Arrow engine's reader
    # a bounded buffer and linear time, and the rejects a few KiB, whatever its size.
    max_line_bytes: int = 4096
    # Arrow engine: partial counts (distinct values of a chunk) merged by one task at a time:
    # a column with more is split into value ranges. Bounds a Python worker's memory (~40
    # bytes per entry at the merge's peak) whatever the number of distinct values.
    arrow_group_values: int = 2_000_000
    # Arrow engine: how the count tasks hand their partial counts to the merge. "files": one
    # file per chunk in the workdir, read by every merge task by slices (a request per value
    # group and file: fast on a local or shared filesystem). "local": the same files on the
    # local disk of the one host that runs every task (a local master only; no request to the
    # workdir's store). "shuffle": binary rows kept on the executors' local disks and shuffled
    # by Spark (no request to the store; what a cluster of several nodes needs). "auto": files
    # for a workdir path; for a URL, local under a local master, else shuffle
    # (docs/cluster.md §2.0.2).
    arrow_exchange: str = "auto"
    # False: the lean-disk mode. The parquet splits are deleted once the binary dataset made
    # from them is complete and verified (the counts, dictionary sizes and data-quality report
    # stay), saving ~57 bytes per row (231 GB on the Terabyte logs, docs/sizing.md). Raising
    # the threshold still needs no Spark (it derives from the binary dataset and the counts);
    # anything else that needs the parquet again reruns the Spark job.
    keep_parquet: bool = True
    # Which days' counts make the dictionaries (and the count histogram, so the table sizes):
    # "all" (the reference's way: the test/validation day shapes the vocabulary too) or "train"
    # (every day but the last: a value seen only on the last day maps to 0, as it would for
    # data that arrives after training).
    dictionary_days: str = "all"
    # How ids are given. "frequency" (the reference's way): every run numbers the kept values
    # 1..k by count descending, value ascending, so a new day may move every id. "stable" (a
    # scheduled job's way): the workdir's dictionaries are append-only, a value keeps its id in
    # every later run (even once rare) and values that newly pass the threshold get the next
    # free ids, so yesterday's model and datasets stay valid. Stable refuses a threshold change
    # (docs/spark_jobs.md, "Stable ids and a rolling window"). "modulo" (MLPerf DLRMv2's capped
    # ids): a value's id is its hexadecimal value modulo its column's cap (`caps`), missing -> 0;
    # no value is counted and no dictionary is built, and the threshold does not apply
    # (docs/spark_jobs.md, "Capped ids"). "contiguous" (TorchRec's contiguous_preproc_criteo,
    # what the MLPerf DLRMv2 dataset is made with): ids 2, 3, ... by first appearance over the
    # days in order, a value seen fewer than the threshold's times -> 1, missing = hex 0;
    # then modulo `caps` when given (docs/spark_jobs.md, "Contiguous ids").
    ids: str = "frequency"
    # ids: modulo (required) or contiguous (optional): the table size of each column, one
    # integer for all 26 or a list of 26 (1 .. 2**31; the MLPerf DLRMv2 list is in
    # docs/spark_jobs.md).
    caps: int | list[int] | None = None
    # The newest N day files of the input are the data (the newest is test/validation, the
    # others train); older day files are ignored, never deleted. None = every day file. At
    # least 2 (a train day and the test/validation day).
    window_days: int | None = None
    # A day file that is a symbolic link is read only when it points inside the input
    # directory, or inside one of these directories (absolute paths): a link planted in a
    # landing directory must not make the job read (and copy rejected lines of) any file the
    # pipeline's user can read. Empty = inside the input directory only.
    input_link_roots: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        _check(
            all(isinstance(r, str) and Path(r).is_absolute() for r in self.input_link_roots),
            f"preprocess.input_link_roots must be absolute directory paths, got {self.input_link_roots!r}",
        )
        self.frequency_threshold = _threshold("preprocess.frequency_threshold", self.frequency_threshold)
        _check_limits(self)
        _check(0.0 <= self.max_reject_rate <= 1.0, f"max_reject_rate {self.max_reject_rate} is not in [0, 1]")
        _one_of("preprocess.engine", self.engine, PREPROCESS_ENGINES)
        _one_of("preprocess.dictionary_days", self.dictionary_days, DICTIONARY_DAYS)
        _one_of("preprocess.ids", self.ids, ID_MODES)
        _check_caps(self)
        _check(
            self.arrow_group_values >= 1, f"arrow_group_values must be >= 1, got {self.arrow_group_values}"
        )
        _one_of("preprocess.arrow_exchange", self.arrow_exchange, ARROW_EXCHANGES)

    @property
    def mode(self) -> IdMode:
        """The id mode ``ids`` names (dlrm_contracts.id_modes); checked when constructed."""
        return id_mode(self.ids)


def _check_caps(cfg: PreprocessConfig) -> None:
    """Caps go with modulo ids (which need them) or contiguous ids (capped after numbering, as
    the reference's reader does); a setting modulo ids would silently ignore (a threshold,
    dictionary days) is refused rather than dropped."""
    mode = cfg.mode
    if not mode.caps_allowed:
        _check(
            cfg.caps is None,
            f"preprocess.caps is set but preprocess.ids is {cfg.ids!r}: "
            "caps apply only with ids: modulo or contiguous",
        )
        return
    if mode.caps_required:
        _check(
            cfg.caps is not None,
            "preprocess.ids is modulo but preprocess.caps is not set: "
            "give one cap for every column or a list of 26 "
            '(docs/spark_jobs.md, "Capped ids", has MLPerf DLRMv2\'s)',
        )
    if cfg.caps is None:
        return
    caps = cfg.caps if isinstance(cfg.caps, list) else [cfg.caps]
    _check(
        all(isinstance(c, int) and not isinstance(c, bool) for c in caps),
        f"preprocess.caps must be integers, got {cfg.caps!r}",
    )
    _check(
        isinstance(cfg.caps, int) or len(caps) == len(CAT_COLUMNS),
        f"preprocess.caps lists {len(caps)} caps: give one for all columns or "
        f"{len(CAT_COLUMNS)}, one per column C1..C26",
    )
    if mode.threshold_applies:  # contiguous: the threshold and dictionary days apply
        return
    _check(
        cfg.frequency_threshold == ThresholdSpec(2),
        f"preprocess.frequency_threshold {cfg.frequency_threshold} does not apply with ids: "
        "modulo (every value keeps its capped id, none is counted): remove the setting",
    )
    _check(
        cfg.dictionary_days == "all",
        "preprocess.dictionary_days does not apply with ids: "
        "modulo (no dictionary is built): remove the setting",
    )


def column_caps(cfg: PreprocessConfig) -> dict[str, int]:
    """ids: modulo (or capped contiguous ids): each column's cap (its table size), by column
    name."""
    if cfg.caps is None:
        raise ValueError("column_caps: preprocess.caps is not set")
    caps = cfg.caps if isinstance(cfg.caps, list) else [cfg.caps] * len(CAT_COLUMNS)
    return dict(zip(CAT_COLUMNS, (int(c) for c in caps)))


@dataclass
class ConvertConfig:
    """Parquet → split binary dataset, and the no-Spark threshold raise."""

    # Threads that decode parquet / transform columns (pyarrow and numpy release the GIL).
    workers: int = 2
    # Rows per record batch (convert) and per chunk (rethreshold, verify): bounds memory.
    batch_rows: int = 131_072
    # Report progress (to the pipeline; run alone: a bar on a terminal, else a line every
    # progress.interval_s on stderr); False reports nothing.
    progress: bool = True
    # Replace an existing complete output (one with _SUCCESS; the swap is atomic and the old
    # dataset stays until the new one is complete); False refuses instead.
    overwrite: bool = True
    # fsync every file and directory before the final rename (durability over speed).
    fsync: bool = True
    # rethreshold: hard-link files that do not change (labels, numericals, tables that keep
    # their size) instead of copying them; falls back to a copy across filesystems.
    link_unchanged: bool = True
    # Check the finished dataset with the full scan (ids, labels, finiteness) before _SUCCESS.
    verify_full: bool = False
    # Before a threshold raise reuses the binary dataset's files, check each against the
    # checksum recorded when it was written (xxh3-128; reads the whole dataset once, a small
    # cost beside the conversion it saves). False trusts files whose size and modification
    # time are unchanged.
    verify_checksums: bool = True
    # Ids per row of each column C1..C26, materialized from the one-hot ids as the MLPerf
    # DLRMv2 reference does (dlrm_contracts/multi_hot.py); None = one-hot, as before. MLPerf's:
    # [3,2,1,2,6,1,1,1,1,7,3,8,1,6,9,5,1,1,1,12,100,27,10,3,1,1].
    multi_hot_sizes: list[int] | None = None
    # The reference's generator seed (0: it seeds numpy's legacy generator with 0) and its
    # draw (--multi_hot_distribution_type; uniform in MLPerf).
    multi_hot_seed: int = 0
    multi_hot_distribution: str = "uniform"
    # The datasets written: "binary" (ours, always) and, beside it in the workdir,
    # "mlperf_multihot" (the reference's day_<d>_sparse_multi_hot.npz + dense and labels .npy)
    # and "torchrec" (TorchRec's per-day .npy files for InMemoryBinaryCriteoIterDataPipe and
    # dlrm_main.py, in binary/torchrec/: converters/torchrec_format.py).
    formats: list[str] = field(default_factory=lambda: ["binary"])

    def __post_init__(self) -> None:
        _check(self.batch_rows >= 1, f"batch rows must be at least 1, not {self.batch_rows}")
        _check(self.workers >= 1, f"convert.workers must be at least 1, not {self.workers}")
        if self.multi_hot_sizes is not None:
            _check(
                len(self.multi_hot_sizes) == len(CAT_COLUMNS) and all(k >= 1 for k in self.multi_hot_sizes),
                f"convert.multi_hot_sizes must list {len(CAT_COLUMNS)} integers >= 1 "
                f"(C1..C26), not {self.multi_hot_sizes}",
            )
        _check(
            0 <= self.multi_hot_seed < 2**32,
            f"convert.multi_hot_seed must be in [0, 2**32), not {self.multi_hot_seed}",
        )
        _one_of("convert.multi_hot_distribution", self.multi_hot_distribution, MULTI_HOT_DISTRIBUTIONS)
        for name in self.formats:
            _one_of("convert.formats", name, CONVERT_FORMATS)
        _check(
            "binary" in self.formats,
            "convert.formats must include binary (the other "
            f"layouts are written beside it), not {self.formats}",
        )


@dataclass
class TrainConfig:
    """The DLRM and its training loop (trainer/, documented in docs/trainer.md)."""

    # "default" = the seed's dimensions (embedding 128, bottom 512-256-128, top
    # 1024-1024-512-256-1); "small" (16, 64-32-16, 128-64-1) suits a 2-core CPU. The three
    # settings below override the preset one by one.
    preset: str = "small"
    embedding_dim: int | None = None
    bottom_mlp: list[int] | None = None
    top_mlp: list[int] | None = None
    # A first-order ("wide") term: one scalar weight per id of every table, their sum added
    # to the top MLP's logit (a logistic regression on the ids inside the DLRM). The DLRM
    # otherwise sees an id only through dot products with other features, and on small data
    # loses to a plain logistic regression. Each weight lives beside its table's rows (the
    # rank holding column 0), so it follows the tables' model-parallel placement, checkpoints
    # and warm starts (saved as the table's column embedding_dim). It costs one more lookup
    # per id and step, and gains test AUC at every data size tried (bench/README.md). Off in
    # the Terabyte configs, which keep the reference's model.
    wide: bool = True
    # How the bottom MLP's output and the 26 pooled embeddings meet before the top MLP: "dot"
    # (the seed's pairwise dot products) or "dcn" (DCNv2, MLPerf DLRMv2's model: dcn_layers
    # low-rank cross layers of rank dcn_rank on their concatenation; docs/trainer.md).
    interaction: str = "dot"
    dcn_layers: int = 3
    dcn_rank: int = 512
    # Global batch (all ranks together); each rank's dense part sees batch_size / ranks.
    batch_size: int = 1024
    eval_batch_size: int | None = None  # None = batch_size
    # At most this many epochs: early stopping (below) ends the run when the validation AUC
    # stops improving, so the data's size, not this number, sets how many run (a few on small
    # datasets).
    epochs: int = 20
    # Steps of the run, counted from its first step: step 0 from scratch, the previous model's
    # step after a warm start (train.init: previous); a resumed run counts from the same start.
    max_steps: int | None = None
    # "adagrad" (tables and MLPs; TorchRec's and MLPerf DLRMv2's choice for the tables),
    # "sgd" (the seed's and NVIDIA's reference, the Terabyte configs) or "adam".
    optimizer: str = "adagrad"
    # The rate at learning_rate_batch; another global batch B scales it by
    # sqrt(B / learning_rate_batch) ("sqrt"), B / learning_rate_batch ("linear") or not
    # ("none"). sqrt is the default because it keeps Adagrad's AUC when the batch grows; 0.045
    # is the rate that suits the model with its wide term.
    learning_rate: float = 0.045
    learning_rate_batch: int = 1024
    learning_rate_scaling: str = "sqrt"
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_epsilon: float = 1e-7
    # Adagrad's accumulators start here: a row's first steps are then proportional to its
    # gradient, so a row seen a few times moves little (the rare rows' regularisation), while
    # a frequent row's steps adapt to its own gradients as they add up. 0 lets a row seen once
    # jump as far as a frequent one, and small data over-fits within an epoch.
    adagrad_initial_accumulator: float = 1e-4
    adagrad_epsilon: float = 1e-8
    # Row L2 (trainer/row_l2.py): 1/2 * l2 * |row|^2 added to the train split's summed loss
    # (a logistic regression's 1/C; a step's mean-loss gradient gets l2 / train rows * row) for
    # each distinct embedding row (table_l2) or wide weight (wide_l2) a step looks up, with any
    # optimizer; rows a step does not touch are not read. row_l2_scaling "inverse_frequency"
    # divides the pull by the chance that a batch holds the row (train counts, counted at
    # start-up), so every row gets the same pull per epoch (the prior of a logistic
    # regression); "none" pulls a row once per batch holding it. wide_l2 30 (C = 0.033; the
    # tuned logistic regression's C is 0.03 at 60k-150k rows) with the wide rate below lets the
    # first-order weights reach their fit before the embeddings over-fit. table_l2 is off:
    # the embeddings gain nothing from it.
    table_l2: float = 0.0
    wide_l2: float = 30.0
    row_l2_scaling: str = "inverse_frequency"
    # The wide weights' rate = the schedule's rate x this (the rest of the model keeps the
    # schedule's). A first-order weight is one number per id fitted from that id's rows alone;
    # at the tables' rate it is still far from its fit when the embeddings start to over-fit.
    # The faster rate needs wide_l2 (without it, the wide weights over-fit).
    wide_learning_rate_factor: float = 4.0
    # The seed's schedule: linear warm-up, then constant, then polynomial decay (power 2).
    warmup_steps: int = 0
    decay_start_step: int | None = None
    decay_steps: int | None = None
    decay_power: float = 2.0
    evals_per_epoch: int = 2
    # Early stopping: evaluations (evals_per_epoch per epoch, and the last step) in a row
    # without a better validation AUC before the run stops; the checkpoint of the best one is
    # the run's model (test AUC, eval, export). 0 = off: every epoch runs and the last model is
    # the result (the Terabyte configs: one epoch is the reference's recipe). 3 (1.5 epochs at
    # evals_per_epoch 2): on small data the validation AUC of a half-epoch moves around a flat
    # top by more than min_delta, so a patience of 2 can stop a run in a dip before its best;
    # where it changes nothing, 3 costs half an epoch more of training.
    early_stopping_patience: int = 3
    # Validation AUC changes smaller than this from the best are rounding, not learning: they
    # neither reset nor spend the patience (a higher one still becomes the kept model). Without
    # it, a flat stretch that two ranks and one process read a little differently (float
    # rounding) spends the patience and stops a run before its embeddings have learnt.
    early_stopping_min_delta: float = 0.001
    amp: bool = False  # bfloat16 on CPU, float16 + loss scaling on GPU
    xla: bool = False  # jit_compile the dense part (bottom MLP, interaction, top MLP, loss)
    bottom_mlp_data_parallel: bool = True  # False: the bottom MLP lives on rank 0 only
    # A table whose float32 size exceeds this is split column-wise over all ranks.
    column_split_threshold_mb: float = 4096.0
    force_column_split: list[str] = field(default_factory=list)  # e.g. ["C3"] (tests)
    seed: int = 12345
    shuffle_batches: bool = True  # batch order within an epoch = permutation(seed, epoch)
    checkpoint_every: int = 0  # steps; 0 = only at the end of the run
    keep_checkpoints: int = 2
    resume: bool = True  # continue from the latest checkpoint in the workdir
    # Where a new run (a dataset no checkpoint of the workdir was trained on) starts:
    # "scratch" = fresh weights; "previous" = the workdir's newest model (the previous run's
    # best checkpoint, trained on an earlier dataset, e.g. yesterday's window), each table grown
    # to its new size (new rows initialised as at the start; a table may only grow, as with
    # preprocess.ids: stable). What a daily job uses: one day of training instead of the window
    # from scratch. An interrupted run of the same dataset is resumed either way (resume).
    init: str = "scratch"
    # With init: previous: "continue" carries the optimizer state (Adagrad accumulators, Adam
    # moments and counter) and the learning-rate schedule on from the previous model's step, as
    # if training had never stopped: rows already trained keep their small steps. "restart"
    # takes the weights only: fresh optimizer state, the schedule (warm-up) from its start
    # (for another optimizer, or SGD with a warm-up).
    init_optimizer: str = "continue"
    # After a warm start, score the previous model on this run's test split before training,
    # as it is served (values it has no row for read as id 0): the model being replaced on
    # the same rows as the new one (summary: previous_model_test_auc). One pass of the test split.
    evaluate_previous: bool = True
    # The train rows of a run: "window" = the whole train split (every day of the window);
    # "new" = with init: previous, only the train days the previous model has not been trained
    # on (its checkpoint records them), so a daily run trains one day whatever the window's
    # length. From scratch, or on a dataset that lists no days (ids
    # by frequency), "new" trains the whole window. "window" (default) revisits the older days
    # every run (W days of cost); "new" costs one day.
    days: str = "window"
    # Read the dataset at a higher threshold than it was written at (ids above k' -> 0);
    # needs the counts histogram (DIR/counts, or counts_dir). Parsed here, as preprocess's.
    frequency_threshold: ThresholdSpec | None = None
    counts_dir: str | None = None
    # dlrm_contracts.verify before reading: "quick" (metadata, file sizes), "full" (every value), "none"
    verify_dataset: str = "quick"
    log_every: int = 20  # steps between metrics lines (and global-loss allreduces)
    prefetch_batches: int = 4
    inference_steps: int = 50
    intra_op_threads: int = 0  # 0 = cores / ranks on this host
    # TensorFlow's inter-op pool; 0 = max(2, intra-op threads): at least 2, so that --amp's
    # casts overlap the matmuls.
    inter_op_threads: int = 0
    # With a workdir URL (docs/cluster.md §2.0.3): this node's local side of the workdir, where
    # the binary dataset is staged in (binary/) and the trainer writes its checkpoints, logs
    # and exports; None = <system temp>/dlrm-workdirs/<hash of the URL>. Unused for a local
    # workdir.
    stage_dir: str | None = None

    def __post_init__(self) -> None:
        _check_limits(self)
        _check(
            self.stage_dir is None or "://" not in self.stage_dir,
            f"train.stage_dir must be a local path, not {self.stage_dir!r}",
        )
        _check(
            self.batch_size >= 1 and (self.eval_batch_size or 1) >= 1,
            f"batch sizes must be at least 1 (batch size {self.batch_size}, eval batch size "
            f"{self.eval_batch_size})",
        )
        _check(
            self.max_steps is None or self.max_steps >= 0,
            f"max steps must be 0 or more, not {self.max_steps}",
        )
        _check(
            self.early_stopping_patience >= 0,
            f"early_stopping_patience must be 0 (off) or more, not {self.early_stopping_patience}",
        )
        _check(
            0 <= self.early_stopping_min_delta < 1,
            f"train.early_stopping_min_delta must be in [0, 1) (an AUC difference), not "
            f"{self.early_stopping_min_delta}",
        )
        _one_of("train.optimizer", self.optimizer, OPTIMIZERS)
        _one_of("train.learning_rate_scaling", self.learning_rate_scaling, LEARNING_RATE_SCALINGS)
        _one_of("train.row_l2_scaling", self.row_l2_scaling, ROW_L2_SCALINGS)
        _check(
            self.wide_learning_rate_factor > 0,
            f"train.wide_learning_rate_factor must be above 0, not {self.wide_learning_rate_factor}",
        )
        _check(
            self.table_l2 >= 0 and self.wide_l2 >= 0,
            f"train.table_l2 and train.wide_l2 must be 0 or more, not {self.table_l2} / {self.wide_l2}",
        )
        _check(
            self.learning_rate_batch >= 1,
            f"learning_rate_batch must be at least 1, not {self.learning_rate_batch}",
        )
        _one_of("train.verify_dataset", self.verify_dataset, DATASET_CHECKS)
        _one_of("train.init", self.init, TRAIN_INITS)
        _one_of("train.init_optimizer", self.init_optimizer, INIT_OPTIMIZERS)
        _one_of("train.days", self.days, TRAIN_DAYS)
        _one_of("train.interaction", self.interaction, INTERACTIONS)
        _check(
            not self.top_mlp or self.top_mlp[-1] == 1,
            f"train.top_mlp must end in one logit (1), got {self.top_mlp}",
        )
        if self.frequency_threshold is not None:
            self.frequency_threshold = _threshold("train.frequency_threshold", self.frequency_threshold)


# What each train setting is to the checkpoints (docs/pipeline.md, "What a config change does
# to checkpoints"). "model": it changes the model being trained (architecture, optimizer,
# schedule, seed, data order, the rows read, where a new run starts): checkpoints written under
# another value belong to another run, and are never resumed (they are set aside, not deleted).
# "run": it changes how the same run is carried out or how far it goes (logging, read-ahead,
# threads, evaluation batch and cadence, checkpoint cadence and retention, verification, the
# placement over ranks, epochs and max_steps, early stopping): the checkpoints are resumed.
# The schedule is in absolute steps (warmup_steps, decay_start_step, decay_steps), never
# derived from the run's total, so raising epochs or max_steps leaves it as it was.
# Every field of TrainConfig is here (tests/test_config.py checks it).
TRAIN_SETTING_KINDS: dict[str, str] = {
    **dict.fromkeys(
        (
            "preset",
            "embedding_dim",
            "bottom_mlp",
            "top_mlp",
            "wide",
            "interaction",
            "dcn_layers",
            "dcn_rank",
            "batch_size",
            "optimizer",
            "learning_rate",
            "learning_rate_batch",
            "learning_rate_scaling",
            "adam_beta1",
            "adam_beta2",
            "adam_epsilon",
            "adagrad_initial_accumulator",
            "adagrad_epsilon",
            "table_l2",
            "wide_l2",
            "row_l2_scaling",
            "wide_learning_rate_factor",
            "warmup_steps",
            "decay_start_step",
            "decay_steps",
            "decay_power",
            "amp",
            "seed",
            "shuffle_batches",
            "init",
            "init_optimizer",
            "days",
            "frequency_threshold",
            "counts_dir",
        ),
        "model",
    ),
    **dict.fromkeys(
        (
            "eval_batch_size",
            "epochs",
            "max_steps",
            "evals_per_epoch",
            "early_stopping_patience",
            "early_stopping_min_delta",
            "xla",
            "bottom_mlp_data_parallel",
            "column_split_threshold_mb",
            "force_column_split",
            "checkpoint_every",
            "keep_checkpoints",
            "resume",
            "evaluate_previous",
            "verify_dataset",
            "log_every",
            "prefetch_batches",
            "inference_steps",
            "intra_op_threads",
            "inter_op_threads",
            "stage_dir",
        ),
        "run",
    ),
}
# Of the "run" settings, those that decide where the run ends (its result): the train stage's
# key holds them with the model settings, so that a finished run is trained further when
# one is raised, while a change of the others alone leaves a finished stage done.
TRAIN_EXTENT_SETTINGS = (
    "epochs",
    "max_steps",
    "evals_per_epoch",
    "early_stopping_patience",
    "early_stopping_min_delta",
)


DCN_SETTINGS = ("interaction", "dcn_layers", "dcn_rank")


def train_model_settings(config: TrainConfig) -> dict[str, Any]:
    """The settings that make the model being trained (``TRAIN_SETTING_KINDS`` "model"), in
    their plain form: what a checkpoint records of its run, and compares on resume."""
    plain = config_to_dict(config)
    # The dot interaction (the default) is recorded as before these settings existed, so its
    # runs' checkpoints and finished train stages stay valid (changed_settings reads an absent
    # setting as its default), and the cross layers' shape makes no dot model.
    unused = DCN_SETTINGS if config.interaction == "dot" else ()
    return {k: plain[k] for k, kind in TRAIN_SETTING_KINDS.items() if kind == "model" and k not in unused}


def changed_settings(recorded: dict[str, Any], wanted: dict[str, Any]) -> list[str]:
    """``train.NAME old -> new`` for every model setting that differs (a setting one side
    does not record counts as changed only when the other holds a value other than its
    default, so that a setting added later does not set every older run aside)."""
    plain = config_to_dict(TrainConfig())
    defaults = {k: plain[k] for k, kind in TRAIN_SETTING_KINDS.items() if kind == "model"}
    out = []
    for name in sorted(set(recorded) | set(wanted)):
        old = recorded.get(name, defaults.get(name))
        new = wanted.get(name, defaults.get(name))
        if old != new:
            out.append(f"train.{name} {old!r} -> {new!r}")
    return out


@dataclass
class ExportConfig:
    """The export stage: latest checkpoint + dictionaries -> one SavedModel (docs/trainer.md)."""

    # The export holds every table whole in one process. 0 = refuse when the estimate exceeds
    # 80% of the memory available now (MemAvailable); otherwise the limit in MiB.
    max_memory_mb: float = 0.0
    # Integer value that ``serve_features`` reads as missing (int64 min). Any value <= -3 gives
    # the same result, since missing and x <= -3 both map to 0 after the log transform; a
    # larger one would be served as a real value (0 as log(3)) where Spark wrote 0.
    missing_integer: int = -(2**63)
    # Each export is a new version DIR/export/<N>/ (TensorFlow Serving's layout: a server
    # watching DIR/export loads the newest without a restart); the newest keep_versions stay,
    # and the pinned, served and newest verified ones (DIR/export/serving.json), so a bad
    # version can be rolled back (`run_pipeline.sh export rollback`).
    keep_versions: int = 3

    def __post_init__(self) -> None:
        _check(self.keep_versions >= 1, f"export.keep_versions must be at least 1, not {self.keep_versions}")
        _check(
            math.isfinite(self.max_memory_mb) and self.max_memory_mb >= 0,
            f"export.max_memory_mb must be 0 (automatic) or a size in MiB, got {self.max_memory_mb}",
        )
        _check(
            -(2**63) <= self.missing_integer <= MISSING_INTEGER_MAX,
            f"export.missing_integer must be an int64 <= {MISSING_INTEGER_MAX} (any such value "
            f"reads as missing, as Spark writes it), got {self.missing_integer}",
        )


@dataclass
class ScoreConfig:
    """The score stage: raw day files (plain or .gz) -> DIR/scores/<name>.parquet."""

    input: list[str] = field(default_factory=list)  # files; --score-input a,b,c
    # Lines per model call (bounds memory: one batch of lines and its scores at a time).
    batch_rows: int = 65_536
    # Whether the files' lines start with the label: None = decide per file from its first
    # lines, read both ways by the Spark job's rules: the way that keeps more lines, unless the
    # other keeps all but max_reject_rate of them too (say every line has 39 fields, which fits
    # both), or the better keeps fewer than half; then the stage refuses the file and asks for
    # this setting.
    has_label: bool | None = None
    # Refuse a file with a larger fraction of rejected lines (as preprocess.max_reject_rate):
    # its rejects are kept, its scores are not written.
    max_reject_rate: float = 0.01
    progress: bool = True  # report progress, as convert.progress

    def __post_init__(self) -> None:
        _check(self.batch_rows >= 1, f"score.batch_rows must be at least 1, not {self.batch_rows}")
        _check(
            0.0 <= self.max_reject_rate <= 1.0,
            f"score.max_reject_rate {self.max_reject_rate} is not in [0, 1]",
        )


@dataclass
class PreflightConfig:
    """The up-front check of disk, memory and time (pipeline/preflight.py, docs/pipeline.md).

    Bytes per row are those of docs/sizing.md section 3; rates are per core (or per
    CPU-second), so the estimates scale with the cores of the machine.
    """

    enabled: bool = True
    # Bytes read from the start of each day file to measure bytes per line (gzip: compressed
    # bytes per line, from the same amount of compressed input).
    sample_bytes: int = 4 * 2**20
    # A stage's estimated disk need must fit in the free space less this fraction of it.
    disk_headroom: float = 0.1
    generated_bytes_per_row: float = 244.0  # the generator's plain text
    parquet_bytes_per_row: float = 56.6
    shuffle_bytes_per_row: float = 139.4  # Spark shuffle files, on spark.local.dir
    # The Arrow engine's partial counts, on the workdir while the count phase runs (8 bytes per
    # distinct value of a chunk and column): 3.9 on ordinary generated rows, 35 with five
    # columns of 2.5M values; 40 is the Terabyte's estimate (docs/sizing.md section 3).
    partial_bytes_per_row: float = 40.0
    counts_bytes_per_row: float = 10.0  # per-day value counts; grows with distinct values
    # Binary dataset before the counts exist: label 1 B + 13 float16 + 26 ids of at most 4 B.
    binary_bytes_per_row_bound: float = 131.0
    # Per-core rates on the reference machine (below), rows or samples per CPU-second of a
    # core the run has to itself: the Arrow engine's preprocess, convert, the trainer's default
    # model on 2 ranks in float32 and in bfloat16 (--amp); bench/README.md has the runs they
    # come from.
    spark_rows_per_core_s: float = 111_000.0
    convert_rows_per_core_s: float = 1_800_000.0
    train_samples_per_core_s: float = 4_400.0
    train_samples_per_core_s_bf16: float = 6_800.0
    # Of a trained sample's core time, what does not grow with the MLPs (embedding lookups, the
    # input pipeline, the ranks' exchange): a small model's rate is not the default model's
    # scaled by its dense size alone.
    train_overhead_us_per_sample: float = 37.0
    # Evaluation runs the forward pass only, about 3 times the training rate.
    eval_speedup: float = 3.0
    # Fixed start-up of a stage whatever its size (JVM and session; TensorFlow and horovodrun),
    # on the reference machine.
    spark_startup_s: float = 20.0
    convert_startup_s: float = 0.5
    trainer_startup_s: float = 10.0
    # The rates above hold for the reference machine; another CPU's cores differ. With
    # calibrate, each rate is scaled by this machine's figure over the reference machine's
    # (pipeline.calibration: a few seconds of single-core micro-benchmarks, once per machine,
    # cached under $CRITEO_DLRM_CACHE or ~/.cache/criteo-dlrm).
    calibrate: bool = True
    reference_parse_rows_per_s: float = 733_000.0
    reference_matmul_gflops: float = 91.7
    reference_convert_rows_per_s: float = 5_380_000.0
    # Other jobs' load (the 1-minute load average) takes its share of the cores: the estimate
    # counts only the share left to the run, as the kernel shares cores among runnable threads
    # (the trainer's ranks keep about this many threads per core busy).
    account_load: bool = True
    train_threads_per_core: float = 4.0
    # A training run with early stopping usually ends after about this many epochs (the
    # estimate's likely figure; its bound is every epoch, which the time limit below uses).
    early_stopping_epochs: float = 7.0
    # The time limit a scheduler gives a run (the preflight's ``timeout_s``; the Airflow DAG's
    # execution_timeout): the bound of the estimate times timeout_factor, at least
    # timeout_floor_s.
    timeout_factor: float = 3.0
    timeout_floor_s: float = 900.0
    # Memory one rank may give its embedding tables and optimizer state, in GiB. None = this
    # machine's memory divided by the ranks it runs (CPU training); set it to the GPU's memory
    # for GPU ranks. rank_reserve_gib is kept for TensorFlow, buffers and the dense part.
    rank_memory_gib: float | None = None
    rank_reserve_gib: float = 6.0

    def __post_init__(self) -> None:
        _check_limits(self)


@dataclass
class ProgressConfig:
    """How long stages say where they are (dlrm_contracts/progress.py, docs/pipeline.md).

    Never part of a stage's key: it changes what is shown, not what is written.
    """

    # A plain progress line every this many seconds when the output is not a terminal (the
    # run's log file always gets them): what a cron or Airflow log shows.
    interval_s: float = 30.0
    # A bar per stage, with its ETA, when stderr is a terminal; False: plain lines there too.
    bar: bool = True
    # Rows per second are measured over this last stretch of a phase.
    rate_window_s: float = 60.0
    # The preprocess stage's fraction done weighs its phases by their share of its time
    # (the Arrow engine's shares at the Terabyte shape, where the count and the transform
    # read every row and the dictionaries only the counts). A phase not named here counts
    # for nothing.
    preprocess_phase_shares: dict[str, float] = field(
        default_factory=lambda: {"count": 0.36, "dictionaries": 0.02, "transform": 0.62}
    )
    # Within the count and the transform, the share of the phase spent in the tasks that read
    # the input (one per chunk); the rest is the count's merge and collects and the
    # transform's train-file writes (from a run's Spark event log at the Terabyte shape).
    preprocess_read_shares: dict[str, float] = field(default_factory=lambda: {"count": 0.8, "transform": 0.6})

    def __post_init__(self) -> None:
        _check(
            0 < self.interval_s < math.inf,
            f"progress.interval_s must be a number of seconds > 0, not {self.interval_s}",
        )
        _check(
            0 < self.rate_window_s < math.inf,
            f"progress.rate_window_s must be a number of seconds > 0, not {self.rate_window_s}",
        )
        reads = self.preprocess_read_shares
        _check(
            set(reads) == {"count", "transform"}
            and all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < 1 for v in reads.values()
            ),
            f"progress.preprocess_read_shares must map count and transform to a share in (0, 1), not {reads}",
        )
        shares = self.preprocess_phase_shares
        _check(
            all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v < math.inf
                for v in shares.values()
            )
            and sum(shares.values()) > 0,
            f"progress.preprocess_phase_shares must map phases to shares >= 0, not all 0: {shares}",
        )


@dataclass
class LaunchConfig:
    """How the trainer is started: one process, or horovodrun over ranks and hosts."""

    np: int = 2
    hosts: str | None = None  # horovodrun -H, e.g. "host1:2,host2:2"; None = localhost:np
    # How long one rank waits for another in Gloo's rendezvous and collectives before the run
    # fails (horovodrun's HOROVOD_GLOO_TIMEOUT_SECONDS, which the pipeline sets for its ranks
    # unless the environment already does). Gloo's own default, 30 s, is shorter than the gap
    # between ranks on a loaded machine or a cluster with slow shared storage: one rank still
    # building its dataset or TensorFlow graph while the other waits ends a 2-rank run with
    # exit 8. 300 s rides that out and still ends a run whose peer really died within minutes.
    # Here, not under train, so that changing it does not change the train stage's key.
    gloo_timeout_seconds: int = 300

    def __post_init__(self) -> None:
        _check(self.np >= 1, f"launch.np (--np) must be at least 1, not {self.np}")
        _check(
            isinstance(self.gloo_timeout_seconds, int)
            and not isinstance(self.gloo_timeout_seconds, bool)
            and self.gloo_timeout_seconds >= 1,
            "launch.gloo_timeout_seconds must be a whole number of seconds >= 1, not "
            f"{self.gloo_timeout_seconds!r}",
        )


@dataclass
class PipelineConfig:
    input: str | None = None
    workdir: str = "workdir"
    stages: list[str] = field(default_factory=lambda: list(DEFAULT_STAGES))
    force: bool = False
    generator: GeneratorConfig = field(default_factory=GeneratorConfig)
    spark: SparkConfig = field(default_factory=SparkConfig)
    preprocess: PreprocessConfig = field(default_factory=PreprocessConfig)
    convert: ConvertConfig = field(default_factory=ConvertConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    launch: LaunchConfig = field(default_factory=LaunchConfig)
    export: ExportConfig = field(default_factory=ExportConfig)
    score: ScoreConfig = field(default_factory=ScoreConfig)
    preflight: PreflightConfig = field(default_factory=PreflightConfig)
    progress: ProgressConfig = field(default_factory=ProgressConfig)

    def __post_init__(self) -> None:
        # Every string here is written to effective_config.yaml and may reach a command line:
        # a URL with a password (an input, a score file) is refused like a secret setting.
        refuse_secret_values(config_to_dict(self), "config")


class ConfigError(UsageError, ValueError):
    """A configuration file, flag or setting that does not fit the schema above."""


def _check(holds: bool, message: str) -> None:
    if not holds:
        raise ConfigError(message)


def _one_of(name: str, value: str, choices: tuple[str, ...]) -> None:
    _check(value in choices, f"{name} {value!r} is not one of {', '.join(choices)}")


def _threshold(name: str, value: ThresholdSpec | str | int) -> ThresholdSpec:
    """The one place a configured threshold spec is parsed: YAML, flags and code all pass
    through a section's __post_init__, so a bad spec is this one message (exit 2)."""
    try:
        return parse_threshold_spec(value)
    except ThresholdSpecError as error:
        raise ConfigError(f"{name}: {error}") from None


# Settings an older version had, with what to do instead: an old config file gets that
# sentence rather than a bare "unknown setting".
REMOVED_SETTINGS: dict[str, str] = {
    "config.preprocess.arrow_index_max_values": "the Arrow engine now looks every column up in its memory-mapped dictionary index, "
    "whatever its size (docs/spark_jobs.md); delete the setting",
}


def _build(cls: type[Section], data: dict[str, Any], where: str) -> Section:
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping, got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for name in sorted(set(data) - set(fields)):
        if f"{where}.{name}" in REMOVED_SETTINGS:
            raise ConfigError(f"{where}.{name} was removed: {REMOVED_SETTINGS[f'{where}.{name}']}")
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(
            f"{where}: unknown setting(s) {', '.join(unknown)}; known: {', '.join(sorted(fields))}"
        )
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for name, value in data.items():
        default = getattr(cls(), name)
        if _is_section(default):
            kwargs[name] = _build(type(default), value or {}, f"{where}.{name}")
        else:
            _check_type(value, hints[name], f"{where}.{name}")
            kwargs[name] = value
    return cls(**kwargs)


def _is_section(value: object) -> TypeGuard[DataclassInstance]:
    """A nested settings section (a dataclass of this module), not a parsed value such as a
    ThresholdSpec, which is a dataclass too but a single setting."""
    return (
        dataclasses.is_dataclass(value)
        and not isinstance(value, type)
        and not isinstance(value, ThresholdSpec)
    )


def _fits(value: object, hint: object) -> bool:
    """Whether a YAML value suits a field's annotation (numbers are accepted for strings, and
    text or a number for a threshold spec: ``frequency_threshold: 15`` is natural YAML)."""
    if hint is Any:
        return True
    if hint is ThresholdSpec:  # parsed by the section's __post_init__
        return isinstance(value, (ThresholdSpec, str, int)) and not isinstance(value, bool)
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_fits(value, arg) for arg in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if origin is not None:
        hint = origin
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, (str, int, float)) and not isinstance(value, bool)
    if isinstance(hint, type):
        return isinstance(value, hint)
    return True


def _check_type(value: object, hint: object, where: str) -> None:
    if not _fits(value, hint):
        shown = getattr(hint, "__name__", None) or str(hint).replace("typing.", "")
        raise ConfigError(f"{where}: {value!r} is not a valid {shown}")


def config_from_dict(data: dict[str, Any]) -> PipelineConfig:
    return _build(PipelineConfig, data or {}, "config")


def load_config(path: str | Path | None) -> PipelineConfig:
    """Defaults, updated by the YAML file at ``path`` when given."""
    if path is None:
        return PipelineConfig()
    import yaml

    try:
        with open(path, encoding="utf-8") as fh:
            data = yaml.safe_load(fh)
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path} is not valid YAML: {exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"config file {path} is not UTF-8 text ({exc.reason} at byte {exc.start}): save it as UTF-8"
        ) from None
    except OSError as exc:
        raise ConfigError(f"config file {path} cannot be read: {exc.strerror or exc}") from None
    return config_from_dict(data or {})


def config_to_dict(config: DataclassInstance) -> dict[str, Any]:
    """The plain form (YAML/JSON types) that config_from_dict reads back: threshold specs as
    their canonical text, so equal settings always write the same file."""
    return {f.name: _plain(getattr(config, f.name)) for f in dataclasses.fields(config)}


def _plain(value: object) -> object:
    if isinstance(value, ThresholdSpec):
        return str(value)
    if _is_section(value):
        return config_to_dict(value)
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(v) for v in value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def with_overrides(section: Section, changes: dict[str, Any], where: str = "flags") -> Section:
    """``section`` with ``changes`` applied; a change of None means "not given" and is skipped.

    The one way the command lines put their flags over a config section: each value is checked
    against the setting's type like a YAML value, and the section's range checks
    (``__post_init__``) run again on the result.
    """
    given = {name: value for name, value in changes.items() if value is not None}
    fields = {f.name for f in dataclasses.fields(section)}
    unknown = sorted(set(given) - fields)
    if unknown:
        raise ConfigError(f"{where}: unknown setting(s) {', '.join(unknown)}")
    hints = typing.get_type_hints(type(section))
    for name, value in given.items():
        _check_type(value, hints[name], f"{where}: {name}")
    return dataclasses.replace(section, **given)


def flag_overrides(section: Section, args: argparse.Namespace, **derived: Any) -> Section:
    """``section`` with every flag of ``args`` whose destination is named like one of its
    settings (and was given), then ``derived`` values (flags that need parsing first)."""
    names = {f.name for f in dataclasses.fields(section)}
    changes = {name: value for name, value in vars(args).items() if name in names}
    return with_overrides(section, {**changes, **derived})


# ------------------------------------------------------------------ ranges of the settings
@dataclass(frozen=True)
class Limit:
    """The values a number (or each element of a list of numbers) may take; None = any."""

    low: float | None = None
    high: float | None = None
    above: bool = False  # low itself is excluded
    below: bool = False  # high itself is excluded

    def holds(self, value: float) -> bool:
        if isinstance(value, float) and not math.isfinite(value):
            return False
        return (self.low is None or value > self.low or (not self.above and value == self.low)) and (
            self.high is None or value < self.high or (not self.below and value == self.high)
        )

    def __str__(self) -> str:
        low = "" if self.low is None else f"{'>' if self.above else '>='} {_number(self.low)}"
        high = "" if self.high is None else f"{'<' if self.below else '<='} {_number(self.high)}"
        return " and ".join(part for part in (low, high) if part) or "finite"


def _number(x: float) -> str:
    """A bound as written: integers whole (2147483648, not 2.14748e+09)."""
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


AT_LEAST_1, AT_LEAST_0, POSITIVE = Limit(1), Limit(0), Limit(0, above=True)
UNIT = Limit(0, 1, below=True)  # [0, 1)

# Checked whenever a section is made (YAML, flags, code): a setting out of its range is one line
# and exit 2 before anything is written or started, not a failure deep inside a stage.
_LIMITS: dict[str, dict[str, Limit | tuple[str, ...]]] = {
    "SparkConfig": {
        "shuffle_partitions": AT_LEAST_0,
        "gpu_per_executor": AT_LEAST_1,
        "gpu_tasks_per_gpu": AT_LEAST_1,
        "gpu_concurrent_tasks": AT_LEAST_1,
        "log_level": SPARK_LOG_LEVELS,
    },
    "PreprocessConfig": {
        "output_files": AT_LEAST_0,
        "train_rows_per_file": AT_LEAST_1,
        "broadcast_max_values": AT_LEAST_0,
        "arrow_chunk_mb": AT_LEAST_1,
        "arrow_block_kb": AT_LEAST_1,
        "arrow_remote_read_mb": AT_LEAST_1,
        "arrow_input_copy_mb": AT_LEAST_0,
        "window_days": Limit(2),
        "max_line_bytes": Limit(1024),
        "caps": Limit(1, MAX_CAP),
        "compression": PARQUET_CODECS,
    },
    "TrainConfig": {
        "preset": MODEL_PRESETS,
        "embedding_dim": AT_LEAST_1,
        "bottom_mlp": AT_LEAST_1,
        "top_mlp": AT_LEAST_1,
        "epochs": AT_LEAST_1,
        "dcn_layers": AT_LEAST_1,
        "dcn_rank": AT_LEAST_1,
        "learning_rate": POSITIVE,
        "adam_beta1": UNIT,
        "adam_beta2": UNIT,
        "adam_epsilon": POSITIVE,
        "warmup_steps": AT_LEAST_0,
        "decay_start_step": AT_LEAST_0,
        "decay_steps": AT_LEAST_0,
        "decay_power": AT_LEAST_0,
        "evals_per_epoch": AT_LEAST_0,
        "column_split_threshold_mb": POSITIVE,
        "force_column_split": CAT_COLUMNS,
        "checkpoint_every": AT_LEAST_0,
        "keep_checkpoints": AT_LEAST_1,
        "log_every": AT_LEAST_1,
        "prefetch_batches": AT_LEAST_1,
        "inference_steps": AT_LEAST_1,
        "intra_op_threads": AT_LEAST_0,
        "inter_op_threads": AT_LEAST_0,
    },
    "PreflightConfig": {
        "sample_bytes": Limit(1024),
        "disk_headroom": UNIT,
        "generated_bytes_per_row": POSITIVE,
        "parquet_bytes_per_row": POSITIVE,
        "shuffle_bytes_per_row": AT_LEAST_0,
        "partial_bytes_per_row": AT_LEAST_0,
        "counts_bytes_per_row": AT_LEAST_0,
        "binary_bytes_per_row_bound": POSITIVE,
        "spark_rows_per_core_s": POSITIVE,
        "convert_rows_per_core_s": POSITIVE,
        "train_samples_per_core_s": POSITIVE,
        "train_samples_per_core_s_bf16": POSITIVE,
        "eval_speedup": POSITIVE,
        "spark_startup_s": AT_LEAST_0,
        "trainer_startup_s": AT_LEAST_0,
        "convert_startup_s": AT_LEAST_0,
        "train_overhead_us_per_sample": AT_LEAST_0,
        "reference_parse_rows_per_s": POSITIVE,
        "reference_matmul_gflops": POSITIVE,
        "reference_convert_rows_per_s": POSITIVE,
        "early_stopping_epochs": POSITIVE,
        "timeout_factor": POSITIVE,
        "train_threads_per_core": POSITIVE,
        "timeout_floor_s": AT_LEAST_0,
        "rank_memory_gib": POSITIVE,
        "rank_reserve_gib": AT_LEAST_0,
    },
}


def _check_limits(section: DataclassInstance) -> None:
    """Every setting of ``section`` named in _LIMITS within its range or among its choices
    (None, where a setting allows it, means "not set" and passes)."""
    where = {
        "SparkConfig": "spark",
        "PreprocessConfig": "preprocess",
        "TrainConfig": "train",
        "PreflightConfig": "preflight",
    }[type(section).__name__]
    for name, rule in _LIMITS[type(section).__name__].items():
        value = getattr(section, name)
        if value is None:
            continue
        values = value if isinstance(value, list) else [value]
        if isinstance(rule, Limit):
            bad = [v for v in values if isinstance(v, (int, float)) and not rule.holds(v)]
            _check(not bad, f"{where}.{name} must be {rule}, got {value!r}")
        else:
            shown = [str(v).upper() if rule is SPARK_LOG_LEVELS else v for v in values]
            unknown = [v for v in shown if v not in rule]
            _check(
                not unknown,
                f"{where}.{name}: {', '.join(map(repr, unknown))} is not one of {', '.join(rule)}",
            )
