"""Stable ids' incremental transform: each day transformed alone, kept, and reused by later runs.

With ``preprocess.ids: stable`` an id never moves, so a day's transformed rows stay right for
as long as its file, its role and the settings that shape its files do. A daily run then
transforms only the days that are new in the window or changed role (yesterday's
test/validation day joins train), reuses the others' parts as they are, and drops the days
that left the window:

    parquet/days/day=<k>/train/part-*.parquet           a train day, in its own hash order
    parquet/days/day=<k>/{test,validation}/part-*.parquet   the newest day, in line order
    parquet/days/day=<k>/day.json                       what the day was made with

The split directories are hard links to the days' parts (train: ``part-d<day>-<n>.parquet``,
so name order is day order), listed with their rows in ``parquet/segments.json`` for the
converter, which reuses the binary of a day it converted before.

"As of": a reused day keeps the ids of the dictionaries it was transformed with. An old id
never changes, but a value that became kept after the day was transformed maps to 0 in that
day's rows (its id did not exist yet). ``--retransform`` transforms every day again with
today's dictionaries. A day is never reused across a restart of the ids (the dictionaries'
lineage, ``stable_ids.lineage``).

Crash safety: a day is written into ``days/.staging-day=<k>`` with its record and renamed into
place (the old one set aside first, deleted after), so a day directory is always whole or
absent; a day absent or damaged is transformed again. The split directories are rebuilt as
links at the end; until then ``parquet/_SUCCESS`` is absent, as for any run.
"""

from __future__ import annotations

import os
import shutil
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

from dlrm_contracts import workdir_io
from dlrm_contracts.atomic import publish, read_json, write_json_atomic
from dlrm_contracts.config import PreprocessConfig
from dlrm_contracts.layout import DAY_JSON, SEGMENTS_JSON, WorkdirLayout
from dlrm_contracts.schema import SPLITS
from spark_jobs.errors import PreprocessJobError
from spark_jobs.inputs import DayFile
from spark_jobs.stats import DayStats

DAY_FORMAT_VERSION = 1
SEGMENTS_FORMAT_VERSION = 1
TRAIN, EVAL = "train", "eval"
ROLE_SPLITS = {TRAIN: ("train",), EVAL: ("test", "validation")}


@dataclass(frozen=True)
class DayWork:
    """What a run does with the days of its window."""

    transform: list[tuple[DayFile, str, str]]  # (day, role, why it is transformed)
    reused: list[int]
    dropped: list[int]
    read: list[int] = field(default_factory=list)  # days the count pass read (filled by it)

    def summary(self) -> dict:
        return {
            "days_transformed": [d.day for d, _, _ in self.transform],
            "why": {str(d.day): why for d, _, why in self.transform},
            "days_reused": self.reused,
            "days_dropped": self.dropped,
            "days_read": self.read,
        }


def role_of(day: DayFile, days: list[DayFile]) -> str:
    return EVAL if day.day == days[-1].day else TRAIN


def day_settings(cfg: PreprocessConfig) -> dict:
    """The settings a day's files depend on (besides its file, role and ids)."""
    return {
        "shuffle_seed": int(cfg.shuffle_seed),
        "compression": cfg.compression.lower(),
        "output_files": int(cfg.output_files),
        "train_rows_per_file": int(cfg.train_rows_per_file),
        "max_line_bytes": int(cfg.max_line_bytes),
    }


def day_part_files(day_dir: Path, split: str) -> list[Path]:
    folder = day_dir / split
    return sorted(folder.glob("part-*.parquet")) if folder.is_dir() else []


def _rows_of(files: list[Path]) -> int:
    import pyarrow.parquet as pq

    return sum(pq.read_metadata(f).num_rows for f in files)


