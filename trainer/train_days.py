"""Which train rows a run trains on: the whole window, or only the days its model has not seen.

With ``preprocess.ids: stable`` the binary dataset lists its train split's days in row order
(``dataset.json`` key ``segments``, written by converters/segments.py): each day is one
contiguous range of rows. Every checkpoint records the train days its model has been trained
on (``train_days`` in its meta.json), so that a warm-started run with ``train.days: new``
trains exactly the days its previous model has not seen: yesterday's day that joined train,
or several after a skipped run, and none after a rerun of the same window.

A run's days count as seen by its checkpoints once it has passed over each of their rows once
(one epoch) or has done all its planned steps; a checkpoint saved before that (a run killed,
or early stopping's best model mid-epoch) records only the days seen before the run, so the
next run trains those days again rather than skipping rows its model never saw.

This module imports numpy only (no TensorFlow).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# meta.json key: {"trained": [days], "before": [days], "run": [days]} (None: unknown)
TRAIN_DAYS_KEY = "train_days"
SEGMENTS_KEY = "segments"  # dataset.json's per-split day list (converters/segments.py)


@dataclass(frozen=True)
class DayPlan:
    """The train rows of a run: ``ranges`` of the train split, in row order."""

    ranges: tuple[tuple[int, int], ...]
    run_days: tuple[int, ...] | None  # the days trained; None: the dataset lists no days
    before: tuple[int, ...] | None  # days the starting model had seen; None: unknown
    note: str = ""

    @property
    def rows(self) -> int:
        return sum(stop - start for start, stop in self.ranges)

    def trained(self, covered: bool) -> list[int] | None:
        """The days a checkpoint of this run has seen: the run's own once ``covered``; None
        when unknown (a dataset without days, or a model that did not record them and has not
        yet covered the whole window)."""
        if self.run_days is None:
            return None
        if self.before is None:
            return sorted(self.run_days) if covered else None
        return sorted(set(self.before) | (set(self.run_days) if covered else set()))

    def to_meta(self, covered: bool) -> dict[str, Any]:
        return {
            "trained": self.trained(covered),
            "before": None if self.before is None else list(self.before),
            "run": None if self.run_days is None else list(self.run_days),
        }


def trained_days(meta: dict[str, Any] | None) -> tuple[int, ...] | None:
    """The days a checkpoint's model has been trained on (None: not recorded)."""
    record = (meta or {}).get(TRAIN_DAYS_KEY)
    days = record.get("trained") if isinstance(record, dict) else None
    return None if days is None else tuple(int(d) for d in days)


def days_before(meta: dict[str, Any] | None) -> tuple[int, ...] | None:
    """What a checkpoint's run started from (resume plans the same rows again)."""
    record = (meta or {}).get(TRAIN_DAYS_KEY)
    days = record.get("before") if isinstance(record, dict) else None
    return None if days is None else tuple(int(d) for d in days)


def train_segments(extra: dict[str, Any], train_rows: int) -> list[tuple[int, int, int]] | None:
    """(day, first row, end row) of every day of the train split; None without segments."""
    recorded = extra.get(SEGMENTS_KEY)
    if not isinstance(recorded, dict) or "train" not in recorded:
        return None
    out, start = [], 0
    for segment in recorded["train"]:
        rows = int(segment["rows"])
        out.append((int(segment["day"]), start, start + rows))
        start += rows
    if start != train_rows:
        raise ValueError(
            f"dataset.json's train segments add up to {start} rows, the train split has {train_rows}"
        )
    return out


def plan_days(
    mode: str, segments: list[tuple[int, int, int]] | None, train_rows: int, before: tuple[int, ...] | None
) -> DayPlan:
    """The rows of a run (``train.days``), given the days its starting model has seen
    (``before``: () from scratch, None when the model does not record them)."""
    if segments is None:
        note = (
            "train.days: new, but the dataset lists no days (ids by frequency): training "
            "on the whole train split"
            if mode == "new"
            else ""
        )
        return DayPlan(((0, train_rows),) if train_rows else (), None, before, note)
    days = tuple(day for day, _, _ in segments)
    if mode == "window" or before is None:
        note = (
            "train.days: new, but the model this run starts from records no trained days: "
            "training on the whole window"
            if mode == "new" and before is None
            else ""
        )
        return DayPlan(_merged([(a, b) for _, a, b in segments]), days, before, note)
    if not before:
        note = "train.days: new from scratch: training on the whole window"
        return DayPlan(_merged([(a, b) for _, a, b in segments]), days, before, note)
    seen = set(before)
    fresh = [(day, a, b) for day, a, b in segments if day not in seen]
    if not fresh:
        note = (
            f"train.days: new: the previous model has been trained on every train day of "
            f"this window ({_listed(days)}): nothing new to train on; the model is kept as "
            "it is"
        )
    else:
        note = (
            f"train.days: new: training on day(s) {_listed(tuple(d for d, _, _ in fresh))} "
            f"only ({sum(b - a for _, a, b in fresh)} of {train_rows} train rows; the "
            f"previous model has seen {_listed(tuple(sorted(seen)))})"
        )
    return DayPlan(_merged([(a, b) for _, a, b in fresh]), tuple(d for d, _, _ in fresh), before, note)


def _merged(ranges: list[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    """Adjacent ranges as one (fewer pieces per batch); empty ones dropped."""
    out: list[tuple[int, int]] = []
    for start, stop in ranges:
        if stop <= start:
            continue
        if out and out[-1][1] == start:
            out[-1] = (out[-1][0], stop)
        else:
            out.append((start, stop))
    return tuple(out)


def _listed(days: tuple[int, ...]) -> str:
    return ", ".join(str(d) for d in days) or "none"
