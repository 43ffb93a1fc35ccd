"""Which sparse variables get a row L2 (``train.table_l2``, ``train.wide_l2``) and its per-row
factor.

A strength is that of ``1/2 * l2 * |row|^2`` added to the train split's summed log loss, as
a logistic regression's 1/C: the step's gradient, of the batch's mean loss, gets
``l2 / train_rows * row``. So a fixed setting is a prior worth a fixed number of rows, which
weighs less as the data grows (as the evidence of each id does), and a logistic regression's
C translates directly. The penalty is applied to the rows a step looks up (trainer/optim.py). Unscaled
(``row_l2_scaling: none``), a row is pulled toward 0 once per batch it appears in: the prior
grows with the row's frequency, as its data does, so the rare rows are held no more than the
frequent ones relative to their evidence. ``inverse_frequency`` divides the pull by the chance
that a batch holds the row (its train count x batch / train rows, at most 1): over an epoch
every row then gets the same total pull, the L2 prior a logistic regression puts on every
weight, while a step still reads only the rows it touched. The counts come from the train
split's ids of the tables this rank owns (one pass over their files at start-up).
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from dlrm_contracts.config import TrainConfig
from trainer.data import BinaryDataset, SplitReader
from trainer.model import DLRM
from trainer.optim import RowL2


def batch_presence(counts: np.ndarray, global_batch: int, train_rows: int) -> np.ndarray:
    """Chance that a batch holds a row seen ``counts`` times in ``train_rows`` (at most 1; a
    row never seen in train is never looked up, so it gets the rarest row's chance)."""
    share = np.maximum(counts, 1).astype(np.float64) * global_batch / max(train_rows, 1)
    return np.minimum(share, 1.0)


def inverse_frequency(
    dataset: BinaryDataset, table: int, rows: int, global_batch: int, counts_chunk: int = 1 << 22
) -> tf.Tensor:
    """[rows] float32: 1 / the batch presence of each row of ``table`` in the train split."""
    reader = SplitReader(dataset, "train")
    counts = np.zeros(rows, np.int64)
    for start in range(0, reader.rows, counts_chunk):
        ids = reader.categorical(table, start, min(counts_chunk, reader.rows - start))
        counts += np.bincount(ids.ravel(), minlength=rows)[:rows]  # each id of a multi-hot row
    presence = batch_presence(counts, global_batch, reader.rows)
    return tf.constant((1.0 / presence).astype(np.float32))


def row_penalties(
    config: TrainConfig, model: DLRM, dataset: BinaryDataset, global_batch: int
) -> dict[str, RowL2]:
    """Variable name -> its ``RowL2`` for this rank's tables and wide weights (none when both
    strengths are 0)."""
    train_rows = max(dataset.rows["train"], 1)
    wide = {id(v) for v in model.wide}
    scales: dict[int, tf.Tensor | None] = {}
    out = {}
    for name, var in model.owned_variables():
        if not name.startswith("table/"):
            continue
        strength = config.wide_l2 if id(var) in wide else config.table_l2
        if not strength:
            continue
        table = int(name.split("/")[1])
        if table not in scales:
            scales[table] = (
                inverse_frequency(dataset, table, int(var.shape[0]), global_batch)
                if config.row_l2_scaling == "inverse_frequency"
                else None
            )
        out[name] = RowL2(strength / train_rows, scales[table])
    return out