def why_not_reused(
    layout: WorkdirLayout, day: DayFile, role: str, cfg: PreprocessConfig, lineage: str | None
) -> str | None:
    """None when day ``day``'s stored parts can be reused in ``role``; else why not."""
    day_dir = layout.parquet_day(day.day)
    try:
        record = read_json(day_dir / DAY_JSON)
    except ValueError:
        record = "damaged"
    if record is None:
        return "new"
    if not isinstance(record, dict) or record.get("format_version") != DAY_FORMAT_VERSION:
        return "its record is damaged or of another version"
    checks = [
        (record.get("fingerprint") == day.fingerprint(), "its file changed"),
        (record.get("role") == role, f"its role changed to {role}"),
        (lineage is not None and record.get("lineage") == lineage, "the ids were started over"),
        (record.get("settings") == day_settings(cfg), "the output settings changed"),
    ]
    for ok, why in checks:
        if not ok:
            return why
    try:
        for split in ROLE_SPLITS[role]:
            files = day_part_files(day_dir, split)
            if not files or _rows_of(files) != record["rows"][split]:
                return f"its {split} parts are missing or damaged"
        if _stats(record).rows_valid != sum(record["rows"][s] for s in ROLE_SPLITS[role]):
            return "its record is damaged"
    except Exception as error:  # noqa: BLE001 — a truncated part (ArrowInvalid, OSError), a bad record
        return f"its parts or record are damaged ({type(error).__name__})"
    return None


def _stats(record: dict) -> DayStats:
    data = dict(record["stats"])
    data["partitions"] = {int(k): int(v) for k, v in data["partitions"].items()}
    return DayStats(**data)


def stats_key(engine: str, cfg: PreprocessConfig) -> str | None:
    """What a day's per-partition line counts depend on besides its file: the Arrow engine's
    chunks (``spark_jobs.engines.arrow.chunks``: the file's size and ``arrow_chunk_mb``). None
    for the SQL engine, whose partitions follow Spark's file splitting settings."""
    return f"arrow/{int(cfg.arrow_chunk_mb)}" if engine == "arrow" else None


def stored_stats(
    layout: WorkdirLayout, work: DayWork, days: list[DayFile], key: str | None
) -> dict[int, DayStats]:
    """Statistics the count pass need not read again, from the days' records: those of the
    days reused whole (``plan`` checked their records), and of a day transformed again with
    its file unchanged (yesterday's test day joining train) when its line counts per
    partition were made the way this run's transform reads them (``stats_key``).

    A day with rejected lines is left out: the rejects output is rewritten every run from the
    day files, with line numbers from a fresh count of its read partitions."""
    out = {}
    redo = {d.day: d for d, _, _ in work.transform}
    for day in days:
        try:
            record = read_json(layout.parquet_day(day.day) / DAY_JSON)
            if day.day in redo and not (
                key is not None
                and record.get("stats_key") == key
                and record.get("fingerprint") == day.fingerprint()
            ):
                continue
            if day.day not in redo and day.day not in work.reused:
                continue
            stats = _stats(record)
        except Exception:  # noqa: BLE001 — no record, or a damaged one: the day is read
            continue
        if stats.rows_rejected == 0:
            out[day.day] = stats
    return out


def plan(
    days: list[DayFile], layout: WorkdirLayout, cfg: PreprocessConfig, lineage: str | None, retransform: bool
) -> DayWork:
    """Which days of the window to transform (with why), which to reuse, which to drop."""
    transform, reused = [], []
    for day in days:
        role = role_of(day, days)
        why = "--retransform" if retransform else why_not_reused(layout, day, role, cfg, lineage)
        if why is None:
            reused.append(day.day)
        else:
            transform.append((day, role, why))
    window = {d.day for d in days}
    dropped = sorted(k for k in stored_days(layout) if k not in window)
    return DayWork(transform, reused, dropped)


def stored_days(layout: WorkdirLayout) -> list[int]:
    root = layout.parquet_days
    if not root.is_dir():
        return []
    return sorted(
        int(p.name.removeprefix("day="))
        for p in root.iterdir()
        if p.is_dir() and p.name.startswith("day=") and p.name.removeprefix("day=").isdigit()
    )


def staging_dir(layout: WorkdirLayout, day: int) -> Path:
    return layout.parquet_days / f".staging-day={day}"


def clear_leftovers(layout: WorkdirLayout) -> None:
    """Staging and set-aside directories of a killed run (never a whole day)."""
    root = layout.parquet_days
    if root.is_dir():
        for path in root.iterdir():
            if path.name.startswith((".staging-day=", ".old-day=")):
                shutil.rmtree(path, ignore_errors=True)


