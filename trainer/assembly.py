"""The parts of one rank's DLRM that a run builds once, before any loop: where each table
lives, this rank's variables and view of the data, the optimizer and the step functions. The
training loop (trainer/loop.py) holds them; building them is a job of its own so that the loop
reads as a loop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import tensorflow as tf

from dlrm_contracts.config import TrainConfig
from trainer.checkpoint_lifecycle import ModelState
from trainer.data import BinaryDataset, RankView
from trainer.dims import ModelDims
from trainer.model import DLRM
from trainer.optim import make_optimizer
from trainer.placement import Placement, plan_placement
from trainer.row_l2 import row_penalties
from trainer.steps import StepFunctions


@dataclass(frozen=True)
class ModelParts:
    """What one rank trains with: the placement of the tables over the ranks, its share of the
    model, the columns of each batch it reads, the optimizer, the step functions, and the named
    variables a checkpoint holds."""

    placement: Placement
    model: DLRM
    view: RankView
    optimizer: Any
    steps: StepFunctions
    state: ModelState


def assemble(
    config: TrainConfig,
    dataset: BinaryDataset,
    dims: ModelDims,
    comm: Any,
    batches: tuple[int, int],
    compute_dtype: tf.DType,
) -> ModelParts:
    """This rank's parts, its replicated variables made equal to rank 0's.

    Args:
        config: the train settings.
        dataset: the run's dataset (table sizes, row counts for the row penalties).
        dims: the model's dimensions.
        comm: the collectives (rank, world, broadcast).
        batches: the global (train, eval) batch sizes.
        compute_dtype: the dtype of the dense part's math (trainer/loop.py's compute_dtype).
    """
    global_batch, eval_batch = batches
    placement = plan_placement(
        dataset.table_sizes,
        dims.embedding_dim,
        comm.size,
        bottom_data_parallel=config.bottom_mlp_data_parallel,
        split_threshold_bytes=config.column_split_threshold_mb * 2**20,
        force_split=tuple(config.force_column_split),
    )
    model = DLRM(dims, placement, comm.rank, global_batch, config.seed, comm, compute_dtype, xla=config.xla)
    view = RankView(comm.size, comm.rank, model.tables_read, _numerical_share(placement, comm.rank))
    replicated, owned = model.replicated_variables(), model.owned_variables()
    optimizer = make_optimizer(
        replicated + owned,
        config,
        row_penalties(config, model, dataset, global_batch),
        {name: config.wide_learning_rate_factor for name in model.wide_names()},
    )
    steps = StepFunctions(model, optimizer, comm, global_batch, eval_batch, compute_dtype, config.xla)
    comm.broadcast_variables([v for _, v in replicated])
    return ModelParts(
        placement, model, view, optimizer, steps, ModelState(owned, replicated, optimizer, steps.loss_scale)
    )


def _numerical_share(placement: Placement, rank: int) -> str:
    """Which numerical columns this rank reads: its batch rows' own when the bottom MLP is data
    parallel, the global batch's on the rank that owns a model-parallel bottom MLP, else none."""
    if placement.bottom_owner is None:
        return "local"
    return "global" if placement.bottom_owner == rank else "none"
