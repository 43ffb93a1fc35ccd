"""The checkpoint lifecycle on its own (trainer/checkpoint_lifecycle.py): save and retain,
restore the best or the latest with the run's state, set aside a damaged checkpoint (found on
this rank or another), refuse another model's run and set earlier runs aside.

Real files, real TensorFlow variables and a real optimizer, one process; the collectives across
ranks are exercised by the horovod tests through the Trainer."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tensorflow as tf

from dlrm_contracts.layout import CURRENT_RUN_JSON, WorkdirLayout
from trainer.checkpoint import CheckpointError, complete_checkpoints
from trainer.checkpoint_lifecycle import CheckpointedModel, CheckpointLifecycle, ModelState
from trainer.comm import LocalComm
from trainer.data import open_dataset
from trainer.early_stopping import EarlyStopping
from trainer.optim import make_optimizer
from trainer.placement import plan_placement
from trainer.run_state import RunState
from trainer.synthetic import write_planted_dataset
from trainer.train_days import DayPlan
from trainer.warm_start import StartPlan, WarmStart
from trainer_helpers import small_config

SIZES = (3, 5) + (2,) * 24
DIMS = {"embedding_dim": 4, "note": "the dims a checkpoint records"}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    path = tmp_path_factory.mktemp("lifecycle") / "binary"
    write_planted_dataset(path, {"train": 32, "test": 8, "validation": 8}, table_sizes=SIZES)
    return open_dataset(path)


class Rig:
    """One rank's lifecycle over two tables and an MLP kernel, Adam (slots and a counter)."""

    def __init__(self, dataset, workdir, comm=None, **settings):
        self.config = small_config(**{"optimizer": "adam", "keep_checkpoints": 1, **settings})
        self.owned = [(f"table/{t}/0-4", tf.Variable(np.zeros((SIZES[t], 4), np.float32))) for t in (0, 1)]
        self.replicated = [("top/0/kernel", tf.Variable(np.zeros((4, 1), np.float32)))]
        optimizer = make_optimizer(self.replicated + self.owned, self.config)
        self.state = ModelState(self.owned, self.replicated, optimizer, tf.Variable(1.0, trainable=False))
        self.run = RunState(EarlyStopping(2))
        self.lines: list[str] = []
        self.layout = WorkdirLayout.at(workdir)
        placement = plan_placement(dataset.table_sizes, 4, 1)
        self.lifecycle = CheckpointLifecycle(
            self.layout,
            comm or LocalComm(),
            self.config,
            dataset,
            CheckpointedModel(placement, DIMS, self.state),
            self.run,
            self.lines.append,
        )

    def save_at(self, step: int, value: float):
        """Every variable (and slot) set to ``value``, saved at ``step``."""
        for _, var in self.state.owned_state() + self.state.replicated_state():
            var.assign(tf.fill(var.shape, tf.cast(value, var.dtype)))
        self.run.step = step
        return self.lifecycle.save()

    def values(self) -> set[float]:
        return {
            float(np.unique(v.numpy())[0])
            for _, v in self.state.owned_state() + self.state.replicated_state()
        }


