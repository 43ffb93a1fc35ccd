"""The Arrow engine: Spark schedules, shuffles, aggregates, joins and sorts; the per-line work
runs in Python tasks over whole blocks of lines (``spark_jobs.arrow_tasks``).

Count pass: one task per chunk emits its statistics and partial value counts; one Spark
aggregation sums them and stays cached as integers: the recounted days' value counts are
written from it (8-character hex strings, as the SQL engine writes them) in a background job,
while the totals, histogram and dictionaries are computed from it. Transform pass: tasks emit
the split rows packed (``spark_jobs.split_writer``), ids already looked up in the workers'
dictionary index (``spark_jobs.lookup``: dictionaries within ``broadcast_max_values``,
smallest first up to ``arrow_index_max_values`` values); the others are joined by Spark on the
integer value of the hex string, broadcast or shuffled. Train is hash-partitioned and sorted by
Spark; pyarrow encodes the parquet files inside the writer tasks.
"""

from __future__ import annotations

import shutil
import uuid
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

from dlrm_contracts.config import PreprocessConfig
from dlrm_contracts.schema import CAT_COLUMNS
from spark_jobs import arrow_tasks, counting, split_writer
from spark_jobs.arrow_tasks import (CODE_BITS, COUNT_SCHEMA, LINES, MISSING_CAT, MISSING_INT,
                                    PADDED, REJECT_SCHEMA, SLOW, STAT, ReadSettings, TransformSpec)
from spark_jobs.chunks import Chunk, plan_chunks
from spark_jobs.fastparse import REASON_CODES
from spark_jobs.inputs import DayFile
from spark_jobs.stats import DayStats, line_number_column
from spark_jobs.split_writer import WriteSpec
from spark_jobs.transform import map_categoricals

# Valid lines whose values a task counts together before emitting partial counts: bounds a
# task's memory (26 int64 per line) whatever the chunk size.
COUNT_FLUSH_LINES = 1 << 18
# Rows a writer task buffers per parquet row group: 40 MB of packed rows, bounding a worker's
# memory whatever the file size.
ROW_GROUP_ROWS = 1 << 18


