"""The preprocess job: raw day files → counts, dictionaries, parquet splits, quality report.

One Spark session reads the raw text twice and caches nothing large: the count pass (one
aggregation gives the value counts of new or changed days and every day's statistics; rejected
lines are written only when there are some), the dictionaries, then the transform pass (one
query writes train, test and validation). Outputs
follow docs/architecture.md under ``WorkdirLayout(workdir)``; ``parquet/_SUCCESS`` is written
last and removed first, so a half-finished run never looks complete.

The workdir may be a URL (``s3://``, ``gs://``, ``abfs://``, ``hdfs://``): every record and
directory is then written and read through ``dlrm_contracts.workdir_io`` (local paths keep
their code), the splits and the dictionaries are published by a commit marker each
(``dlrm_contracts.object_commit``), records are one PUT each (docs/cluster.md §2.0.3).

With ``preprocess.ids: modulo`` (capped ids, ``spark_jobs.capped_ids``) the first read only
gathers the statistics (no value is counted, no dictionary built) and the transform computes
every id from its value and its column's cap. With ``preprocess.ids: contiguous``
(``spark_jobs.contiguous_ids``) the first read gathers the statistics alone too, and a
dictionary pass numbers the values by first appearance before the transform.

Each mode's stages are one ``Steps`` entry of ``STEPS``, keyed by its mode object
(``dlrm_contracts.id_modes``); every stage takes the run's ``RunContext``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from dlrm_contracts import workdir_io
from dlrm_contracts.atomic import fsync_tree
from dlrm_contracts.config import PreprocessConfig, SparkConfig, column_caps
from dlrm_contracts.id_modes import CONTIGUOUS, FREQUENCY, ID_MODES, MODULO, STABLE, IdMode
from dlrm_contracts.layout import PREPROCESS_JSON, SEGMENTS_JSON, SUCCESS, WorkdirLayout
from dlrm_contracts.schema import SPLITS
from spark_jobs import counting, day_store, quality, stable_ids
from spark_jobs.contiguous_ids import table_sizes as contiguous_table_sizes
from spark_jobs.dictionaries import sizes_of_kept, table_sizes
from spark_jobs.engine import AfterPrevious, ByCount, ByFirstAppearance, Engine, Histogram
from spark_jobs.engines.arrow.chunks import input_tasks as arrow_input_tasks
from spark_jobs.engines.arrow.engine import ArrowEngine
from spark_jobs.engines.sql.engine import SqlEngine
from spark_jobs.engines.sql.parse import input_tasks as sql_input_tasks
from spark_jobs.errors import PreprocessConfigError
from spark_jobs.inputs import DayFile, discover_days
from spark_jobs.session import get_session
from spark_jobs.spark_failure import spark_errors
from spark_jobs.splits import (
    move_split_dirs,
    rows_in_files,
    settle_split_dirs,
    split_staging,
    train_files,
    write_empty,
)
from spark_jobs.stats import DayStats
from spark_jobs.progress import NO_PROGRESS, NoProgress
from spark_jobs.timing import StageTimer

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from dlrm_contracts.thresholds import ThresholdSpec

PREPROCESS_FORMAT_VERSION = 1


def published_dictionaries(layout: WorkdirLayout, mode: IdMode = FREQUENCY):
    """Where ``mode``'s dictionaries' tables are: their directory on a path, the committed
    version under it at a URL (its ``_COMMIT.json`` names it; None before any run published
    them, and for a mode without dictionaries)."""
    tables = layout.dictionaries_of(mode)
    return None if tables is None else workdir_io.published_dir(tables)


def run_preprocess(
    input_dir,
    workdir,
    spark: SparkConfig,
    preprocess: PreprocessConfig,
    retransform: bool = False,
    progress: NoProgress = NO_PROGRESS,
) -> dict:
    """Run count → dictionaries → transform over the day files of ``input_dir`` (every one,
    or the newest ``preprocess.window_days``).

    A day whose file has not changed since it was counted is not counted again, so a rerun
    with a new day or another threshold does not recount the others. With stable ids a day
    whose transformed parts still hold (``spark_jobs.day_store``) is not transformed again
    either, unless ``retransform``.

    Args:
        input_dir: the raw day files (``day_0`` .. ``day_N``, plain or ``.gz``); the last day
            is split into test and validation, the others are train.
        workdir: the workdir (counts, dictionaries, parquet and reports go in its layout).
        spark: the session settings (master, memory, ``--conf``, GPU profile).
        preprocess: threshold spec, engine, reject limit, shuffle seed, output files.
        progress: told each phase and the days it reads (spark_jobs.progress).

    Returns:
        The summary also written to ``parquet/preprocess.json``: rows per split, table sizes,
        data-quality totals, timings; ``parquet/_SUCCESS`` marks it complete.

    Raises:
        PreprocessConfigError: a setting that cannot work.
        PreprocessInputError: unusable input, or too many rejected lines.
        PreprocessJobError: Spark failed, or rows in != rows out + rejected.
    """
    spec = preprocess.frequency_threshold
    mode = preprocess.mode
    engine_id = engine_name(preprocess, spark)
    days = discover_days(input_dir, preprocess.window_days, preprocess.input_link_roots)
    layout = WorkdirLayout.at(workdir)
    remote = workdir_io.is_remote(layout.root)
    if engine_id == "sql" and (remote or _is_url(input_dir)):
        with spark_errors():  # before the workdir is touched
            check_spark_connector(get_session(spark), [input_dir, workdir])
    if remote:
        check_url_workdir(preprocess, engine_id)
    else:
        # before anything is replaced: a killed run's half-done swap is settled, and a stable
        # workdir's threshold is checked
        stable_ids.recover(layout.dictionaries)
    previous = stable_ids.previous_dictionaries(layout.dictionaries, spec) if mode.grows_tables else None
    workdir_io.make_dir(layout.parquet)
    workdir_io.remove(layout.parquet / SUCCESS)
    workdir_io.remove(layout.parquet / SEGMENTS_JSON)
    if not mode.grows_tables:
        day_store.forget_days(layout)
    if not remote:  # stable ids' staging (refused at a URL)
        day_store.clear_leftovers(layout)
    with spark_errors():
        engine = _make_engine(engine_id, get_session(spark), days, preprocess)
        try:
            if mode.grows_tables:
                engine.use_previous_dictionaries(previous)
            timer = StageTimer(progress)  # tells the job's progress each phase
            return _run_stages(RunContext(engine, days, layout, spec, preprocess, timer, retransform))
        finally:
            engine.close()


def check_url_workdir(preprocess: PreprocessConfig, engine_id: str) -> None:
    """What a workdir URL does not support, refused (exit 2) before anything is written:
    stable ids keep their dictionaries' lineage by directory swaps on a filesystem, contiguous
    ids write their dictionaries with Spark's own parquet writer and build their index on the
    driver's filesystem, and the SQL engine settles its splits by renaming Spark's output
    directories."""
    if engine_id == "sql":
        raise PreprocessConfigError(
            "preprocess.engine: sql writes its splits by renaming directories, which a workdir "
            "URL does not have: use preprocess.engine: arrow with a workdir URL, or a workdir "
            "path (the input may be a URL) (docs/cluster.md §2.0.3)"
        )
    if not preprocess.mode.on_url_workdir:
        supported = " and ".join(m.name for m in ID_MODES.values() if m.on_url_workdir)
        raise PreprocessConfigError(
            f"preprocess.ids: {preprocess.mode.name} needs a workdir on a filesystem path; a "
            f"workdir URL supports ids: {supported} (docs/cluster.md §2.0.3)"
        )


# Hadoop's FileSystem for each URL scheme the SQL engine may meet (docs/cluster.md §2.0.3)
_HADOOP_SCHEMES = {
    "s3": "s3",
    "gs": "gs",
    "gcs": "gs",
    "abfs": "abfs",
    "abfss": "abfss",
    "hdfs": "hdfs",
    "viewfs": "viewfs",
}


def check_spark_connector(session: SparkSession, targets: list) -> None:
    """The SQL engine reads and writes a URL through Hadoop's filesystems: a URL whose scheme
    has none in this session (no ``hadoop-aws``, ``gcs-connector``, ``hadoop-azure`` jar, or
    no ``spark.hadoop.fs.<scheme>.impl``) is refused with one line (exit 2) naming the
    settings, instead of a Java stack trace from the first read."""
    from urllib.parse import urlsplit

    from py4j.protocol import Py4JJavaError

    for target in targets:
        if not _is_url(target):
            continue
        scheme = urlsplit(str(target)).scheme.lower()
        try:
            session._jvm.org.apache.hadoop.fs.FileSystem.getFileSystemClass(
                _HADOOP_SCHEMES.get(scheme, scheme), session._jsc.hadoopConfiguration()
            )
        except Py4JJavaError:
            raise PreprocessConfigError(
                f"{target}: preprocess.engine: sql reads and writes '{scheme}://' through "
                f"Spark's Hadoop connector, and this Spark session has none for it (no "
                f"FileSystem for scheme {_HADOOP_SCHEMES.get(scheme, scheme)}): add the "
                "connector's jars and settings (for S3: spark.jars.packages "
                "org.apache.hadoop:hadoop-aws:<Hadoop version>, "
                "spark.hadoop.fs.s3.impl org.apache.hadoop.fs.s3a.S3AFileSystem; "
                "docs/cluster.md §2.0.3), or use preprocess.engine: arrow"
            ) from None


def _is_url(target) -> bool:
    from dlrm_contracts.storage import is_url

    return is_url(target)


def engine_name(preprocess: PreprocessConfig, spark: SparkConfig) -> str:
    """The engine a run uses: ``auto`` is sql under the RAPIDS profile (it accelerates SQL, not
    Python), arrow otherwise."""
    if preprocess.engine == "auto":
        return "sql" if spark.gpu else "arrow"
    return preprocess.engine


def input_tasks(engine_id: str, days: list[DayFile], cfg: PreprocessConfig) -> int:
    """The tasks the engine reads ``days`` with (the progress report plans its phases on them)."""
    if engine_id == "sql":
        return sql_input_tasks(days)
    return arrow_input_tasks(days, cfg)


def _make_engine(name: str, session: SparkSession, days: list[DayFile], cfg: PreprocessConfig) -> Engine:
    if name == "sql":
        return SqlEngine(session, days, cfg)
    return ArrowEngine(session, days, cfg)


@dataclass(frozen=True)
class RunContext:
    """One run of the job: what every stage reads, passed as one instead of argument lists."""

    engine: Engine
    days: list[DayFile]
    layout: WorkdirLayout
    spec: ThresholdSpec
    cfg: PreprocessConfig
    timer: StageTimer
    retransform: bool = False

    @property
    def mode(self) -> IdMode:
        return self.cfg.mode

    @property
    def progress(self) -> NoProgress:
        """The job's progress: the timer tells it each phase, the stages the days they read."""
        return self.timer.progress

    def dictionary_days(self) -> list[int] | None:
        """The days whose counts make the dictionaries: None = all of them."""
        return [d.day for d in self.days[:-1]] if self.cfg.dictionary_days == "train" else None


