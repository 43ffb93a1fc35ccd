"""The Arrow engine: Spark schedules, caches, shuffles, groups and sorts; the per-line and
per-value work runs in Python tasks over whole blocks of lines and whole arrays of values.

Count pass: one task per chunk emits its statistics and, per column, its distinct values and
their counts as binary values, cached by Spark. Totals and dictionaries
(``spark_jobs.engines.arrow.dictionaries``): the partial counts are grouped by (column, value range)
and merged, the recounted days' counts written, the totals' histograms collected; then each
group writes its part of the dictionaries and of the dictionary index. Transform pass: tasks
look every categorical up in the memory-mapped index (``spark_jobs.engines.arrow.dictionary_index``; no Spark
join) and emit the split rows packed (``spark_jobs.engines.arrow.split_writer``); the last day's tasks write
test and validation themselves, train is hash-partitioned and sorted by Spark and written by
pyarrow inside the writer tasks.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from functools import partial, singledispatchmethod
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from dlrm_contracts.config import PreprocessConfig, column_caps
from dlrm_contracts.schema import CAT_COLUMNS
from dlrm_contracts.thresholds import ThresholdSpec
from spark_jobs import stable_ids
from spark_jobs.engine import AfterPrevious, ByCount, ByFirstAppearance, Numbering
from spark_jobs.columns import literal_lookup
from spark_jobs.engines.arrow import dictionaries as dicts
from spark_jobs.engines.arrow import count_exchange, dictionary_index, partial_files, remote, split_writer
from spark_jobs.engines.arrow import stable_ids as stable_groups
from spark_jobs.engines.arrow import tasks as arrow_tasks
from spark_jobs.engines.arrow.chunks import plan_chunks
from spark_jobs.engines.arrow.fastparse import REASON_CODES
from spark_jobs.engines.arrow.input_copies import CopySpec
from spark_jobs.engines.arrow.split_writer import WriteSpec
from spark_jobs.engines.arrow.tasks import (
    CODE_BITS,
    LINES,
    MISSING_CAT,
    MISSING_INT,
    PADDED,
    REJECT_SCHEMA,
    SLOW,
    TRANSFORM_SCHEMA,
    ReadSettings,
    TransformSpec,
)
from spark_jobs.engines.arrow.value_counts import VALUE_DTYPE
from spark_jobs.inputs import DayFile
from spark_jobs.stats import DayStats, line_number_column

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

# Valid lines whose values a task counts together before merging them into the chunk's counts:
# bounds a task's memory (26 int64 per line) whatever the chunk size.
COUNT_FLUSH_LINES = 1 << 18
# Rows a writer task buffers per parquet row group: 40 MB of packed rows, bounding a worker's
# memory whatever the file size.
ROW_GROUP_ROWS = 1 << 18


class ArrowEngine:
    name = "arrow"
    lookups = "dictionary index"  # how the transform finds ids (recorded in preprocess.json)

    def __init__(self, session: SparkSession, days: list[DayFile], cfg: PreprocessConfig):
        self.session = session
        self.days = days
        self.cfg = cfg
        self.settings = ReadSettings(
            block_bytes=max(4096, cfg.arrow_block_kb << 10),
            count_flush_lines=COUNT_FLUSH_LINES,
            max_line_bytes=cfg.max_line_bytes,
            remote_read_bytes=cfg.arrow_remote_read_mb << 20,
            input_copies=(
                CopySpec.new(cfg.arrow_input_copy_mb) if any(remote.is_url(d.path) for d in days) else None
            ),
        )
        self.chunks = plan_chunks(days, max(1, cfg.arrow_chunk_mb) << 20)
        self._recounted: list[int] = []
        self._partials_dir: str | Path | None = None  # the count pass's partial files, until merged
        self._host_partials: Path | None = None  # the ``local`` exchange's directory
        self._host_totals: Path | None = None  # its staged dictionary parts, on this host too
        self._counted: list = []  # the shuffle exchange's persisted count outputs
        self._samples: list = []  # (column, entries, sampled values) per partial
        self._entries: dict[int, int] = {}  # distinct values per group (totals on disk)
        self._totals_dir: Path | None = None  # where the merge leaves the totals or staged parts
        self._staged_for: ThresholdSpec | None = None  # the threshold the parts are staged for
        self._plan: dicts.GroupPlan | None = None
        self._histograms: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._previous: stable_ids.Previous | None = None  # stable ids: what they extend
        self._previous_samples: list = []
        if not session.sparkContext.master.startswith("local"):
            _ship_code(session)

    def _over(self, items: list, task, schema: str) -> DataFrame:
        """One partition (and so one task) per item (a chunk, a stored counts file)."""
        return self.session.range(0, len(items), 1, max(1, len(items))).mapInArrow(task, schema)

    # ------------------------------------------------------------ count pass
    def exchange(self, counts_dir) -> str:
        """How partial counts reach the merge (``PreprocessConfig.arrow_exchange``)."""
        return choose_exchange(
            self.cfg.arrow_exchange, remote.is_url(counts_dir), self.session.sparkContext.master
        )

    def _partials_at(self, counts_dir) -> str | Path:
        """Where the count tasks leave their partial files: the workdir (``files``) or one
        directory on this host's local disk for the whole job (``local``)."""
        if self.exchange(counts_dir) != "local":
            return partial_files.partials_dir(counts_dir)
        if self._host_partials is None:
            self._host_partials = partial_files.on_this_host(_local_dir(self.session))
        return self._host_partials

    def _totals_at(self, counts_dir) -> Path | str:
        """Where the merge leaves each group's totals or staged dictionary part for the
        dictionary tasks: the workdir, or with the ``local`` exchange a directory on this
        host's local disk (every task runs here), so that behind a URL the staged parts do
        not go to the store and back."""
        if self.exchange(counts_dir) != "local":
            return dicts.totals_dir(counts_dir)
        if self._host_totals is None:
            self._host_totals = partial_files.on_this_host(_local_dir(self.session))
        return self._host_totals

    def count(
        self, recount: list[int], counts_dir: Path, read: set[int] | None = None
    ) -> dict[int, DayStats]:
        """Statistics of every day read (``read``, a superset of ``recount``; None: every
        day); the partial value counts of ``recount`` stay cached for ``count_totals``."""
        days = [d for d in self.days if read is None or d.day in read]
        chunks = [c for c in self.chunks if read is None or c.day in read]
        self._release_counted()
        if self.exchange(counts_dir) == "shuffle":
            task = arrow_tasks.count_task(chunks, frozenset(recount), self.settings, None)
            rows = self._persisted(self._over(chunks, task, dicts.COUNT_SCHEMA))
        else:
            partials = self._partials_dir = self._partials_at(counts_dir)
            partial_files.clear(partials)
            task = arrow_tasks.count_task(chunks, frozenset(recount), self.settings, str(partials))
            rows = self._over(chunks, task, dicts.COUNT_SCHEMA).collect()
        self._recounted = list(recount)
        self._samples = _samples(rows)
        return _stats_from_rows([r for r in rows if r["kind"] == dicts.KIND_STATS], days)

    def _persisted(self, frame) -> list:
        """``frame`` kept on the executors' local disks for the shuffled merge; its rows other
        than the partial counts (statistics, samples), collected."""
        from pyspark import StorageLevel
        from pyspark.sql import functions as F

        frame = frame.persist(StorageLevel.DISK_ONLY)
        self._counted.append(frame)
        return frame.filter(F.col("kind") != count_exchange.KIND_PARTIAL).collect()

    def _release_counted(self) -> None:
        for frame in self._counted:
            frame.unpersist()
        self._counted = []

    def count_totals(
        self, counts_dir: Path, days: list[int] | None, frequency_ids: ThresholdSpec | None = None
    ) -> dict[str, list[tuple[int, int]]]:
        """Write the recounted days' value counts, sum the totals over ``days`` (None: all) by
        group, and return (and store) their count histogram per column. With
        ``frequency_ids`` (the threshold of a frequency-ids run) the merge also stages each
        group's dictionary part, so that only the ids are left for ``write_dictionaries``."""
        shuffle = self.exchange(counts_dir) == "shuffle"
        if remote.is_url(counts_dir) and frequency_ids is None:
            raise RuntimeError(
                "stable ids (preprocess.ids: stable) need a workdir on a "
                "filesystem path; a workdir URL supports frequency ids"
            )
        wanted = [d.day for d in self.days] if days is None else list(days)
        partials = None if shuffle else self._partials_at(counts_dir)
        samples = list(self._samples) + self._previous_samples
        stored = dicts.stored_files(counts_dir, [d for d in wanted if d not in self._recounted])
        if stored:
            batches = dicts.stored_batches(stored, 4 * self.session.sparkContext.defaultParallelism)
            task = dicts.stored_partials_task(batches, None if shuffle else str(partials))
            frame = self._over(batches, task, dicts.COUNT_SCHEMA)
            samples += _samples(self._persisted(frame) if shuffle else frame.collect())
        self._plan = dicts.GroupPlan.from_samples(samples, self.cfg.arrow_group_values)
        dicts.clear_day_counts(counts_dir, self._recounted)
        self._totals_dir = self._totals_at(counts_dir)
        dicts.clear_dir(self._totals_dir)
        merge = dicts.MergeSpec(
            self._plan,
            frozenset(self._recounted),
            frozenset(wanted),
            str(counts_dir),
            str(self._totals_dir),
            dicts.thresholds(frequency_ids) if frequency_ids else None,
        )
        self._staged_for = frequency_ids
        if shuffle:
            rows = self._shuffled_merge(merge)
        else:
            groups = dicts.balanced_batches(self._plan.group_entries(), self._tasks_per_group_pass())
            rows = self._over(
                groups, dicts.merge_task(merge, groups, partial_files.files(partials)), dicts.TOTALS_SCHEMA
            ).collect()
            partial_files.clear(partials)
        self._histograms = {
            int(r["group"]): (
                np.frombuffer(r["histogram_counts"], np.int64),
                np.frombuffer(r["histogram_sizes"], np.int64),
            )
            for r in rows
        }
        self._entries = {int(r["group"]): int(r["entries"]) for r in rows}
        return _write_histogram(_column_histogram(self._plan, self._histograms), counts_dir)

    def _shuffled_merge(self, merge: dicts.MergeSpec) -> list:
        """The merge over Spark's exchange: each persisted partial row cut at its column's
        group bounds (``count_exchange.route_task``), the pieces shuffled to their group's
        task, a task's rows sorted by group."""
        from functools import reduce

        from pyspark.sql import functions as F

        partials = reduce(lambda a, b: a.unionByName(b), self._counted).filter(
            F.col("kind") == count_exchange.KIND_PARTIAL
        )
        routed = partials.select(*count_exchange.ROUTE_INPUT).mapInArrow(
            count_exchange.route_task(self._plan), count_exchange.ROUTED_SCHEMA
        )
        rows = (
            routed.repartition(self._tasks_per_group_pass(), "group")
            .sortWithinPartitions("group", "day")
            .mapInArrow(count_exchange.merge_task(merge), dicts.TOTALS_SCHEMA)
            .collect()
        )
        self._release_counted()
        return rows

    def count_statistics(self, counts_dir: Path) -> dict[int, DayStats]:
        """Every day's statistics; no value is counted (the tasks parse and sum
        their statistics rows only)."""
        return self.count([], counts_dir)

    def finish_counts(self) -> None:
        """The merge wrote the recounted days' value counts before count_totals returned."""

    def close(self) -> None:
        """Remove the partial files of a count pass that did not reach its merge."""
        if self._partials_dir is not None:
            partial_files.clear(self._partials_dir)
        if self._host_partials is not None:
            partial_files.clear(self._host_partials)
        if self._host_totals is not None:
            partial_files.clear(self._host_totals)
        self._release_counted()

    # ------------------------------------------------------------ dictionaries
    @singledispatchmethod
    def write_dictionaries(self, numbering: Numbering, dict_dir: Path, index_dir: Path) -> dict[str, int]:
        """The dictionaries numbered by ``numbering``'s rule (one method per rule below)."""
        raise TypeError(f"no numbering {type(numbering).__name__}")

    @write_dictionaries.register(ByCount)
    def _by_count(self, numbering: ByCount, dict_dir: Path, index_dir: Path) -> dict[str, int]:
        """Each group's part of the dictionaries (value, id, count), staged by the merge, gets
        its ids; its region of the dictionary index is written."""
        spec, sizes = numbering.spec, numbering.sizes
        if self._staged_for != spec:
            raise RuntimeError(
                f"the merge staged the dictionaries for threshold {self._staged_for}, not {spec}"
            )
        minimum = dicts.thresholds(spec)
        first_ids = dicts.first_ids(self._plan, self._histograms, minimum)
        layouts, regions = dicts.index_layouts(self._plan, self._histograms, minimum)
        expected = sum(sizes[c] - 1 for c in CAT_COLUMNS)
        dicts.clear_dir(dict_dir)
        if not remote.is_url(dict_dir):
            dict_dir.mkdir(parents=True)
        dictionary_index.create_index(index_dir, layouts)
        broadcast = self.session.sparkContext.broadcast(first_ids)
        try:
            write = dicts.WriteSpec(self._plan, str(dict_dir), str(index_dir), regions, str(self._totals_dir))
            # one task per core: a group's fill takes milliseconds, less than a task's start-up;
            # dealt by the slots each fills (a group's distinct values say little of what it
            # keeps), and only the groups that keep something: the others staged nothing
            batches = dicts.balanced_batches(
                {g: slots for g, (_, slots) in regions.items() if slots},
                self.session.sparkContext.defaultParallelism,
            )
            written = self._over(
                batches, dicts.dictionary_task(write, batches, broadcast), dicts.WRITTEN_SCHEMA
            ).collect()
        finally:
            broadcast.unpersist()
        kept = sum(r["kept"] for r in written)
        if kept != expected:
            raise RuntimeError(
                f"{kept} values kept in the dictionaries, but the table sizes from "
                f"the histogram add up to {expected}"
            )
        checksums = {
            (CAT_COLUMNS[column], rank): r["checksum"]
            for r in written
            if r["checksum"] is not None
            for column, rank in [self._plan.column_range(int(r["group"]))]
        }
        dictionary_index.seal_index(index_dir, checksums if remote.is_url(index_dir) else None)
        dicts.clear_dir(self._totals_dir)
        return {c: sizes[c] - 1 for c in CAT_COLUMNS}

    @write_dictionaries.register(ByFirstAppearance)
    def _by_first_appearance(
        self, numbering: ByFirstAppearance, dict_dir: Path, index_dir: Path
    ) -> dict[str, int]:
        """First-seen tasks over the chunks of the numbered days, the shared builder's
        dictionaries (``spark_jobs.contiguous_ids``), then their index
        (``engines.arrow.contiguous``)."""
        from spark_jobs.contiguous_ids import PARTIAL_SCHEMA, build_dictionaries
        from spark_jobs.engines.arrow import contiguous

        if remote.is_url(index_dir):
            from spark_jobs.errors import PreprocessConfigError

            raise PreprocessConfigError(
                "contiguous ids (preprocess.ids: contiguous) need a "
                "workdir on a filesystem path with the arrow engine "
                "(or preprocess.engine: sql)"
            )
        chunks = [c for c in self.chunks if c.day in set(numbering.days)]
        partials = self._over(chunks, contiguous.first_seen_task(chunks, self.settings), PARTIAL_SCHEMA)
        ids, kept = build_dictionaries(partials, numbering.spec, dict_dir)
        try:
            contiguous.write_index(self.session, ids, kept, str(index_dir), self.cfg.arrow_group_values)
        finally:
            ids.unpersist()
        return kept

    def use_previous_dictionaries(self, previous: stable_ids.Previous | None) -> None:
        """What ``AfterPrevious`` extends (None: the first run); its entries count in the
        value ranges' sizes, so a range holds about ``arrow_group_values`` of old and new."""
        self._previous = previous
        self._previous_samples = stable_groups.dictionary_samples(previous)

    @write_dictionaries.register(AfterPrevious)
    def _after_previous(self, numbering: AfterPrevious, dict_dir: Path, index_dir: Path) -> dict[str, int]:
        """Stable ids (``spark_jobs.stable_ids``): every group reads its range of the previous
        dictionaries and finds its kept newcomers (a survey pass: their count histograms and
        the old entries per group, collected), the newcomers' first ids are summed on the
        driver as in the frequency mode, after each column's previous ids; then every group
        writes its part (old ids kept, newcomers numbered) into a staging directory and its
        index region, and the staging directory replaces the dictionaries."""
        spec = numbering.spec
        minimum = dicts.thresholds(spec)
        previous = self._previous
        before = previous.table_sizes if previous else {c: 1 for c in CAT_COLUMNS}
        ids = stable_groups.StableSpec(
            self._plan,
            minimum,
            previous.directory if previous else None,
            str(self._totals_dir),
            frozenset(self._entries),
        )
        # every group, not only those with counts this run: old entries must be carried over
        weights = {g: self._entries.get(g, 0) + 1 for g in range(self._plan.groups)}
        batches = dicts.balanced_batches(weights, self._tasks_per_group_pass())
        survey = {
            int(r["group"]): r
            for r in self._over(
                batches, stable_groups.survey_task(ids, batches), stable_groups.SURVEY_SCHEMA
            ).collect()
        }
        stable_groups.check_old_entries(self._plan, survey, before)
        histograms = {
            g: (np.frombuffer(r["histogram_counts"], np.int64), np.frombuffer(r["histogram_sizes"], np.int64))
            for g, r in survey.items()
        }
        kept = {g: int(r["old"]) + int(histograms[g][1].sum()) for g, r in survey.items()}
        sizes = dict(before)
        for g, (_, added) in histograms.items():
            sizes[CAT_COLUMNS[self._plan.column_range(g)[0]]] += int(added.sum())
        first_ids = stable_groups.newcomer_first_ids(self._plan, histograms, minimum, before)
        layouts, regions = dicts.layouts_of(self._plan, kept)
        staging = stable_ids.staging_dir(dict_dir)
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        dictionary_index.create_index(index_dir, layouts)
        broadcast = self.session.sparkContext.broadcast(first_ids)
        try:
            write = stable_groups.StableWriteSpec(ids, str(staging), str(index_dir), regions)
            batches = dicts.balanced_batches(
                {g: n + 1 for g, n in kept.items()}, self._tasks_per_group_pass()
            )
            written = self._over(
                batches, stable_groups.write_task(write, batches, broadcast), stable_groups.WRITTEN_SCHEMA
            ).collect()
        finally:
            broadcast.unpersist()
        total = sum(r["kept"] for r in written)
        if total != sum(sizes[c] - 1 for c in CAT_COLUMNS):
            raise RuntimeError(
                f"{total} values written to the stable dictionaries, but their "
                f"ids add up to {sum(sizes[c] - 1 for c in CAT_COLUMNS)}"
            )
        dictionary_index.seal_index(index_dir)
        stable_ids.commit(staging, dict_dir, spec, sizes)
        shutil.rmtree(self._totals_dir, ignore_errors=True)
        return {c: sizes[c] - 1 for c in CAT_COLUMNS}

    def _tasks_per_group_pass(self) -> int:
        return _merge_partitions(
            self._plan, self.cfg.arrow_group_values, self.session.sparkContext.defaultParallelism
        )

    # ------------------------------------------------------------ rejects
    def write_rejects(self, stats: dict[int, DayStats], out_dir: Path) -> None:
        dicts.clear_dir(out_dir)
        dirty = {d.day for d in self.days if stats[d.day].rows_rejected}
        if not dirty:
            if not remote.is_url(out_dir):
                Path(out_dir).mkdir(parents=True, exist_ok=True)
            return
        chunks = [c for c in self.chunks if c.day in dirty]
        rows = self._over(chunks, arrow_tasks.reject_task(chunks, self.settings), REJECT_SCHEMA)
        names = {d.day: d.name for d in self.days}
        rejects = rows.select(
            literal_lookup(names, "day").alias("file"),
            (line_number_column(stats, dirty) + 1).alias("line_number"),
            "reason",
            "line",
            "line_bytes",
        )
        if remote.is_url(out_dir):
            _write_json_lines(rejects, remote.join(out_dir, "part-00000.json"))
        else:
            rejects.write.mode("overwrite").json(str(out_dir))

    # ------------------------------------------------------------ transform pass
    def write_splits(
        self,
        stats: dict[int, DayStats],
        sizes: dict[str, int],
        dict_dir: Path,
        index_dir: Path,
        staging: Path,
        train_files: int,
        days: set[int] | None = None,
    ) -> None:
        """Write ``staging/<split>/part-*.parquet``. Every id comes from the dictionary index
        (with ``ids: modulo``: from the caps, ``spark_jobs.capped_ids``; with ``ids:
        contiguous`` from the index and the caps, ``spark_jobs.contiguous_ids``). Train is
        hash-partitioned into ``train_files`` by its order key and sorted within each file;
        the last day's tasks write test and validation in line order (chunk k writes part k).
        ``days``: only these days' rows (None: every day)."""
        spec = self.transform_spec(stats, index_dir)
        last = self.days[-1].day
        dicts.clear_dir(staging)
        write = partial(
            WriteSpec, out_dir=str(staging), compression=self.cfg.compression, row_group_rows=ROW_GROUP_ROWS
        )
        results = []
        if days is None or last in days:
            eval_chunks = [c for c in self.chunks if c.day == last]
            task = arrow_tasks.eval_write_task(
                eval_chunks, spec, self.settings, write(test_lines=spec.test_lines)
            )
            results += self._over(eval_chunks, task, split_writer.RESULT_SCHEMA).collect()
        if days is None or days - {last}:
            results += split_writer.write_partitions(
                self.train_rows(spec, train_files, days), write(test_lines=None)
            )
        split_writer.commit(results, staging)
        if remote.is_url(index_dir) and not spec.index_on_node:  # local mode's one copy
            import tempfile

            shutil.rmtree(
                Path(tempfile.gettempdir()) / f"criteo-dlrm-index-{spec.run_token}", ignore_errors=True
            )

    def train_rows(self, spec: TransformSpec, train_files: int, days: set[int] | None = None):
        """The train split's packed rows, hash-partitioned by their order key and sorted."""
        chunks = [c for c in self.chunks if c.day != spec.eval_day and (days is None or c.day in days)]
        rows = self._over(chunks, arrow_tasks.transform_task(chunks, spec, self.settings), TRANSFORM_SCHEMA)
        return rows.repartition(train_files, "_order").sortWithinPartitions("_order", "_tie")

    def transform_spec(self, stats, index_dir: Path) -> TransformSpec:
        first_line = {
            (day, chunk): offset for day, s in stats.items() for chunk, offset in s.line_offsets().items()
        }
        last = stats[self.days[-1].day]
        on_cluster = not self.session.sparkContext.master.startswith("local")
        mode = self.cfg.mode
        caps = tuple(column_caps(self.cfg)[c] for c in CAT_COLUMNS) if self.cfg.caps is not None else None
        return TransformSpec(
            index_dir=str(index_dir) if mode.writes_dictionaries else None,
            run_token=uuid.uuid4().hex,
            index_on_node=on_cluster,
            seed=int(self.cfg.shuffle_seed),
            chunk_first_line=first_line,
            eval_day=last.day,
            test_lines=last.test_lines,
            caps=caps,
            missing_value=mode.missing_value,
            rare_id=mode.rare_id,
        )