class ArrowEngine:
    name = "arrow"

    def __init__(self, session, days: list[DayFile], cfg: PreprocessConfig):
        self.session = session
        self.days = days
        self.cfg = cfg
        self.settings = ReadSettings(block_bytes=max(4096, cfg.arrow_block_kb << 10),
                                     count_flush_lines=COUNT_FLUSH_LINES)
        self.chunks = plan_chunks(days, max(1, cfg.arrow_chunk_mb) << 20)
        self._counts = None            # the count pass's sums, cached until close()
        self._recounted: list[int] = []
        self._writing = None           # the value counts' write, running beside later jobs
        if not session.sparkContext.master.startswith("local"):
            _ship_code(session)

    def _over_chunks(self, chunks: list[Chunk], task, schema: str):
        """One partition (and so one task) per chunk."""
        return self.session.range(0, len(chunks), 1, max(1, len(chunks))).mapInArrow(task, schema)

    # ------------------------------------------------------------ count pass
    def count(self, recount: list[int], counts_dir: Path) -> dict[int, DayStats]:
        """Statistics of every day; value counts of ``recount`` written to their partitions.
        The summed counts stay cached (as integers) for ``value_totals`` until ``close``."""
        from pyspark import StorageLevel
        from pyspark.sql import functions as F

        task = arrow_tasks.count_task(self.chunks, frozenset(recount), self.settings)
        self._counts = (self._over_chunks(self.chunks, task, COUNT_SCHEMA)
                        .groupBy("day", "column", "value").agg(F.sum("count").alias("count"))
                        .persist(StorageLevel.MEMORY_AND_DISK))
        self._recounted = list(recount)
        stats = _stats_from_rows(self._counts.where(F.col("column") == STAT).collect(), self.days)
        if recount:
            # Spark runs this write's tasks in the slots the next jobs leave idle (their
            # scheduling gaps and one-task stages); finish_counts() waits for it
            pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="value-counts")
            self._writing = pool.submit(_write_value_counts, self._counts, list(recount), counts_dir)
            pool.shutdown(wait=False)
        return stats

    def finish_counts(self) -> None:
        """Wait for the value counts' write (raising its error, if it failed)."""
        writing, self._writing = self._writing, None
        if writing is not None:
            writing.result()

    def value_totals(self, counts_dir: Path, days: list[int] | None):
        """(column, value, count) over the counted days (``days``: only those), ``value`` as
        its integer (whose order is the 8-digit hex strings' order): the recounted days come
        from the cached integer counts, the others from their stored partitions."""
        from pyspark.sql import functions as F

        wanted = [d.day for d in self.days] if days is None else list(days)
        fresh = [d for d in wanted if d in self._recounted]
        stored = [d for d in wanted if d not in self._recounted]
        if stored:       # the stored partitions are listed while the write may be renaming its own
            self.finish_counts()
        names = F.element_at(F.array(*[F.lit(c) for c in CAT_COLUMNS]), F.col("column") + 1)
        parts = []
        if fresh:
            parts.append(self._counts.where((F.col("column") >= 0) & F.col("day").isin(fresh))
                         .select(names.alias("column"), "value", "count"))
        if stored:
            parts.append(counting.stored_counts(self.session, counts_dir, stored)
                         .select("column", _hex_value(F.col("value")).alias("value"), "count"))
        if not parts:
            return self.session.createDataFrame([], "column STRING, value LONG, count LONG")
        frame = parts[0] if len(parts) == 1 else parts[0].unionByName(parts[1])
        return frame.groupBy("column", "value").agg(F.sum("count").cast("long").alias("count"))

    def close(self) -> None:
        """Wait for the value counts' write, then drop the cached counts. Its error is raised
        by finish_counts(); here another error is already on its way, or it was raised."""
        if self._writing is not None:
            self._writing.exception()
            self._writing = None
        if self._counts is not None:
            self._counts.unpersist()
            self._counts = None

    # ------------------------------------------------------------ rejects
    def write_rejects(self, stats: dict[int, DayStats], out_dir: Path) -> None:
        shutil.rmtree(out_dir, ignore_errors=True)
        dirty = {d.day for d in self.days if stats[d.day].rows_rejected}
        if not dirty:
            Path(out_dir).mkdir(parents=True, exist_ok=True)
            return
        chunks = [c for c in self.chunks if c.day in dirty]
        rows = self._over_chunks(chunks, arrow_tasks.reject_task(chunks, self.settings), REJECT_SCHEMA)
        names = {d.day: d.name for d in self.days}
        rows.select(_literal_lookup(names, "day").alias("file"),
                    (line_number_column(stats, dirty) + 1).alias("line_number"),
                    "reason", "line").write.mode("overwrite").json(str(out_dir))

    # ------------------------------------------------------------ transform pass
    def write_splits(self, stats: dict[int, DayStats], sizes: dict[str, int], dict_dir: Path,
                     staging: Path, train_files: int) -> dict[str, int]:
        """Write ``staging/<split>/part-*.parquet``; returns rows per split. Train is
        hash-partitioned into ``train_files`` by its order key and sorted within each file;
        the last day's rows keep their line order (test first)."""
        spec = self._transform_spec(stats, sizes, dict_dir)
        schema = arrow_tasks.transform_schema(spec)
        last = self.days[-1].day

        def rows(chunks):
            frame = self._over_chunks(chunks, arrow_tasks.transform_task(chunks, spec, self.settings),
                                      schema)
            return self._join_large(frame, spec, sizes, dict_dir)

        shutil.rmtree(staging, ignore_errors=True)
        write = partial(WriteSpec, out_dir=str(staging), compression=self.cfg.compression,
                        row_group_rows=ROW_GROUP_ROWS, joined_columns=spec.joined_columns)
        eval_chunks = [c for c in self.chunks if c.day == last]
        if spec.joined_columns:
            evaluation, shuffled = rows(eval_chunks)
            # a shuffle join lost the line order: a global sort restores it
            evaluation = evaluation.orderBy("_k1") if shuffled else evaluation
            results = split_writer.write_partitions(evaluation, write(eval_half=spec.eval_half))
        else:
            task = arrow_tasks.eval_write_task(eval_chunks, spec, self.settings,
                                               write(eval_half=spec.eval_half))
            results = self._over_chunks(eval_chunks, task, split_writer.RESULT_SCHEMA).collect()
        train, _ = rows([c for c in self.chunks if c.day != last])
        train = train.repartition(train_files, "_k1").sortWithinPartitions("_k1", "_k2")
        results += split_writer.write_partitions(train, write(eval_half=None))
        return split_writer.commit(results, staging)

    def _indexed_columns(self, sizes: dict[str, int]) -> tuple[int, ...]:
        """Columns the workers look up themselves: each within broadcast_max_values, smallest
        first while the index stays within arrow_index_max_values (bounds a worker's memory)."""
        chosen, total = [], 0
        for j in sorted(range(len(CAT_COLUMNS)), key=lambda j: sizes[CAT_COLUMNS[j]]):
            kept = sizes[CAT_COLUMNS[j]] - 1
            if kept <= self.cfg.broadcast_max_values and total + kept <= self.cfg.arrow_index_max_values:
                chosen.append(j)
                total += kept
        return tuple(sorted(chosen))

    def _transform_spec(self, stats, sizes, dict_dir) -> TransformSpec:
        cached = self._indexed_columns(sizes)
        joined = tuple(j for j in range(len(CAT_COLUMNS)) if j not in cached)
        first_line = {(day, chunk): offset for day, s in stats.items()
                      for chunk, offset in s.line_offsets().items()}
        last = stats[self.days[-1].day]
        return TransformSpec(dict_dir=str(dict_dir), run_token=uuid.uuid4().hex,
                             cached_columns=cached, joined_columns=joined,
                             seed=int(self.cfg.shuffle_seed), chunk_first_line=first_line,
                             eval_day=last.day, eval_half=last.eval_half)

    def _join_large(self, frame, spec: TransformSpec, sizes, dict_dir: Path):
        """Ids of the columns the workers did not look up: Spark joins on the integer value,
        broadcast up to broadcast_max_values (columns left out of the index by its budget),
        shuffled above (never collected to the driver). Returns (rows, shuffled?)."""
        columns = [CAT_COLUMNS[j] for j in spec.joined_columns]
        if not columns:
            return frame, False
        return map_categoricals(frame, self.session, dict_dir, sizes, self.cfg.broadcast_max_values,
                                columns=columns, dictionary_key=_hex_value)