@dataclass
class Counted:
    """What the count stage found: every day's statistics, the days whose values it counted
    again, and (stable ids) the plan of which days to transform."""

    stats: dict[int, DayStats]
    recount: list[int]
    work: day_store.DayWork | None = None
    histogram: Histogram | None = None  # the value counts' histogram (modes that count values)


@dataclass(frozen=True)
class Steps:
    """A mode's stages: count (then, once the statistics pass the quality checks, the value
    counts' totals), the tables (their sizes), the splits (rows per split)."""

    count: Callable[[RunContext], Counted]
    totals: Callable[[RunContext], Histogram | None]
    tables: Callable[[RunContext, Counted], dict[str, int]]
    splits: Callable[[RunContext, Counted, dict[str, int]], dict[str, int]]


def _run_stages(run: RunContext) -> dict:
    steps = STEPS[run.mode]
    layout, cfg, days = run.layout, run.cfg, run.days
    with run.timer.stage("count"):
        counted = steps.count(run)
        stats = counted.stats
        quality.check_days_not_empty(days, stats)
        run.engine.write_rejects(stats, layout.rejects)
        report = quality.quality_report(days, stats, cfg.max_reject_rate)
        workdir_io.write_json(layout.data_quality, report, sort_keys=False)
        quality.check_reject_rate(report)
        counted.histogram = steps.totals(run)
    sizes = steps.tables(run, counted)
    rows = steps.splits(run, counted, sizes)
    rows_out = sum(rows.values())
    report = quality.quality_report(days, stats, cfg.max_reject_rate, rows_out_checked=rows_out)
    workdir_io.write_json(layout.data_quality, report, sort_keys=False)
    quality.check_identity(report)
    summary = _summary(run, counted, rows, sizes, report)
    workdir_io.write_json(layout.parquet / PREPROCESS_JSON, summary, sort_keys=False)
    if not workdir_io.is_remote(layout.parquet):
        # the splits, dictionaries, index and records on disk before the marker that says they
        # are complete (the tasks wrote most of them without flushing: one pass here instead);
        # a store's objects are durable once their upload completed
        fsync_tree(layout.parquet)
    workdir_io.write_text(layout.parquet / SUCCESS, "")
    return summary


