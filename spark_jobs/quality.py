"""Rejected lines and the data-quality report: rows in = rows out + rejected, always.

Rejected lines go to ``DIR/rejects/`` as JSON lines (file, line number, reason, the line),
readable by eye and by any tool. The report's "written" figures come from reading the written
parquet back, not from the plan, so a lost row would show as a broken identity.
"""

from __future__ import annotations

from dlrm_contracts.schema import REJECT_REASONS
from spark_jobs.errors import PreprocessInputError, PreprocessJobError
from spark_jobs.inputs import DayFile
from spark_jobs.stats import DayStats


def day_report(day: DayFile, s: DayStats) -> dict:
    return {
        "day": day.day,
        "file": day.name,
        "rows_read": s.rows_read,
        "rows_written": s.rows_valid,
        "rows_padded": s.rows_padded,
        "rows_rejected": s.rows_rejected,
        "rejected_by_reason": dict(s.rejected),
    }


def quality_report(
    days: list[DayFile],
    stats: dict[int, DayStats],
    max_reject_rate: float,
    rows_out_checked: int | None = None,
) -> dict:
    """The report; ``rows_out_checked`` (rows found in the written splits) when known."""
    per_day = [day_report(d, stats[d.day]) for d in days]
    rows_in = sum(d["rows_read"] for d in per_day)
    rejected = sum(d["rows_rejected"] for d in per_day)
    by_reason = {r: sum(d["rejected_by_reason"][r] for d in per_day) for r in REJECT_REASONS}
    rows_out = rows_out_checked if rows_out_checked is not None else rows_in - rejected
    return {
        "days": per_day,
        "totals": {
            "rows_read": rows_in,
            "rows_written": rows_out,
            "rows_padded": sum(d["rows_padded"] for d in per_day),
            "rows_rejected": rejected,
            "rejected_by_reason": by_reason,
        },
        "rows_in": rows_in,
        "rows_out": rows_out,
        "rejected": rejected,
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
            f"{reasons}); see the rejects output and data_quality.json"
        )


def check_identity(report: dict) -> None:
    if not report["identity_holds"]:
        raise PreprocessJobError(
            f"rows in ({report['rows_in']}) != rows written ({report['rows_out']}) + rejected "
            f"({report['rejected']}): output is incomplete"
        )
