"""Optimizers on explicit variables, and the seed's learning-rate schedule.

Embedding gradients arrive as ``tf.IndexedSlices`` (only the looked-up rows); SGD applies them
with a scatter, Adam lazily (moments of the touched rows only, as the DLRM references do), so a
step never touches a whole table. Optimizer state is a list of named variables, which is what
the checkpoints save.

Row L2 (``train.table_l2`` / ``train.wide_l2``): a table's gradient gets ``l2 * row`` added for
each distinct row the step looked up (times the row's scale, see trainer/row_l2.py), before the
optimizer's own update. It is the per-row L2 of CTR systems' sparse tables: the rows a step does
not touch are not read, so the cost follows the batch, not the table. A variable may also
have its own rate factor (``train.wide_learning_rate_factor``, the wide weights'), applied to
the schedule's rate before each update.
"""

from __future__ import annotations

import math

import tensorflow as tf

from dlrm_contracts.config import TrainConfig


def base_learning_rate(config: TrainConfig) -> float:
    """``learning_rate`` (set for a global batch of ``learning_rate_batch``) at this run's
    global batch: a larger batch takes fewer steps per epoch, each with less noise, so it
    can take larger ones."""
    ratio = config.batch_size / config.learning_rate_batch
    factor = {"sqrt": math.sqrt(ratio), "linear": ratio, "none": 1.0}[config.learning_rate_scaling]
    return config.learning_rate * factor


def learning_rate(step: int, config: TrainConfig) -> float:
    """Linear warm-up over ``warmup_steps``, constant, then polynomial decay to 0.

    Step s (0-based) of the warm-up uses base * (s + 1) / warmup_steps; from
    ``decay_start_step`` the rate is base * ((decay_steps - k) / decay_steps) ** power after k
    decay steps, and 0 once the decay is over (as in the seed). base = the batch-scaled rate.
    """
    base = base_learning_rate(config)
    if config.warmup_steps and step < config.warmup_steps:
        return base * (step + 1) / config.warmup_steps
    if config.decay_start_step is not None and config.decay_steps:
        done = step - config.decay_start_step
        if done >= config.decay_steps:
            return 0.0
        if done >= 0:
            return base * ((config.decay_steps - done) / config.decay_steps) ** config.decay_power
    return base


class RowL2:
    """The L2 penalty of one sparse variable: strength, and a per-row factor or None (= 1)."""

    def __init__(self, strength: float, scale: tf.Tensor | None = None):
        self.strength, self.scale = float(strength), scale

    def add(self, var: tf.Variable, rows: tf.Tensor, values: tf.Tensor) -> tf.Tensor:
        """``values`` (the summed gradient of the distinct ``rows``) + the penalty's gradient."""
        factor = tf.constant(self.strength, values.dtype)
        if self.scale is not None:
            factor = factor * tf.gather(self.scale, rows)[:, None]
        return values + factor * tf.gather(var, rows)


def distinct_rows(grad: tf.IndexedSlices) -> tuple[tf.Tensor, tf.Tensor]:
    """(distinct rows, their summed gradients): a row looked up k times in a batch is one
    row of the update."""
    rows, where = tf.unique(grad.indices)
    return rows, tf.math.unsorted_segment_sum(grad.values, where, tf.shape(rows)[0])


def scaled(lr: tf.Tensor, factor: float) -> tf.Tensor:
    """A variable's own rate: the schedule's times its factor (train.wide_learning_rate_factor)."""
    return lr if factor == 1.0 else lr * factor


def penalties_for(variables, penalties) -> list[RowL2 | None]:
    """One entry per variable: its ``RowL2`` or None (``penalties`` maps names to them)."""
    penalties = penalties or {}
    return [penalties.get(name) for name, _ in variables]


class Optimizer:
    """What the optimizers share: their variables, each one's row L2 (or None) and rate
    factor, and their state by name (the checkpoints save it); a kind makes its own slots
    in ``make_slots`` and updates them in ``apply``."""

    def __init__(
        self,
        variables: list[tuple[str, tf.Variable]],
        config: TrainConfig,
        penalties: dict[str, RowL2] | None = None,
        rate_factors: dict[str, float] | None = None,
    ):
        self.variables = variables
        self.penalties = penalties_for(variables, penalties)
        self.rates = [(rate_factors or {}).get(name, 1.0) for name, _ in variables]
        self._by_name = {name: i for i, (name, _) in enumerate(variables)}
        self.make_slots(config)

    def make_slots(self, config: TrainConfig) -> None:
        """The kind's own settings and per-variable state (none for SGD)."""

    def state(self) -> list[tuple[str, tf.Variable]]:
        """State of the optimizer as a whole (counters), saved with the replicated part."""
        return []

    def state_for(self, name: str) -> list[tuple[str, tf.Variable]]:
        """The slots of variable ``name``, saved beside it."""
        return []

    def apply(self, grads: list, lr: tf.Tensor) -> None:
        raise NotImplementedError