def _summary(
    run: RunContext, counted: Counted, rows: dict[str, int], sizes: dict[str, int], report: dict
) -> dict:
    """preprocess.json: what the run made and from what."""
    cfg, timer, work = run.cfg, run.timer, counted.work
    return {
        "format_version": PREPROCESS_FORMAT_VERSION,
        # capped ids keep every value: they are at no threshold
        "threshold_spec": str(run.spec) if run.mode.threshold_applies else None,
        "seed": cfg.shuffle_seed,
        "engine": run.engine.name,
        "lookups": run.engine.lookups,
        "dictionary_days": cfg.dictionary_days,
        "ids": cfg.ids,
        "window_days": cfg.window_days,
        "days": [{"day": d.day, "file": d.name, "fingerprint": d.fingerprint()} for d in run.days],
        "days_counted": counted.recount,
        "days_reused": [d.day for d in run.days if d.day not in counted.recount]
        if run.mode.counts_values
        else [],
        # stable ids: which days were transformed (and why), reused, dropped
        **({"transform": work.summary()} if work is not None else {}),
        "rows": rows,
        "table_sizes": sizes,
        "data_quality": report["totals"],
        "timings": {**timer.seconds, "total": round(sum(timer.seconds.values()), 3)},
        "cpu_seconds": {**timer.cpu_seconds, "total": round(sum(timer.cpu_seconds.values()), 3)},
    }


