"""The preflight's figures as objects: the workdir's peak and the time's reckoning follow the
stage-by-stage rule, whatever sentences print them."""

import dataclasses
import os

import pytest

from dlrm_contracts.config import PipelineConfig
from dlrm_contracts.layout import WorkdirLayout
from pipeline.preflight_needs import disk_needs, time_needs

ROWS = 1_000_000


@pytest.fixture
def config(tmp_path, monkeypatch):
    monkeypatch.delenv("SPARK_LOCAL_DIRS", raising=False)
    base = PipelineConfig(workdir=str(tmp_path / "w"))
    spark = dataclasses.replace(base.spark, local_dir=str(tmp_path / "spark"))  # same filesystem
    return dataclasses.replace(base, spark=spark)


@pytest.mark.parametrize("keep_parquet", [True, False])
def test_the_workdir_peak_is_the_largest_sum_along_the_stages(config, keep_parquet):
    config = dataclasses.replace(
        config, preprocess=dataclasses.replace(config.preprocess, keep_parquet=keep_parquet)
    )
    p = config.preflight
    needs = disk_needs(
        config,
        WorkdirLayout.at(config.workdir),
        ROWS,
        raw_bytes=5_000,
        generated=True,
        sizes=None,
        state_factor=2,
    )
    raw, counts, parquet = 5_000, ROWS * p.counts_bytes_per_row, ROWS * p.parquet_bytes_per_row
    binary, shuffle = ROWS * p.binary_bytes_per_row_bound, ROWS * p.shuffle_bytes_per_row
    # the shuffle shares the workdir's filesystem: it counts while preprocess runs
    assert needs.shuffle_on_workdir and needs.shuffle == shuffle
    assert needs.peak == pytest.approx(max(raw + counts + parquet + shuffle, raw + counts + parquet + binary))
    assert [g.stage for g in needs.stages] == ["generate", "preprocess", "convert"]
    assert needs.checkpoints_unknown and not needs.tables_known
    assert needs.parquet_freed == (None if keep_parquet else pytest.approx(parquet))
    assert dataclasses.replace(needs, free=int(needs.peak)).workdir_short  # no headroom left
    assert not dataclasses.replace(needs, free=10 * int(needs.peak)).workdir_short


def test_training_time_follows_max_steps_or_the_epochs(config):
    # (no test rows: the evaluations, which follow their own rule below, add nothing here)
    by_epochs = time_needs(config, ROWS, test_rows=None)
    train = dataclasses.replace(config.train, max_steps=10)
    by_steps = time_needs(dataclasses.replace(config, train=train), ROWS, test_rows=None)
    assert by_epochs.epochs == config.train.epochs and by_steps.epochs is None
    seconds = {s.stage: s.seconds for s in by_epochs.stages}
    startup = config.preflight.trainer_startup_s
    ratio = (seconds["train"] - startup) / ({s.stage: s.seconds for s in by_steps.stages}["train"] - startup)
    samples = ROWS * config.train.epochs / (10 * config.train.batch_size)
    assert ratio == pytest.approx(samples)
    assert by_epochs.total == pytest.approx(sum(seconds.values()))


def test_the_train_stage_counts_its_evaluations_and_early_stoppings_likely_end(config):
    """Validation passes evals_per_epoch times an epoch and the closing test and validation
    evaluation, forward only; with early stopping the likely figure stops at
    preflight.early_stopping_epochs while the bound trains every epoch."""
    test_rows, p, t = ROWS // 4, config.preflight, config.train
    needs = time_needs(config, ROWS, test_rows=test_rows)
    train = {s.stage: s for s in needs.stages}["train"]
    passes = t.epochs * t.evals_per_epoch + 1  # and the last step's, with early stopping
    per_sample = (train.seconds - p.trainer_startup_s) / (
        (ROWS - test_rows) * t.epochs + (passes * test_rows / 2 + test_rows) / p.eval_speedup
    )
    passes = int(p.early_stopping_epochs * t.evals_per_epoch) + 1
    likely = p.trainer_startup_s + per_sample * (
        (ROWS - test_rows) * p.early_stopping_epochs + (passes * test_rows / 2 + test_rows) / p.eval_speedup
    )
    assert t.early_stopping_patience and p.early_stopping_epochs < t.epochs
    assert train.likely == pytest.approx(likely) and train.expected == train.likely
    assert needs.expected_total < needs.total
    patient = dataclasses.replace(config, train=dataclasses.replace(t, early_stopping_patience=0))
    assert {s.stage: s for s in time_needs(patient, ROWS, test_rows).stages}["train"].likely is None


