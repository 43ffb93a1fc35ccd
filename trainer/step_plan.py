"""The steps a run trains and the row each step starts at: epochs or max_steps counted from
the run's first step, over the rows the run trains (the whole train split, or its new days:
train.days), in an order reproducible from (seed, epoch) so that a resumed run reads the
batches the interrupted one would have.
"""

from __future__ import annotations

from dlrm_contracts.config import ConfigError, TrainConfig
from trainer.data import batch_starts


def run_length(
    train_rows: int, split_rows: int, global_batch: int, config: TrainConfig, nothing_new: bool = False
) -> tuple[int, int]:
    """(steps this run trains, steps per epoch) over ``train_rows`` of the ``split_rows`` of
    the train split; (0, 1) when train.days: new finds no day the model has not seen
    (``nothing_new``).

    Raises:
        ConfigError: fewer rows than one global batch.
    """
    if nothing_new:
        return 0, 1
    steps_per_epoch = train_rows // global_batch
    if steps_per_epoch == 0:
        which = "the train split" if train_rows == split_rows else "the new train days (train.days: new)"
        raise ConfigError(f"{which} have {train_rows} rows, fewer than one global batch of {global_batch}")
    total = steps_per_epoch * config.epochs
    if config.max_steps is not None:
        total = min(total, config.max_steps)
    return total, steps_per_epoch


def batch_plan(
    first: int,
    total: int,
    run_start: int,
    steps_per_epoch: int,
    train_rows: int,
    global_batch: int,
    config: TrainConfig,
) -> list[tuple[int, int]]:
    """(global step, first row of the run's rows) of every batch from step ``first`` to
    ``total``; epochs count from the run's first step ``run_start``."""
    plan, starts, epoch = [], None, None
    for step in range(first, total):
        local = step - run_start
        if local // steps_per_epoch != epoch:
            epoch = local // steps_per_epoch
            starts = batch_starts(
                train_rows, global_batch, epoch=epoch, seed=config.seed, shuffle=config.shuffle_batches
            )
        assert starts is not None  # set by the first step of the loop
        plan.append((step, int(starts[local % steps_per_epoch])))
    return plan