# ---------------------------------------------------------------- count
def _recount(run: RunContext) -> list[int]:
    """The days whose value counts are missing or stale (the others' are reused)."""
    counting.drop_stale_days(run.days, run.layout.counts)
    return counting.days_to_count(run.days, run.layout.counts, run.cfg.max_line_bytes)


def _count_values(run: RunContext) -> Counted:
    """Frequency ids: every day's statistics, and the value counts of the days to recount."""
    recount = _recount(run)
    return Counted(run.engine.count(recount, run.layout.counts), recount)


def _count_stable(run: RunContext) -> Counted:
    """Stable ids: plan the days to transform, then every day's statistics, reading only the
    days whose statistics are not kept with their transformed parts
    (``day_store.stored_stats``), those to recount, and the newest day (so the pass always has
    a day to read). The days read are noted in the plan."""
    days, layout, engine = run.days, run.layout, run.engine
    recount = _recount(run)
    work = day_store.plan(days, layout, run.cfg, stable_ids.lineage(layout.dictionaries), run.retransform)
    # the progress report plans the transform on the days it will read, not the window
    run.progress.planned(
        "transform",
        [d.day for d, _, _ in work.transform],
        [d.day for d, role, _ in work.transform if role == day_store.TRAIN],
    )
    kept = day_store.stored_stats(layout, work, days, day_store.stats_key(engine.name, run.cfg))
    read = {d.day for d in days if d.day not in kept} | set(recount) | {days[-1].day}
    run.progress.planned("count", sorted(read))
    stats = engine.count(recount, layout.counts, read)
    work.read.extend(sorted(read))
    stats.update({day: s for day, s in kept.items() if day not in stats})
    return Counted(stats, recount, work)


