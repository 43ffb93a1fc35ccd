"""bench/bench_quality.py's paired comparison: the bootstrap of the AUC difference, and the
DLRM's test scores read back from the run's model (the best checkpoint, not the last)."""

from __future__ import annotations


import numpy as np
import pytest

from trainer.metrics import roc_auc
from trainer_helpers import SMALL_ROWS, config_flags, small_config

import bench_quality


def test_paired_difference_is_zero_for_the_same_model_and_sees_a_real_gap():
    rng = np.random.default_rng(3)
    labels = (rng.random(4000) < 0.3).astype(np.float32)
    good = labels + rng.normal(0, 0.8, labels.size)  # AUC ~0.8
    noise = rng.normal(0, 1, labels.size)  # AUC ~0.5

    same = bench_quality.paired_difference(labels, good, good, rounds=200)
    assert same["difference"] == 0 and same["ci95"] == [0.0, 0.0]
    assert same["share_below_zero"] == 0

    gap = bench_quality.paired_difference(labels, good, noise, rounds=200)
    assert gap["difference"] == pytest.approx(roc_auc(labels, good) - roc_auc(labels, noise))
    low, high = gap["ci95"]
    assert 0.2 < low < gap["difference"] < high  # a gap of ~0.3 AUC is not luck
    assert gap["share_below_zero"] == 0
    # Deterministic for a seed (the bench's figures can be rerun), another seed resamples.
    assert bench_quality.paired_difference(labels, good, noise, rounds=200) == gap
    assert bench_quality.paired_difference(labels, good, noise, rounds=200, seed=1) != gap


def test_dlrm_scores_are_the_best_checkpoints(small_dataset):
    """The bench reads the test scores back from the run's model: with early stopping that is
    the best validation AUC's checkpoint, not the last one, and its AUC is the summary's."""
    dataset = small_dataset
    config = small_config(
        optimizer="adam", learning_rate=0.01, epochs=20, early_stopping_patience=2, log_every=8
    )
    result = bench_quality.dlrm(dataset, config_flags(config), ranks=1, keep_scores=True)
    assert result["step"] < result["last_step"]  # Adam over-fitted: the best is not the last
    labels, scores = result["test_scores"]
    assert labels.size == scores.size == SMALL_ROWS["test"]
    assert roc_auc(labels, scores) == pytest.approx(result["test_auc"], abs=1e-6)
    with_labels = np.fromfile(dataset / "test" / "label.bin", "u1").astype(np.float32)
    assert np.array_equal(labels, with_labels)  # row order: the baseline's rows, paired
