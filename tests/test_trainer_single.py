"""One-process training: resume (clean stop and SIGKILL), learning vs logistic regression,
XLA / mixed precision, the eval and inference-benchmark modes, and the CLI's input check."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time

import numpy as np
import pytest

from dlrm_contracts.errors import ExitCode
from trainer.checkpoint import complete_checkpoints
from trainer.loop import run
from trainer.metrics import read_metrics, roc_auc
from trainer.synthetic import write_planted_dataset
from trainer_helpers import (
    SMALL_ROWS,
    VENV_BIN,
    checkpoint_arrays,
    config_flags,
    small_config,
    step_losses,
    trainer_main,
    trainer_main_summary,
    write_histogram,
)


# Runs that several tests read (each test copies the workdir before it trains on in it).
@pytest.fixture(scope="module")
def plain_run(small_dataset, tmp_path_factory):
    """10 steps of the plain float32 graph: (its summary, its workdir)."""
    workdir = tmp_path_factory.mktemp("plain") / "w"
    return run(small_config(max_steps=10), small_dataset, workdir), workdir


@pytest.fixture(scope="module")
def two_steps(small_dataset, tmp_path_factory):
    """The workdir of a 2-step run (a checkpoint at step 2)."""
    workdir = tmp_path_factory.mktemp("two_steps") / "w"
    run(small_config(max_steps=2), small_dataset, workdir)
    return workdir


def test_stop_after_step_k_and_resume_gives_the_same_losses(small_dataset, tmp_path):
    # Adam (so optimizer state must be restored) over an epoch boundary (16 steps per epoch).
    config = dict(optimizer="adam", learning_rate=0.01, epochs=2)
    run(small_config(max_steps=22, **config), small_dataset, tmp_path / "whole")
    run(small_config(max_steps=7, **config), small_dataset, tmp_path / "resumed")
    summary = run(small_config(max_steps=22, **config), small_dataset, tmp_path / "resumed")
    assert summary["steps_run"] == 15 and summary["step"] == 22
    whole, resumed = step_losses(tmp_path / "whole"), step_losses(tmp_path / "resumed")
    assert sorted(resumed) == list(range(1, 23))
    np.testing.assert_allclose(
        [resumed[s] for s in range(8, 23)], [whole[s] for s in range(8, 23)], rtol=1e-6
    )
    final_whole, final_resumed = (
        checkpoint_arrays(tmp_path / "whole"),
        checkpoint_arrays(tmp_path / "resumed"),
    )
    for name, value in final_whole.items():
        np.testing.assert_allclose(final_resumed[name], value, rtol=1e-6, atol=1e-8, err_msg=name)


def test_killed_run_resumes_at_the_next_batch(small_dataset, tmp_path):
    config = small_config(epochs=100, checkpoint_every=4)
    workdir = tmp_path / "killed"
    args = ["--dataset", str(small_dataset), "--workdir", str(workdir), *config_flags(config)]
    proc = subprocess.Popen(
        [str(VENV_BIN / "python"), "-m", "trainer", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=os.getcwd(),
    )
    try:
        deadline = time.time() + 180
        while time.time() < deadline and len(complete_checkpoints(workdir / "checkpoints")) < 2:
            assert proc.poll() is None, "the run ended before it could be killed"
            time.sleep(0.2)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL
    k = complete_checkpoints(workdir / "checkpoints")[-1][0]
    assert k >= 8 and k % 4 == 0
    # The resume and the eval below are the trainer's command line run in this process (the
    # killed run had to be a process of its own).
    summary = trainer_main_summary(
        args[:4] + config_flags(small_config(epochs=100, checkpoint_every=4, max_steps=k + 6))
    )
    assert summary["steps_run"] == 6
    reference = run(small_config(epochs=100, max_steps=k + 6), small_dataset, tmp_path / "reference")
    got, want = step_losses(workdir), step_losses(tmp_path / "reference")
    np.testing.assert_allclose(
        [got[s] for s in range(k + 1, k + 7)], [want[s] for s in range(k + 1, k + 7)], rtol=1e-6
    )
    # Weights agree to float rounding, not bit for bit (thread scheduling orders the sums), and
    # one near-tied pair of the 1,000 test rows swapping order moves the AUC by ~5e-6.
    assert summary["test_auc"] == pytest.approx(reference["test_auc"], abs=1e-4)
    # The eval mode restores the latest checkpoint and reports the same AUC.
    evaluated = trainer_main_summary(args[:4] + ["--mode", "eval", *config_flags(small_config())])
    assert evaluated["mode"] == "eval" and evaluated["step"] == k + 6
    assert evaluated["test_auc"] == pytest.approx(summary["test_auc"], abs=1e-9)
    assert json.loads((workdir / "logs" / "summary_eval.json").read_text()) == evaluated


def logistic_regression_auc(train, valid, iterations=400, lr=0.5) -> float:
    """Numericals + one-hot ids of every column, full-batch gradient descent (with momentum)."""
    (x, cats, y), (vx, vcats, vy) = train, valid
    w, b = np.zeros(x.shape[1]), 0.0
    tables = [np.zeros(int(max(c.max(), vc.max())) + 1) for c, vc in zip(cats, vcats)]
    velocity = [np.zeros_like(t) for t in tables] + [np.zeros_like(w), 0.0]
    for _ in range(iterations):
        logit = x @ w + b + sum(t[c] for t, c in zip(tables, cats))
        residual = 1 / (1 + np.exp(-logit)) - y
        grads = [np.bincount(c, residual, len(t)) / len(y) for t, c in zip(tables, cats)]
        grads += [x.T @ residual / len(y), residual.mean()]
        params = tables + [w, b]
        for i, g in enumerate(grads):
            velocity[i] = 0.9 * velocity[i] + g
            params[i] = params[i] - lr * velocity[i]
        tables, w, b = params[:-2], params[-2], params[-1]
    vlogit = vx @ w + b + sum(t[c] for t, c in zip(tables, vcats))
    return roc_auc(vy, vlogit)


def read_split(path, split, n):
    x = np.fromfile(path / split / "numerical.bin", "<f2").reshape(n, 13).astype(np.float64)
    y = np.fromfile(path / split / "label.bin", "u1").astype(np.float64)
    info = json.loads((path / "dataset.json").read_text())
    cats = [
        np.fromfile(path / split / f"cat_{i}.bin", info["cat_dtypes"][i]).astype(np.int64) for i in range(26)
    ]
    return x, cats, y


def test_dlrm_learns_the_planted_interaction_better_than_logistic_regression(tmp_path):
    rows = {"train": 16384, "test": 2048, "validation": 4096}
    path = tmp_path / "binary"
    write_planted_dataset(path, rows, seed=5)
    summary = run(
        small_config(optimizer="adam", learning_rate=0.003, warmup_steps=10, epochs=2, log_every=50),
        path,
        tmp_path / "work",
    )
    baseline = logistic_regression_auc(
        read_split(path, "train", rows["train"]), read_split(path, "validation", rows["validation"])
    )
    assert baseline > 0.55  # the baseline does learn the main effects
    assert summary["validation_auc"] > 0.8
    assert summary["validation_auc"] > baseline + 0.05, (summary["validation_auc"], baseline)
    # Metrics: JSON lines with step, loss, lr, samples/s and the evaluations; TensorBoard events.
    records = read_metrics(tmp_path / "work" / "logs" / "metrics.jsonl")
    steps = [r for r in records if "loss" in r]
    assert [r["step"] for r in steps] == [50, 100, 128] and all(
        r["samples_per_s"] > 0 and r["lr"] == 0.003 for r in steps
    )
    evals = [r for r in records if r.get("event") == "eval"]
    assert [(r["split"], r["step"]) for r in evals] == [
        ("validation", 64),
        ("test", 128),
        ("validation", 128),
    ]
    assert list((tmp_path / "work" / "logs" / "tensorboard").glob("events.out.tfevents.*"))


def test_xla_matches_plain_graph_and_bfloat16_trains(small_dataset, plain_run, tmp_path):
    plain, plain_dir = plain_run
    xla = run(small_config(max_steps=10, xla=True), small_dataset, tmp_path / "xla")
    a, b = step_losses(plain_dir), step_losses(tmp_path / "xla")
    np.testing.assert_allclose([b[s] for s in a], list(a.values()), rtol=1e-4)
    assert xla["xla"] is True and plain["xla"] is False
    # Adam (lazy sparse updates) with --xla matches plain too, the wide term included
    run(
        small_config(max_steps=6, optimizer="adam", learning_rate=0.01, wide=True),
        small_dataset,
        tmp_path / "adam",
    )
    adam_xla = run(
        small_config(max_steps=6, optimizer="adam", learning_rate=0.01, wide=True, xla=True),
        small_dataset,
        tmp_path / "adam_xla",
    )
    a2, b2 = step_losses(tmp_path / "adam"), step_losses(tmp_path / "adam_xla")
    np.testing.assert_allclose([b2[s] for s in a2], list(a2.values()), rtol=1e-4)
    assert adam_xla["xla"] is True and len(a2) == 6
    amp = run(small_config(max_steps=10, amp=True), small_dataset, tmp_path / "amp")
    assert amp["compute_dtype"] in ("bfloat16", "float32")
    c = step_losses(tmp_path / "amp")
    assert np.all(np.isfinite(list(c.values())))
    np.testing.assert_allclose([c[s] for s in a], list(a.values()), atol=0.05)
    weights = checkpoint_arrays(tmp_path / "amp")
    assert all(v.dtype in (np.float32, np.int64) for v in weights.values())


def test_inference_benchmark_reports_a_rate(small_dataset, tmp_path):
    summary = run(
        small_config(inference_steps=5), small_dataset, tmp_path / "bench", mode="inference_benchmark"
    )
    assert summary["mode"] == "inference_benchmark" and summary["inference_samples_per_s"] > 0


def test_cli_refuses_an_incomplete_dataset_before_training(tmp_path):
    path = tmp_path / "binary"
    write_planted_dataset(path, {"train": 512, "test": 64, "validation": 64})
    (path / "_SUCCESS").unlink()
    # the command line's main in this process (trainer_main): its outcome, not its process
    code, _out, err = trainer_main(["--dataset", str(path), "--workdir", str(tmp_path / "w")])
    assert code == ExitCode.DATASET_INVALID
    assert "_SUCCESS" in err and "incomplete" in err
    assert not (tmp_path / "w" / "checkpoints").exists()


def test_reading_at_a_higher_threshold_trains_like_the_rethresholded_dataset(small_dataset, tmp_path):
    """--frequency-threshold on a dataset == converters.rethreshold, then training on that."""
    from converters.rethreshold import rethreshold
    from trainer.synthetic import DEFAULT_TABLE_SIZES
    from dlrm_contracts.schema import CAT_COLUMNS

    write_histogram(
        tmp_path / "counts",
        {c: {1: s - 1 - min(s - 1, 5), 9: min(s - 1, 5)} for c, s in zip(CAT_COLUMNS, DEFAULT_TABLE_SIZES)},
    )
    rethreshold(small_dataset, tmp_path / "counts", "9", tmp_path / "raised")
    clamped = run(
        small_config(max_steps=6, frequency_threshold="9", counts_dir=str(tmp_path / "counts")),
        small_dataset,
        tmp_path / "a",
    )
    raised = run(small_config(max_steps=6), tmp_path / "raised", tmp_path / "b")
    assert step_losses(tmp_path / "a") == step_losses(tmp_path / "b")
    assert clamped["test_auc"] == raised["test_auc"]
    config = json.loads((tmp_path / "a" / "logs" / "trainer_config.json").read_text())
    assert config["table_sizes"] == [min(s - 1, 5) + 1 for s in DEFAULT_TABLE_SIZES]


def test_float16_with_loss_scaling_trains_like_float32(small_dataset, plain_run, tmp_path, monkeypatch):
    """The GPU mixed-precision path (float16 + loss scale), forced on the CPU; the reference is
    the float32 run's first 6 steps (a step's batch and rate do not depend on max_steps)."""
    import tensorflow as tf

    import trainer.loop as loop

    reference, reference_dir = plain_run
    monkeypatch.setattr(loop, "compute_dtype", lambda config: tf.float16)
    half = run(small_config(max_steps=6), small_dataset, tmp_path / "fp16")
    assert half["compute_dtype"] == "float16" and reference["compute_dtype"] == "float32"
    b = step_losses(tmp_path / "fp16")
    a = {s: loss for s, loss in step_losses(reference_dir).items() if s <= 6}
    assert sorted(b) == sorted(a) == list(range(1, 7))
    np.testing.assert_allclose([b[s] for s in a], list(a.values()), atol=0.01)
    assert checkpoint_arrays(tmp_path / "fp16")["loss_scale"] == 2.0**15  # no overflow: kept


def test_a_split_with_one_class_gets_no_auc_and_an_empty_split_no_metrics(tmp_path):
    path = tmp_path / "binary"
    write_planted_dataset(path, {"train": 600, "test": 150, "validation": 0}, seed=5)
    np.zeros(150, np.uint8).tofile(path / "test" / "label.bin")  # all negatives
    summary = run(small_config(max_steps=2, eval_batch_size=4096), path, tmp_path / "w")
    assert summary["test_rows"] == 150 and summary["test_auc"] is None
    assert summary["test_logloss"] is not None and np.isfinite(summary["test_logloss"])
    assert summary["validation_rows"] == 0 and summary["validation_auc"] is None

    def strict(constant):
        raise ValueError(f"non-standard JSON constant {constant}")

    lines = (tmp_path / "w" / "logs" / "metrics.jsonl").read_text().splitlines()
    evals = [json.loads(line, parse_constant=strict) for line in lines if '"eval"' in line]
    assert [(e["split"], e["auc"]) for e in evals] == [("test", None)]


@pytest.mark.parametrize(
    "setting,message",
    [
        (dict(batch_size=0), "batch sizes must be at least 1"),
        (dict(eval_batch_size=-8), "batch sizes must be at least 1"),
        (dict(max_steps=-1), "max steps must be 0 or more"),
    ],
)
def test_impossible_settings_are_refused(small_dataset, tmp_path, setting, message):
    with pytest.raises(ValueError, match=message):
        run(small_config(**setting), small_dataset, tmp_path / "w")


def test_resuming_from_a_truncated_checkpoint_is_a_clear_error(small_dataset, two_steps, tmp_path):
    from trainer.checkpoint import CheckpointError, latest_checkpoint

    shutil.copytree(two_steps, tmp_path / "w")
    part = latest_checkpoint(tmp_path / "w" / "checkpoints") / "rank-0.npz"
    part.write_bytes(part.read_bytes()[:1000])
    with pytest.raises(CheckpointError, match="rank-0.npz is unreadable"):
        run(small_config(max_steps=4), small_dataset, tmp_path / "w")
    # the eval mode's command line (run in this process): its exit code and one line
    code, _, stderr = trainer_main(
        [
            "--dataset",
            str(small_dataset),
            "--workdir",
            str(tmp_path / "w"),
            "--mode",
            "eval",
            *config_flags(small_config()),
        ]
    )
    assert code == ExitCode.EVAL and "rank-0.npz is unreadable" in stderr
    assert "Traceback" not in stderr


def test_adam_over_fits_small_data_and_early_stopping_keeps_the_best_model(small_dataset, tmp_path):
    """Adam trains (the validation AUC rises well above chance within two epochs) and then
    over-fits 4,096 rows (it falls); early stopping ends the run after two evaluations without
    a better AUC, and the summary, the eval mode and a rerun all report the best model."""
    config = small_config(
        optimizer="adam",
        learning_rate=0.01,
        epochs=20,
        early_stopping_patience=2,
        keep_checkpoints=1,
        log_every=8,
    )
    workdir = tmp_path / "adam"
    summary = run(config, small_dataset, workdir)
    curve = summary["periodic_validation_auc"]
    steps_per_epoch = SMALL_ROWS["train"] // config.batch_size
    assert max(curve) > 0.8, curve  # it trains
    assert summary["stopped_early"] and summary["last_step"] < 20 * steps_per_epoch
    assert curve[-1] < max(curve) - 0.02 and len(curve) == summary["last_step"] // steps_per_epoch
    # The two evaluations after the best were no better: the run stopped at the second.
    best_index = curve.index(max(curve))
    assert len(curve) == best_index + 3
    assert summary["step"] == (best_index + 1) * steps_per_epoch < summary["last_step"]
    assert summary["best_validation_auc"] == max(curve)
    assert summary["validation_auc"] == pytest.approx(max(curve), abs=1e-12)  # restored exactly
    assert summary["checkpoint"].endswith(f"step-{summary['step']:09d}")
    # The best checkpoint outlives keep_checkpoints=1; the last one is where a resume starts.
    steps = [step for step, _ in complete_checkpoints(workdir / "checkpoints")]
    assert steps == [summary["step"], summary["last_step"]]
    evaluated = run(config, small_dataset, workdir, mode="eval")
    assert evaluated["step"] == summary["step"]
    assert evaluated["test_auc"] == pytest.approx(summary["test_auc"], abs=1e-12)
    # A rerun of the finished run trains nothing more and reports the same model.
    again = run(config, small_dataset, workdir)
    assert again["steps_run"] == 0 and again["step"] == summary["step"]
    assert again["test_auc"] == pytest.approx(summary["test_auc"], abs=1e-12)


def test_adagrad_trains_and_resumes_exactly(small_dataset, tmp_path):
    """Adagrad's accumulators are optimizer state: a run stopped at step 7 and resumed gives
    the losses and weights of an uninterrupted one (the wide weights and theirs included)."""
    config = dict(optimizer="adagrad", learning_rate=0.05, epochs=2, warmup_steps=0, wide=True)
    whole = run(small_config(max_steps=22, **config), small_dataset, tmp_path / "whole")
    run(small_config(max_steps=7, **config), small_dataset, tmp_path / "resumed")
    run(small_config(max_steps=22, **config), small_dataset, tmp_path / "resumed")
    losses, expected = step_losses(tmp_path / "resumed"), step_losses(tmp_path / "whole")
    np.testing.assert_allclose(
        [losses[s] for s in range(8, 23)], [expected[s] for s in range(8, 23)], rtol=1e-6
    )
    assert expected[22] < expected[1]
    weights = checkpoint_arrays(tmp_path / "resumed")
    assert any(name.endswith("/adagrad") for name in weights)
    assert weights["table/0"].shape[1] == 17 and np.abs(weights["table/0"][:, 16]).max() > 0
    for name, value in checkpoint_arrays(tmp_path / "whole").items():
        np.testing.assert_allclose(weights[name], value, rtol=1e-6, atol=1e-8, err_msg=name)
    assert whole["test_auc"] > 0.55  # 22 steps of batch 256 on a planted signal


def test_rank_0_reports_steps_loss_and_each_evaluations_auc_to_the_pipeline(
    small_dataset, tmp_path, monkeypatch
):
    from dlrm_contracts.progress import PROGRESS_FILE_ENV, Progress

    channel = tmp_path / "train.progress.jsonl"
    monkeypatch.setenv(PROGRESS_FILE_ENV, str(channel))
    # 16 steps an epoch, two epochs, a validation every 8 steps: 3 periodic evaluations + 2 final
    summary = run(small_config(epochs=2, evals_per_epoch=2), small_dataset, tmp_path / "w")
    records = [Progress.from_line(line) for line in channel.read_text().splitlines()]
    assert all(r is not None and r.stage == "train" for r in records)
    assert records[0].phase == "train" and records[0].fraction is None  # before the first step
    fractions = [r.fraction for r in records[1:]]
    assert fractions == sorted(fractions) and fractions[-1] == pytest.approx(1.0)
    steps = [r for r in records if r.phase == "train" and r.fraction is not None]
    assert steps[-1].done == 32 and steps[-1].total == 32 and steps[-1].rows == 32 * 256
    assert {r.phase for r in records} == {"train", "eval validation", "eval test"}
    last = records[-1].metrics
    assert last["loss"] == pytest.approx(summary["train_loss"], abs=1e-5)
    assert last["test AUC"] == f"{summary['test_auc']:.5f} (step 32)"
    assert last["validation AUC"] == f"{summary['validation_auc']:.5f} (step 32)"
    # the evaluations weigh in: the last training step is not the end of the stage
    assert steps[-1].fraction < 0.99


def test_a_damaged_newest_checkpoint_resumes_from_the_one_before(small_dataset, tmp_path):
    """A rank file of the newest checkpoint lost (a disk, a copy cut short) while an older one
    of the same run is intact: the run resumes from the older one, the damaged one is moved
    aside (kept, not deleted), and the run ends as an undamaged run would."""
    config = dict(checkpoint_every=4, keep_checkpoints=3)
    run(small_config(max_steps=12, **config), small_dataset, tmp_path / "whole")
    workdir = tmp_path / "w"
    run(small_config(max_steps=8, **config), small_dataset, workdir)
    root = workdir / "checkpoints"
    assert [s for s, _ in complete_checkpoints(root)] == [4, 8]
    (root / "step-000000008" / "rank-0.npz").unlink()
    summary = run(small_config(max_steps=12, **config), small_dataset, workdir)
    assert summary["steps_run"] == 8 and summary["step"] == 12
    assert (root / "damaged-step-000000008").is_dir()
    assert [s for s, _ in complete_checkpoints(root)] == [4, 8, 12]
    whole, resumed = step_losses(tmp_path / "whole"), step_losses(workdir)
    np.testing.assert_allclose(
        [resumed[s] for s in range(5, 13)], [whole[s] for s in range(5, 13)], rtol=1e-6
    )


def test_a_checkpoint_of_the_model_without_the_wide_term_is_not_resumed_with_it(
    small_dataset, two_steps, tmp_path
):
    """The wide weights are part of the model's shape: turning train.wide on or off over an
    existing run is refused by name, not resumed with weights missing or ignored."""
    from trainer.checkpoint import CheckpointError

    assert small_config(max_steps=2).wide is False  # the shared run's model has no wide term
    shutil.copytree(two_steps, tmp_path / "w")
    # named as the setting of the model that changed (the checkpoint records its run's)
    with pytest.raises(CheckpointError, match=r"train\.wide False -> True"):
        run(small_config(max_steps=4, wide=True), small_dataset, tmp_path / "w")