def _write_histogram(histogram, counts_dir) -> dict[str, list[tuple[int, int]]]:
    """The count histogram file (``write_histogram``'s bytes), behind a URL written in a scratch
    directory and sent as one object."""
    from dlrm_contracts.table_sizes import write_histogram

    if not remote.is_url(counts_dir):
        return write_histogram(histogram, counts_dir)
    from dlrm_contracts.layout import HISTOGRAM_FILE

    scratch = Path(remote.local_scratch("criteo-dlrm-histogram-"))
    try:
        ordered = write_histogram(histogram, scratch)
        remote.upload(scratch / HISTOGRAM_FILE, remote.join(counts_dir, HISTOGRAM_FILE))
        return ordered
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _write_json_lines(frame, url: str) -> None:
    """A small frame (the rejects) as one object of JSON lines, collected by the driver:
    Spark's own writer would need the store's Hadoop connector on every node. Each line is
    made by Spark's JSON generator (``to_json``), so it has the bytes of a local run's lines."""
    from pyspark.sql import functions as F

    json_lines = frame.select(F.to_json(F.struct(*frame.columns)).alias("line"))
    lines = (row["line"] for row in json_lines.toLocalIterator())
    remote.write_bytes(url, "".join(line + "\n" for line in lines).encode())


def _ship_code(session) -> None:
    """Executors unpickle the tasks by importing spark_jobs (and the contracts package it uses):
    send both as a zip, so a cluster's Python needs only the pinned packages, not the project."""
    import tempfile
    import zipfile

    root = Path(__file__).resolve().parents[3]
    archive = Path(tempfile.mkdtemp(prefix="criteo-dlrm-code-")) / "criteo_dlrm_code.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        for package in ("spark_jobs", "dlrm_contracts"):
            for source in sorted((root / package).rglob("*.py")):
                zf.write(source, source.relative_to(root))
    session.sparkContext.addPyFile(str(archive))


