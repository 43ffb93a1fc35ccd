"""A model trained on capped ids (``preprocess.ids: modulo``) exported, served and scored on raw
lines, and warm-started from one modulo run to the next.

The serving graph's capped id against the preprocess rule (spark_jobs.capped_ids) on the real
rows and on generated fields, malformed ones included; then a real trained multi-hot DCN model
on capped ids, exported with no dictionaries in the workdir, whose scores of raw lines equal
the trainer's predictions of the same rows' ids; then a warm start between two modulo runs:
equal caps carry the rows over as they are, a cap doubled remaps them, other changes are
refused."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
from bench_capped_ids_anchor import CAPS as MLPERF_CAPS  # 40M, mid-sized, and tiny ones

from dlrm_contracts.binary_format import NUMERICAL_FILE, read_info
from dlrm_contracts.config import ExportConfig
from dlrm_contracts.dataset_identity import IDENTITY_KEY, dataset_identity
from dlrm_contracts.schema import CAT_COLUMNS, NUM_CATEGORICAL, NUM_INTEGER
from spark_jobs.capped_ids import capped_ids as preprocess_capped_ids
from tests.spark_fixtures import reference_parse
from trainer.synthetic import write_planted_dataset
from trainer_helpers import CAPPED_ROWS, CAPS, small_config

MULTI_HOT = (3, 1, 1, 2, 1, 1, 1, 1, 1, 4, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1)
DCN = {"interaction": "dcn", "dcn_layers": 2, "dcn_rank": 4}
MODULO = {"ids": "modulo"}
BAD_HEX = ["abcdef123", "0x12", "zz", "-1", " 1", "ff\rff", "éé", "1 ", "+a", "0X1"]


def _hex_field(rng: random.Random) -> str:
    """A categorical as a day file may hold it: 1-8 hex digits in either case, or missing."""
    kind = rng.random()
    if kind < 0.15:
        return ""
    if kind < 0.2:
        return rng.choice(["ffffffff", "FFFFFFFF", "0", "00000000", "80000000", "7fffffff"])
    text = f"{rng.getrandbits(32):08x}"[rng.randint(0, 7) :]
    return text.upper() if rng.random() < 0.3 else text


def generated_lines(seed: int, count: int) -> list[str]:
    """Labelled lines with random categoricals; one in ten with a malformed one somewhere."""
    rng = random.Random(seed)
    lines = []
    for _ in range(count):
        cats = [_hex_field(rng) for _ in range(NUM_CATEGORICAL)]
        if rng.random() < 0.1:
            cats[rng.randrange(NUM_CATEGORICAL)] = rng.choice(BAD_HEX)
        fields = ["1", *(str(rng.randint(-5, 999)) for _ in range(NUM_INTEGER)), *cats]
        lines.append("\t".join(fields[: rng.choice([40, 40, 40, 30])]))  # short lines too
    return lines


def test_served_capped_ids_equal_the_preprocess_rule(real_sample):
    """On the 200 real rows and generated lines: a line the preprocess keeps gets, in every
    column, the id spark_jobs.capped_ids gives its value (missing: 0); a line with a field
    that is not 1-8 hex digits is refused as the preprocess rejects it."""
    import tensorflow as tf

    from trainer.serving import NON_HEX_CATEGORICAL, capped_ids, normalise_categoricals, split_lines

    lines = real_sample.read_text().splitlines() + generated_lines(3, 2000)
    fields, _ = split_lines(tf.constant([line.encode() for line in lines]), tf.constant(True))
    normalised, unusable, valid = normalise_categoricals(fields[:, 1 + NUM_INTEGER :])
    valid = valid.numpy()
    for caps in (MLPERF_CAPS, list(CAPS), [2**31] * NUM_CATEGORICAL):
        served = capped_ids(normalised, unusable, caps).numpy()
        kept = 0
        for i, line in enumerate(lines):
            reason, _, _, _, cats = reference_parse(line)
            assert valid[i] == (reason != NON_HEX_CATEGORICAL), line
            if reason is not None:
                continue
            values = np.array([[-1 if c is None else int(c, 16)] for c in cats], np.int64)
            np.testing.assert_array_equal(served[i], preprocess_capped_ids(values, caps)[:, 0], err_msg=line)
            kept += 1
        assert kept > 1800 and (served[:200] > 0).any()


def _raw_value(rng: np.random.Generator, capped_id: int, cap: int) -> str:
    """A hex value whose capped id is ``capped_id``: missing for some 0s, else id + k * cap
    (any k keeping it below 2**32), without leading zeros, in either case."""
    if capped_id == 0 and rng.random() < 0.5:
        return ""
    value = capped_id + cap * int(rng.integers(0, (2**32 - 1 - capped_id) // cap + 1))
    text = f"{value:x}"
    return text.upper() if rng.random() < 0.5 else text


@pytest.fixture(scope="module")
def capped_model(tmp_path_factory):
    """A multi-hot DCN model trained on a dataset of capped ids (no dictionaries anywhere),
    its export, and its test rows as raw lines whose values give the dataset's ids."""
    from trainer.data import SplitReader, open_dataset
    from trainer.export import export_model
    from trainer.loop import Trainer, run

    root = tmp_path_factory.mktemp("capped")
    path = root / "binary"
    write_planted_dataset(
        path,
        CAPPED_ROWS,
        seed=5,
        table_sizes=CAPS,
        threshold_spec=None,
        extra=MODULO,
        multi_hot_sizes=MULTI_HOT,
    )
    rng = np.random.default_rng(11)
    raw = rng.integers(-5, 5000, (CAPPED_ROWS["test"], NUM_INTEGER))
    logs = np.where(raw > -3, np.log(np.maximum(raw, -2) + 3.0), 0.0)
    logs.astype(np.float32).astype(np.float16).tofile(path / "test" / NUMERICAL_FILE)

    work = root / "work"
    config = small_config(max_steps=8, optimizer="adagrad", learning_rate=0.05, wide=True, **DCN)
    run(config, path, work)
    summary = export_model(work, path, ExportConfig())
    trainer = Trainer(config, path, work)
    trainer.restore_best(required=True)
    labels, expected = trainer.predictions("test")

    reader = SplitReader(open_dataset(path), "test")
    one_hot = [
        ids if ids.ndim == 1 else ids[:, 0]  # a multi-hot row's first id is its own
        for ids in (reader.categorical(c, 0, reader.rows) for c in range(NUM_CATEGORICAL))
    ]
    lines = [
        "\t".join(
            [
                str(int(labels[r])),
                *map(str, raw[r]),
                *(_raw_value(rng, int(ids[r]), cap) for ids, cap in zip(one_hot, CAPS)),
            ]
        )
        for r in range(reader.rows)
    ]
    return {
        "path": path,
        "work": work,
        "summary": summary,
        "lines": lines,
        "raw": raw,
        "labels": labels,
        "expected": expected,
    }


