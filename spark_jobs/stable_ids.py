"""Stable ids (``preprocess.ids: stable``): a workdir's dictionaries are append-only across runs.

A value that once got an id keeps it in every later run; values that newly pass the threshold
get the next free ids of their column (count descending, then value ascending, among the
newcomers: the frequency order, so the first stable run gives exactly the frequency ids); id 0
stays rare-or-missing. A value that later becomes rare (or leaves the window altogether) keeps
its id *and still maps to it*: its embedding row was trained on it, and sending it to 0 would
change what yesterday's model sees for the same value (and its row would be unused while the
table keeps it anyway). So a table's size is the column's highest id + 1 and only grows.

Where the previous ids come from: ``DIR/parquet/dictionaries/`` itself, with ``_ids.json``
beside its column folders (threshold, table sizes; it moves with them). A run writes the new
dictionaries into a staging directory and swaps it in only once every group is written and the
totals are checked (``commit``); a killed run leaves the previous dictionaries in place, and
``recover`` finishes or undoes a swap a kill interrupted. The new parts and their record are
on disk before the swap, and the swap before the previous dictionaries are deleted, so a
power cut leaves one whole copy too: the id lineage never ends by accident.

This module is the part both engines share: the record, the swap, the checks. How an engine
numbers the newcomers is its own (``spark_jobs.engines.arrow.stable_ids``: per value group;
``spark_jobs.engines.sql.engine``: an anti join and a global sort).

The threshold of a stable workdir cannot change: a raise would have to drop values that keep
their ids, a cut would have to renumber. Both are refused (``previous_dictionaries``).
"""

from __future__ import annotations

import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from dlrm_contracts.atomic import fsync_path, publish, read_json, write_json_atomic
from dlrm_contracts.id_modes import STABLE
from dlrm_contracts.layout import IDS_RECORD
from dlrm_contracts.schema import CAT_COLUMNS
from dlrm_contracts.thresholds import ThresholdSpec, parse_threshold_spec
from spark_jobs.errors import PreprocessConfigError, PreprocessJobError

IDS_FORMAT_VERSION = 1


@dataclass(frozen=True)
class Previous:
    """The stable dictionaries a run extends."""

    directory: str
    threshold_spec: str
    table_sizes: dict[str, int]  # per column its highest id + 1


# ---------------------------------------------------------------- the workdir's dictionaries


def staging_dir(dict_dir: Path) -> Path:
    return dict_dir.with_name(f".{dict_dir.name}-staging")


def retired_dir(dict_dir: Path) -> Path:
    return dict_dir.with_name(f".{dict_dir.name}-previous")


def recover(dict_dir: Path) -> None:
    """Finish or undo the swap of a killed run: the new dictionaries are in place once their
    record is; otherwise the previous ones are put back. Staging leftovers are dropped."""
    retired = retired_dir(dict_dir)
    if retired.is_dir():
        if (dict_dir / IDS_RECORD).is_file():
            shutil.rmtree(retired)
        else:
            shutil.rmtree(dict_dir, ignore_errors=True)
            retired.rename(dict_dir)
            fsync_path(dict_dir.parent)  # put back for good before anything else is deleted
    shutil.rmtree(staging_dir(dict_dir), ignore_errors=True)


def previous_dictionaries(dict_dir: Path, spec: ThresholdSpec) -> Previous | None:
    """The stable dictionaries of the workdir (None: there are none yet, the ids start at 1),
    after ``recover``. A threshold other than theirs is refused (exit 2)."""
    recover(dict_dir)
    record_path = dict_dir / IDS_RECORD
    try:
        record = read_json(record_path)
    except ValueError as exc:
        raise PreprocessJobError(
            f"{record_path} is damaged ({exc}): the stable ids cannot be "
            f"extended; restore it, or delete {dict_dir} to give every id "
            "anew (models trained on the old ids then no longer fit)"
        ) from None
    if record is None:
        return None
    sizes = record.get("table_sizes") if isinstance(record, dict) else None
    if (
        not isinstance(sizes, dict)
        or record.get("format_version") != IDS_FORMAT_VERSION
        or sorted(sizes) != sorted(CAT_COLUMNS)
    ):
        raise PreprocessJobError(
            f"{record_path} is not a stable-ids record of this version; "
            f"restore it, or delete {dict_dir} to give every id anew"
        )
    made_at = parse_threshold_spec(record["threshold_spec"])
    if not same_threshold(made_at, spec):
        raise PreprocessConfigError(
            f"preprocess.ids is stable and the dictionaries in {dict_dir} were built at "
            f"threshold {made_at}, but this run asks for {spec}: stable ids never move, so a "
            f"workdir's threshold cannot change. Run at {made_at}, or start the ids over in a "
            f"new workdir (or delete {dict_dir}; models trained on the old ids then no longer fit)"
        )
    for column, size in sizes.items():
        if size > 1 and not (dict_dir / f"column={column}").is_dir():
            raise PreprocessJobError(
                f"the stable dictionary of {column} is missing from "
                f"{dict_dir} ({size - 1} ids recorded): restore it, or "
                f"delete {dict_dir} to give every id anew"
            )
    return Previous(str(dict_dir), str(made_at), {c: int(sizes[c]) for c in CAT_COLUMNS})


def same_threshold(a: ThresholdSpec, b: ThresholdSpec) -> bool:
    """Whether two specs keep the same values (0 and 1 both keep every value seen)."""
    return all(max(1, a.effective(c)) == max(1, b.effective(c)) for c in CAT_COLUMNS)


def lineage(dict_dir: Path) -> str | None:
    """The token the dictionaries' ids descend from: kept by every run that extends them, new
    when they are started over (deleted). A day transformed under another lineage has other
    ids and is never reused (spark_jobs.day_store). None: no stable dictionaries (or a record
    written before lineages existed, which the next commit gives one)."""
    try:
        record = read_json(Path(dict_dir) / IDS_RECORD)
    except ValueError:
        return None
    value = record.get("lineage") if isinstance(record, dict) else None
    return value if isinstance(value, str) and value else None


def commit(staging: Path, dict_dir: Path, spec: ThresholdSpec, sizes: dict[str, int]) -> None:
    """The staged dictionaries, with their record, become the workdir's (see ``recover``)."""
    write_json_atomic(
        staging / IDS_RECORD,
        {
            "format_version": IDS_FORMAT_VERSION,
            "ids": STABLE.name,
            "lineage": lineage(dict_dir) or uuid.uuid4().hex,
            "threshold_spec": str(spec),
            "table_sizes": sizes,
            "written": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        },
        sort_keys=False,
    )
    # every staged part and the record on disk, the previous dictionaries set aside, the new
    # ones renamed in and that rename on disk; only then are the previous ones deleted: a
    # power cut at any point leaves one whole copy for ``recover`` (dlrm_contracts.atomic)
    publish(staging, dict_dir, aside=retired_dir(dict_dir))


def check_old_ids(found: dict[str, tuple[int, int]], previous_sizes: dict[str, int]) -> None:
    """Every previous id was read back: per column (entries, highest id) must be (M, M) for
    ids 1..M. A lost or damaged part would otherwise give its values new ids."""
    for column in CAT_COLUMNS:
        entries, highest = found.get(column, (0, 0))
        expected = previous_sizes[column] - 1
        if entries != expected or highest != expected:
            raise PreprocessJobError(
                f"the stable dictionary of {column} holds {entries} values up to id {highest}, "
                f"but its record says ids 1..{expected}: it is damaged; restore it, or delete the "
                "dictionaries to give every id anew (models trained on the old ids then no "
                "longer fit)"
            )