def _stats_from_rows(rows, days: list[DayFile]) -> dict[int, DayStats]:
    """DayStats from the summed statistics rows (column STATS_COLUMN) of the count pass."""
    from dlrm_contracts.schema import INT_COLUMNS

    stats = {d.day: DayStats(d.day) for d in days}
    for row in rows:
        s = stats[int(row["day"])]
        chunk, code, n = row["value"] >> CODE_BITS, row["value"] & ((1 << CODE_BITS) - 1), row["count"]
        if code == LINES:
            s.rows_read += n
            s.partitions[int(chunk)] = s.partitions.get(int(chunk), 0) + n
        elif 1 <= code < len(REASON_CODES):
            s.rejected[REASON_CODES[code]] += n
        elif code == PADDED:
            s.rows_padded += n
        elif code == SLOW:
            s.rows_fast -= n
        elif MISSING_INT <= code < MISSING_INT + len(INT_COLUMNS):
            s.missing[INT_COLUMNS[code - MISSING_INT]] += n
        elif MISSING_CAT <= code < MISSING_CAT + len(CAT_COLUMNS):
            s.missing[CAT_COLUMNS[code - MISSING_CAT]] += n
    for s in stats.values():
        s.rows_valid = s.rows_read - s.rows_rejected
        s.rows_fast += s.rows_read
    return stats


