"""bench/bench_reference_dlrm.py's converter: our split binary dataset as the int32 records
facebookresearch/dlrm's ``--mlperf-bin-loader`` reads (the reference itself is not run here:
it needs PyTorch, which this project does not install)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dlrm_contracts.binary_format import NUM_CATEGORICAL, NUM_NUMERICAL, DatasetError, cat_dtype
from spark_jobs.engines.arrow.tasks import log_numericals
from trainer.synthetic import write_planted_dataset

import bench_reference_dlrm as ref

ROWS = {"train": 300, "test": 200, "validation": 50}
SIZES = (5, 100, 200, 40000, 3) + (2,) * 20 + (70000,)  # int8, int16 and int32 id files


def pipeline_numericals(rng, n):
    """What preprocess writes: log(x + 3) of Criteo-like integers (-3..10^7, some missing)."""
    ints = np.concatenate([rng.integers(-3, 300, (n, 7)), rng.integers(0, 10**7, (n, 6))], axis=1)
    return log_numericals(ints, rng.random(ints.shape) < 0.2).astype(np.float16)


def test_log_values_map_back_to_the_integers_the_reference_logs():
    """The reference computes log(k + 1) itself: k = x + 2 exactly for the small integers, and
    log(k + 1) rounds back to the stored float16 everywhere, so it sees our inputs."""
    x = np.arange(-2, 259)
    stored = log_numericals(x, np.zeros(x.size, bool)).astype(np.float16)
    assert np.array_equal(ref.reference_ints(stored), x + 2)
    assert np.array_equal(
        ref.reference_ints(
            log_numericals(np.array([-3, -7, 5]), np.array([False, False, True])).astype(np.float16)
        ),
        [0, 0, 0],
    )

    large = pipeline_numericals(np.random.default_rng(0), 2000)
    again = np.log(ref.reference_ints(large).astype(np.float32) + 1).astype(np.float16)
    assert np.array_equal(again, large)

    with pytest.raises(DatasetError, match="below 0"):
        ref.reference_ints(np.array([0.5, -0.25], np.float16))
    with pytest.raises(DatasetError, match="int32"):
        ref.reference_ints(np.array([22.0], np.float16))  # exp(22) > 2^31


def test_records_are_our_rows_byte_for_byte(tmp_path):
    dataset = tmp_path / "binary"
    write_planted_dataset(dataset, ROWS, seed=4, table_sizes=SIZES)
    # The planted numericals are N(0, 1), which the pipeline never writes: give the splits the
    # pipeline's log values (same dtype and size, so the dataset stays well formed).
    rng = np.random.default_rng(1)
    for split, n in ROWS.items():
        pipeline_numericals(rng, n).tofile(dataset / split / "numerical.bin")
    workdir = tmp_path / "ref"
    conversion = ref.convert(dataset, workdir, train_rows=None, test_rows=150)
    assert conversion["rows"] == {"train": 300, "test": 150}

    for split, n in (("train", 300), ("test", 150)):
        records = np.fromfile(workdir / "input" / f"processed_{split}.bin", "<i4")
        assert records.size == n * (1 + NUM_NUMERICAL + NUM_CATEGORICAL)
        records = records.reshape(n, -1)
        label = np.fromfile(dataset / split / "label.bin", "u1")[:n]
        assert np.array_equal(records[:, 0], label)
        numerical = np.fromfile(dataset / split / "numerical.bin", "<f2").reshape(-1, 13)[:n]
        assert np.array_equal(records[:, 1:14], np.rint(np.exp(numerical.astype(np.float64))) - 1)
        for i, size in enumerate(SIZES):
            ids = np.fromfile(dataset / split / f"cat_{i}.bin", cat_dtype(size))[:n]
            assert np.array_equal(records[:, 14 + i], ids)
            assert records[:, 14 + i].max() < size
    with np.load(workdir / "input" / "day_fea_count.npz") as counts:
        assert counts["counts"].tolist() == list(SIZES)


def test_reference_command_runs_its_recipe_once_over_the_epoch(tmp_path):
    command = ref.reference_command("py", Path("/dlrm"), tmp_path, "terabyte")
    assert command[:2] == ["py", "/dlrm/dlrm_s_pytorch.py"]
    assert "--arch-mlp-top=512-512-256-1" in command and "--nepochs=1" in command
    assert "--mlperf-bin-loader" in command
    # the loader opens <dir>/<stem>_train.bin and <raw-data-file>_fea_count.npz
    assert f"--processed-data-file={tmp_path / 'input' / 'processed.npz'}" in command
    assert f"--raw-data-file={tmp_path / 'input' / 'day'}" in command
    assert not any(flag.startswith("--max-ind-range") for flag in command)
    assert ref.AUC_LINE.findall("ap 0.06, auc 0.7812, best auc 0.7812, accuracy") == ["0.7812"]
