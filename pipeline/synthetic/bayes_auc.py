"""The Bayes-optimal AUC, computed over every generated row in constant memory.

The best any model can do on the generated labels is to rank rows by their true click
probability, so the Bayes-optimal AUC is the ROC AUC of the planted probabilities against
the drawn labels. Probabilities are monotone in the logit, so rows are binned by logit into
``BINS`` equal bins over [LOGIT_MIN, LOGIT_MAX] (width ~4e-5; the rare logits outside go to
the end bins), counting clicks and non-clicks per bin. Pairs in different bins are ordered
exactly; a click/non-click pair in the same bin counts one half, as a tie would, and the
largest possible error from that is reported beside the AUC (it is ~1e-6 in practice).
Chunks contribute sparse counts, so the result does not depend on how rows were split up.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

LOGIT_MIN = -20.0
LOGIT_MAX = 20.0
BINS = 1 << 20


def logit_bins(logits: np.ndarray) -> np.ndarray:
    scaled = (logits - LOGIT_MIN) * (BINS / (LOGIT_MAX - LOGIT_MIN))
    return np.clip(scaled, 0, BINS - 1).astype(np.int64)


@dataclass
class SparseCounts:
    """One chunk's contribution: occupied bins and their click / non-click counts."""

    bins: np.ndarray
    clicks: np.ndarray
    non_clicks: np.ndarray

    @classmethod
    def of(cls, logits: np.ndarray, labels: np.ndarray) -> "SparseCounts":
        bins, inverse = np.unique(logit_bins(logits), return_inverse=True)
        clicks = np.bincount(inverse, weights=labels, minlength=bins.size).astype(np.int64)
        totals = np.bincount(inverse, minlength=bins.size).astype(np.int64)
        return cls(bins, clicks, totals - clicks)


class LogitHistogram:
    """Click / non-click counts per logit bin, accumulated over chunks."""

    def __init__(self) -> None:
        self.clicks = np.zeros(BINS, np.int64)
        self.non_clicks = np.zeros(BINS, np.int64)

    def add(self, counts: SparseCounts) -> None:
        self.clicks[counts.bins] += counts.clicks
        self.non_clicks[counts.bins] += counts.non_clicks

    def auc(self) -> tuple[float, float]:
        """(AUC, largest possible error from same-bin pairs); NaN if one class is absent."""
        positives = int(self.clicks.sum())
        negatives = int(self.non_clicks.sum())
        if positives == 0 or negatives == 0:
            return float("nan"), 0.0
        clicks = self.clicks.astype(np.float64)
        non_clicks = self.non_clicks.astype(np.float64)
        below = np.cumsum(non_clicks) - non_clicks  # non-clicks in lower bins
        pairs = float(positives) * float(negatives)
        same_bin = float(np.dot(clicks, non_clicks))
        auc = (float(np.dot(clicks, below)) + 0.5 * same_bin) / pairs
        return auc, 0.5 * same_bin / pairs
