"""Where a train or eval run is, reported by rank 0 (dlrm_contracts.progress).

The loop calls the hooks below; everything about how the run is weighed lives here. The
stage's fraction counts work in trained samples, an evaluated row counting 1/eval_speedup of
one (the forward pass only), so the periodic and final evaluations are part of the ETA.
"""

from __future__ import annotations

from typing import Any

from dlrm_contracts.progress import Reporter, channel_sink


class NoProgress:
    """Ranks other than 0, and a Trainer used as a library, report nothing."""

    def start_training(self, *args: Any) -> None:
        pass

    def step(self, step: int) -> None:
        pass

    def loss(self, value: float) -> None:
        pass

    def eval_rows(self, split: str, done: int, total: int) -> None:
        pass

    def evaluated_split(self, split: str, step: int, auc: float | None) -> None:
        pass


class TrainProgress(NoProgress):
    """Rank 0's reporter: steps done of total, samples/s, the latest loss and AUCs."""

    def __init__(
        self, global_batch: int, split_rows: dict[str, int], eval_speedup: float, reporter: Reporter
    ):
        self.reporter = reporter
        self.batch = global_batch
        self.split_rows = split_rows
        self.eval_cost = 1.0 / max(eval_speedup, 1e-9)  # of a trained sample, per evaluated row
        self.first_step = self.total_steps = 0
        self.trained = 0.0  # sample-equivalents: steps done so far
        self.evaluated = 0.0  # sample-equivalents: evaluations finished so far
        self.metrics: dict[str, Any] = {}
        # eval mode evaluates test and validation once; train mode plans in start_training
        self.work_total = self.eval_cost * (split_rows.get("test", 0) + split_rows.get("validation", 0))

    def start_training(
        self, first_step: int, total_steps: int, eval_every: int, final_eval: bool, first_eval_rows: int = 0
    ) -> None:
        """Steps are the run's own (a warm-started run counts from its start);
        ``first_eval_rows``: rows evaluated before the first step (the previous model)."""
        self.first_step, self.total_steps = first_step, total_steps
        periodic = sum(1 for s in range(first_step + 1, total_steps) if s % eval_every == 0)
        finals = self.work_total if final_eval else 0.0
        self.work_total = (
            (total_steps - first_step) * self.batch
            + finals
            + self.eval_cost * periodic * self.split_rows.get("validation", 0)
            + self.eval_cost * first_eval_rows
        )
        # no fraction yet: the first step traces the step function, which the ETA leaves out
        self.reporter.report(
            phase="train", unit="steps", done=first_step, total=total_steps, rows_unit="samples", force=True
        )

    def _fraction(self, partial: float = 0.0) -> float | None:
        if self.work_total <= 0:
            return None
        return min(1.0, (self.trained + self.evaluated + partial) / self.work_total)

    def step(self, step: int) -> None:
        self.trained = float((step - self.first_step) * self.batch)
        self.reporter.report(
            phase="train",
            unit="steps",
            done=step,
            total=self.total_steps,
            rows=self.trained,
            rows_unit="samples",
            fraction=self._fraction(),
            metrics=self.metrics,
            force=step == self.total_steps,
        )

    def loss(self, value: float) -> None:
        self.metrics["loss"] = round(value, 5)
        self.reporter.report(metrics=self.metrics)

    def eval_rows(self, split: str, done: int, total: int) -> None:
        self.reporter.report(
            phase=f"eval {split}",
            unit="rows",
            done=done,
            total=total,
            rows=done,
            rows_unit="rows",
            fraction=self._fraction(self.eval_cost * done),
            metrics=self.metrics,
        )

    def evaluated_split(self, split: str, step: int, auc: float | None) -> None:
        self.evaluated += self.eval_cost * self.split_rows.get(split, 0)
        shown = "undefined (one class)" if auc is None else f"{auc:.5f}"
        self.metrics[f"{split} AUC"] = f"{shown} (step {step:,})"
        self.reporter.report(metrics=self.metrics, fraction=self._fraction(), force=True)


def make_progress(
    rank: int, mode: str, global_batch: int, split_rows: dict[str, int], eval_speedup: float
) -> NoProgress:
    """Rank 0 of a train or eval run reports to the pipeline's channel; anything else
    reports nothing (run alone, the trainer's own step lines on stderr say where it is)."""
    sink = channel_sink() if rank == 0 and mode in ("train", "eval") else None
    if sink is None:
        return NoProgress()
    return TrainProgress(global_batch, split_rows, eval_speedup, Reporter(mode, sink))
