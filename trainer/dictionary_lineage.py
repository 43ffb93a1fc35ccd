"""Which stable dictionaries a checkpoint's ids descend from, so that an export may pair it
with a later day's dictionaries of the same lineage.

With ``preprocess.ids: stable`` the workdir's dictionaries are append-only: every preprocess
run keeps each value's id and gives newcomers the next free ids, and ``_ids.json`` beside the
column folders carries a ``lineage`` token that every run extending them keeps (a new one only
when they are started over; spark_jobs/stable_ids.py). A model trained on one day's
dictionaries therefore still means the same value by every row it has under any later
dictionaries of the same lineage: those are a superset, the old ids unchanged, the tables only
grown. The dataset identity (dlrm_contracts.dataset_identity) pins a checkpoint to exact bytes;
this record is what says the later dictionaries extend them.

Each checkpoint records the lineage (``dictionaries_lineage`` in its meta.json) only when the
workdir's dictionaries are the ones its dataset was converted with (same fingerprint): a
checkpoint trained on an older binary dataset after a newer preprocess, or on dictionaries
started over, must not claim a lineage it cannot show.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dlrm_contracts.dataset_identity import DICTIONARIES_FINGERPRINT_KEY, dictionaries_fingerprint
from dlrm_contracts.id_modes import recorded_or_default
from dlrm_contracts.layout import IDS_RECORD
from dlrm_contracts.schema import CAT_COLUMNS

LINEAGE_KEY = "dictionaries_lineage"  # checkpoint meta.json


def stable_record(dictionaries: Path) -> dict[str, Any] | None:
    """The stable-ids record of the dictionaries (None: ids by frequency, or no record)."""
    try:
        record = json.loads((Path(dictionaries) / IDS_RECORD).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or not recorded_or_default(record).grows_tables:
        return None
    lineage, sizes = record.get("lineage"), record.get("table_sizes")
    if (
        not isinstance(lineage, str)
        or not lineage
        or not isinstance(sizes, dict)
        or sorted(sizes) != sorted(CAT_COLUMNS)
    ):
        return None
    return record


def lineage_of(dictionaries: Path, identity: dict[str, Any]) -> str | None:
    """The lineage of the dictionaries, when they are the ones of the dataset whose
    ``identity`` is given (the fingerprint it records); None otherwise."""
    record = stable_record(dictionaries)
    recorded = (identity or {}).get(DICTIONARIES_FINGERPRINT_KEY)
    if record is None or recorded is None:
        return None
    return record["lineage"] if dictionaries_fingerprint(dictionaries) == recorded else None


def extension(meta: dict[str, Any], dictionaries: Path) -> tuple[dict[str, Any] | None, str]:
    """Whether the dictionaries extend those a checkpoint was trained on: ``(record, "")``
    when they do (record: the lineage and how many values each table gained, which the served
    model reads as id 0), ``(None, why not)`` otherwise."""
    trained = meta.get(LINEAGE_KEY)
    if not trained:
        return None, (
            "the checkpoint records no stable-ids lineage (ids by frequency, or "
            "trained before checkpoints recorded it)"
        )
    record = stable_record(dictionaries)
    if record is None:
        return None, f"the dictionaries in {dictionaries} are not stable ids (no {IDS_RECORD})"
    if record["lineage"] != trained:
        return None, (
            f"the dictionaries in {dictionaries} were started over since the "
            f"checkpoint's (lineage {record['lineage']}, the checkpoint's {trained}): "
            "their ids are not the checkpoint's"
        )
    old = [int(s) for s in meta.get("table_sizes", [])]
    new = [int(record["table_sizes"][c]) for c in CAT_COLUMNS]
    shrunk = [c for c, o, n in zip(CAT_COLUMNS, old, new) if n < o]
    if len(old) != len(new) or shrunk:
        return None, (
            f"tables of the dictionaries in {dictionaries} are smaller than the "
            f"checkpoint's ({', '.join(shrunk[:4]) or 'another number of tables'})"
        )
    gained = {c: n - o for c, o, n in zip(CAT_COLUMNS, old, new) if n > o}
    return {"lineage": trained, "values_read_as_id_0": gained}, ""
