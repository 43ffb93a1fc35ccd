"""DCNv2 (train.interaction: dcn) and multi-hot rows: the cross layers and the pooled lookups
against plain numpy, the multi-hot reader, checkpoints that refuse another interaction or
another multi-hot layout, a warm start, and the export of a multi-hot model (raw lines scored
through the converters' materialization, and serve_multi_hot, equal the trainer's
predictions). Two ranks against one process: test_trainer_horovod.py's dlrmv2 variant."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from dlrm_contracts.binary_format import NUMERICAL_FILE, cat_file
from dlrm_contracts.config import ExportConfig
from dlrm_contracts.dataset_identity import DICTIONARIES_FINGERPRINT_KEY, dictionaries_fingerprint
from dlrm_contracts.schema import NUM_CATEGORICAL, NUM_INTEGER
from trainer.synthetic import DEFAULT_TABLE_SIZES, write_planted_dataset
from trainer_helpers import DLRMV2_MULTI_HOT, small_config, write_stable_dictionaries

ROWS = {"train": 2048, "test": 300, "validation": 200}
DCN = dict(interaction="dcn", dcn_layers=3, dcn_rank=6)


def numpy_cross(x0: np.ndarray, downs, ups, biases) -> np.ndarray:
    x = x0
    for down, up, bias in zip(downs, ups, biases):
        x = x0 * (x @ down @ up + bias) + x
    return x


def test_cross_layers_match_numpy():
    import tensorflow as tf

    from trainer.model import CrossNet

    cross = CrossNet(12, 3, 4, seed=5, ident=3000)
    rng = np.random.default_rng(0)
    for bias in cross.biases:  # they start at 0: make the bias term count
        bias.assign(rng.normal(size=12).astype(np.float32))
    x0 = rng.normal(size=(7, 12)).astype(np.float32)
    got = cross(tf.constant(x0), tf.float32).numpy()
    want = numpy_cross(
        x0.astype(np.float64),
        *([v.numpy().astype(np.float64) for v in vs] for vs in (cross.downs, cross.ups, cross.biases)),
    )
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert [v.shape for v in cross.downs[0:1] + cross.ups[0:1]] == [(12, 4), (4, 12)]
    # one layer with zero kernels and bias is the identity (the residual): x1 = x0
    zero = CrossNet(12, 1, 4, seed=5, ident=3000)
    zero.downs[0].assign(tf.zeros([12, 4]))
    np.testing.assert_array_equal(zero(tf.constant(x0), tf.float32).numpy(), x0)


def test_pooled_lookup_sums_a_rows_ids_and_sends_each_its_gradient():
    import tensorflow as tf

    from trainer.model import pooled_lookup

    table = tf.Variable(np.random.default_rng(1).normal(size=(10, 4)).astype(np.float32))
    ids = np.array([[1, 2, 2], [0, 9, 3]], np.int32)  # a duplicate id in the first row
    with tf.GradientTape() as tape:
        pooled = pooled_lookup(table, tf.constant(ids))
        loss = tf.reduce_sum(pooled * tf.constant([[1.0], [2.0]]))
    np.testing.assert_allclose(pooled.numpy(), table.numpy()[ids].sum(axis=1), rtol=1e-6)
    grad = tape.gradient(loss, table)
    assert isinstance(grad, tf.IndexedSlices)  # sparse: the looked-up rows only
    dense = tf.convert_to_tensor(grad).numpy()
    want = np.zeros((10, 4))
    np.add.at(want, ids.ravel(), np.repeat([1.0, 2.0], 3)[:, None] * np.ones(4))
    np.testing.assert_allclose(dense, want)
    # a one-hot column [B] is the plain lookup
    np.testing.assert_array_equal(pooled_lookup(table, tf.constant([4, 4])).numpy(), table.numpy()[[4, 4]])


def test_dense_parameters_count_the_cross_layers():
    from trainer.comm import LocalComm
    from trainer.dims import dense_parameters, model_dims
    from trainer.model import DLRM
    from trainer.placement import plan_placement

    config = small_config(**DCN)
    dims = model_dims(config)
    placement = plan_placement(DEFAULT_TABLE_SIZES, dims.embedding_dim, 1)
    model = DLRM(dims, placement, 0, 256, config.seed, LocalComm())
    counted = sum(int(np.prod(v.shape)) for _, v in model.replicated_variables())
    assert dense_parameters(dims) == counted
    assert model.top.kernels[0].shape == (27 * 16, 128)
    assert (
        dims.meta()["interaction"] == "dcn" and "interaction" not in model_dims(small_config()).meta()
    )  # a dot model's dims are recorded as before


@pytest.fixture(scope="module")
def multi_hot(tmp_path_factory):
    """A multi-hot dataset whose test rows' numericals are the log transform of known raw
    integers (as preprocess writes them), with dictionaries beside it for the export."""
    root = tmp_path_factory.mktemp("multi_hot")
    dictionaries = root / "work" / "parquet" / "dictionaries"
    write_stable_dictionaries(dictionaries, DEFAULT_TABLE_SIZES)
    path = root / "binary"
    write_planted_dataset(
        path,
        ROWS,
        seed=4,
        multi_hot_sizes=DLRMV2_MULTI_HOT,
        extra={DICTIONARIES_FINGERPRINT_KEY: dictionaries_fingerprint(dictionaries)},
    )
    raw = np.random.default_rng(9).integers(-5, 5000, (ROWS["test"], NUM_INTEGER))
    transformed = np.where(raw > -3, np.log(np.maximum(raw, -2) + 3.0), 0.0)
    transformed.astype(np.float32).astype(np.float16).tofile(path / "test" / NUMERICAL_FILE)
    return path, root / "work", raw


def test_multi_hot_rows_read_as_written(multi_hot, tmp_path):
    from trainer.data import DatasetError, SplitReader, open_dataset, single_process_view

    path, _, _ = multi_hot
    dataset = open_dataset(path)
    assert dataset.multi_hot_sizes == DLRMV2_MULTI_HOT and dataset.multi_hot
    reader = SplitReader(dataset, "train")
    c10 = np.fromfile(path / "train" / cat_file(9), dataset.cat_dtypes[9]).reshape(-1, 7)
    np.testing.assert_array_equal(reader.categorical(9, 100, 50), c10[100:150])
    assert reader.categorical(2, 0, 8).shape == (8,)  # C3 is one-hot
    # the last batch: padded with rows of id 0
    batch = reader.read(single_process_view(), 0, ROWS["train"] - 10, 32)
    assert batch.categorical[9].shape == (32, 7) and not batch.categorical[9][10:].any()
    # its rows are drawn over the table sizes: read at another threshold they would not be
    # what converters rethreshold writes
    with pytest.raises(DatasetError, match="multi-hot columns, which cannot be read at threshold 2"):
        open_dataset(path, threshold="2")
    # an id outside its table is named with its row, not its position in the flat file
    damaged = tmp_path / "damaged"
    shutil.copytree(path, damaged)
    c10 = np.memmap(damaged / "train" / cat_file(9), dataset.cat_dtypes[9], "r+").reshape(-1, 7)
    c10[5, 3] = DEFAULT_TABLE_SIZES[9] + 1
    c10.flush()
    with pytest.raises(DatasetError, match=f"id {DEFAULT_TABLE_SIZES[9] + 1} at row 5 is outside"):
        SplitReader(open_dataset(damaged), "train").categorical(9, 0, 10)


def test_checkpoints_refuse_another_interaction_or_multi_hot_layout(multi_hot, tmp_path):
    """The interaction and the ids per row shape the model: a checkpoint trained with another
    is never resumed, evaluated or warm-started from as if it fitted."""
    from trainer.checkpoint import CheckpointError
    from trainer.loop import run

    path, _, _ = multi_hot
    run(small_config(max_steps=2), path, tmp_path / "w")
    with pytest.raises(CheckpointError, match=r"train\.interaction 'dot' -> 'dcn'"):
        run(small_config(max_steps=4, **DCN), path, tmp_path / "w")
    with pytest.raises(CheckpointError, match=r"model dims .*'interaction': 'dcn'"):
        run(small_config(**DCN), path, tmp_path / "w", mode="eval")
    # the same rows read one-hot (C1..C26's first ids): the checkpoint pooled k ids per row
    one_hot = tmp_path / "one_hot"
    write_planted_dataset(one_hot, ROWS, seed=4)
    with pytest.raises(CheckpointError, match=r"multi_hot_sizes"):
        run(small_config(), one_hot, tmp_path / "w", mode="eval")


def raw_lines(path: Path, raw: np.ndarray, split: str = "test") -> list[str]:
    """The split's rows as raw labelled lines: the known integers, and each column's one-hot id
    (a multi-hot row's first id) as its value in write_stable_dictionaries's dictionaries."""
    from trainer.data import SplitReader, open_dataset

    reader = SplitReader(open_dataset(path), split)
    labels = np.fromfile(path / split / "label.bin", np.uint8)
    columns = [reader.categorical(c, 0, reader.rows) for c in range(NUM_CATEGORICAL)]
    firsts = [ids if ids.ndim == 1 else ids[:, 0] for ids in columns]
    return [
        "\t".join(
            [
                str(labels[r]),
                *map(str, raw[r]),
                *(f"{c:02x}{int(ids[r]):06x}" if ids[r] else "" for c, ids in enumerate(firsts)),
            ]
        )
        for r in range(reader.rows)
    ]


def test_a_multi_hot_dcn_model_exports_scores_raw_lines_and_serves_multi_hot_rows(multi_hot, tmp_path):
    """The export of a multi-hot DCN model: raw lines (the score stage) reach the rows the
    converters materialized and score as the trainer does; serve_multi_hot takes those rows
    as the dataset holds them (raw integers + each column's k ids side by side) and agrees; an
    id outside its table is refused by name."""
    import pyarrow.parquet as pq
    import tensorflow as tf

    from dlrm_contracts.config import ScoreConfig
    from trainer import export
    from trainer.loop import Trainer, run
    from trainer.score import score_files

    path, work, raw = multi_hot
    config = small_config(max_steps=8, optimizer="adagrad", learning_rate=0.05, wide=True, **DCN)
    run(config, path, work)
    summary = export.export_model(work, path, ExportConfig())
    assert summary["signatures"] == ["serve_features", "serve_lines", "serving_default", "serve_multi_hot"]
    assert summary["multi_hot_sizes"] == list(DLRMV2_MULTI_HOT)
    assert (summary["multi_hot_seed"], summary["multi_hot_distribution"]) == (0, "uniform")
    assert summary["dims"]["interaction"] == "dcn"

    trainer = Trainer(config, path, work)
    trainer.restore_best(required=True)
    labels, expected = trainer.predictions("test")
    assert np.std(expected) > 1e-3  # the rows' scores differ: not a constant model
    day = tmp_path / "day_test"
    day.write_text("\n".join(raw_lines(path, raw)) + "\n")
    scored = score_files(summary["saved_model"], [day], tmp_path / "scores", ScoreConfig())
    assert scored["scored"] == ROWS["test"] and scored["rejected"] == 0
    table = pq.read_table(tmp_path / "scores" / "day_test.parquet")
    np.testing.assert_allclose(table.column("probability").to_numpy(), expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(table.column("label").to_numpy(), labels)

    ids = np.concatenate(
        [
            np.fromfile(path / "test" / cat_file(i), dt).reshape(ROWS["test"], -1)
            for i, dt in zip(range(NUM_CATEGORICAL), trainer.dataset.cat_dtypes)
        ],
        axis=1,
    ).astype(np.int64)
    assert ids.shape == (ROWS["test"], sum(DLRMV2_MULTI_HOT))
    model = tf.saved_model.load(summary["saved_model"])
    out = model.signatures["serve_multi_hot"](
        int_features=tf.constant(raw, tf.int64), cat_ids=tf.constant(ids)
    )
    np.testing.assert_allclose(out["probability"].numpy(), expected, rtol=1e-5, atol=1e-6)
    assert set(out["reject_reason"].numpy().tolist()) == {b""}
    bad = ids[:2].copy()
    bad[1, 5] = DEFAULT_TABLE_SIZES[2]  # C3's one id, past its table
    out = model.signatures["serve_multi_hot"](
        int_features=tf.constant(raw[:2], tf.int64), cat_ids=tf.constant(bad)
    )
    assert out["reject_reason"].numpy().tolist() == [b"", b"id_out_of_range"]
    assert out["probability"].numpy()[1] == -1.0


def test_a_multi_hot_dcn_model_warm_starts_with_its_cross_layers(tmp_path):
    """The daily job with DLRMv2's model: day 2 (a grown multi-hot table) starts from day 1's
    model, cross layers and optimizer state included; a day of one-hot rows is refused."""
    from trainer.checkpoint import CheckpointError
    from trainer.loop import run
    from trainer_helpers import checkpoint_arrays

    grown = tuple(s + 100 if i == 9 else s for i, s in enumerate(DEFAULT_TABLE_SIZES))
    day1, day2 = tmp_path / "day1", tmp_path / "day2"
    write_planted_dataset(day1, ROWS, seed=1, signal_seed=3, multi_hot_sizes=DLRMV2_MULTI_HOT)
    write_planted_dataset(
        day2, ROWS, seed=2, signal_seed=3, table_sizes=grown, multi_hot_sizes=DLRMV2_MULTI_HOT
    )
    config = dict(optimizer="adagrad", learning_rate=0.05, **DCN)
    run(small_config(max_steps=4, **config), day1, tmp_path / "w")
    before = checkpoint_arrays(tmp_path / "w")
    # nothing to train: the previous model is saved for day 2 as it is, its tables grown
    summary = run(small_config(max_steps=0, init="previous", **config), day2, tmp_path / "w")
    assert summary["init"]["mode"] == "previous" and summary["init"]["grown_tables"] == {
        "C10": [DEFAULT_TABLE_SIZES[9], grown[9]]
    }
    after = checkpoint_arrays(tmp_path / "w")
    cross = [k for k in before if k.startswith("cross/")]
    assert len(cross) == 3 * 3 * 2  # down, up, bias and their Adagrad accumulators
    for key in cross:
        np.testing.assert_array_equal(after[key], before[key], err_msg=key)
    np.testing.assert_array_equal(after["table/9"][: DEFAULT_TABLE_SIZES[9]], before["table/9"])
    one_hot = tmp_path / "day3"
    write_planted_dataset(one_hot, ROWS, seed=3, signal_seed=3, table_sizes=grown)
    with pytest.raises(CheckpointError, match="multi_hot_sizes"):
        run(small_config(max_steps=4, init="previous", **config), one_hot, tmp_path / "w")


def test_raw_values_reach_the_multi_hot_rows_their_one_hot_ids_expand_to(tmp_path):
    """A multi-hot model served with each column's lookup table (one-hot id -> its row's k
    ids, the converter's materialization): a raw line scores as its expanded row does through
    serve_multi_hot, an unknown value as id 0's row, and serve_features agrees."""
    import tensorflow as tf

    from trainer.dims import model_dims
    from trainer.export import write_vocabularies
    from trainer.model import cross_sizes
    from trainer.serving import RawIds, ServingDLRM, ServingWeights

    sizes = [5] * NUM_CATEGORICAL
    k = [1 if j % 3 else 3 for j in range(NUM_CATEGORICAL)]
    write_stable_dictionaries(tmp_path / "dictionaries", tuple(sizes))
    vocabularies = write_vocabularies(tmp_path / "dictionaries", sizes, tmp_path / "vocab")
    dims = model_dims(small_config(**DCN))
    rng = np.random.default_rng(3)

    def normal(*shape):
        return rng.normal(0, 0.1, shape).astype(np.float32)

    top_in = dims.top_input(NUM_CATEGORICAL + 1)
    widths = ((NUM_INTEGER,) + dims.bottom_mlp, (top_in,) + dims.top_mlp)
    bottom, top = (
        {
            f"{name}/{i}/{part}": normal(*((a, b) if part == "kernel" else (b,)))
            for i, (a, b) in enumerate(zip(w[:-1], w[1:]))
            for part in ("kernel", "bias")
        }
        for name, w in zip(("bottom", "top"), widths)
    )
    cross = {
        name: normal(*shape) for name, shape in cross_sizes(top_in, dims.dcn_layers, dims.dcn_rank).items()
    }
    expansions = [None if kj == 1 else rng.integers(0, 5, (5, kj)).astype(np.int32) for kj in k]
    weights = ServingWeights(
        [normal(5, 16) for _ in sizes], bottom, top, [normal(5, 1) for _ in sizes], cross
    )
    model = ServingDLRM(dims, weights, -(2**63), RawIds(vocabularies), expansions)

    one_hot = rng.integers(0, 5, (6, NUM_CATEGORICAL))
    one_hot[0, 3] = 0  # a missing value (id 0 expands too)
    values = [[f"{c:02x}{i:06x}" if i else "" for c, i in enumerate(row)] for row in one_hot]
    values[1][0] = "fffffff"  # unknown: id 0
    one_hot[1, 0] = 0
    ints = rng.integers(0, 100, (6, NUM_INTEGER))
    lines = ["\t".join(["1", *map(str, r), *v]) for r, v in zip(ints, values)]
    expanded = np.concatenate(
        [one_hot[:, [j]] if e is None else e[one_hot[:, j]] for j, e in enumerate(expansions)], axis=1
    )
    by_ids = model.serve_multi_hot(tf.constant(ints, tf.int64), tf.constant(expanded, tf.int64))
    by_line = model.serve_lines(tf.constant(lines), tf.constant([True] * 6))
    by_features = model.serve_features(tf.constant(ints, tf.int64), tf.constant(values))
    probability = by_ids["probability"].numpy()
    assert np.all((probability > 0.01) & (probability < 0.99)) and np.ptp(probability) > 1e-3
    np.testing.assert_allclose(by_line["probability"].numpy(), probability, rtol=1e-6)
    np.testing.assert_array_equal(by_line["probability"].numpy(), by_features["probability"].numpy())
    # the expansion matters: the one-hot reading of the same ids scores otherwise
    plain = np.concatenate(
        [one_hot[:, [j]].repeat(kj, axis=1) * (np.arange(kj) == 0) for j, kj in enumerate(k)], axis=1
    )
    other = model.serve_multi_hot(tf.constant(ints, tf.int64), tf.constant(plain, tf.int64))
    assert np.abs(other["probability"].numpy() - by_ids["probability"].numpy()).max() > 1e-4


def test_dot_runs_record_their_settings_as_before_the_dcn_settings_existed():
    """A dot run's recorded settings (checkpoints, the train stage's key) are what they were,
    so upgrading leaves its checkpoints and finished stage valid; the cross layers' shape is
    no setting of a dot model; switching the interaction is one change, named."""
    from dlrm_contracts.config import (
        DCN_SETTINGS,
        TRAIN_SETTING_KINDS,
        changed_settings,
        train_model_settings,
    )

    dot = train_model_settings(small_config())
    assert set(dot) == {k for k, kind in TRAIN_SETTING_KINDS.items() if kind == "model"} - set(DCN_SETTINGS)
    assert train_model_settings(small_config(dcn_rank=64)) == dot
    dcn = train_model_settings(small_config(**DCN))
    assert changed_settings(dot, dcn) == ["train.dcn_rank 512 -> 6", "train.interaction 'dot' -> 'dcn'"]
    assert changed_settings(train_model_settings(small_config(interaction="dcn")), dot) == [
        "train.interaction 'dcn' -> 'dot'"
    ]
