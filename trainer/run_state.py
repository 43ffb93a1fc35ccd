"""Where a run stands: its step, its first step, the warm start it began with, the days its
model had seen and the days it trains, and its early-stopping state.

The loop advances it, the checkpoints record it (``meta.json``) and a restore sets it back, so
the two read one object instead of each other's attributes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trainer.early_stopping import EarlyStopping
from trainer.train_days import TRAIN_DAYS_KEY, DayPlan, days_before, trained_days
from trainer.warm_start import RUN_START_KEY, WARM_START_KEY, WarmStart


@dataclass
class RunState:
    early_stopping: EarlyStopping
    step: int = 0
    # The run's first step: 0 from scratch, the previous model's step after a warm start.
    # Epochs, evaluations and max_steps count from it; the checkpoints' numbers go on.
    run_start: int = 0
    warm_start: WarmStart | None = None
    # The train days the starting model had seen (checkpoint meta "train_days"): () from
    # scratch, None when not recorded; the rows of this run follow (train.days).
    days_seen_before: tuple[int, ...] | None = ()
    day_plan: DayPlan | None = None
    covering_steps: int = 0  # steps after which the run's days count as trained

    def to_meta(self) -> dict[str, Any]:
        """The run's part of a checkpoint's meta.json at this step."""
        meta: dict[str, Any] = {RUN_START_KEY: self.run_start}
        if self.early_stopping.enabled:
            meta["early_stopping"] = self.early_stopping.to_meta()
        if self.day_plan is not None:
            covered = self.step - self.run_start >= self.covering_steps
            meta[TRAIN_DAYS_KEY] = self.day_plan.to_meta(covered)
        if self.warm_start is not None:
            meta[WARM_START_KEY] = self.warm_start.to_meta()
        return meta

    def start_record(self, kind: str) -> dict[str, Any]:
        """How the run started (``kind``: scratch, resume, previous), for the summary; a
        resumed warm start says both."""
        record: dict[str, Any] = {"mode": kind, "run_start_step": self.run_start}
        if self.warm_start is not None:
            record.update(self.warm_start.to_meta())
            record.pop("previous_model_test_auc")  # a summary field of its own
        return record

    def protected_steps(self) -> list[int]:
        """The checkpoints retention keeps beyond the newest: the best so far, and the previous
        model a warm start began from, which outlives keep_checkpoints while this run is not
        over (a rerun of this dataset, another setting or --force, starts from it again)."""
        steps = [self.early_stopping.best_step]
        if self.warm_start is not None:
            steps.append(self.warm_start.source_step)
        return [s for s in steps if s is not None]

    def continue_from(self, meta: dict[str, Any]) -> None:
        """Where the run of a restored checkpoint stood, under this run's early-stopping
        settings (a resumed run with a larger patience may go on after an earlier stop)."""
        self.step = int(meta["step"])
        self.run_start = int(meta.get(RUN_START_KEY, 0))
        self.warm_start = WarmStart.from_meta(meta.get(WARM_START_KEY))
        self.days_seen_before = days_before(meta) if TRAIN_DAYS_KEY in meta else None
        self.early_stopping = EarlyStopping.from_meta(
            self.early_stopping.patience, meta.get("early_stopping"), self.early_stopping.min_delta
        )

    def start_from(self, warm: WarmStart, meta: dict[str, Any]) -> None:
        """A new run from the previous model whose meta is ``meta``: it starts at that model's
        step, with the days it had seen and no early-stopping history."""
        self.step = self.run_start = warm.source_step
        self.warm_start = warm
        self.days_seen_before = trained_days(meta)
        self.early_stopping = EarlyStopping(self.early_stopping.patience, self.early_stopping.min_delta)
