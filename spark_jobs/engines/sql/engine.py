"""The SQL engine: every per-line step is a Spark SQL expression (``engines.sql.parse``).

It is what the RAPIDS accelerator can run on GPUs (it runs SQL, not Python), so ``--gpu``
uses it; on CPUs the Arrow engine (``spark_jobs.engines.arrow.engine``) writes the same data
faster. Count pass: one aggregation over (day, column, value) pairs plus one row-class pair per
line (``engines.sql.counting``, ``engines.sql.row_classes``). Transform pass: categoricals become 64-bit
keys joined to the dictionaries, broadcast or shuffled (``spark_jobs.engines.sql.transform``);
with ``ids: modulo`` their hex values taken modulo the caps, with no count of values and no
join; with ``ids: contiguous`` joined on their hex values (``engines.sql.contiguous``).
"""

from __future__ import annotations

import shutil
from functools import reduce, singledispatchmethod
from pathlib import Path
from typing import TYPE_CHECKING

from dlrm_contracts.config import PreprocessConfig, column_caps
from dlrm_contracts.schema import CAT_COLUMNS
from dlrm_contracts.thresholds import ThresholdSpec
from spark_jobs import stable_ids
from spark_jobs.columns import hex_value
from spark_jobs.engine import AfterPrevious, ByCount, ByFirstAppearance, Numbering
from spark_jobs.engines.sql import contiguous, counting, rejects, transform
from spark_jobs.engines.sql.dictionaries import _threshold_of, build_dictionaries
from spark_jobs.engines.sql.parse import parse_for_counting, parse_for_transform, read_day
from spark_jobs.inputs import DayFile
from spark_jobs.order import train_key_columns
from spark_jobs.stats import DayStats, line_number_column

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


