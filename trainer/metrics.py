"""Exact evaluation metrics in numpy, and the JSON-lines metrics log.

The AUC is the exact Mann-Whitney statistic: the probability that a random positive scores above
a random negative, ties counting one half (average ranks), the same number as the area under the
ROC curve with tied scores joined by a straight segment.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np

from dlrm_contracts.atomic import open_append


def roc_auc(labels: np.ndarray, scores: np.ndarray) -> float:
    labels = np.asarray(labels).astype(bool).ravel()
    scores = np.asarray(scores, dtype=np.float64).ravel()
    positives = int(labels.sum())
    negatives = labels.size - positives
    if positives == 0 or negatives == 0:
        return float("nan")
    order = np.argsort(scores, kind="stable")
    sorted_scores = scores[order]
    # Average 1-based rank of every group of tied scores.
    starts = np.flatnonzero(np.r_[True, sorted_scores[1:] != sorted_scores[:-1]])
    ends = np.r_[starts[1:], scores.size]
    average_rank = (starts + ends + 1) / 2.0
    ranks = np.empty(scores.size, dtype=np.float64)
    ranks[order] = np.repeat(average_rank, ends - starts)
    rank_sum = ranks[labels].sum()
    return float((rank_sum - positives * (positives + 1) / 2.0) / (positives * negatives))


def log_loss(labels: np.ndarray, probabilities: np.ndarray, eps: float = 1e-7) -> float:
    p = np.clip(np.asarray(probabilities, dtype=np.float64), eps, 1 - eps)
    y = np.asarray(labels, dtype=np.float64)
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log1p(-p)))


class MetricsLog:
    """Appends one JSON object per line to ``DIR/logs/metrics.jsonl`` (rank 0 only)."""

    def __init__(self, path: Path | None):
        self.path = path
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, record: dict[str, Any]) -> None:
        if self.path is None:
            return
        record = {"time": round(time.time(), 3), **record}
        # Strict JSON: a NaN/inf (diverged loss, undefined AUC) is written as null, not NaN.
        record = {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in record.items()}
        with open_append(self.path) as fh:  # never through a link planted there
            fh.write(json.dumps(record, allow_nan=False) + "\n")


def read_metrics(path: Path) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]
