"""Trainer building blocks against plain numpy: interaction, AUC, schedule, placement, loader."""

from __future__ import annotations

import numpy as np
import pytest

from dlrm_contracts.binary_format import DatasetError
from dlrm_contracts.schema import CAT_COLUMNS
from trainer.data import RankView, SplitReader, batch_starts, open_dataset, prefetch
from trainer.metrics import log_loss, roc_auc
from trainer.optim import learning_rate
from trainer.placement import BOTTOM, plan_placement
from trainer.synthetic import DEFAULT_TABLE_SIZES, write_planted_dataset
from trainer_helpers import pairwise_auc, small_config, write_histogram


# -- dot interaction ---------------------------------------------------------------------------
def numpy_interaction(features: np.ndarray) -> np.ndarray:
    b, f, _ = features.shape
    rows = []
    for sample in features:
        dots = [sample[i] @ sample[j] for i in range(f) for j in range(i)]
        rows.append(np.concatenate([sample[0], np.array(dots)]))
    return np.array(rows)


def test_dot_interaction_matches_numpy():
    import tensorflow as tf

    from trainer.model import dot_interaction

    features = np.random.default_rng(0).normal(size=(5, 27, 4)).astype(np.float32)
    got = dot_interaction(tf.constant(features)).numpy()
    assert got.shape == (5, 4 + 27 * 26 // 2)
    np.testing.assert_allclose(got, numpy_interaction(features.astype(np.float64)), rtol=1e-5, atol=1e-5)


# -- AUC and log loss --------------------------------------------------------------------------
@pytest.mark.parametrize("levels", [None, 5, 2])
def test_auc_equals_pairwise_definition_with_ties(levels):
    rng = np.random.default_rng(levels or 1)
    labels = (rng.random(600) < 0.3).astype(int)
    scores = rng.random(600) + 0.3 * labels
    if levels:  # heavy ties, also across the classes
        scores = np.round(scores * levels) / levels
    assert roc_auc(labels, scores) == pytest.approx(pairwise_auc(labels, scores), abs=1e-12)


def test_auc_edge_values():
    assert roc_auc([0, 0, 1, 1], [0.1, 0.2, 0.3, 0.4]) == 1.0
    assert roc_auc([1, 1, 0, 0], [0.1, 0.2, 0.3, 0.4]) == 0.0
    assert roc_auc([0, 1, 0, 1], [0.5, 0.5, 0.5, 0.5]) == 0.5
    assert np.isnan(roc_auc([1, 1], [0.2, 0.3]))
    assert log_loss([1, 0], [0.5, 0.5]) == pytest.approx(np.log(2))


# -- schedule ----------------------------------------------------------------------------------
def test_learning_rate_warmup_constant_and_polynomial_decay():
    config = small_config(learning_rate=2.0, warmup_steps=4, decay_start_step=10, decay_steps=5)
    lrs = [learning_rate(s, config) for s in range(17)]
    np.testing.assert_allclose(lrs[:4], [0.5, 1.0, 1.5, 2.0])
    assert lrs[4:10] == [2.0] * 6
    np.testing.assert_allclose(lrs[10:15], [2.0 * ((5 - k) / 5) ** 2 for k in range(5)])
    assert lrs[15:] == [0.0, 0.0]


def test_throughput_clock_leaves_out_the_first_step_and_restarts_its_window(monkeypatch):
    """The first step traces the step functions: a run rate that counted it would understate the
    steady rate. A report's rate covers the steps since the previous report. (The clock is
    advanced by hand: a loaded or slow machine must not change what is asserted.)"""
    import tensorflow as tf

    from trainer import step_report

    now = [1000.0]
    monkeypatch.setattr(step_report.time, "perf_counter", lambda: now[0])
    loss = tf.constant(0.5)
    clock = step_report.ThroughputClock(batch_size=100)
    now[0] += 1.5  # a slow first step
    clock.step_done(loss)
    assert clock.steps == 1 and clock.run_rate() is None  # nothing timed yet
    now[0] += 0.1
    clock.step_done(loss)
    # Counting the first step would give 200 samples / 1.6 s = 125 samples/s.
    assert clock.run_rate() == pytest.approx(1000.0)
    assert clock.window_rate() == pytest.approx(125.0)  # the first window holds both steps
    clock.restart_window()
    now[0] += 0.1
    clock.step_done(loss)
    assert clock.window_steps == 1 and clock.steps == 3
    assert clock.window_rate() == pytest.approx(1000.0)
    assert clock.run_rate() == pytest.approx(2 * 100 / 0.2)


# -- placement ---------------------------------------------------------------------------------
def test_placement_balances_and_covers_every_table_once():
    sizes = list(DEFAULT_TABLE_SIZES)
    plan = plan_placement(sizes, 16, 2)
    owned = [p.table for rank in plan.pieces for p in rank]
    assert sorted(owned) == list(range(26))
    loads = [sum(p.rows for p in rank) for rank in plan.pieces]
    # Greedy: the lighter rank is at most one (largest remaining) table lighter.
    assert abs(loads[0] - loads[1]) <= max(sizes)


def test_column_split_by_threshold_and_forced():
    sizes = [10] * 26
    sizes[6] = 1_000_000
    plan = plan_placement(sizes, 16, 2, split_threshold_bytes=1_000_000 * 16 * 4 - 1, force_split=["C2"])
    for table in (6, 1):
        slices = sorted(
            (p.col_start, p.col_end, r)
            for r, rank in enumerate(plan.pieces)
            for p in rank
            if p.table == table
        )
        assert slices == [(0, 8, 0), (8, 16, 1)]
    assert plan_placement(sizes, 16, 1, force_split=["C2"]).pieces[0][1].width == 16


@pytest.mark.parametrize("bottom_dp", [True, False])
def test_feature_columns_reorder_exchange_layout(bottom_dp):
    dim, world = 4, 3
    plan = plan_placement(
        [5 + t for t in range(26)], dim, world, bottom_data_parallel=bottom_dp, force_split=["C1", "C9"]
    )
    # Build the rank-order layout with labels (table, column), then apply the permutation.
    layout = []
    for rank in range(world):
        if plan.bottom_owner == rank:
            layout += [(BOTTOM, c) for c in range(dim)]
        layout += [(p.table, c) for p in plan.pieces[rank] for c in range(p.col_start, p.col_end)]
    reordered = [layout[i] for i in plan.feature_columns()]
    tables = ([] if bottom_dp else [BOTTOM]) + list(range(26))
    assert reordered == [(t, c) for t in tables for c in range(dim)]


# -- loader ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    path = tmp_path_factory.mktemp("loader") / "binary"
    write_planted_dataset(path, {"train": 1000, "test": 300, "validation": 0}, seed=3)
    return path


def raw(path, split, name, dtype, width=1):
    data = np.fromfile(path / split / name, dtype=dtype)
    return data.reshape(-1, width) if width > 1 else data


def test_each_rank_reads_exactly_its_slice(dataset):
    ds = open_dataset(dataset)
    reader = SplitReader(ds, "train")
    numerical = raw(dataset, "train", "numerical.bin", "<f2", 13).astype(np.float32)
    labels = raw(dataset, "train", "label.bin", "u1").astype(np.float32)
    cat6 = raw(dataset, "train", "cat_6.bin", "<i4")  # 40000 rows: int32 file
    cat1 = raw(dataset, "train", "cat_1.bin", "<i1")
    start, batch = 200, 100
    for rank, mode in ((0, "local"), (1, "global"), (3, "none")):
        view = RankView(4, rank, (1, 6), mode)
        got = reader.read(view, step=9, start=start, global_batch=batch)
        lo = start + rank * 25
        np.testing.assert_array_equal(got.label, labels[lo : lo + 25])
        want = {
            "local": numerical[lo : lo + 25],
            "global": numerical[start : start + batch],
            "none": np.zeros((0, 13), np.float32),
        }[mode]
        np.testing.assert_array_equal(got.numerical, want)
        assert got.categorical[0].dtype == np.int32 and got.numerical.dtype == np.float32
        np.testing.assert_array_equal(got.categorical[0], cat1[start : start + batch])
        np.testing.assert_array_equal(got.categorical[1], cat6[start : start + batch])
        assert got.valid == batch and got.step == 9


def test_last_batch_is_zero_padded_and_counted(dataset):
    reader = SplitReader(open_dataset(dataset), "test")
    starts = batch_starts(300, 128, drop_remainder=False)
    assert starts.tolist() == [0, 128, 256]
    batches = list(prefetch(reader, RankView(2, 1, (0,), "local"), list(enumerate(starts)), 128))
    assert [b.valid for b in batches] == [128, 128, 44]
    # Rank 1 of the last batch holds rows 320..383: all padding. Rank 0 holds 256..299 + padding.
    assert not batches[2].label.any() and not batches[2].categorical[0][44:].any()
    rank0 = reader.read(RankView(2, 0, (0,), "local"), 2, 256, 128)
    labels = raw(dataset, "test", "label.bin", "u1")
    np.testing.assert_array_equal(rank0.label[:44], labels[256:300])
    assert not rank0.label[44:].any()


def test_batch_order_is_a_function_of_seed_and_epoch():
    a = batch_starts(10_000, 100, epoch=3, seed=5, shuffle=True)
    assert a.tolist() == batch_starts(10_000, 100, epoch=3, seed=5, shuffle=True).tolist()
    assert a.tolist() != batch_starts(10_000, 100, epoch=4, seed=5, shuffle=True).tolist()
    assert sorted(a.tolist()) == list(range(0, 10_000, 100))


def test_reading_at_a_higher_threshold_clamps_ids(dataset, tmp_path):
    # Histogram consistent with the written sizes at threshold 1: table size - 1 values each.
    hist = {
        c: {1: size - 1 - min(size - 1, 5), 9: min(size - 1, 5)}
        for c, size in zip(CAT_COLUMNS, DEFAULT_TABLE_SIZES)
    }
    write_histogram(tmp_path / "counts", hist)
    ds = open_dataset(dataset, threshold="9", counts_dir=tmp_path / "counts")
    assert ds.table_sizes == tuple(min(s - 1, 5) + 1 for s in DEFAULT_TABLE_SIZES)
    ids = SplitReader(ds, "train").read(RankView(1, 0, tuple(range(26)), "local"), 0, 0, 1000)
    for t, got in enumerate(ids.categorical):
        original = raw(dataset, "train", f"cat_{t}.bin", np.dtype(ds.cat_dtypes[t]))
        np.testing.assert_array_equal(got, np.where(original > ds.table_sizes[t] - 1, 0, original))
    assert (ids.categorical[6] == 0).mean() > 0.5  # the 40000-row table lost most ids
    # Counts of another dataset (sizes at the dataset's own threshold differ) are refused.
    write_histogram(tmp_path / "other", {c: {1: s + 10} for c, s in zip(CAT_COLUMNS, DEFAULT_TABLE_SIZES)})
    with pytest.raises(DatasetError, match="do not belong"):
        open_dataset(dataset, threshold="9", counts_dir=tmp_path / "other")


def test_a_threshold_below_the_written_one_is_refused(tmp_path):
    write_planted_dataset(
        tmp_path / "binary", {"train": 10, "test": 10, "validation": 10}, threshold_spec="9"
    )
    write_histogram(
        tmp_path / "counts", {c: {1: 3, 9: s - 1} for c, s in zip(CAT_COLUMNS, DEFAULT_TABLE_SIZES)}
    )
    assert (
        open_dataset(tmp_path / "binary", threshold="9", counts_dir=tmp_path / "counts").table_sizes
        == DEFAULT_TABLE_SIZES
    )
    with pytest.raises(DatasetError, match="below the dataset's base threshold"):
        open_dataset(tmp_path / "binary", threshold="2", counts_dir=tmp_path / "counts")


def test_dataset_is_checked_before_anything_is_read(tmp_path):
    path = tmp_path / "binary"
    write_planted_dataset(path, {"train": 100, "test": 10, "validation": 10})
    (path / "_SUCCESS").unlink()
    with pytest.raises(DatasetError, match="_SUCCESS"):
        open_dataset(path)
    (path / "_SUCCESS").write_text("")
    with open(path / "train" / "cat_3.bin", "ab") as fh:
        fh.write(b"\0")
    with pytest.raises(DatasetError, match="cat_3.bin"):
        open_dataset(path)


def test_cli_settings_come_from_yaml_then_flags(tmp_path):
    from trainer.cli import config_from_args, parser

    yaml_file = tmp_path / "c.yaml"
    yaml_file.write_text("train:\n  batch_size: 512\n  preset: default\n  learning_rate: 3.0\n")
    args = parser().parse_args(
        [
            "--dataset",
            "d",
            "--workdir",
            "w",
            "--config",
            str(yaml_file),
            "--learning-rate",
            "0.25",
            "--force-column-split",
            "C3, C20",
            "--bottom-mlp-data-parallel",
            "false",
            "--top-mlp",
            "64,1",
            "--no-resume",
            "--xla",
        ]
    )
    config = config_from_args(args)
    assert (config.batch_size, config.preset, config.learning_rate) == (512, "default", 0.25)
    assert config.force_column_split == ["C3", "C20"] and config.top_mlp == [64, 1]
    assert config.bottom_mlp_data_parallel is False and config.resume is False and config.xla
    assert config.amp is False  # untouched settings keep their defaults


def test_an_id_outside_its_table_is_a_clear_error_not_a_lookup_crash(tmp_path):
    # The quick dataset check (the default) reads no values: the loader itself refuses the id.
    path = tmp_path / "binary"
    write_planted_dataset(path, {"train": 300, "test": 10, "validation": 10})
    ids = np.fromfile(path / "train" / "cat_1.bin", dtype="<i1")  # C2: a table of 20
    ids[130] = 20
    ids.tofile(path / "train" / "cat_1.bin")
    reader = SplitReader(open_dataset(path), "train")
    view = RankView(1, 0, tuple(range(26)), "local")
    reader.read(view, 0, 0, 128)  # rows 0..127 are fine
    with pytest.raises(
        DatasetError,
        match=r"cat_1.bin: id 20 at row 130 is outside its table "
        r"of size 20",
    ):
        reader.read(view, 1, 128, 128)
    ids[130] = -1
    ids.tofile(path / "train" / "cat_1.bin")
    with pytest.raises(DatasetError, match="id -1 at row 130"):
        SplitReader(open_dataset(path), "train").read(view, 1, 128, 128)


def test_metrics_log_is_strict_json_when_a_value_is_nan_or_inf(tmp_path):
    import json

    from trainer.metrics import MetricsLog

    log = MetricsLog(tmp_path / "metrics.jsonl")
    log.write({"event": "eval", "auc": float("nan"), "logloss": 0.5})
    log.write({"step": 3, "loss": float("inf")})

    def strict(constant):
        raise ValueError(f"non-standard JSON constant {constant}")

    records = [
        json.loads(line, parse_constant=strict)
        for line in (tmp_path / "metrics.jsonl").read_text().splitlines()
    ]
    assert records[0]["auc"] is None and records[0]["logloss"] == 0.5
    assert records[1]["loss"] is None


def _checkpoint(root):
    import json

    path = root / "step-000000004"
    path.mkdir(parents=True)
    np.savez(path / "rank-0.npz", **{"table/0/0-4": np.ones((3, 4), np.float32)})
    np.savez(path / "replicated.npz", **{"bottom/0/kernel": np.ones((13, 4), np.float32)})
    (path / "meta.json").write_text(json.dumps({"step": 4, "table_sizes": [3], "dims": {}}))
    return path


@pytest.mark.parametrize(
    "damage,message",
    [
        ("truncate_npz", r"rank-0.npz is unreadable \(truncated or corrupt"),
        ("bad_meta", r"meta.json is unreadable"),
        ("no_step", r"meta.json has no integer 'step'"),
        ("flip_bytes", r"'bottom/0/kernel' is unreadable"),
    ],
)
def test_a_damaged_checkpoint_is_a_checkpoint_error(tmp_path, damage, message):
    import json

    from trainer.checkpoint import CheckpointError, CheckpointReader

    path = _checkpoint(tmp_path)
    reader = CheckpointReader(path)
    assert reader.value("table/0/0-4", (3, 4)).sum() == 12
    reader.close()
    if damage == "truncate_npz":
        data = (path / "rank-0.npz").read_bytes()
        (path / "rank-0.npz").write_bytes(data[: len(data) // 2])
    elif damage == "bad_meta":
        (path / "meta.json").write_text('{"step": ')
    elif damage == "no_step":
        (path / "meta.json").write_text(json.dumps({"table_sizes": [3]}))
    else:  # a flipped byte inside the stored array: the zip CRC no longer matches
        data = bytearray((path / "replicated.npz").read_bytes())
        data[200] ^= 0xFF
        (path / "replicated.npz").write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=message):
        reader = CheckpointReader(path)
        try:
            reader.value("bottom/0/kernel", (13, 4))
        finally:
            reader.close()


def test_a_save_removes_temporaries_left_by_a_run_killed_while_saving(tmp_path):
    from trainer.checkpoint import Retention, complete_checkpoints, save_checkpoint
    from trainer.comm import LocalComm

    stale = tmp_path / ".step-000000007.tmp"
    stale.mkdir()
    (stale / "rank-0.npz").write_bytes(b"half written")
    save_checkpoint(
        tmp_path,
        4,
        LocalComm(),
        {"table/0/0-4": np.ones((3, 4), np.float32)},
        {},
        {"table_sizes": [3]},
        Retention(keep=2),
    )
    assert [step for step, _ in complete_checkpoints(tmp_path)] == [4]
    assert not stale.exists()


# -- early stopping and the best checkpoint ----------------------------------------------------
def test_early_stopping_keeps_the_best_auc_and_stops_after_patience_evaluations():
    from trainer.early_stopping import EarlyStopping

    stopping = EarlyStopping(patience=2)
    assert stopping.update(10, 0.70) and stopping.update(20, 0.72)
    assert not stopping.update(30, 0.72)  # equal is no improvement
    assert not stopping.stopped and stopping.evals_since_best == 1
    assert stopping.update(40, 0.73) and stopping.evals_since_best == 0
    assert not stopping.update(50, float("nan"))  # one class only: never the best
    assert not stopping.update(60, None) and stopping.stopped
    assert (stopping.best_step, stopping.best_auc) == (40, 0.73)
    # The state a checkpoint carries: the same stop under the same patience; a larger patience
    # lets a resumed run go on from it.
    meta = stopping.to_meta()
    assert EarlyStopping.from_meta(2, meta) == stopping
    resumed = EarlyStopping.from_meta(5, meta)
    assert not resumed.stopped and (resumed.best_step, resumed.evals_since_best) == (40, 2)
    assert EarlyStopping.from_meta(2, None) == EarlyStopping(2)
    assert not EarlyStopping(0).enabled


def test_early_stopping_says_its_own_figures_and_shares_rank_0s_auc():
    """Its progress lines and train-summary fields, from its state (the horovod tests check two
    ranks stop together on the shared AUC)."""
    from trainer.comm import LocalComm, shared_auc
    from trainer.early_stopping import EarlyStopping

    stopping = EarlyStopping(patience=1)
    assert stopping.update(10, 0.7) and not stopping.update(20, 0.6) and stopping.stopped
    assert stopping.stopping_line(20) == (
        "trainer: validation AUC has not improved for 1 evaluations: stopping at step 20, best 0.7 at step 10"
    )
    assert stopping.restoring_line() == "trainer: restoring the best model (validation AUC 0.7 at step 10)"
    assert stopping.stopped_before_line() == (
        "trainer: stopped early before (best validation AUC 0.7 at step 10): nothing to train"
    )
    assert stopping.summary_fields(20) == {"last_step": 20, "stopped_early": True, "best_validation_auc": 0.7}
    assert EarlyStopping(0).summary_fields(20) == {}  # off: the summary has no such fields
    assert shared_auc(LocalComm(), 0.7) == 0.7 and np.isnan(shared_auc(LocalComm(), None))


def test_early_stopping_min_delta_lets_rounding_neither_reset_nor_spend_the_patience():
    from trainer.early_stopping import EarlyStopping

    # The embedded default's flat stretch as two ranks read it: without min_delta, the two
    # rounding-level drops spend the whole patience.
    flat = [(219, 0.76452), (292, 0.76427), (365, 0.76425), (438, 0.77069)]
    plain = EarlyStopping(patience=2)
    assert [plain.update(s, a) for s, a in flat[:3]] == [True, False, False] and plain.stopped

    stopping = EarlyStopping(patience=2, min_delta=0.001)
    assert [stopping.update(s, a) for s, a in flat] == [True, False, False, True]
    assert not stopping.stopped and stopping.evals_since_best == 0
    assert (stopping.best_step, stopping.best_auc) == (438, 0.77069)
    # Higher by less than min_delta: the kept model moves to it, the patience count does not.
    assert not stopping.update(500, 0.7690) and stopping.evals_since_best == 1
    assert stopping.update(600, 0.7712) and stopping.evals_since_best == 1
    assert stopping.best_step == 600
    # Lower by more than min_delta, or undefined: spent.
    assert not stopping.update(700, 0.7700) and stopping.stopped
    assert stopping.best_step == 600
    undefined = EarlyStopping(patience=1, min_delta=0.001)
    assert undefined.update(1, 0.7) and not undefined.update(2, float("nan")) and undefined.stopped
    # A resumed run takes its min_delta from its own configuration.
    assert EarlyStopping.from_meta(3, stopping.to_meta(), 0.0).min_delta == 0.0


def test_default_patience_outlasts_a_dip_before_the_best():
    """Seed 7202's 60k-row validation curve under the default rule (half-epoch evaluations):
    after 0.7660 it dips for three evaluations and then reaches 0.7679. A patience of 2 stops
    in the dip and keeps step 348; the default (3) reaches the later best and stops three
    evaluations after it."""
    from dlrm_contracts.config import TrainConfig
    from trainer.early_stopping import EarlyStopping

    curve = [
        0.6968,
        0.7317,
        0.7407,
        0.7516,
        0.7584,
        0.7571,
        0.7587,
        0.7605,
        0.764,
        0.7638,
        0.7628,
        0.766,
        0.7658,
        0.7642,
        0.7637,
        0.7679,
        0.7639,
        0.7646,
        0.7552,
    ]

    def replay(stopping):
        for k, auc in enumerate(curve, 1):
            stopping.update(29 * k, auc)
            if stopping.stopped:
                return stopping.best_step, 29 * k
        return stopping.best_step, None

    config = TrainConfig()
    assert replay(EarlyStopping(2, config.early_stopping_min_delta)) == (348, 435)
    assert replay(EarlyStopping(config.early_stopping_patience, config.early_stopping_min_delta)) == (
        464,
        551,
    )


def test_early_stopping_min_delta_is_checked_and_reaches_the_cli():
    from dlrm_contracts.config import ConfigError, TrainConfig
    from trainer.cli import config_from_args, parser

    assert TrainConfig().early_stopping_min_delta == 0.001
    for bad in (-0.001, 1.0):
        with pytest.raises(ConfigError, match="early_stopping_min_delta"):
            TrainConfig(early_stopping_min_delta=bad)
    args = parser().parse_args(["--dataset", "d", "--workdir", "w", "--early-stopping-min-delta", "0.002"])
    assert config_from_args(args).early_stopping_min_delta == 0.002


def _meta_only_checkpoint(root, step, meta):
    import json

    path = root / f"step-{step:09d}"
    path.mkdir(parents=True)
    (path / "meta.json").write_text(json.dumps({"step": step, **meta}))
    return path


def test_best_checkpoint_is_the_one_the_latest_names_else_the_latest(tmp_path):
    from dlrm_contracts.layout import best_checkpoint, latest_checkpoint

    assert best_checkpoint(tmp_path / "none") is None
    first = _meta_only_checkpoint(tmp_path, 10, {})
    assert best_checkpoint(tmp_path) == first  # no early stopping: the latest
    best = _meta_only_checkpoint(tmp_path, 20, {"early_stopping": {"best_step": 20}})
    last = _meta_only_checkpoint(tmp_path, 40, {"early_stopping": {"best_step": 20}})
    assert latest_checkpoint(tmp_path) == last and best_checkpoint(tmp_path) == best
    (tmp_path / ".step-000000050.tmp").mkdir()  # incomplete: never a candidate
    (best / "meta.json").unlink()  # the best was deleted by hand: the latest is left
    assert best_checkpoint(tmp_path) == last


def test_a_save_keeps_the_protected_best_beyond_the_newest(tmp_path):
    from trainer.checkpoint import Retention, complete_checkpoints, save_checkpoint
    from trainer.comm import LocalComm

    state = {"table/0/0-4": np.ones((3, 4), np.float32)}
    for step in (4, 8, 12, 16):
        save_checkpoint(
            tmp_path, step, LocalComm(), state, {}, {"table_sizes": [3]}, Retention(keep=1, protect=[8, None])
        )
    assert [step for step, _ in complete_checkpoints(tmp_path)] == [8, 16]


def test_the_wide_term_adds_each_ids_weight_to_the_deep_logit():
    """With train.wide the logit is the DLRM's logit plus, per sample, the sum of one weight
    per table at its id; the deep part is the model without the term (same seed, same
    variables), and the weights sit beside the tables in the checkpoint's column layout."""
    import tensorflow as tf

    from trainer.comm import make_comm
    from trainer.dims import ModelDims
    from trainer.model import DLRM, wide_key

    sizes = [5 + t for t in range(len(CAT_COLUMNS))]
    placement = plan_placement(sizes, 4, 1)
    deep_dims = ModelDims(4, (8, 4), (8, 1))
    wide_dims = ModelDims(4, (8, 4), (8, 1), wide=True)
    comm = make_comm()
    deep, wide = (DLRM(d, placement, 0, 32, 3, comm) for d in (deep_dims, wide_dims))
    names = [name for name, _ in wide.owned_variables()]
    assert [wide_key(t, 4) for t in range(len(sizes))] == [n for n in names if n.endswith("4-5")]
    rng = np.random.default_rng(0)
    weights = [rng.normal(size=(rows, 1)).astype(np.float32) for rows in sizes]
    for variable, value in zip(wide.wide, weights):
        variable.assign(value)
    ids = [rng.integers(0, rows, 32) for rows in sizes]
    categorical = [tf.constant(i) for i in ids]
    numerical = tf.constant(rng.normal(size=(32, 13)).astype(np.float32))
    expected = deep(categorical, numerical, 32).numpy() + sum(w[i, 0] for w, i in zip(weights, ids))
    np.testing.assert_allclose(wide(categorical, numerical, 32).numpy(), expected, rtol=1e-5, atol=1e-5)
    assert np.abs(sum(w[i, 0] for w, i in zip(weights, ids))).max() > 0.5  # the term counts
    assert wide_dims.meta()["wide"] is True and "wide" not in deep_dims.meta()
    assert ModelDims.from_meta(wide_dims.meta()) == wide_dims
    assert ModelDims.from_meta(deep_dims.meta()) == deep_dims


# -- row L2 ------------------------------------------------------------------------------------
def test_batch_presence_is_count_times_batch_over_rows_at_most_one():
    from trainer.row_l2 import batch_presence

    presence = batch_presence(np.array([0, 1, 4, 100]), global_batch=10, train_rows=200)
    np.testing.assert_allclose(presence, [0.05, 0.05, 0.2, 1.0])


@pytest.mark.parametrize("optimizer", ["adagrad", "sgd", "adam"])
def test_row_l2_pulls_only_the_looked_up_rows_toward_zero(optimizer):
    """The penalty adds l2 * scale * row to the summed gradient of each distinct row a step
    touches (a row looked up twice is penalised once); untouched rows stay as they were."""
    import tensorflow as tf

    from trainer.optim import RowL2, make_optimizer

    # accumulators from 1: Adagrad's first step follows the gradient's size, not its sign
    config = small_config(optimizer=optimizer, learning_rate=0.1, adagrad_initial_accumulator=1.0)
    start = np.arange(1, 13, dtype=np.float32).reshape(6, 2)
    scale = tf.constant([1, 1, 1, 1, 4, 1], tf.float32)
    grad = tf.IndexedSlices(
        tf.constant([[0.5, 0.5], [0.5, 0.5], [0.0, 1.0]]), tf.constant([1, 1, 4]), tf.constant([6, 2])
    )
    tables = {}
    for l2 in (0.0, 0.3):
        var = tf.Variable(start)
        penalties = {"table/0/0-2": RowL2(l2, scale)} if l2 else None
        make_optimizer([("table/0/0-2", var)], config, penalties).apply([grad], tf.constant(0.1))
        tables[l2] = var.numpy()
    for table in tables.values():
        np.testing.assert_array_equal(table[[0, 2, 3, 5]], start[[0, 2, 3, 5]])
    if optimizer == "sgd":  # plain arithmetic: row 1 summed once, row 4 with its scale of 4
        np.testing.assert_allclose(tables[0.3][1], start[1] - 0.1 * (1.0 + 0.3 * start[1]))
        np.testing.assert_allclose(tables[0.3][4], start[4] - 0.1 * (np.array([0, 1]) + 1.2 * start[4]))
    # with every optimizer the penalised rows end nearer zero than without the penalty (Adam's
    # first step is the gradient's sign: row 4's first value moves only through the penalty)
    penalised, plain = np.abs(tables[0.3][[1, 4]]), np.abs(tables[0.0][[1, 4]])
    assert (penalised <= plain + 1e-7).all() and (penalised < plain - 1e-4).any()
    if optimizer != "adam":
        assert (penalised < plain).all()


def test_row_l2_counts_train_ids_for_the_inverse_frequency_scale(tmp_path):
    """``inverse_frequency``: each table's and wide variable's penalty is scaled by 1 / the
    batch presence of the row's train count; tables get table_l2, wide weights wide_l2, each
    per train row (a strength on the summed loss)."""
    from trainer.comm import make_comm
    from trainer.dims import model_dims
    from trainer.model import DLRM
    from trainer.row_l2 import row_penalties

    write_planted_dataset(tmp_path / "d", {"train": 3000, "test": 100, "validation": 100}, seed=4)
    dataset = open_dataset(tmp_path / "d")
    config = small_config(wide=True, table_l2=3.0, wide_l2=60.0, row_l2_scaling="inverse_frequency")
    placement = plan_placement(dataset.table_sizes, model_dims(config).embedding_dim, 1)
    model = DLRM(model_dims(config), placement, 0, 64, 1, make_comm())
    penalties = row_penalties(config, model, dataset, 64)
    dim = model_dims(config).embedding_dim
    assert len(penalties) == 52
    assert penalties[f"table/3/0-{dim}"].strength == pytest.approx(3.0 / 3000)
    assert penalties[f"table/3/{dim}-{dim + 1}"].strength == pytest.approx(60.0 / 3000)
    ids = np.fromfile(tmp_path / "d" / "train" / "cat_3.bin", dataset.cat_dtypes[3])
    counts = np.bincount(ids, minlength=dataset.table_sizes[3])
    expected = 1.0 / np.minimum(np.maximum(counts, 1) * 64 / 3000, 1.0)
    np.testing.assert_allclose(penalties[f"table/3/0-{dim}"].scale.numpy(), expected, rtol=1e-6)
    assert expected.max() > expected.min()  # the planted data has rare and frequent ids
    none = row_penalties(
        small_config(wide=True, table_l2=3.0, wide_l2=0.0, row_l2_scaling="none"), model, dataset, 64
    )
    assert len(none) == 26 and all(p.scale is None for p in none.values())
    assert row_penalties(small_config(wide=True, wide_l2=0.0), model, dataset, 64) == {}


@pytest.mark.parametrize("optimizer", ["adagrad", "sgd", "adam"])
def test_a_rate_factor_scales_only_its_variables_step(optimizer):
    """``rate_factors`` (the wide weights' train.wide_learning_rate_factor) multiplies the
    named variable's step, sparse or dense; the other variables take the schedule's rate."""
    import tensorflow as tf

    from trainer.optim import make_optimizer

    config = small_config(optimizer=optimizer, learning_rate=0.1)
    grads = [
        tf.IndexedSlices(tf.constant([[0.5], [-0.25]]), tf.constant([0, 2]), tf.constant([3, 1])),
        tf.constant([0.5, -1.0]),
    ]
    moved = {}
    for factor in (1.0, 3.0):
        variables = [
            ("table/0/16-17", tf.Variable(tf.ones([3, 1]))),
            ("top/0/bias", tf.Variable(tf.ones([2]))),
        ]
        make_optimizer(variables, config, None, {"table/0/16-17": factor}).apply(grads, tf.constant(0.1))
        moved[factor] = [1.0 - v.numpy() for _, v in variables]
    np.testing.assert_allclose(moved[3.0][0], 3.0 * moved[1.0][0], rtol=1e-5)
    np.testing.assert_allclose(moved[3.0][1], moved[1.0][1], rtol=1e-6)
    assert np.abs(moved[1.0][0]).max() > 1e-3 and moved[1.0][0][1, 0] == 0.0


def test_bfloat16_is_not_chosen_when_onednn_is_capped_below_avx512(monkeypatch):
    """TensorFlow's bfloat16 matmul under ONEDNN_MAX_CPU_ISA=AVX2 dies with a segmentation
    fault (tried), so --amp with such a cap must train in float32, whatever the CPU has."""
    from pathlib import Path

    from trainer.loop import cpu_supports_bfloat16

    flags = Path("/proc/cpuinfo").read_text()
    has_bf16 = "avx512_bf16" in flags or "amx_bf16" in flags
    for cap in ("AVX2", "avx2", "SSE41", "AVX2_VNNI"):
        monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", cap)
        assert cpu_supports_bfloat16() is False, cap
    for cap in ("AVX512_CORE_BF16", "AVX512_CORE_AMX", "ALL", ""):
        monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", cap)
        assert cpu_supports_bfloat16() is has_bf16, cap
