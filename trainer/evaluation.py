"""Evaluation and the inference benchmark: a split's predictions in row order on every rank,
its AUC and log loss on rank 0, and the rate of the prediction step.

The Trainer owns the model and says which split to score and when; this module reads the split
in whole batches over the ranks (the last one padded, the padding dropped), so the same code
scores one process and N ranks, and it shapes the records the run logs and sums up.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from dlrm_contracts.config import ConfigError
from trainer.data import BinaryDataset, RankView, SplitReader, batch_starts, prefetch
from trainer.metrics import log_loss, roc_auc
from trainer.steps import batch_tensors

# (split, rows scored so far, rows of the split): the progress reporter's eval_rows
RowsHook = Callable[[str, int, int], None]


@dataclass
class EvalResult:
    split: str
    rows: int
    auc: float | None
    logloss: float | None


class Evaluator:
    """Scores splits with a prediction step that gathers every rank's probabilities and labels.

    Args:
        predict: (categorical, numerical, label) -> (probabilities, labels) of the global batch.
        view: this rank's view of a batch (the tables it looks up).
        dataset: the run's dataset.
        batch_size: the global evaluation batch.
        prefetch_batches: batches read ahead.
        rank: this rank; the metrics are computed on rank 0 only.
    """

    def __init__(
        self,
        predict: Callable,
        view: RankView,
        dataset: BinaryDataset,
        batch_size: int,
        prefetch_batches: int,
        rank: int,
    ):
        self.predict, self.view, self.dataset = predict, view, dataset
        self.batch_size, self.prefetch_batches, self.rank = batch_size, prefetch_batches, rank

    def predictions(
        self, split: str, dataset: BinaryDataset | None = None, on_rows: RowsHook | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """(labels, probabilities) of a whole split in row order (on every rank); ``dataset``
        reads it at other table sizes (ids past them as 0)."""
        reader = SplitReader(dataset or self.dataset, split)
        starts = batch_starts(reader.rows, self.batch_size, drop_remainder=False)
        labels, scores = [], []
        for batch in prefetch(
            reader, self.view, list(enumerate(starts.tolist())), self.batch_size, self.prefetch_batches
        ):
            probabilities, gathered = self.predict(*batch_tensors(batch))
            scores.append(probabilities.numpy()[: batch.valid])
            labels.append(gathered.numpy()[: batch.valid])
            if on_rows is not None:
                on_rows(split, sum(map(len, scores)), reader.rows)
        if not scores:
            return np.zeros(0, np.float32), np.zeros(0, np.float32)
        return np.concatenate(labels), np.concatenate(scores)

    def evaluate(
        self, split: str, dataset: BinaryDataset | None = None, on_rows: RowsHook | None = None
    ) -> EvalResult:
        """AUC and log loss of a split (rank 0's; None on the others, and for an empty split).
        A split with one class only has no AUC: None, never a number."""
        labels, scores = self.predictions(split, dataset, on_rows)
        if labels.size == 0 or self.rank != 0:
            return EvalResult(split, int(labels.size), None, None)
        auc = roc_auc(labels, scores)
        return EvalResult(split, int(labels.size), None if math.isnan(auc) else auc, log_loss(labels, scores))

    def inference_rate(self, steps: int) -> float:
        """Samples per second of the prediction step over ``steps`` batches of the test split
        (of train when test is smaller than a batch); the first batch, which traces and
        compiles the step, is not timed."""
        split = "test" if self.dataset.rows["test"] >= self.batch_size else "train"
        reader = SplitReader(self.dataset, split)
        starts = batch_starts(reader.rows, self.batch_size)
        if len(starts) == 0:
            raise ConfigError(f"the {split} split has fewer rows than one batch of {self.batch_size}")
        plan = [(i, int(starts[i % len(starts)])) for i in range(steps)]
        first = None
        for i, batch in enumerate(prefetch(reader, self.view, plan, self.batch_size, self.prefetch_batches)):
            probabilities, _ = self.predict(*batch_tensors(batch))
            probabilities.numpy()
            if i == 0:
                first = time.perf_counter()
        assert first is not None  # the plan holds at least one batch
        return (steps - 1) * self.batch_size / max(time.perf_counter() - first, 1e-9)


def as_served(dataset: BinaryDataset, table_sizes: Sequence[int]) -> BinaryDataset:
    """The dataset as a model with tables of ``table_sizes`` serves it: a value it has no row
    for reads as id 0, not as a fresh row (how a previous model is scored on a new day)."""
    return dataclasses.replace(
        dataset, table_sizes=tuple(min(a, b) for a, b in zip(table_sizes, dataset.table_sizes))
    )


def eval_record(result: EvalResult, step: int, model: str | None = None) -> dict[str, Any]:
    """The metrics log's record of an evaluation; ``model`` names a model other than the
    run's own (the previous model before a warm-started run trains)."""
    record = {
        "event": "eval",
        "split": result.split,
        "step": step,
        "rows": result.rows,
        "auc": result.auc,
        "logloss": result.logloss,
    }
    return {**record, "model": model} if model else record


def eval_line(result: EvalResult, step: int, model: str | None = None) -> str:
    """The progress line of an evaluation."""
    shown = "undefined (the split has one class only)" if result.auc is None else result.auc
    whose = f" ({model} model)" if model else ""
    return (
        f"eval {result.split}{whose} at step {step}: auc {shown} logloss {result.logloss} "
        f"({result.rows} rows)"
    )


def summary_record(
    head: dict[str, Any], evals: Iterable[EvalResult], extra: dict[str, Any]
) -> dict[str, Any]:
    """A mode's summary: ``head`` (mode, step, ranks...), each evaluation's AUC, log loss and
    rows under its split's name, then ``extra``."""
    record = dict(head)
    for result in evals:
        record[f"{result.split}_auc"] = result.auc
        record[f"{result.split}_logloss"] = result.logloss
        record[f"{result.split}_rows"] = result.rows
    record.update(extra)
    return record