class SGD(Optimizer):
    def apply(self, grads: list, lr_all: tf.Tensor) -> None:
        for (_, var), grad, penalty, factor in zip(self.variables, grads, self.penalties, self.rates):
            lr = scaled(lr_all, factor)
            if isinstance(grad, tf.IndexedSlices) and penalty is not None:
                rows, values = distinct_rows(grad)
                var.scatter_sub(tf.IndexedSlices(penalty.add(var, rows, values) * lr, rows))
            elif isinstance(grad, tf.IndexedSlices):
                var.scatter_sub(tf.IndexedSlices(grad.values * lr, grad.indices, grad.dense_shape))
            else:
                var.assign_sub(grad * lr)


class Adam(Optimizer):
    """Adam; sparse gradients update only the rows they touch ("lazy" Adam)."""

    def make_slots(self, config: TrainConfig) -> None:
        self.beta1, self.beta2 = config.adam_beta1, config.adam_beta2
        self.epsilon = config.adam_epsilon
        self.iterations = tf.Variable(0, dtype=tf.int64, trainable=False, name="adam_iterations")
        self.m = [tf.Variable(tf.zeros_like(v), trainable=False) for _, v in self.variables]
        self.v = [tf.Variable(tf.zeros_like(v), trainable=False) for _, v in self.variables]

    def state_for(self, name: str) -> list[tuple[str, tf.Variable]]:
        i = self._by_name[name]
        return [(f"{name}/adam_m", self.m[i]), (f"{name}/adam_v", self.v[i])]

    def state(self) -> list[tuple[str, tf.Variable]]:
        return [("adam/iterations", self.iterations)]

    def apply(self, grads: list, lr: tf.Tensor) -> None:
        t = tf.cast(self.iterations.assign_add(1), tf.float32)
        step_all = lr * tf.sqrt(1.0 - self.beta2**t) / (1.0 - self.beta1**t)
        for (_, var), grad, m, v, penalty, factor in zip(
            self.variables, grads, self.m, self.v, self.penalties, self.rates
        ):
            step = scaled(step_all, factor)
            if isinstance(grad, tf.IndexedSlices):
                rows, values = distinct_rows(grad)
                if penalty is not None:
                    values = penalty.add(var, rows, values)
                m_rows = self.beta1 * tf.gather(m, rows) + (1 - self.beta1) * values
                v_rows = self.beta2 * tf.gather(v, rows) + (1 - self.beta2) * tf.square(values)
                m.scatter_update(tf.IndexedSlices(m_rows, rows))
                v.scatter_update(tf.IndexedSlices(v_rows, rows))
                var.scatter_sub(tf.IndexedSlices(step * m_rows / (tf.sqrt(v_rows) + self.epsilon), rows))
            else:
                m.assign(self.beta1 * m + (1 - self.beta1) * grad)
                v.assign(self.beta2 * v + (1 - self.beta2) * tf.square(grad))
                var.assign_sub(step * m / (tf.sqrt(v) + self.epsilon))


class Adagrad(Optimizer):
    """Adagrad (one accumulator per value); sparse gradients touch only their rows' accumulators.

    The sparse optimizer of TorchRec's and MLPerf DLRMv2's DLRM: a value's step shrinks as its
    squared gradients add up, so the rows seen in every batch settle while the rare ones keep
    a larger step. Duplicate ids of a batch are summed first, so a row's accumulator grows by
    the square of its whole-batch gradient, as with a dense gradient.
    """

    def make_slots(self, config: TrainConfig) -> None:
        self.epsilon = config.adagrad_epsilon
        self.accumulators = [
            tf.Variable(tf.fill(v.shape, config.adagrad_initial_accumulator), trainable=False)
            for _, v in self.variables
        ]

    def state_for(self, name: str) -> list[tuple[str, tf.Variable]]:
        return [(f"{name}/adagrad", self.accumulators[self._by_name[name]])]

    def apply(self, grads: list, lr_all: tf.Tensor) -> None:
        for (_, var), grad, acc, penalty, factor in zip(
            self.variables, grads, self.accumulators, self.penalties, self.rates
        ):
            lr = scaled(lr_all, factor)
            if isinstance(grad, tf.IndexedSlices):
                rows, values = distinct_rows(grad)
                if penalty is not None:
                    values = penalty.add(var, rows, values)
                acc_rows = tf.gather(acc, rows) + tf.square(values)
                acc.scatter_update(tf.IndexedSlices(acc_rows, rows))
                var.scatter_sub(tf.IndexedSlices(lr * values / (tf.sqrt(acc_rows) + self.epsilon), rows))
            else:
                acc.assign_add(tf.square(grad))
                var.assign_sub(lr * grad / (tf.sqrt(acc) + self.epsilon))


def make_optimizer(
    variables: list[tuple[str, tf.Variable]],
    config: TrainConfig,
    penalties: dict[str, RowL2] | None = None,
    rate_factors: dict[str, float] | None = None,
) -> Optimizer:
    """The configured optimizer; ``penalties`` names the sparse variables with a row L2,
    ``rate_factors`` those whose rate is the schedule's times a factor."""
    kinds = {"sgd": SGD, "adam": Adam, "adagrad": Adagrad}
    if config.optimizer not in kinds:
        raise ValueError(f"unknown optimizer {config.optimizer!r}; known: {sorted(kinds)}")
    return kinds[config.optimizer](variables, config, penalties, rate_factors)