def _ship_code(session) -> None:
    """Executors unpickle the tasks by importing spark_jobs (and the contracts package it uses):
    send both as a zip, so a cluster's Python needs only the pinned packages, not the project."""
    import tempfile
    import zipfile

    root = Path(__file__).resolve().parent.parent
    archive = Path(tempfile.mkdtemp(prefix="criteo-dlrm-code-")) / "criteo_dlrm_code.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        for package in ("spark_jobs", "dlrm_contracts"):
            for source in sorted((root / package).rglob("*.py")):
                zf.write(source, source.relative_to(root))
    session.sparkContext.addPyFile(str(archive))


def _hex_value(value):
    """The dictionary's join key for the Arrow engine: the integer value of the hex string."""
    from pyspark.sql import functions as F

    return F.conv(value, 16, 10).cast("long")


def _literal_lookup(mapping: dict, column: str):
    from pyspark.sql import functions as F

    pairs = [x for key, value in mapping.items() for x in (F.lit(key), F.lit(value))]
    return F.element_at(F.create_map(*pairs), F.col(column))


def _stats_from_rows(rows, days: list[DayFile]) -> dict[int, DayStats]:
    """DayStats from the summed statistics rows (column STAT) of the count pass."""
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


def _write_value_counts(counts, recount: list[int], counts_dir: Path) -> None:
    """The recounted days' value counts, stored as the SQL engine stores them."""
    from pyspark.sql import functions as F

    for day in recount:
        shutil.rmtree(counting.values_dir(counts_dir) / f"day={day}", ignore_errors=True)
    names = F.element_at(F.array(*[F.lit(c) for c in CAT_COLUMNS]), F.col("column") + 1)
    # day stays an INT: the writer sorts rows by the partition column, and an int sorts by
    # radix on its prefix where a string needs full comparisons (the directories are the same)
    values = (counts.where((F.col("column") >= 0) & F.col("day").isin(list(recount)))
              .select("day", names.alias("column"),
                      F.lpad(F.lower(F.hex("value")), 8, "0").alias("value"), "count"))
    (values.write.mode("overwrite").option("partitionOverwriteMode", "dynamic")
     .partitionBy("day").parquet(str(counting.values_dir(counts_dir))))


__all__ = ["ArrowEngine"]