def test_a_capped_model_exports_and_scores_raw_lines_as_the_trainer(capped_model, tmp_path):
    """No dictionaries, no vocabulary: the export records ids modulo, and scoring the raw
    lines (the score stage's path) equals the trainer's predictions of their ids; a malformed
    value is refused as the preprocess refuses it."""
    import pyarrow.parquet as pq
    import tensorflow as tf

    from dlrm_contracts.config import ScoreConfig
    from trainer.score import score_files

    summary, work = capped_model["summary"], capped_model["work"]
    assert not (work / "parquet" / "dictionaries").exists()
    version = Path(summary["saved_model"])
    assert summary["ids"] == "modulo" and summary["table_sizes"] == list(CAPS)
    assert summary["signatures"][-1] == "serve_multi_hot"
    assert not list(version.glob("assets/*.vocab"))
    assert summary["size"]["vocabulary_bytes"] == 0
    expected = capped_model["expected"]
    assert np.std(expected) > 1e-3  # the rows' scores differ: not a constant model

    day = tmp_path / "day_test"
    day.write_text("\n".join(capped_model["lines"]) + "\n")
    scored = score_files(version, [day], tmp_path / "scores", ScoreConfig())
    assert scored["scored"] == CAPPED_ROWS["test"] and scored["rejected"] == 0
    table = pq.read_table(tmp_path / "scores" / "day_test.parquet")
    np.testing.assert_allclose(table.column("probability").to_numpy(), expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(table.column("label").to_numpy(), capped_model["labels"])

    model = tf.saved_model.load(str(version))
    first = capped_model["lines"][0].split("\t")
    cats = [first[1 + NUM_INTEGER :], first[1 + NUM_INTEGER :]]
    cats[1][3] = "123456789"  # 9 digits: the preprocess rejects the line
    out = model.signatures["serve_features"](
        int_features=tf.constant(capped_model["raw"][:2], tf.int64), cat_features=tf.constant(cats)
    )
    assert out["reject_reason"].numpy().tolist() == [b"", b"non_hex_categorical"]
    assert out["probability"].numpy()[0] == pytest.approx(expected[0], rel=1e-5, abs=1e-6)
    assert out["probability"].numpy()[1] == -1.0


def test_warm_start_between_two_modulo_runs(tmp_path):
    """Equal caps: every row of every table (and its Adagrad state) carries over as it is.
    A cap doubled (C7 4000 -> 8000): new row s starts as old row s mod 4000, and the previous
    model is evaluated as it serves (every id its remapped row). A cap changed otherwise, a
    multi-hot model's cap changed, or dictionary ids after capped ones: refused by name."""
    from trainer.checkpoint import CheckpointError, CheckpointReader, latest_checkpoint
    from trainer.loop import Trainer, run
    from trainer.warm_start import check_warm_start
    from trainer_helpers import checkpoint_arrays

    base = {"optimizer": "adagrad", "learning_rate": 0.05, "max_steps": 4}
    work = tmp_path / "work"
    run(small_config(**base), _modulo_day(tmp_path / "day1", 1, CAPS), work)
    before = checkpoint_arrays(work)
    reader = CheckpointReader(latest_checkpoint(work / "checkpoints"))
    slots = {t: reader.value(f"table/{t}/0-16/adagrad", (cap, 16)) for t, cap in enumerate(CAPS)}
    reader.close()
    c7 = CAT_COLUMNS.index("C7")
    doubled = tuple(2 * c if i == c7 else c for i, c in enumerate(CAPS))
    for name, caps in (("same", CAPS), ("doubled", doubled)):
        trainer = Trainer(small_config(init="previous", **base), _modulo_day(tmp_path / name, 2, caps), work)
        assert trainer._start().kind == "previous"
        assert trainer.run.warm_start.capped
        state = {n: v.numpy() for n, v in trainer._owned_state()}
        for t, cap in enumerate(caps):
            table = state[f"table/{t}/0-16"]
            assert table.shape[0] == cap
            rows = np.arange(cap) % CAPS[t]
            np.testing.assert_array_equal(table, before[f"table/{t}"][rows])
            np.testing.assert_array_equal(state[f"table/{t}/0-16/adagrad"], slots[t][rows])
        assert trainer.run.warm_start.grown == ({} if name == "same" else {"C7": [4000, 8000]})
        assert trainer.run.warm_start.served_sizes(caps) == caps
    summary = trainer.train()
    assert 0.5 < summary["previous_model_test_auc"] < 1

    meta = json.loads((max((work / "checkpoints").glob("step-*")) / "meta.json").read_text())
    config = small_config(init="previous")
    odd = list(doubled)
    odd[c7] = 8001
    with pytest.raises(CheckpointError, match="C7 8000 -> 8001 rows.*not multiples"):
        check_warm_start(meta, tmp_path, odd, meta["dims"], config, meta[IDENTITY_KEY])
    with pytest.raises(CheckpointError, match="capped ids.*this dataset has dictionary ids"):
        check_warm_start(
            meta, tmp_path, list(doubled), meta["dims"], config, {**meta[IDENTITY_KEY], "ids": None}
        )
    multi_hot = {**meta["dims"], "multi_hot_sizes": list(MULTI_HOT)}
    with pytest.raises(CheckpointError, match="C7 8000 -> 16000 rows.*multi-hot"):
        check_warm_start(
            {**meta, "dims": multi_hot},
            tmp_path,
            [2 * c if i == c7 else c for i, c in enumerate(doubled)],
            multi_hot,
            config,
            meta[IDENTITY_KEY],
        )


def _modulo_day(path: Path, seed: int, caps: tuple[int, ...]) -> Path:
    """A one-hot dataset of capped ids whose rows carry one planted signal (the days of a
    stream), as convert records it (``"ids": "modulo"``, no threshold)."""
    write_planted_dataset(
        path, CAPPED_ROWS, seed=seed, table_sizes=caps, threshold_spec=None, signal_seed=99, extra=MODULO
    )
    assert dataset_identity(read_info(path))["ids"] == "modulo"
    return path