def truncate(path):
    data = (path / "rank-0.npz").read_bytes()
    (path / "rank-0.npz").write_bytes(data[: len(data) // 2])


def test_retention_keeps_the_newest_and_the_best_and_restores_bring_back_model_and_run(dataset, tmp_path):
    rig = Rig(dataset, tmp_path)
    rig.run.run_start = 1
    rig.run.early_stopping.update(2, 0.7)
    best = rig.save_at(2, 2.0)
    rig.save_at(4, 4.0)
    rig.save_at(6, 6.0)
    assert [step for step, _ in complete_checkpoints(rig.layout.checkpoints)] == [2, 6]
    meta = json.loads((rig.layout.checkpoints / "step-000000006" / "meta.json").read_text())
    assert meta["run_start_step"] == 1 and meta["early_stopping"]["best_step"] == 2
    assert (
        meta["run"]["id"]
        == rig.lifecycle.run_id
        == json.loads((rig.layout.checkpoints / CURRENT_RUN_JSON).read_text())["id"]
    )

    rig.save_at(8, 8.0)  # changes the variables; its retention drops step 6
    rig.run.step, rig.run.run_start, rig.run.early_stopping = 0, 0, EarlyStopping(2)
    assert rig.lifecycle.restore("best") == best
    assert rig.values() == {2.0} and (rig.run.step, rig.run.run_start) == (2, 1)
    assert rig.run.early_stopping.best_step == 2 and rig.run.early_stopping.best_auc == 0.7
    assert rig.lifecycle.restore("latest").name == "step-000000008" and rig.values() == {8.0}


def test_a_damaged_newest_checkpoint_is_set_aside_for_the_newest_intact_one(dataset, tmp_path):
    rig = Rig(dataset, tmp_path, keep_checkpoints=3)
    older = rig.save_at(2, 2.0)
    newest = rig.save_at(4, 4.0)
    truncate(newest)
    assert rig.lifecycle.restore("latest") == older
    assert rig.values() == {2.0} and rig.run.step == 2
    assert not newest.exists() and newest.with_name("damaged-step-000000004").is_dir()
    assert "rank-0.npz is unreadable" in rig.lines[-1] and "moved aside" in rig.lines[-1]


def test_with_no_intact_checkpoint_the_error_names_the_damage_and_says_train_again(dataset, tmp_path):
    rig = Rig(dataset, tmp_path)
    assert rig.lifecycle.restore("best") is None
    with pytest.raises(CheckpointError, match="no complete checkpoint under"):
        rig.lifecycle.restore("best", required=True)
    truncate(rig.save_at(2, 2.0))
    with pytest.raises(
        CheckpointError,
        match=r"rank-0.npz is unreadable .*, and no older "
        r"checkpoint of this run is intact: train again",
    ):
        rig.lifecycle.restore("best")


class OtherRankFails(LocalComm):
    """One process standing for a world where another rank cannot read the first candidate:
    the vote the lifecycle takes before any other collective counts that rank's failure."""

    def allreduce_sum(self, tensors, name):
        return [t + 1.0 for t in tensors] if name == "resume_check_0" else list(tensors)


def test_a_checkpoint_another_rank_cannot_read_is_set_aside_on_every_rank(dataset, tmp_path):
    rig = Rig(dataset, tmp_path, comm=OtherRankFails(), keep_checkpoints=3)
    older = rig.save_at(2, 2.0)
    newest = rig.save_at(4, 4.0)  # intact here: the other rank's copy is the damaged one
    assert rig.lifecycle.resume(newest) == older and rig.values() == {2.0}
    assert newest.with_name("damaged-step-000000004").is_dir()
    assert "(on another rank)" in rig.lines[-1]


def test_resume_refuses_another_models_run_and_a_new_run_sets_the_old_one_aside(dataset, tmp_path):
    first = Rig(dataset, tmp_path, learning_rate=0.5)
    newest = first.save_at(2, 2.0)
    other = Rig(dataset, tmp_path, learning_rate=0.1)
    with pytest.raises(CheckpointError, match="another model's run .*learning_rate"):
        other.lifecycle.resume(newest)
    other.lifecycle.start(StartPlan("scratch"))
    assert complete_checkpoints(other.layout.checkpoints) == []
    assert list(other.layout.superseded.glob("*/step-000000002"))
    assert other.lifecycle.run_id not in (None, first.lifecycle.run_id)
    assert "moved to" in other.lines[-1]


def test_run_state_round_trips_through_a_checkpoints_meta():
    run = RunState(
        EarlyStopping(3),
        step=12,
        run_start=8,
        days_seen_before=(0,),
        day_plan=DayPlan(((100, 200),), (0, 1), (0,), ""),
        covering_steps=2,
        warm_start=WarmStart("/w/step-8", 8, "continue", [3, 5], {"C1": [3, 4]}),
    )
    run.early_stopping.update(10, 0.75)
    meta = {**run.to_meta(), "step": 12}
    assert run.protected_steps() == [10, 8]  # the best, and the previous model
    back = RunState(EarlyStopping(5))
    back.continue_from(meta)
    assert (back.step, back.run_start, back.warm_start) == (12, 8, run.warm_start)
    assert back.days_seen_before == (0,)
    assert (back.early_stopping.patience, back.early_stopping.best_step) == (5, 10)
    back.start_from(WarmStart("/w/step-12", 12, "restart", [3, 5]), meta)
    assert (back.step, back.run_start, back.early_stopping.best_step) == (12, 12, None)
    assert back.days_seen_before == (0, 1)  # what the previous model had trained
