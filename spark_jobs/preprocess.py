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
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from dlrm_contracts import workdir_io
from dlrm_contracts.atomic import fsync_tree
from dlrm_contracts.config import PreprocessConfig, SparkConfig, column_caps
from dlrm_contracts.layout import PREPROCESS_JSON, SEGMENTS_JSON, SUCCESS, WorkdirLayout
from dlrm_contracts.schema import SPLITS
from spark_jobs import counting, day_store, progress, quality, stable_ids
from spark_jobs.contiguous_ids import DICTIONARIES_DIR as CONTIGUOUS_DICTIONARIES
from spark_jobs.contiguous_ids import table_sizes as contiguous_table_sizes
from spark_jobs.dictionaries import table_sizes
from spark_jobs.engine import Engine
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
from spark_jobs.timing import StageTimer

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from dlrm_contracts.thresholds import ThresholdSpec

PREPROCESS_FORMAT_VERSION = 1


def dictionaries_dir(layout: WorkdirLayout) -> Path:
    """value → id tables, partitioned by column (kept for inspection and for serving). At a
    URL the tables are in the version its ``_COMMIT.json`` names (``published_dictionaries``)."""
    return layout.parquet / "dictionaries"


def published_dictionaries(layout: WorkdirLayout):
    """Where the dictionaries' tables are: ``dictionaries_dir`` on a path, the committed
    version under it at a URL (None before any run published them)."""
    return workdir_io.published_dir(dictionaries_dir(layout))


