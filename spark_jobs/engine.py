"""The contract between the preprocess job and its engines: what each phase takes and returns.

``spark_jobs.preprocess`` drives the phases in this order and settles everything that does not
depend on how the data is read (days to count, days.json, the quality report, moving the
splits into place, the stable ids' record); an engine does the reading and writing in between.
Two engines keep it: ``spark_jobs.engines.arrow.engine.ArrowEngine`` (Python tasks over whole
blocks of lines; the default on CPUs) and ``spark_jobs.engines.sql.engine.SqlEngine`` (Spark
SQL expressions only; what the RAPIDS accelerator runs). Each is constructed as
``Engine(session, days, cfg)``.

The contract is structural (``typing.Protocol``): the engines import only its numbering types
(``Numbering``), and neither engine imports the other (import-linter checks both,
pyproject.toml).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from dlrm_contracts.thresholds import ThresholdSpec
    from spark_jobs.stable_ids import Previous
    from spark_jobs.stats import DayStats

# (count, number of values with that count) per categorical column, counts ascending
Histogram = dict[str, list[tuple[int, int]]]


# How the dictionaries phase numbers the values: one type per rule, holding what that rule
# reads. The job picks the run's mode's (spark_jobs.preprocess.STEPS); an engine implements
# each rule and never asks which mode the run is in.
@dataclass(frozen=True)
class ByCount:
    """Frequency ids: each column's values kept at ``spec`` numbered 1..k by count
    descending, from the totals ``count_totals`` summed (and prepared for ``spec``);
    ``sizes``: the table sizes the histogram gives at ``spec`` (k + 1 per column)."""

    spec: ThresholdSpec
    sizes: dict[str, int]


@dataclass(frozen=True)
class AfterPrevious:
    """Stable ids (``spark_jobs.stable_ids``): the previous dictionaries
    (``use_previous_dictionaries``) keep their ids, this run's newcomers kept at ``spec`` are
    numbered by count after each column's last id, and the result replaces the dictionaries
    (``stable_ids.commit``)."""

    spec: ThresholdSpec


@dataclass(frozen=True)
class ByFirstAppearance:
    """Contiguous ids (``spark_jobs.contiguous_ids``): a read of ``days`` numbers each column's
    values kept at ``spec`` by first appearance; ``stats``: those days' statistics (where
    each chunk's lines start, which days parsed fast)."""

    spec: ThresholdSpec
    stats: dict[int, DayStats]
    days: list[int]


Numbering = ByCount | AfterPrevious | ByFirstAppearance


class Engine(Protocol):
    """One preprocess run's reading and writing, phase by phase."""

    name: str  # recorded in preprocess.json ("arrow", "sql") and in the stored days' keys
    lookups: str  # how the transform finds the ids (recorded in preprocess.json)

    # ------------------------------------------------------------ count pass
    def count(
        self, recount: list[int], counts_dir: Path, read: set[int] | None = None
    ) -> dict[int, DayStats]:
        """Statistics of the days in ``read`` (None: every day), and the value counts of the
        days in ``recount`` (a subset of ``read``), kept for ``count_totals``."""
        ...

    def count_statistics(self, counts_dir: Path) -> dict[int, DayStats]:
        """For a mode that counts no values (``IdMode.counts_values`` false): every day's
        statistics (those of ``count``), with no value counted or stored (``counts_dir``:
        where a pass may keep its temporaries)."""
        ...

    def write_rejects(self, stats: dict[int, DayStats], out_dir: Path) -> None:
        """Replace ``out_dir`` with the rejected lines (file, 1-based line number, reason,
        line) as JSON lines; an empty directory when there are none."""
        ...

    def count_totals(
        self, counts_dir: Path, days: list[int] | None, frequency_ids: ThresholdSpec | None = None
    ) -> Histogram:
        """Store the recounted days' value counts (if not stored yet), sum the totals over
        ``days`` (None: every day) and return (and store) their count histogram per column.
        ``frequency_ids``: the threshold of a ``ByCount`` numbering to come, which an engine
        may use to prepare it (None before any other)."""
        ...

    def finish_counts(self) -> None:
        """The recounted days' value counts are on disk once this returns (days.json may then
        say they can be reused)."""
        ...

    # ------------------------------------------------------------ dictionaries
    def use_previous_dictionaries(self, previous: Previous | None) -> None:
        """The dictionaries an ``AfterPrevious`` numbering extends (None: the first run).
        Called before ``count``, so that the value ranges are cut for old and new values."""
        ...

    def write_dictionaries(self, numbering: Numbering, dict_dir: Path, index_dir: Path) -> dict[str, int]:
        """The dictionaries phase: number the kept values as ``numbering`` says (the run's mode
        chose it: ``ByCount``, ``AfterPrevious`` or ``ByFirstAppearance``), write the value ->
        id tables into ``dict_dir`` and, for an engine that looks ids up without a join, their
        index into ``index_dir``. Returns the values given an id, per column."""
        ...

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
        """Replace ``staging`` with ``staging/<split>/part-*.parquet`` of the days in ``days``
        (None: every day): train in ``train_files`` files ordered by ``spark_jobs.order``,
        test and validation in line order. A split without rows may have no directory. The
        caller counts the rows from the files' footers, never from the engine's word."""
        ...

    def close(self) -> None:
        """Release what the run cached (cached frames, partial files); safe to call twice."""
        ...


__all__ = ["AfterPrevious", "ByCount", "ByFirstAppearance", "Engine", "Histogram", "Numbering"]
