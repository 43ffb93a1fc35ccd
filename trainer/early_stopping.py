"""Keep the best model: track validation AUC through a run and say when to stop.

One more epoch than the data supports costs the model (a small dataset over-fits within a few
epochs), so a run with ``early_stopping_patience`` > 0 evaluates the validation split at every
evaluation point, saves a checkpoint whenever its AUC improves, and stops once it has not
improved for ``patience`` evaluations in a row. Changes within ``min_delta`` of the best AUC are
rounding, not learning (a flat stretch that two ranks read 0.76452, 0.76427, 0.76425 and one
process 0.7643, 0.7643, 0.7646): they neither reset nor spend the patience. The state travels in every checkpoint's
``meta.json``, so a resumed run continues the same count and a finished run that stopped
trains nothing more.

Every rank must take the same decision (a rank that stops while the others train would hang
their collectives), so the decision is taken from rank 0's AUC, broadcast to all ranks
(``trainer.comm.shared_auc``: the collective stays with the others, and this module, plain
state, imports no TensorFlow). What it tells the run (its progress lines, its fields of the
train summary) is said here too, from its own state: the training loop only says when to
validate, saves the best model and stops.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any


@dataclass
class EarlyStopping:
    patience: int  # 0 = off: every planned step is trained and the last model is the result
    min_delta: float = 0.0  # AUC changes smaller than this are neither gain nor loss
    best_step: int | None = None
    best_auc: float | None = None
    evals_since_best: int = 0
    stopped: bool = False

    @property
    def enabled(self) -> bool:
        return self.patience > 0

    def validates_at(self, step: int, total: int, eval_every: int) -> bool:
        """Whether the loop evaluates the validation split after ``step`` of ``total``: every
        ``eval_every`` steps. Without early stopping the end has its own evaluation; with it,
        the last step's model is one of the candidates too."""
        if self.enabled:
            return step % eval_every == 0 or step == total
        return step % eval_every == 0 and step < total

    def update(self, step: int, auc: float | None) -> bool:
        """Record the validation AUC at ``step``; True when it is the best so far (the caller
        keeps its checkpoint).

        Above the best by more than ``min_delta``: an improvement (the patience starts again).
        Above the best by less: the new best model, the patience count unchanged. Less than
        ``min_delta`` below the best: nothing changes. ``min_delta`` or more below (with 0: not
        above, as before min_delta existed), or undefined (None or NaN: a split with one
        class): one evaluation of the patience spent.
        """
        if auc is not None and not math.isnan(auc):
            best = self.best_auc
            if best is None or auc > best:
                if best is None or auc > best + self.min_delta:
                    self.evals_since_best = 0
                self.best_step, self.best_auc = step, float(auc)
                return True
            if auc > best - self.min_delta:
                return False
        self.evals_since_best += 1
        self.stopped = self.evals_since_best >= self.patience
        return False

    # -- what it tells the run's log and summary ------------------------------------------
    def stopped_before_line(self) -> str:
        """The progress line of a run whose checkpoint had already stopped: nothing to train."""
        return (
            f"trainer: stopped early before (best validation AUC {self.best_auc} at step "
            f"{self.best_step}): nothing to train"
        )

    def stopping_line(self, step: int) -> str:
        """The progress line of the evaluation at ``step`` that spent the patience."""
        return (
            f"trainer: validation AUC has not improved for {self.patience} evaluations: "
            f"stopping at step {step}, best {self.best_auc} at step {self.best_step}"
        )

    def restoring_line(self) -> str:
        """The progress line of a run that ends on its best model, an earlier step's."""
        return f"trainer: restoring the best model (validation AUC {self.best_auc} at step {self.best_step})"

    def summary_fields(self, last_step: int) -> dict[str, Any]:
        """The train summary's fields, none when early stopping is off: the step the run
        reached, whether it stopped early, and the best validation AUC (its model's)."""
        if not self.enabled:
            return {}
        return {"last_step": last_step, "stopped_early": self.stopped, "best_validation_auc": self.best_auc}

    def to_meta(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_meta(cls, patience: int, meta: dict[str, Any] | None, min_delta: float = 0.0) -> EarlyStopping:
        """The state a checkpoint saved, under this run's patience and min_delta (a resumed run
        with a larger patience may go on after an earlier stop)."""
        if not meta:
            return cls(patience, min_delta)
        state = cls(
            patience,
            min_delta,
            meta.get("best_step"),
            meta.get("best_auc"),
            int(meta.get("evals_since_best", 0)),
        )
        state.stopped = patience > 0 and state.evals_since_best >= patience
        return state
