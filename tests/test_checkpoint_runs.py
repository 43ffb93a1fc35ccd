"""Checkpoints belong to runs: retention, resume, eval and export use the current run's, and
checkpoints a run cannot continue are set aside, never deleted (another run's checkpoints
must not decide this run's resume, eval or export, and may be the only copy of its model).

Real files through the real save (one process: LocalComm); the trainer and the pipeline's
train stage are run for real in tests/test_train_stage_resume.py.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from dlrm_contracts.config import TrainConfig
from dlrm_contracts.layout import (
    CURRENT_RUN_JSON,
    best_checkpoint,
    checkpoint_dir,
    complete_checkpoints,
    latest_checkpoint,
)
from dlrm_contracts.superseded import set_aside, superseded_runs
from trainer.checkpoint import Retention, checkpoint_meta, save_checkpoint
from trainer.comm import LocalComm

STATE = {"table/0/0-4": np.ones((3, 4), np.float32)}


def _save(
    root: Path, step: int, run: str, keep: int = 2, run_start: int = 0, extra: dict | None = None
) -> Path:
    meta = {**checkpoint_meta(TrainConfig(), {}, [3], {}, {}, run_id=run), **(extra or {})}
    return save_checkpoint(
        root,
        step,
        LocalComm(),
        STATE,
        {"replicated/x": np.zeros(2)},
        meta,
        Retention(keep=keep, run_start=run_start),
    )


def _steps(root: Path) -> list[int]:
    return [step for step, _ in complete_checkpoints(root)]


def test_retention_keeps_the_new_runs_checkpoints_below_an_older_runs(tmp_path):
    for step in (100, 200):
        _save(tmp_path, step, "old")
    for step in (10, 20, 30):  # a run restarted at step 0 (--no-resume, init: scratch)
        _save(tmp_path, step, "new")
    # the new run keeps its newest two; the older run's higher steps are not its to remove
    assert _steps(tmp_path) == [20, 30, 100, 200]
    assert json.loads((tmp_path / CURRENT_RUN_JSON).read_text()) == {"id": "new"}
    assert latest_checkpoint(tmp_path) == checkpoint_dir(tmp_path, 30)
    assert best_checkpoint(tmp_path) == checkpoint_dir(tmp_path, 30)


def test_a_stray_high_step_checkpoint_captures_neither_resume_nor_eval(tmp_path):
    _save(tmp_path, 10, "mine")
    stray = checkpoint_dir(tmp_path, 999999999)
    shutil.copytree(checkpoint_dir(tmp_path, 10), stray)
    meta = json.loads((stray / "meta.json").read_text())
    meta["run"]["id"] = "elsewhere"
    (stray / "meta.json").write_text(json.dumps(meta))
    assert latest_checkpoint(tmp_path) == checkpoint_dir(tmp_path, 10)
    assert best_checkpoint(tmp_path) == checkpoint_dir(tmp_path, 10)
    _save(tmp_path, 20, "mine", keep=1)
    assert _steps(tmp_path) == [20, 999999999]
    assert best_checkpoint(tmp_path) == checkpoint_dir(tmp_path, 20)


def test_the_best_checkpoint_must_be_of_the_same_run(tmp_path):
    _save(tmp_path, 10, "old", keep=5)
    _save(tmp_path, 5, "new", keep=5, extra={"early_stopping": {"best_step": 10}})
    assert best_checkpoint(tmp_path) == checkpoint_dir(tmp_path, 5)


def test_a_warm_start_still_retires_the_history_below_it(tmp_path):
    for step in (10, 20, 30):
        _save(tmp_path, step, "day1", keep=5)
    _save(tmp_path, 40, "day2", keep=2, run_start=30)  # numbered on from day 1's model at 30
    # day 1's checkpoints below the start go, as they did by step count; the model it
    # started from (30) is not below it
    assert _steps(tmp_path) == [30, 40]


def test_checkpoints_without_a_run_keep_the_old_retention(tmp_path):
    for step in (1, 2, 3):
        save_checkpoint(tmp_path, step, LocalComm(), STATE, {}, {"table_sizes": [3]}, Retention(keep=2))
    assert _steps(tmp_path) == [2, 3]
    assert latest_checkpoint(tmp_path) == checkpoint_dir(tmp_path, 3)


def test_set_aside_moves_and_records_never_deletes(tmp_path):
    saved = [_save(tmp_path, step, "r1", keep=5) for step in (4, 8)]
    (tmp_path / ".step-000000012.tmp").mkdir()
    before = {p.name: sorted(f.name for f in p.iterdir()) for p in saved}
    record = set_aside(tmp_path, saved, "settings of the model changed", ["train.seed 1 -> 2"])
    folder = Path(record["path"])
    assert folder.parent == tmp_path / "superseded"
    assert {p.name: sorted(f.name for f in p.iterdir()) for p in folder.iterdir() if p.is_dir()} == before
    assert complete_checkpoints(tmp_path) == [] and latest_checkpoint(tmp_path) is None
    assert not (tmp_path / CURRENT_RUN_JSON).exists()  # its run went with it
    assert (folder / CURRENT_RUN_JSON).exists()
    why = json.loads((folder / "why.json").read_text())
    assert (
        why["changed"] == ["train.seed 1 -> 2"]
        and why["checkpoints"] == ["step-000000004", "step-000000008"]
        and why["bytes"] > 0
    )
    assert record["remove_with"] == f"rm -r {folder}"
    listed = superseded_runs(tmp_path)
    assert [r["path"] for r in listed] == [str(folder)] and listed[0]["bytes"] >= why["bytes"]
    assert not (tmp_path / ".step-000000012.tmp").exists()  # a partial save is no checkpoint
    assert set_aside(tmp_path, [], "nothing") is None


@pytest.mark.parametrize("kept", [1, 3])
def test_the_current_run_keeps_its_newest(tmp_path, kept):
    for step in range(1, 6):
        _save(tmp_path, step, "r", keep=kept)
    assert _steps(tmp_path) == list(range(6 - kept, 6))


# ---------------------------------------------------------------- the real trainer, one process
def test_a_no_resume_run_keeps_its_checkpoints_and_eval_uses_them(small_dataset, tmp_path):
    from trainer.loop import run
    from trainer_helpers import small_config

    workdir = tmp_path / "w"
    run(small_config(epochs=100, checkpoint_every=4, max_steps=8), small_dataset, workdir)
    assert _steps(workdir / "checkpoints") == [4, 8]
    # a new run from scratch below the older run's steps
    summary = run(small_config(epochs=100, max_steps=2, resume=False), small_dataset, workdir)
    assert summary["step"] == 2 and summary["init"]["mode"] == "scratch"
    assert _steps(workdir / "checkpoints") == [2]
    [aside] = superseded_runs(workdir / "checkpoints")  # the older run: moved, not deleted
    assert sorted(p.name for p in Path(aside["path"]).glob("step-*")) == ["step-000000004", "step-000000008"]
    assert run(small_config(), small_dataset, workdir, mode="eval")["step"] == 2
    # a stray copy at a huge step is not taken for the model
    shutil.copytree(
        Path(aside["path"]) / "step-000000008", checkpoint_dir(workdir / "checkpoints", 999999999)
    )
    assert best_checkpoint(workdir / "checkpoints") == checkpoint_dir(workdir / "checkpoints", 2)
    assert run(small_config(), small_dataset, workdir, mode="eval")["step"] == 2
    resumed = run(small_config(epochs=100, max_steps=5, log_every=3), small_dataset, workdir)
    assert resumed["init"]["mode"] == "resume" and resumed["steps_run"] == 3
    assert 999999999 in _steps(workdir / "checkpoints")  # another run's: kept, unused


def test_resuming_another_models_checkpoints_is_refused_in_one_line(small_dataset, tmp_path):
    from trainer.checkpoint import CheckpointError
    from trainer.loop import run
    from trainer_helpers import small_config

    workdir = tmp_path / "w"
    run(small_config(epochs=100, max_steps=3), small_dataset, workdir)
    with pytest.raises(CheckpointError, match=r"train\.learning_rate 0\.5 -> 0\.25.*--no-resume"):
        run(small_config(epochs=100, max_steps=6, learning_rate=0.25), small_dataset, workdir)
    assert _steps(workdir / "checkpoints") == [3]


def test_a_copy_under_another_steps_name_is_not_the_runs_newest(tmp_path):
    """A stray copy of the run's own checkpoint at a huge step (same run id): its meta.json
    still says which step it is, so it is not taken for the newest."""
    _save(tmp_path, 10, "mine")
    shutil.copytree(checkpoint_dir(tmp_path, 10), checkpoint_dir(tmp_path, 999999999))
    assert latest_checkpoint(tmp_path) == checkpoint_dir(tmp_path, 10)
    assert best_checkpoint(tmp_path) == checkpoint_dir(tmp_path, 10)


# On two ranks: test_trainer_horovod.py::test_two_ranks_restarted_with_no_resume_set_the_older_run_aside
