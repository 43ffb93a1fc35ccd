"""Exporting a checkpoint with later dictionaries of the same stable-ids lineage: yesterday's
model against today's dictionaries, which only appended values, so a daily export need not wait
for a model trained on them. Allowed, the
values added since read as id 0 in the served model; refused with a clear message when the
dictionaries were started over, are not stable ids, shrank, or the checkpoint records no
lineage. The rules without TensorFlow, then a real trained checkpoint, export and SavedModel."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from dlrm_contracts.config import ExportConfig
from dlrm_contracts.dataset_identity import IDENTITY_KEY, dictionaries_fingerprint
from dlrm_contracts.schema import CAT_COLUMNS, NUM_INTEGER
from trainer.dictionary_lineage import IDS_RECORD, LINEAGE_KEY, extension, lineage_of
from trainer_helpers import STREAM_SIZES_1, STREAM_SIZES_2, small_config, stream_day

C7 = CAT_COLUMNS.index("C7")


def ids_record(dictionaries: Path, sizes, lineage: str, ids: str = "stable") -> None:
    """The record spark_jobs/stable_ids.py writes beside stable dictionaries."""
    (dictionaries / IDS_RECORD).write_text(
        json.dumps(
            {
                "format_version": 1,
                "ids": ids,
                "lineage": lineage,
                "threshold_spec": "2",
                "table_sizes": dict(zip(CAT_COLUMNS, (int(s) for s in sizes))),
            }
        )
    )


def stable_day(path: Path, seed: int, sizes, dictionaries: Path, lineage: str) -> Path:
    stream_day(path, seed, sizes, dictionaries=dictionaries)
    ids_record(dictionaries, sizes, lineage)
    return path


def test_the_rule_extension_same_lineage_and_tables_that_only_grew(tmp_path):
    from trainer_helpers import write_stable_dictionaries

    dictionaries = tmp_path / "dictionaries"
    write_stable_dictionaries(dictionaries, STREAM_SIZES_2)
    ids_record(dictionaries, STREAM_SIZES_2, "L1")
    meta = {LINEAGE_KEY: "L1", "table_sizes": list(STREAM_SIZES_1)}
    granted, why = extension(meta, dictionaries)
    assert why == "" and granted == {
        "lineage": "L1",
        "values_read_as_id_0": {"C2": 4, "C5": 60, "C7": 500, "C17": 100},
    }
    assert extension({**meta, "table_sizes": list(STREAM_SIZES_2)}, dictionaries)[0] == {
        "lineage": "L1",
        "values_read_as_id_0": {},
    }
    refused = [
        (
            {**meta, LINEAGE_KEY: "L0"},
            "started over since the checkpoint's \\(lineage L1, the checkpoint's L0\\)",
        ),
        ({"table_sizes": list(STREAM_SIZES_1)}, "records no stable-ids lineage"),
        (
            {**meta, "table_sizes": [s + 1 for s in STREAM_SIZES_2]},
            "smaller than the checkpoint's \\(C1, C2, C3",
        ),
    ]
    for bad, words in refused:
        granted, why = extension(bad, dictionaries)
        assert granted is None
        assert re.search(words, why), why
    ids_record(dictionaries, STREAM_SIZES_2, "L1", ids="frequency")
    assert extension(meta, dictionaries) == (
        None,
        f"the dictionaries in {dictionaries} are not stable ids (no {IDS_RECORD})",
    )
    # the lineage a checkpoint records: only of the dictionaries its dataset was converted with
    ids_record(dictionaries, STREAM_SIZES_2, "L1")
    own = {"dictionaries_fingerprint": dictionaries_fingerprint(dictionaries)}
    assert lineage_of(dictionaries, own) == "L1"
    assert lineage_of(dictionaries, {"dictionaries_fingerprint": "xxh3:other"}) is None
    assert lineage_of(dictionaries, {}) is None


def _serve(version: Path, cats: list[list[str]]) -> np.ndarray:
    import tensorflow as tf

    model = tf.saved_model.load(str(version))
    out = model.signatures["serve_features"](
        int_features=tf.constant(np.ones((len(cats), NUM_INTEGER), np.int64)),
        cat_features=tf.constant(cats, tf.string),
    )
    assert [r.decode() for r in out["reject_reason"].numpy()] == [""] * len(cats)
    return out["probability"].numpy()


def test_yesterdays_model_exports_with_todays_dictionaries_new_values_read_as_0(tmp_path):
    """Day 1 trained (its checkpoint records lineage L1); day 2's preprocess appends values
    (same lineage, C2, C5, C7, C17 grown) and no training follows: the day-1 checkpoint exports
    with day 2's dictionaries, its vocabularies day 1's ids, a value added on day 2 scoring
    as an unseen value (id 0). The same checkpoint against dictionaries started over (another
    lineage) is refused, naming why, and nothing is written."""
    from trainer.export import ExportError, export_model
    from trainer.loop import run

    work = tmp_path / "work"
    dictionaries = work / "parquet" / "dictionaries"
    day1 = stable_day(tmp_path / "day1", 1, STREAM_SIZES_1, dictionaries, "L1")
    run(small_config(max_steps=6), day1, work)
    [checkpoint] = sorted((work / "checkpoints").glob("step-*"))
    meta = json.loads((checkpoint / "meta.json").read_text())
    assert meta[LINEAGE_KEY] == "L1"

    stable_day(tmp_path / "day2", 2, STREAM_SIZES_2, dictionaries, "L1")  # not trained on
    made = export_model(work, day1, ExportConfig())
    version = Path(made["saved_model"])
    assert made["version"] == 1 and made["table_sizes"] == list(STREAM_SIZES_1)
    assert made["dictionaries_extended"] == {
        "lineage": "L1",
        "values_read_as_id_0": {"C2": 4, "C5": 60, "C7": 500, "C17": 100},
    }
    assert (
        made["dataset"]["dictionaries_fingerprint"] == meta[IDENTITY_KEY]["dictionaries_fingerprint"]
    )  # what it was trained on
    vocabulary = (version / "assets" / "C7.vocab").read_text().splitlines()
    assert len(vocabulary) == STREAM_SIZES_1[C7]  # header + the model's rows

    def row(c7: str) -> list[str]:
        cats = [f"{c:02x}{1:06x}" for c in range(len(CAT_COLUMNS))]  # id 1 everywhere
        cats[C7] = c7
        return cats

    added = f"{C7:02x}{STREAM_SIZES_1[C7] + 10:06x}"  # in day 2's dictionary only
    unseen = "deadbeef"  # in no dictionary
    old = f"{C7:02x}{7:06x}"  # id 7 in both
    p_added, p_unseen, p_old = _serve(version, [row(added), row(unseen), row(old)])
    assert p_added == p_unseen  # id 0, the rare value
    assert p_old != p_unseen  # its own trained row

    shutil.rmtree(dictionaries)
    stable_day(tmp_path / "day2b", 2, STREAM_SIZES_2, dictionaries, "L2")  # started over
    with pytest.raises(
        ExportError,
        match="do not extend its own \\(the dictionaries in .* were started over since the checkpoint's",
    ):
        export_model(work, day1, ExportConfig())
    assert sorted(p.name for p in (work / "export").iterdir()) == ["1", "serving.json"]