def _merge_partitions(plan: dicts.GroupPlan, group_values: int, cores: int) -> int:
    """Tasks of the merge (and of the dictionary write after it): about one group's
    worth of entries each, at least one per core (adaptive execution would fold a small
    shuffle into one task and leave the other cores idle), at most four per core (each task
    has its start-up cost), never more than the groups."""
    by_work = -(-plan.entries // max(1, group_values))
    return max(1, min(plan.groups, 4 * cores, max(cores, by_work)))


def _samples(rows) -> list[tuple[int, int, np.ndarray]]:
    """(column, entries, sampled values) of the sample rows among ``rows``."""
    return [
        (int(r["column"]), int(r["value"]), np.frombuffer(r["values"], VALUE_DTYPE))
        for r in rows
        if r["kind"] == dicts.KIND_SAMPLE
    ]


def _column_histogram(plan, histograms) -> dict[str, list[tuple[int, int]]]:
    """(count, number of values) per column, summed over its groups, counts ascending."""
    out = {}
    for j, name in enumerate(CAT_COLUMNS):
        groups = [plan.first[j] + r for r in range(len(plan.bounds[j]))]
        parts = [histograms[g] for g in groups if g in histograms]
        if not parts:
            out[name] = []
            continue
        counts = np.concatenate([p[0] for p in parts])
        sizes = np.concatenate([p[1] for p in parts])
        unique, inverse = np.unique(counts, return_inverse=True)
        summed = np.bincount(inverse, weights=sizes).astype(np.int64) if len(counts) else sizes
        out[name] = [(int(c), int(n)) for c, n in zip(unique, summed)]
    return out


__all__ = ["ArrowEngine"]


def choose_exchange(setting: str, workdir_is_url: bool, master: str) -> str:
    """The exchange a run uses: ``setting`` unless "auto"; auto picks the workdir's files on
    a filesystem path, and behind a URL the partial files on the local disk when one host
    runs every task (a ``local`` master), else Spark's shuffle (a cluster's nodes share no
    disk). ``local`` under another master is refused: a merge task on one node would miss
    the files another node wrote."""
    one_host = master.startswith("local")
    if setting == "auto":
        return "files" if not workdir_is_url else "local" if one_host else "shuffle"
    if setting == "local" and not one_host:
        from spark_jobs.errors import PreprocessConfigError

        raise PreprocessConfigError(
            f"preprocess.arrow_exchange: local keeps the partial counts on one host's disk, "
            f"so it needs a local master, not {master}; use shuffle (or auto)"
        )
    return setting


def _local_dir(session: SparkSession) -> str:
    """This host's scratch directory for Spark: the first of ``SPARK_LOCAL_DIRS``, else
    ``spark.local.dir``, else the temporary directory (Spark's own order in local mode)."""
    listed = os.environ.get("SPARK_LOCAL_DIRS") or session.conf.get("spark.local.dir", None) or ""
    return listed.split(",")[0] or tempfile.gettempdir()