def run_preprocess(
    input_dir, workdir, spark: SparkConfig, preprocess: PreprocessConfig, retransform: bool = False
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

    Returns:
        The summary also written to ``parquet/preprocess.json``: rows per split, table sizes,
        data-quality totals, timings; ``parquet/_SUCCESS`` marks it complete.

    Raises:
        PreprocessConfigError: a setting that cannot work.
        PreprocessInputError: unusable input, or too many rejected lines.
        PreprocessJobError: Spark failed, or rows in != rows out + rejected.
    """
    spec = preprocess.frequency_threshold
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
        stable_ids.recover(dictionaries_dir(layout))
    previous = (
        stable_ids.previous_dictionaries(dictionaries_dir(layout), spec)
        if preprocess.ids == "stable"
        else None
    )
    workdir_io.make_dir(layout.parquet)
    workdir_io.remove(layout.parquet / SUCCESS)
    workdir_io.remove(layout.parquet / SEGMENTS_JSON)
    if preprocess.ids != "stable":
        day_store.forget_days(layout)
    if not remote:  # stable ids' staging (refused at a URL)
        day_store.clear_leftovers(layout)
    with spark_errors():
        session = get_session(spark)
        return _run(session, days, layout, spec, preprocess, engine_id, previous, retransform)


def check_url_workdir(preprocess: PreprocessConfig, engine_id: str) -> None:
    """What a workdir URL does not support, refused (exit 2) before anything is written:
    stable ids keep their dictionaries' lineage by directory swaps on a filesystem, and the
    SQL engine settles its splits by renaming Spark's output directories."""
    if engine_id == "sql":
        raise PreprocessConfigError(
            "preprocess.engine: sql writes its splits by renaming directories, which a workdir "
            "URL does not have: use preprocess.engine: arrow with a workdir URL, or a workdir "
            "path (the input may be a URL) (docs/cluster.md §2.0.3)"
        )
    if preprocess.ids == "stable":
        raise PreprocessConfigError(
            "preprocess.ids: stable needs a workdir on a filesystem path (its dictionaries are "
            "extended in place run after run); a workdir URL supports ids: frequency and "
            "modulo (docs/cluster.md §2.0.3)"
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


def _run(
    session: SparkSession,
    days: list[DayFile],
    layout: WorkdirLayout,
    spec: ThresholdSpec,
    cfg: PreprocessConfig,
    engine_id: str,
    previous: stable_ids.Previous | None = None,
    retransform: bool = False,
) -> dict:
    timer = StageTimer()
    engine = _make_engine(engine_id, session, days, cfg)
    if cfg.ids == "stable":
        engine.use_previous_dictionaries(previous)
    try:
        return _run_stages(engine, days, layout, spec, cfg, timer, retransform)
    finally:
        engine.close()


def _run_stages(
    engine: Engine,
    days: list[DayFile],
    layout: WorkdirLayout,
    spec: ThresholdSpec,
    cfg: PreprocessConfig,
    timer: StageTimer,
    retransform: bool = False,
) -> dict:
    work = None
    modulo = cfg.ids == "modulo"
    uncounted = cfg.ids in ("modulo", "contiguous")  # no value counts are kept
    with timer.stage("count"):
        if not uncounted:
            counting.drop_stale_days(days, layout.counts)
        recount = [] if uncounted else counting.days_to_count(days, layout.counts, cfg.max_line_bytes)
        if uncounted:
            stats = _count_modulo(engine, layout)
        elif cfg.ids == "stable":
            work = day_store.plan(
                days, layout, cfg, stable_ids.lineage(dictionaries_dir(layout)), retransform
            )
            # the progress report plans the transform on the days it will read, not the window
            progress.planned(
                "transform",
                [d.day for d, _, _ in work.transform],
                [d.day for d, role, _ in work.transform if role == day_store.TRAIN],
            )
            stats = _count_stable(engine, days, layout, recount, cfg, work)
        else:
            stats = engine.count(recount, layout.counts)
        quality.check_days_not_empty(days, stats)
        engine.write_rejects(stats, layout.rejects)
        report = quality.quality_report(days, stats, cfg.max_reject_rate)
        workdir_io.write_json(layout.data_quality, report, sort_keys=False)
        quality.check_reject_rate(report)
        histogram = (
            None
            if uncounted
            else engine.count_totals(
                layout.counts,
                _dictionary_days(days, cfg),
                frequency_ids=None if cfg.ids == "stable" else spec,
            )
        )
    if modulo:  # no dictionaries: the tables are the caps
        sizes = column_caps(cfg)
        workdir_io.write_json(layout.parquet_model_size, sizes, sort_keys=False)
    elif cfg.ids == "contiguous":
        sizes = _contiguous_dictionaries(engine, days, layout, spec, cfg, stats, timer)
    else:
        sizes = _dictionaries(engine, days, layout, spec, cfg, stats, histogram, timer)
    if work is not None:
        rows = _write_stable_splits(engine, days, layout, sizes, stats, cfg, timer, work)
    else:
        rows = _write_splits(engine, days, layout, sizes, stats, cfg, timer)
    rows_out = sum(rows.values())
    report = quality.quality_report(days, stats, cfg.max_reject_rate, rows_out_checked=rows_out)
    workdir_io.write_json(layout.data_quality, report, sort_keys=False)
    quality.check_identity(report)
    summary = {
        "format_version": PREPROCESS_FORMAT_VERSION,
        # modulo ids keep every value (capped): they are at no threshold
        "threshold_spec": None if modulo else str(spec),
        "seed": cfg.shuffle_seed,
        "engine": engine.name,
        "lookups": engine.lookups,
        "dictionary_days": cfg.dictionary_days,
        "ids": cfg.ids,
        "window_days": cfg.window_days,
        "days": [{"day": d.day, "file": d.name, "fingerprint": d.fingerprint()} for d in days],
        "days_counted": recount,
        "days_reused": [] if uncounted else [d.day for d in days if d.day not in recount],
        # stable ids: which days were transformed (and why), reused, dropped
        **({"transform": work.summary()} if work is not None else {}),
        "rows": rows,
        "table_sizes": sizes,
        "data_quality": report["totals"],
        "timings": {**timer.seconds, "total": round(sum(timer.seconds.values()), 3)},
        "cpu_seconds": {**timer.cpu_seconds, "total": round(sum(timer.cpu_seconds.values()), 3)},
    }
    workdir_io.write_json(layout.parquet / PREPROCESS_JSON, summary, sort_keys=False)
    if not workdir_io.is_remote(layout.parquet):
        # the splits, dictionaries, index and records on disk before the marker that says they
        # are complete (the tasks wrote most of them without flushing: one pass here instead);
        # a store's objects are durable once their upload completed
        fsync_tree(layout.parquet)
    workdir_io.write_text(layout.parquet / SUCCESS, "")
    return summary


def _dictionaries(
    engine: Engine,
    days: list[DayFile],
    layout: WorkdirLayout,
    spec: ThresholdSpec,
    cfg: PreprocessConfig,
    stats: dict[int, DayStats],
    histogram,
    timer: StageTimer,
) -> dict[str, int]:
    """Frequency or stable ids: the dictionaries and their table sizes (model_size.json), then
    days.json (once the recounted days' value counts are stored: it says they can be reused)."""
    with timer.stage("dictionaries"):
        if cfg.ids == "stable":
            sizes = engine.write_stable_dictionaries(spec, dictionaries_dir(layout), layout.dictionary_index)
        else:
            sizes = table_sizes(histogram, spec)
            _write_frequency_dictionaries(engine, spec, sizes, layout)
        workdir_io.write_json(layout.parquet_model_size, sizes, sort_keys=False)
        engine.finish_counts()
        counting.write_days_json(days, stats, layout.counts, cfg.max_line_bytes)
    return sizes


def _write_frequency_dictionaries(
    engine: Engine, spec: ThresholdSpec, sizes: dict[str, int], layout: WorkdirLayout
) -> None:
    """The engine writes the dictionaries in place on a path; at a URL into a new version
    under ``dictionaries/``, published by its marker once every table is written."""
    final = dictionaries_dir(layout)
    if not workdir_io.is_remote(final):
        engine.write_dictionaries(spec, sizes, final, layout.dictionary_index)
        return
    version = workdir_io.new_version(final)
    engine.write_dictionaries(spec, sizes, version, layout.dictionary_index)
    workdir_io.commit_version(final, version)


def _contiguous_dictionaries(
    engine: Engine,
    days: list[DayFile],
    layout: WorkdirLayout,
    spec: ThresholdSpec,
    cfg: PreprocessConfig,
    stats: dict[int, DayStats],
    timer: StageTimer,
) -> dict[str, int]:
    """Contiguous ids: the dictionary pass over the dictionary days; the table sizes (the
    caps, or each column's highest id + 1) in model_size.json."""
    with timer.stage("dictionaries"):
        numbered = _dictionary_days(days, cfg) or [d.day for d in days]
        kept = engine.write_contiguous_dictionaries(
            spec, stats, numbered, layout.parquet / CONTIGUOUS_DICTIONARIES, layout.dictionary_index
        )
        sizes = contiguous_table_sizes(kept, column_caps(cfg) if cfg.caps is not None else None)
        workdir_io.write_json(layout.parquet_model_size, sizes, sort_keys=False)
    return sizes


def _count_modulo(engine: Engine, layout: WorkdirLayout) -> dict[int, DayStats]:
    """Modulo (and contiguous) ids: every day's statistics, no value counted. The counts of another mode's
    runs stay as they are (days.json vouches only for the counts it lists); the dictionaries
    and their index go, since no id of these splits comes from them."""
    workdir_io.remove_tree(dictionaries_dir(layout))
    workdir_io.remove_tree(layout.dictionary_index)
    return engine.count_statistics(layout.counts)


def _count_stable(
    engine: Engine,
    days: list[DayFile],
    layout: WorkdirLayout,
    recount: list[int],
    cfg: PreprocessConfig,
    work: day_store.DayWork,
) -> dict[int, DayStats]:
    """Every day's statistics, reading only the days whose statistics are not kept with their
    transformed parts (``day_store.stored_stats``), those to recount, and the newest day (so
    the pass always has a day to read). The days read are noted in ``work``."""
    kept = day_store.stored_stats(layout, work, days, day_store.stats_key(engine.name, cfg))
    read = {d.day for d in days if d.day not in kept} | set(recount) | {days[-1].day}
    progress.planned("count", sorted(read))
    stats = engine.count(recount, layout.counts, read)
    work.read.extend(sorted(read))
    stats.update({day: s for day, s in kept.items() if day not in stats})
    return stats


def _dictionary_days(days: list[DayFile], cfg: PreprocessConfig) -> list[int] | None:
    """The days whose counts make the dictionaries: None = all of them."""
    return [d.day for d in days[:-1]] if cfg.dictionary_days == "train" else None


def _write_splits(
    engine: Engine,
    days: list[DayFile],
    layout: WorkdirLayout,
    sizes: dict[str, int],
    stats: dict[int, DayStats],
    cfg: PreprocessConfig,
    timer: StageTimer,
) -> dict[str, int]:
    """Train, test and validation from a second read of every day; rows per split, counted
    from the written files' footers."""
    with timer.stage("transform"):
        staging = split_staging(layout.parquet)
        partitions = train_files(cfg, sum(stats[d.day].rows_valid for d in days[:-1]))
        engine.write_splits(
            stats,
            sizes,
            published_dictionaries(layout) or dictionaries_dir(layout),
            layout.dictionary_index,
            staging,
            partitions,
        )
        settle_split_dirs(staging, {s: layout.parquet_split(s) for s in SPLITS}, cfg.compression)
    return {split: rows_in_files(layout.parquet_split(split)) for split in SPLITS}


def _write_stable_splits(
    engine: Engine,
    days: list[DayFile],
    layout: WorkdirLayout,
    sizes: dict[str, int],
    stats: dict[int, DayStats],
    cfg: PreprocessConfig,
    timer: StageTimer,
    work: day_store.DayWork,
) -> dict[str, int]:
    """Stable ids: transform only the days ``work`` says (new, changed role, changed file or
    settings), each alone into ``parquet/days/day=<k>``; the splits are then links to the
    window's days. Returns rows per split (from the linked files' footers)."""
    with timer.stage("transform"):
        # after the dictionaries' commit: the lineage they were extended under (kept), or a
        # new one when they started over (then every day is in ``work.transform``)
        lineage = stable_ids.lineage(dictionaries_dir(layout))
        for day, role, _ in work.transform:
            staging = day_store.staging_dir(layout, day.day)
            partitions = train_files(cfg, stats[day.day].rows_valid)
            engine.write_splits(
                stats,
                sizes,
                dictionaries_dir(layout),
                layout.dictionary_index,
                staging,
                partitions,
                days={day.day},
            )
            for split in day_store.ROLE_SPLITS[role]:
                if not day_store.day_part_files(staging, split):
                    write_empty(staging / split / "part-00000.parquet", cfg.compression)
            day_store.commit_day(
                layout, day, role, cfg, lineage, sizes, stats[day.day], day_store.stats_key(engine.name, cfg)
            )
        staging = layout.parquet / ".splits-staging"
        segments = day_store.link_splits(layout, days, staging)
        move_split_dirs(staging, {s: layout.parquet_split(s) for s in SPLITS})
        day_store.write_segments(layout, segments)
        day_store.drop_days(layout, work.dropped)
    return {split: rows_in_files(layout.parquet_split(split)) for split in SPLITS}


def clean_outputs(workdir) -> None:
    """Remove this job's outputs (not the counts, which are reused across runs)."""
    layout = WorkdirLayout.at(workdir)
    for path in (layout.parquet, layout.rejects):
        workdir_io.remove_tree(path)


__all__ = ["run_preprocess", "clean_outputs", "dictionaries_dir", "published_dictionaries"]