def _count_statistics(run: RunContext) -> Counted:
    """Modulo and contiguous ids: every day's statistics, no value counted. The counts of
    another mode's runs stay as they are (days.json vouches only for the counts it lists); the
    frequency dictionaries and their index go, since no id of these splits comes from them."""
    workdir_io.remove_tree(run.layout.dictionaries)
    workdir_io.remove_tree(run.layout.dictionary_index)
    return Counted(run.engine.count_statistics(run.layout.counts), [])


# ---------------------------------------------------------------- tables
def _frequency_totals(run: RunContext) -> Histogram:
    """The value counts' histogram over the dictionary days; the threshold lets an engine
    prepare the dictionaries as it merges."""
    return run.engine.count_totals(run.layout.counts, run.dictionary_days(), frequency_ids=run.spec)


def _stable_totals(run: RunContext) -> Histogram:
    return run.engine.count_totals(run.layout.counts, run.dictionary_days(), frequency_ids=None)


def _no_totals(run: RunContext) -> None:
    """Modulo and contiguous ids keep no value counts."""
    return None


def _frequency_dictionaries(run: RunContext, counted: Counted) -> dict[str, int]:
    """Frequency ids: the table sizes the histogram gives at the threshold, and the
    dictionaries. The engine writes them in place on a path; at a URL into a new version under
    ``dictionaries/``, published by its marker once every table is written."""
    assert counted.histogram is not None  # _frequency_totals
    with run.timer.stage("dictionaries"):
        sizes = table_sizes(counted.histogram, run.spec)
        final = run.layout.dictionaries
        if workdir_io.is_remote(final):
            version = workdir_io.new_version(final)
            run.engine.write_dictionaries(ByCount(run.spec, sizes), version, run.layout.dictionary_index)
            workdir_io.commit_version(final, version)
        else:
            run.engine.write_dictionaries(ByCount(run.spec, sizes), final, run.layout.dictionary_index)
        _finish_counted_tables(run, counted, sizes)
    return sizes


def _stable_dictionaries(run: RunContext, counted: Counted) -> dict[str, int]:
    """Stable ids: the previous dictionaries extended with this run's kept newcomers."""
    with run.timer.stage("dictionaries"):
        kept = run.engine.write_dictionaries(
            AfterPrevious(run.spec), run.layout.dictionaries, run.layout.dictionary_index
        )
        sizes = sizes_of_kept(kept)
        _finish_counted_tables(run, counted, sizes)
    return sizes


def _finish_counted_tables(run: RunContext, counted: Counted, sizes: dict[str, int]) -> None:
    """The table sizes (model_size.json), then days.json once the recounted days' value counts
    are stored (it says they can be reused)."""
    workdir_io.write_json(run.layout.parquet_model_size, sizes, sort_keys=False)
    run.engine.finish_counts()
    counting.write_days_json(run.days, counted.stats, run.layout.counts, run.cfg.max_line_bytes)


def _capped_tables(run: RunContext, counted: Counted) -> dict[str, int]:
    """Modulo ids: no dictionaries, the tables are the caps."""
    sizes = column_caps(run.cfg)
    workdir_io.write_json(run.layout.parquet_model_size, sizes, sort_keys=False)
    return sizes


def _contiguous_dictionaries(run: RunContext, counted: Counted) -> dict[str, int]:
    """Contiguous ids: the dictionary pass over the dictionary days; the table sizes (the
    caps, or each column's highest id + 1) in model_size.json."""
    cfg = run.cfg
    with run.timer.stage("dictionaries"):
        numbered = run.dictionary_days() or [d.day for d in run.days]
        kept = run.engine.write_dictionaries(
            ByFirstAppearance(run.spec, counted.stats, numbered),
            run.layout.dictionaries_of(run.mode),
            run.layout.dictionary_index,
        )
        sizes = contiguous_table_sizes(kept, column_caps(cfg) if cfg.caps is not None else None)
        workdir_io.write_json(run.layout.parquet_model_size, sizes, sort_keys=False)
    return sizes


