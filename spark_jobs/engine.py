"""The contract between the preprocess job and its engines: what each phase takes and returns.

``spark_jobs.preprocess`` drives the phases in this order and settles everything that does not
depend on how the data is read (days to count, days.json, the quality report, moving the
splits into place, the stable ids' record); an engine does the reading and writing in between.
Two engines keep it: ``spark_jobs.engines.arrow.engine.ArrowEngine`` (Python tasks over whole
blocks of lines; the default on CPUs) and ``spark_jobs.engines.sql.engine.SqlEngine`` (Spark
SQL expressions only; what the RAPIDS accelerator runs). Each is constructed as
``Engine(session, days, cfg)``.

The contract is structural (``typing.Protocol``): the engines do not import it, and neither
engine imports the other (import-linter checks both, pyproject.toml).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from dlrm_contracts.thresholds import ThresholdSpec
    from spark_jobs.stable_ids import Previous
    from spark_jobs.stats import DayStats

# (count, number of values with that count) per categorical column, counts ascending
Histogram = dict[str, list[tuple[int, int]]]


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
        """Modulo ids: every day's statistics (those of ``count``), with no value counted or
        stored (``counts_dir``: where a pass may keep its temporaries)."""
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
        ``frequency_ids``: the threshold of a frequency-ids run, which an engine may use to
        prepare ``write_dictionaries`` (None under stable ids)."""
        ...

    def finish_counts(self) -> None:
        """The recounted days' value counts are on disk once this returns (days.json may then
        say they can be reused)."""
        ...

    # ------------------------------------------------------------ dictionaries
    def write_dictionaries(
        self, spec: ThresholdSpec, sizes: dict[str, int], dict_dir: Path, index_dir: Path
    ) -> None:
        """Frequency ids: write the dictionaries (value, id, count per column) into
        ``dict_dir``; ``sizes`` are the table sizes the histogram gives for ``spec``.
        ``index_dir``: where an engine that looks ids up without a join keeps its index."""
        ...

    def write_contiguous_dictionaries(
        self,
        spec: ThresholdSpec,
        stats: dict[int, DayStats],
        days: list[int],
        dict_dir: Path,
        index_dir: Path,
    ) -> dict[str, int]:
        """Contiguous ids (``spark_jobs.contiguous_ids``): read ``days`` for each value's first
        appearance and count, write the dictionaries into ``dict_dir`` (and the index an
        engine looks ids up in into ``index_dir``); returns the kept values per column."""
        ...

    def use_previous_dictionaries(self, previous: Previous | None) -> None:
        """Stable ids: the dictionaries this run extends (None: the first run). Called before
        ``count``."""
        ...

    def write_stable_dictionaries(
        self, spec: ThresholdSpec, dict_dir: Path, index_dir: Path
    ) -> dict[str, int]:
        """Stable ids: extend the previous dictionaries with this run's kept newcomers and make
        the result ``dict_dir`` (``spark_jobs.stable_ids.commit``); returns the table sizes."""
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


__all__ = ["Engine", "Histogram"]
