"""Per-day value counts (incremental), the count histogram and days.json.

A day's counts depend only on that day's file, so they are kept per day
(``counts/values/day=<k>/``) and a day whose fingerprint is unchanged in ``days.json`` is not
recounted: adding a day counts only the new one. ``days.json`` is written after the counts,
so a crash in between only means the day is counted again.
"""

from __future__ import annotations

import sys
from pathlib import Path

from dlrm_contracts import workdir_io
from dlrm_contracts.atomic import fsync_tree
from dlrm_contracts.layout import COUNT_VALUES_DIR, DAYS_JSON
from spark_jobs.inputs import DayFile
from spark_jobs.stats import DayStats

# 2: lines end at '\n' only and fields must match up to the end of the line (parse.py);
# 3: a value is stored as its integer (the 8 hex digits' value), not as its string. Counts
# 4: a line longer than preprocess.max_line_bytes is rejected (line_too_long). Counts written
# under another version, or another line limit, are recounted, not reused.
DAYS_FORMAT_VERSION = 4


def _values(counts_dir):
    """counts/values (a Path or, for a workdir URL, a Location: both join with ``/``)."""
    return counts_dir / COUNT_VALUES_DIR


def counted_days(counts_dir: Path, max_line_bytes: int) -> dict[int, dict]:
    """days.json entries whose counts partition still exists, by day number (none when the
    counts were written by another DAYS_FORMAT_VERSION or line limit: which lines are valid
    depends on both)."""
    path = counts_dir / DAYS_JSON
    try:
        data = workdir_io.read_json(path, default={}) or {}
        if (
            data.get("format_version") != DAYS_FORMAT_VERSION  # counted under other rules
            or data.get("max_line_bytes") != max_line_bytes
        ):
            return {}
        return {
            int(entry["day"]): entry
            for entry in data.get("days", [])
            if workdir_io.is_dir(_values(counts_dir) / f"day={entry['day']}")
        }
    except (ValueError, TypeError, KeyError, AttributeError) as error:
        # our own bookkeeping, damaged (a disk, a hand edit): every day is counted again
        print(
            f"spark_jobs: {path} is damaged ({type(error).__name__}: {error}): every day is counted again",
            file=sys.stderr,
        )
        return {}


def days_to_count(days: list[DayFile], counts_dir: Path, max_line_bytes: int) -> list[int]:
    """Days that are new, whose file changed since they were counted, or whose stored counts
    are damaged (counted again from the day file, which is at hand)."""
    known = counted_days(counts_dir, max_line_bytes)
    return [
        d.day
        for d in days
        if d.day not in known
        or known[d.day].get("fingerprint") != d.fingerprint()
        or not _stored_counts_intact(counts_dir, d.day)
    ]


def _stored_counts_intact(counts_dir: Path, day: int) -> bool:
    """Every stored counts file of ``day`` opens as parquet (a truncated or overwritten file
    fails here, on its footer, for the cost of one small read per file). At a workdir URL
    nothing is read: an object appears whole or not at all, so no crash truncates one, and a
    footer read per (group, day) object would cost requests in proportion to groups x days."""
    import pyarrow.parquet as pq

    if workdir_io.is_remote(counts_dir):
        return True
    for path in sorted((counts_dir / COUNT_VALUES_DIR / f"day={day}").glob("*.parquet")):
        if path.name.startswith((".", "_")):
            continue
        try:
            pq.read_metadata(path)
        except Exception as error:  # noqa: BLE001 — ArrowInvalid, OSError: whatever makes it unreadable
            print(
                f"spark_jobs: the stored value counts {path} are damaged "
                f"({type(error).__name__}): day {day} is counted again",
                file=sys.stderr,
            )
            return False
    return True


def drop_stale_days(days: list[DayFile], counts_dir: Path) -> None:
    """Remove counts of days no longer in the input, so totals cover exactly the input."""
    root = _values(counts_dir)
    if not workdir_io.is_dir(root):
        return
    wanted = {f"day={d.day}" for d in days}
    for child in workdir_io.entries(root):
        if workdir_io.is_dir(child) and child.name.startswith("day=") and child.name not in wanted:
            workdir_io.remove_tree(child)


def write_days_json(
    days: list[DayFile], stats: dict[int, DayStats], counts_dir: Path, max_line_bytes: int
) -> None:
    """The record that the days' value counts can be reused: written (and flushed) only once
    the counts themselves are on disk, so a power cut never leaves it vouching for lost ones."""
    if not workdir_io.is_remote(counts_dir):  # a store's objects are durable once written
        fsync_tree(_values(counts_dir))
    entries = []
    for d in days:
        s = stats[d.day]
        entries.append(
            {
                "day": d.day,
                "file": d.name,
                "fingerprint": d.fingerprint(),
                "rows_read": s.rows_read,
                "rows_counted": s.rows_valid,
                "missing_rate": s.missing_rates(),
            }
        )
    workdir_io.write_json(
        counts_dir / DAYS_JSON,
        {"format_version": DAYS_FORMAT_VERSION, "max_line_bytes": max_line_bytes, "days": entries},
        sort_keys=False,
    )
