"""Rejected lines and the data-quality report: rows in = rows out + rejected, always.

Rejected lines go to ``DIR/rejects/`` as JSON lines (file, line number, reason, the line),
readable by eye and by any tool. The report's "written" figures come from reading the written
parquet back, not from the plan, so a lost row would show as a broken identity.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from dlrm_contracts.schema import REJECT_REASONS
from spark_jobs.columns import literal_lookup
from spark_jobs.errors import PreprocessInputError, PreprocessJobError
from spark_jobs.inputs import DayFile
from spark_jobs.stats import DayStats, line_number_column


def write_rejects(parsed: dict, days: list[DayFile], stats: dict[int, DayStats], out_dir: Path) -> None:
    """Rejected lines with their day file, 1-based line number and reason.

    Only days that have rejects are read again (clean data costs nothing here); the directory
    is emptied first, so it always holds exactly this run's rejects.
    """
    from functools import reduce

    from pyspark.sql import functions as F

    shutil.rmtree(out_dir, ignore_errors=True)
    dirty = [d for d in days if stats[d.day].rows_rejected]
    if not dirty:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        return
    names = {str(d.day): d.name for d in dirty}
    rows = reduce(lambda a, b: a.unionByName(b), [parsed[d.day] for d in dirty])
    rejects = rows.where(F.col("reason").isNotNull()).select(
        literal_lookup(names, "day").alias("file"),
        (line_number_column(stats, [d.day for d in dirty]) + 1).alias("line_number"),
        "reason",
        F.col("raw").alias("line"))
    rejects.write.mode("overwrite").json(str(out_dir))


def day_report(day: DayFile, s: DayStats) -> dict:
    return {"day": day.day, "file": day.name, "rows_read": s.rows_read,
            "rows_written": s.rows_valid, "rows_padded": s.rows_padded,
            "rows_rejected": s.rows_rejected, "rejected_by_reason": dict(s.rejected)}


def quality_report(days: list[DayFile], stats: dict[int, DayStats], max_reject_rate: float,
                   rows_out_checked: int | None = None) -> dict:
    """The report; ``rows_out_checked`` (rows found in the written splits) when known."""
    per_day = [day_report(d, stats[d.day]) for d in days]
    rows_in = sum(d["rows_read"] for d in per_day)
    rejected = sum(d["rows_rejected"] for d in per_day)
    by_reason = {r: sum(d["rejected_by_reason"][r] for d in per_day) for r in REJECT_REASONS}
    rows_out = rows_out_checked if rows_out_checked is not None else rows_in - rejected
    return {
        "days": per_day,
        "totals": {"rows_read": rows_in, "rows_written": rows_out,
                   "rows_padded": sum(d["rows_padded"] for d in per_day),
                   "rows_rejected": rejected, "rejected_by_reason": by_reason},
        "rows_in": rows_in, "rows_out": rows_out, "rejected": rejected,
        "identity_holds": rows_in == rows_out + rejected,
        "reject_rate": rejected / rows_in if rows_in else 0.0,
        "max_reject_rate": max_reject_rate,
        "rows_out_checked": rows_out_checked is not None,
    }


def check_days_not_empty(days: list[DayFile], stats: dict[int, DayStats]) -> None:
    for d in days:
        if d.day not in stats or stats[d.day].rows_read == 0:
            raise PreprocessInputError(f"day file {d.path} has no lines")


def check_reject_rate(report: dict) -> None:
    if report["reject_rate"] > report["max_reject_rate"]:
        reasons = ", ".join(f"{r}={n}" for r, n in report["totals"]["rejected_by_reason"].items() if n)
        raise PreprocessInputError(
            f"{report['rejected']} of {report['rows_in']} lines rejected "
            f"({report['reject_rate']:.2%} > max_reject_rate {report['max_reject_rate']:.2%}; "
            f"{reasons}); see the rejects output and data_quality.json")


def check_identity(report: dict) -> None:
    if not report["identity_holds"]:
        raise PreprocessJobError(
            f"rows in ({report['rows_in']}) != rows written ({report['rows_out']}) + rejected "
            f"({report['rejected']}): output is incomplete")