@dataclass(frozen=True)
class TransformedWith:
    """What a run transforms its days with, the same for each day and recorded in its
    day.json: the settings, the dictionaries' lineage and table sizes (the ids as of this
    run), and the key its statistics were read under (``stats_key``)."""

    cfg: PreprocessConfig
    lineage: str
    sizes: dict[str, int]
    key: str | None = None


def commit_day(
    layout: WorkdirLayout, day: DayFile, role: str, stats: DayStats, run: TransformedWith
) -> dict[str, int]:
    """The staged day (its split folders written) gets its record and replaces the stored
    one. Returns its rows per split."""
    staging = staging_dir(layout, day.day)
    rows = {split: _rows_of(day_part_files(staging, split)) for split in ROLE_SPLITS[role]}
    if sum(rows.values()) != stats.rows_valid:
        raise PreprocessJobError(
            f"day {day.day}: {sum(rows.values())} rows transformed, but "
            f"{stats.rows_valid} valid lines counted"
        )
    write_json_atomic(
        staging / DAY_JSON,
        {
            "format_version": DAY_FORMAT_VERSION,
            "day": day.day,
            "file": day.name,
            "fingerprint": day.fingerprint(),
            "role": role,
            "settings": day_settings(run.cfg),
            "lineage": run.lineage,
            # names this transform of the day: the converter reuses a day's binary
            # only while the token it converted is the one linked
            "token": uuid.uuid4().hex,
            # the ids it was transformed with ("as of"): values kept later are 0 here
            "table_sizes": run.sizes,
            "rows": rows,
            # the count pass's statistics of the day: a run reusing it does not read it
            "stats": asdict(stats),
            "stats_key": run.key,
            "transformed": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        },
        sort_keys=False,
    )
    # on disk before it replaces the stored day, which is deleted only once it has
    publish(staging, layout.parquet_day(day.day), aside=layout.parquet_days / f".old-day={day.day}")
    return rows


@dataclass(frozen=True)
class Segment:
    """One day's files of one split, in the split's row order."""

    day: int
    files: list[str]
    rows: int
    token: str  # the day's transform (day.json), which its binary is known by


def link_splits(layout: WorkdirLayout, days: list[DayFile], staging: Path) -> dict[str, list[Segment]]:
    """``staging/<split>/`` as hard links to the window's day parts: train day by day (each
    in its own hash order), test and validation from the newest day. Returns the segments."""
    shutil.rmtree(staging, ignore_errors=True)
    segments: dict[str, list[Segment]] = {s: [] for s in SPLITS}
    for day in days:
        role = role_of(day, days)
        day_dir = layout.parquet_day(day.day)
        for split in ROLE_SPLITS[role]:
            target = staging / split
            target.mkdir(parents=True, exist_ok=True)
            names = []
            for part in day_part_files(day_dir, split):
                name = (
                    f"part-d{day.day:06d}-{part.name.removeprefix('part-')}" if role == TRAIN else part.name
                )
                _link(part, target / name)
                names.append(name)
            # the record's rows: checked against the parts' footers when the day was planned
            # for reuse, or taken from them when it was committed
            record = read_json(day_dir / DAY_JSON)
            segments[split].append(
                Segment(day.day, names, int(record["rows"][split]), f"{record['token']}/{split}")
            )
    return segments


def _link(source: Path, target: Path) -> None:
    """A hard link (no bytes copied); a copy where the filesystem has none."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def write_segments(layout: WorkdirLayout, segments: dict[str, list[Segment]]) -> None:
    write_json_atomic(
        layout.parquet / SEGMENTS_JSON,
        {
            "format_version": SEGMENTS_FORMAT_VERSION,
            "splits": {s: [asdict(g) for g in segments[s]] for s in SPLITS},
        },
        sort_keys=False,
    )


def drop_days(layout: WorkdirLayout, dropped: list[int]) -> None:
    """Days that left the window (the split directories no longer link them)."""
    for day in dropped:
        shutil.rmtree(layout.parquet_day(day), ignore_errors=True)


def forget_days(layout: WorkdirLayout) -> None:
    """Frequency mode keeps no days (any id may move): a stable workdir's days and segment
    list go, so nothing reads them against other ids."""
    workdir_io.remove(layout.parquet / SEGMENTS_JSON)
    workdir_io.remove_tree(layout.parquet_days)