# ---------------------------------------------------------------- splits
def _transform(
    run: RunContext,
    counted: Counted,
    sizes: dict[str, int],
    dictionaries: Path,
    staging: Path,
    days: list[DayFile] | None = None,
) -> None:
    """The engine's transform of ``days`` (None: every day) into ``staging/<split>/``, the train
    split in as many files as the rows of those days (of the train days, for every day) call for."""
    stats = counted.stats
    sized = run.days[:-1] if days is None else days
    run.engine.write_splits(
        stats,
        sizes,
        dictionaries,
        run.layout.dictionary_index,
        staging,
        train_files(run.cfg, sum(stats[d.day].rows_valid for d in sized)),
        None if days is None else {d.day for d in days},
    )


def _write_splits(run: RunContext, counted: Counted, sizes: dict[str, int]) -> dict[str, int]:
    """Train, test and validation from a second read of every day; rows per split, counted
    from the written files' footers."""
    layout, cfg = run.layout, run.cfg
    with run.timer.stage("transform"):
        staging = split_staging(layout.parquet)
        # (the transform of modulo ids reads no dictionaries)
        dictionaries = published_dictionaries(layout, run.mode) or layout.dictionaries_of(run.mode)
        _transform(run, counted, sizes, dictionaries or layout.dictionaries, staging)
        settle_split_dirs(staging, {s: layout.parquet_split(s) for s in SPLITS}, cfg.compression)
    return {split: rows_in_files(layout.parquet_split(split)) for split in SPLITS}


def _write_day_splits(run: RunContext, counted: Counted, sizes: dict[str, int]) -> dict[str, int]:
    """Stable ids: transform only the days the plan says (new, changed role, changed file or
    settings), each alone into ``parquet/days/day=<k>``; the splits are then links to the
    window's days. Returns rows per split (from the linked files' footers)."""
    layout, cfg, stats, work = run.layout, run.cfg, counted.stats, counted.work
    assert work is not None  # planned by _count_stable
    with run.timer.stage("transform"):
        # after the dictionaries' commit: the lineage they were extended under (kept), or a
        # new one when they started over (then every day is in ``work.transform``)
        lineage = stable_ids.lineage(layout.dictionaries)
        transformed = day_store.TransformedWith(
            cfg, lineage, sizes, day_store.stats_key(run.engine.name, cfg)
        )
        for day, role, _ in work.transform:
            staging = day_store.staging_dir(layout, day.day)
            _transform(run, counted, sizes, layout.dictionaries, staging, [day])
            for split in day_store.ROLE_SPLITS[role]:
                if not day_store.day_part_files(staging, split):
                    write_empty(staging / split / "part-00000.parquet", cfg.compression)
            day_store.commit_day(layout, day, role, stats[day.day], transformed)
        staging = layout.parquet / ".splits-staging"
        segments = day_store.link_splits(layout, run.days, staging)
        move_split_dirs(staging, {s: layout.parquet_split(s) for s in SPLITS})
        day_store.write_segments(layout, segments)
        day_store.drop_days(layout, work.dropped)
    return {split: rows_in_files(layout.parquet_split(split)) for split in SPLITS}


# Each mode's stages, asked by its mode object (dlrm_contracts.id_modes).
STEPS: dict[IdMode, Steps] = {
    FREQUENCY: Steps(_count_values, _frequency_totals, _frequency_dictionaries, _write_splits),
    STABLE: Steps(_count_stable, _stable_totals, _stable_dictionaries, _write_day_splits),
    MODULO: Steps(_count_statistics, _no_totals, _capped_tables, _write_splits),
    CONTIGUOUS: Steps(_count_statistics, _no_totals, _contiguous_dictionaries, _write_splits),
}


def clean_outputs(workdir) -> None:
    """Remove this job's outputs (not the counts, which are reused across runs)."""
    layout = WorkdirLayout.at(workdir)
    for path in (layout.parquet, layout.rejects):
        workdir_io.remove_tree(path)


__all__ = ["RunContext", "run_preprocess", "clean_outputs", "published_dictionaries"]