class SqlEngine:
    name = "sql"
    lookups = "Spark joins"  # broadcast up to broadcast_max_values, shuffled above

    def __init__(self, session: SparkSession, days: list[DayFile], cfg: PreprocessConfig):
        self.session = session
        self.days = days
        self.cfg = cfg
        self.parsed = {
            d.day: parse_for_counting(read_day(session, str(d.path), d.day), cfg.max_line_bytes) for d in days
        }
        self._totals: DataFrame | None = None  # (column, value, count), cached by count_totals
        self._previous: stable_ids.Previous | None = None
        # the values the numbering gave ids to, per column: the transform's joins follow them
        self._kept: dict[str, int] | None = None

    def count(
        self, recount: list[int], counts_dir: Path, read: set[int] | None = None
    ) -> dict[int, DayStats]:
        """Statistics of the days in ``read`` (None: every day), value counts of ``recount``."""
        parsed = {d: f for d, f in self.parsed.items() if read is None or d in read}
        return counting.count_pass(parsed, recount, counts_dir)

    def count_statistics(self, counts_dir: Path) -> dict[int, DayStats]:
        """Every day's statistics from the row classes alone; no value is counted
        or stored, so the classes carry the missing categoricals too."""
        return counting.count_pass(self.parsed, [], counts_dir, values_counted=False)

    def count_totals(
        self, counts_dir: Path, days: list[int] | None, frequency_ids: ThresholdSpec | None = None
    ) -> dict[str, list[tuple[int, int]]]:
        """Cache (column, value, count) over the counted days (None: all), from the stored
        counts; return (and store) their count histogram per column. (``frequency_ids``: the
        Arrow engine's; this engine builds its dictionaries from the cached totals.)"""
        self._totals = counting.value_totals(self.session, counts_dir, days).persist()
        return counting.write_histogram(self._totals, counts_dir)

    @singledispatchmethod
    def write_dictionaries(self, numbering: Numbering, dict_dir: Path, index_dir: Path) -> dict[str, int]:
        """The dictionaries numbered by ``numbering``'s rule (one method per rule below); the
        transform joins them, so no index is written."""
        raise TypeError(f"no numbering {type(numbering).__name__}")

    @write_dictionaries.register(ByCount)
    def _by_count(self, numbering: ByCount, dict_dir: Path, index_dir: Path) -> dict[str, int]:
        """The dictionaries by one global sort of the kept values."""
        build_dictionaries(self._totals, numbering.spec, numbering.sizes, dict_dir)
        self.close()
        self._kept = {c: numbering.sizes[c] - 1 for c in CAT_COLUMNS}
        return self._kept

    def use_previous_dictionaries(self, previous: stable_ids.Previous | None) -> None:
        self._previous = previous

    @write_dictionaries.register(AfterPrevious)
    def _after_previous(self, numbering: AfterPrevious, dict_dir: Path, index_dir: Path) -> dict[str, int]:
        """Stable ids in SQL: the kept values without an id (an anti join with the previous
        dictionaries) numbered by the same global sort, after each column's previous ids; the
        previous entries carried over with their counts of this run; written into a staging
        directory that replaces the dictionaries (``stable_ids.commit``)."""
        from pyspark.sql import functions as F

        spec = numbering.spec
        previous = self._previous
        before = previous.table_sizes if previous else {c: 1 for c in CAT_COLUMNS}
        totals = self._totals.select("column", hex_value("value").alias("value"), "count")
        kept = totals.where(F.col("count") >= _threshold_of(F.col("column"), spec))
        newcomers, carried = kept, None
        if previous is not None and max(before.values()) > 1:  # else no column has an id yet
            old = self.session.read.parquet(previous.directory).select("column", "value", "id")
            found = {
                r["column"]: (int(r["n"]), int(r["top"]))
                for r in old.groupBy("column")
                .agg(F.count(F.lit(1)).alias("n"), F.max("id").alias("top"))
                .collect()
            }
            stable_ids.check_old_ids(found, before)
            newcomers = kept.join(old.select("column", "value"), ["column", "value"], "left_anti")
            carried = old.join(totals, ["column", "value"], "left").select(
                "column", "value", "id", F.coalesce(F.col("count"), F.lit(0)).alias("count")
            )
        added = {r["column"]: int(r["count"]) for r in newcomers.groupBy("column").count().collect()}
        staging = stable_ids.staging_dir(dict_dir)
        build_dictionaries(
            newcomers,
            spec,
            {c: added.get(c, 0) + 1 for c in CAT_COLUMNS},
            staging,
            after={c: before[c] - 1 for c in CAT_COLUMNS},
            carried=carried,
        )
        sizes = {c: before[c] + added.get(c, 0) for c in CAT_COLUMNS}
        stable_ids.commit(staging, dict_dir, spec, sizes)
        self.close()
        self._kept = {c: sizes[c] - 1 for c in CAT_COLUMNS}
        return self._kept

    @write_dictionaries.register(ByFirstAppearance)
    def _by_first_appearance(
        self, numbering: ByFirstAppearance, dict_dir: Path, index_dir: Path
    ) -> dict[str, int]:
        """Contiguous ids (``spark_jobs.contiguous_ids``): a read of the numbered days for the
        first appearances, the dictionaries written."""
        from spark_jobs.contiguous_ids import build_dictionaries

        read = [d for d in self.days if d.day in set(numbering.days)]
        partials = contiguous.first_seen_partials(
            self.session, read, numbering.stats, self.cfg.max_line_bytes
        )
        ids, kept = build_dictionaries(partials, numbering.spec, dict_dir)
        ids.unpersist()
        self._kept = kept
        return kept

    def finish_counts(self) -> None:
        """The count pass wrote its value counts before returning."""

    def close(self) -> None:
        if self._totals is not None:
            self._totals.unpersist()
            self._totals: DataFrame | None = None  # (column, value, count), cached by count_totals

    def write_rejects(self, stats: dict[int, DayStats], out_dir: Path) -> None:
        rejects.write_rejects(self.parsed, self.days, stats, out_dir)

    def _rows(self, day: DayFile, stats: dict[int, DayStats]) -> DataFrame:
        """The second read of a day: valid rows with join keys and line numbers (checks skipped
        for days whose count pass found every line fast)."""
        rows = parse_for_transform(
            read_day(self.session, str(day.path), day.day),
            self.cfg.max_line_bytes,
            checked=not stats[day.day].all_fast,
            hex_values=self.cfg.mode.hex_values,
        )
        return rows.withColumn("_line", line_number_column(stats, [day.day]))

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
        """``staging/<split>/part-*.parquet`` by Spark's writer: test and validation from one
        split-partitioned write, then train hash-partitioned into ``train_files``. ``days``:
        only these days' rows (None: every day)."""
        train_days = [d for d in self.days[:-1] if days is None or d.day in days]
        with_eval = days is None or self.days[-1].day in days
        train, evaluation, shuffled = self._split_rows(stats, sizes, dict_dir, train_days, with_eval)
        compression = self.cfg.compression
        shutil.rmtree(staging, ignore_errors=True)
        # test and validation first: their write replaces the staging directory
        if evaluation is not None:
            transform.write_parquet(
                transform.eval_part(evaluation, shuffled), staging, compression, partition_by="split"
            )
        if train is not None:
            transform.write_parquet(
                transform.train_part(train, train_files), staging / "split=train", compression
            )
        for split_dir in staging.glob("split=*"):
            split_dir.replace(staging / split_dir.name.removeprefix("split="))

    def _split_rows(
        self,
        stats: dict[int, DayStats],
        sizes: dict[str, int],
        dict_dir: Path,
        train_days: list[DayFile],
        with_eval: bool,
    ):
        """(train rows, evaluation rows, whether evaluation rows lost their line order); None
        for a part not asked for."""
        from pyspark.sql import functions as F

        mode = self.cfg.mode
        caps = column_caps(self.cfg) if self.cfg.caps is not None else None
        # the values with an id per column: the numbering's, or those the sizes give
        kept = self._kept if self._kept is not None else {c: sizes[c] - 1 for c in CAT_COLUMNS}

        def mapped(rows):
            if not mode.writes_dictionaries:  # no dictionaries: each id from its value and cap
                assert caps is not None  # IdMode.caps_required
                return transform.capped_categoricals(rows, caps)
            lookup = transform.Lookup(mode.hex_values, mode.missing_value, mode.rare_id, caps)
            return transform.looked_up(
                rows, self.session, dict_dir, kept, self.cfg.broadcast_max_values, lookup
            )

        def keyed(day: DayFile):
            key, tie = train_key_columns(self.cfg.shuffle_seed, day.day, F.col("_line"))
            return self._rows(day, stats).withColumns({"_order": key, "_tie": tie})

        train = None
        if train_days:
            train, _ = mapped(reduce(lambda a, b: a.unionByName(b), [keyed(d) for d in train_days]))
            train = transform.output_projection(train, extra=("_order", "_tie"))
        if not with_eval:
            return train, None, False
        last = self.days[-1]
        evaluation, shuffled = mapped(self._rows(last, stats))
        split = F.when(F.col("_line") < F.lit(stats[last.day].test_lines), F.lit("test")).otherwise(
            F.lit("validation")
        )
        evaluation = evaluation.withColumns(
            {"split": split, "_order": F.col("_line"), "_tie": F.lit(0).cast("long")}
        )
        return (train, transform.output_projection(evaluation, extra=("split", "_order", "_tie")), shuffled)