def test_a_slower_machine_or_a_loaded_one_takes_longer_in_proportion(config):
    """The calibration's ratios divide each stage's rate (and its start-up); other jobs' load
    leaves the run its share of the cores."""
    from pipeline.calibration import Speed
    from pipeline.preflight_needs import core_share

    base = {s.stage: s.seconds for s in time_needs(config, ROWS, ROWS // 4).stages}
    slow = time_needs(config, ROWS, ROWS // 4, speed=Speed(parse=0.5, train=0.25, convert=0.1))
    assert {s.stage: s.seconds for s in slow.stages} == pytest.approx(
        {"preprocess": base["preprocess"] * 2, "convert": base["convert"] * 10, "train": base["train"] * 4}
    )
    loaded = time_needs(config, ROWS, ROWS // 4, load=6.0)
    cores = os.cpu_count() or 1
    threads = {
        "preprocess": 2,
        "convert": min(cores, config.convert.workers),
        "train": cores * config.preflight.train_threads_per_core,
    }  # local[2]
    shares = {stage: core_share(n, 6.0) for stage, n in threads.items()}
    assert all(0 < share < 1 for share in shares.values())
    assert loaded.share == min(shares.values())
    assert {s.stage: s.seconds for s in loaded.stages} == pytest.approx(
        {k: v / shares[k] for k, v in base.items()}
    )
    ignored = dataclasses.replace(config, preflight=dataclasses.replace(config.preflight, account_load=False))
    assert time_needs(ignored, ROWS, ROWS // 4, load=6.0).share == 1.0


def test_the_arrow_engines_partial_files_count_while_preprocess_runs(config):
    """The count phase's partial files sit on the workdir before the transform's shuffle: the
    larger of the two counts in the peak, and the SQL engine writes none."""
    preflight = dataclasses.replace(
        config.preflight, partial_bytes_per_row=3 * config.preflight.shuffle_bytes_per_row
    )
    arrow = dataclasses.replace(config, preflight=preflight)
    sql = dataclasses.replace(arrow, preprocess=dataclasses.replace(config.preprocess, engine="sql"))
    needs = {
        name: disk_needs(
            c, WorkdirLayout.at(c.workdir), ROWS, raw_bytes=5_000, generated=True, sizes=None, state_factor=2
        )
        for name, c in (("arrow", arrow), ("sql", sql))
    }
    assert needs["arrow"].partials == pytest.approx(ROWS * preflight.partial_bytes_per_row)
    assert needs["sql"].partials == 0
    growth = {n: {g.stage: g for g in needs[n].stages}["preprocess"] for n in needs}
    assert growth["arrow"].transient == pytest.approx(ROWS * preflight.partial_bytes_per_row)
    assert growth["sql"].transient == pytest.approx(ROWS * preflight.shuffle_bytes_per_row)
    assert needs["arrow"].peak - needs["sql"].peak == pytest.approx(
        ROWS * (preflight.partial_bytes_per_row - preflight.shuffle_bytes_per_row)
    )


def test_checkpoints_set_aside_are_counted_apart_and_said(config):
    """Earlier runs set aside (checkpoints/superseded) stay on disk: the preflight says what
    they hold and how to remove them, and never counts them as the checkpoints this run
    writes over."""
    from pipeline.preflight import Estimate, _say_disk

    layout = WorkdirLayout.at(config.workdir)
    (layout.checkpoints / "step-000000004").mkdir(parents=True)
    (layout.checkpoints / "step-000000004" / "rank-0.npz").write_bytes(b"x" * 1000)
    (layout.superseded / "20260101T000000Z" / "step-000000009").mkdir(parents=True)
    (layout.superseded / "20260101T000000Z" / "step-000000009" / "rank-0.npz").write_bytes(b"x" * 5000)
    needs = disk_needs(config, layout, ROWS, raw_bytes=5_000, generated=True, sizes=[10] * 26, state_factor=2)
    assert needs.superseded == 5000 and needs.existing["checkpoints"] == 1000
    est = Estimate()
    _say_disk(est, layout.root, needs)
    said = [line for line in est.lines if "set aside" in line]
    assert len(said) == 1 and "4.9 KiB" in said[0] and f"rm -r {layout.superseded}" in said[0]
