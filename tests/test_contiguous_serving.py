"""A model trained on contiguous ids (``preprocess.ids: contiguous``) exported with the
contiguous dictionaries and scored on raw lines: the raw values are drawn so that the
transform's rule (``spark_jobs.contiguous_ids.ContiguousIds``: missing is the value 0, a value
with no id is 1, then the caps) gives the dataset's ids, and the served scores equal the
trainer's predictions of those ids; and convert records those dictionaries' fingerprint."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from dlrm_contracts.binary_format import NUMERICAL_FILE
from dlrm_contracts.config import ExportConfig, ScoreConfig
from dlrm_contracts.contiguous_ids import DICTIONARIES_DIR, FIRST_ID, RARE_ID
from dlrm_contracts.dataset_identity import DICTIONARIES_FINGERPRINT_KEY, dictionaries_fingerprint
from dlrm_contracts.layout import PREPROCESS_JSON
from dlrm_contracts.schema import CAT_COLUMNS, NUM_INTEGER
from dlrm_contracts.table_sizes import VOCABULARY_LINE_BYTES
from spark_jobs.contiguous_ids import ContiguousIds
from trainer.synthetic import write_planted_dataset
from trainer_helpers import CAPPED_ROWS, CAPS, small_config


class _Index:
    """The dictionary index's lookup_into over plain dicts (value -> id, absent: 0)."""

    def __init__(self, dictionaries: list[dict[int, int]]):
        self.dictionaries = dictionaries

    def lookup_into(self, values: np.ndarray, out: np.ndarray) -> None:
        for j, column in enumerate(values):
            out[j] = [self.dictionaries[j].get(int(v), 0) for v in column]


def _dictionaries(rng: np.random.Generator, path: Path) -> list[dict[int, int]]:
    """Per column, 3 * cap + 5 values (0 among them in half the columns) numbered from
    FIRST_ID in a random order, so every capped id has several values; written as the
    preprocess writes them."""
    out, tables = [], []
    for j, (column, cap) in enumerate(zip(CAT_COLUMNS, CAPS)):
        count = 3 * cap + 5
        values = rng.choice(2**32, count, replace=False)
        if j % 2:
            values[0] = 0
        ids = FIRST_ID + rng.permutation(count)
        out.append(dict(zip(values.tolist(), ids.tolist())))
        tables.append(
            pa.table(
                {
                    "value": [f"{v:08x}" for v in values.tolist()],
                    "id": pa.array(ids, pa.int32()),
                    "count": pa.array(np.ones(count, np.int64)),
                    "column": [column] * count,
                }
            )
        )
    pq.write_to_dataset(pa.concat_tables(tables), str(path), partition_cols=["column"])
    return out


def _raw_value(rng: np.random.Generator, dictionary: dict[int, int], capped_id: int, cap: int) -> str:
    """A field whose contiguous id, capped, is ``capped_id``: a numbered value, a value with no
    id when the rare id fits, or missing where the value 0 fits."""
    choices = [v for v, i in dictionary.items() if i % cap == capped_id]
    if RARE_ID % cap == capped_id:
        choices.append(None)
    value = choices[int(rng.integers(len(choices)))]
    if value is None:
        while (value := int(rng.integers(2**32))) in dictionary:
            pass
    if value == 0 and rng.random() < 0.7:
        return ""
    text = f"{value:x}"
    return text.upper() if rng.random() < 0.5 else text


def test_a_contiguous_id_model_exports_and_scores_raw_lines_as_the_trainer(tmp_path):
    from trainer.data import SplitReader, open_dataset
    from trainer.export import export_model
    from trainer.loop import Trainer, run
    from trainer.score import score_files

    rng = np.random.default_rng(7)
    work = tmp_path / "work"
    dictionaries = _dictionaries(rng, work / "parquet" / DICTIONARIES_DIR)
    path = tmp_path / "binary"
    extra = {
        "ids": "contiguous",
        DICTIONARIES_FINGERPRINT_KEY: dictionaries_fingerprint(work / "parquet" / DICTIONARIES_DIR),
    }
    write_planted_dataset(path, CAPPED_ROWS, seed=5, table_sizes=CAPS, threshold_spec=None, extra=extra)
    raw = rng.integers(-5, 5000, (CAPPED_ROWS["test"], NUM_INTEGER))
    logs = np.where(raw > -3, np.log(np.maximum(raw, -2) + 3.0), 0.0)
    logs.astype(np.float32).astype(np.float16).tofile(path / "test" / NUMERICAL_FILE)

    config = small_config(max_steps=8, optimizer="adagrad", learning_rate=0.05)
    run(config, path, work)
    summary = export_model(work, path, ExportConfig())
    assert not (work / "parquet" / "dictionaries").exists()
    assert summary["ids"] == "contiguous" and summary["table_sizes"] == list(CAPS)
    # every value is shipped (ids beyond a cap too), and the size check counts them
    assert summary["size"]["vocabulary_bytes"] == sum(map(len, dictionaries)) * VOCABULARY_LINE_BYTES
    trainer = Trainer(config, path, work)
    trainer.restore_best(required=True)
    labels, expected = trainer.predictions("test")
    assert np.std(expected) > 1e-3  # the rows' scores differ: not a constant model

    reader = SplitReader(open_dataset(path), "test")
    ids = np.stack([reader.categorical(c, 0, reader.rows) for c in range(len(CAT_COLUMNS))])
    fields = [
        [_raw_value(rng, dictionaries[j], int(ids[j, r]), cap) for r in range(reader.rows)]
        for j, cap in enumerate(CAPS)
    ]
    # the transform's rule gives these fields the dataset's ids
    values = np.array([[int(f, 16) if f else -1 for f in column] for column in fields], np.int64)
    transformed = np.empty_like(values)
    ContiguousIds(_Index(dictionaries), CAPS).lookup_into(values, transformed)
    np.testing.assert_array_equal(transformed, ids)
    assert (values < 0).any() and (transformed == RARE_ID % np.array(CAPS)[:, None]).any()

    lines = [
        "\t".join([str(int(labels[r])), *map(str, raw[r]), *(column[r] for column in fields)])
        for r in range(reader.rows)
    ]
    day = tmp_path / "day_test"
    day.write_text("\n".join(lines) + "\n")
    version = Path(summary["saved_model"])
    scored = score_files(version, [day], tmp_path / "scores", ScoreConfig())
    assert scored["scored"] == CAPPED_ROWS["test"] and scored["rejected"] == 0
    table = pq.read_table(tmp_path / "scores" / "day_test.parquet")
    np.testing.assert_allclose(table.column("probability").to_numpy(), expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(table.column("label").to_numpy(), labels)


def test_convert_records_the_contiguous_dictionaries_a_model_is_served_with(tmp_path):
    """dataset.json's dictionaries fingerprint (what the export checks) is that of
    parquet/contiguous_dictionaries when preprocess numbered contiguous ids."""
    from converters.convert import _dataset_extra

    parquet = tmp_path / "parquet"
    _dictionaries(np.random.default_rng(1), parquet / DICTIONARIES_DIR)
    (parquet / PREPROCESS_JSON).write_text(json.dumps({"ids": "contiguous"}))
    extra = _dataset_extra(parquet, None, {}, None)
    assert extra["ids"] == "contiguous"
    assert extra[DICTIONARIES_FINGERPRINT_KEY] == dictionaries_fingerprint(parquet / DICTIONARIES_DIR)
    assert extra[DICTIONARIES_FINGERPRINT_KEY] is not None
