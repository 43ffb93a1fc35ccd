"""One rank's step functions: the training step and the prediction step, traced once each.

Gradient bookkeeping (global batch B over N ranks, local loss L_r = mean over rank r's B/N
samples, global loss L = mean_r L_r): each rank differentiates L_r / N. Replicated variables
(MLPs) get their gradients summed by one grouped allreduce -> dL/dθ. Owned variables (tables,
a model-parallel bottom MLP) receive through the alltoall's gradient the sum over ranks of
d(L_r / N)/dθ = dL/dθ as well. So every update equals the single-process update on the whole
global batch, up to float rounding.
"""

from __future__ import annotations

import tensorflow as tf

from trainer.data import Batch
from trainer.model import DLRM


def batch_tensors(batch: Batch):
    """(categorical columns, numerical, label) of a batch as the step functions take them."""
    return (
        [tf.convert_to_tensor(c) for c in batch.categorical],
        tf.convert_to_tensor(batch.numerical),
        tf.convert_to_tensor(batch.label),
    )


class StepFunctions:
    """The training step (lookups, exchange, dense pass, allreduce, update) and the prediction
    step of one rank's model, with the loss scale of float16 training."""

    def __init__(
        self,
        model: DLRM,
        optimizer,
        comm,
        global_batch: int,
        eval_batch: int,
        compute_dtype: tf.DType,
        xla: bool,
    ):
        self.model, self.optimizer, self.comm = model, optimizer, comm
        self.world = comm.size
        self.replicated = model.replicated_variables()
        self.owned = model.owned_variables()
        self.global_batch, self.eval_batch = global_batch, eval_batch
        self.compute_dtype = compute_dtype
        self.loss_scale = tf.Variable(
            2.0**15 if compute_dtype == tf.float16 else 1.0, trainable=False, name="loss_scale"
        )
        # The steps branch on Python values only (tf.cond where a tensor decides), so they are
        # traced as written: AutoGraph would rewrite every function they call, Horovod's
        # included, in each new process before its first step, for the same graph.
        # --xla compiles the dense part only: it holds no Horovod op (see _dense_gradients).
        self._dense_step = (
            tf.function(self._dense_gradients, jit_compile=True, autograph=False)
            if xla
            else self._dense_gradients
        )
        self._train_step = tf.function(self._train_step_impl, autograph=False)
        self.predict = tf.function(self._predict_step_impl, autograph=False)

    def train_on_batch(self, batch: Batch, lr: float) -> tf.Tensor:
        """One optimizer step; returns the global-batch mean loss (before the update)."""
        categorical, numerical, label = batch_tensors(batch)
        return self._train_step(categorical, numerical, label, tf.constant(lr, tf.float32))

    def _dense_gradients(self, numerical, features, wide, label):
        """Loss, replicated-variable gradients and the gradients w.r.t. the exchanged features
        and wide sum.

        The whole dense forward and backward pass, so that --xla compiles both into one
        cluster; it contains no Horovod op.
        """
        variables = [v for _, v in self.replicated]
        with tf.GradientTape() as tape:
            tape.watch([features, wide])
            logits = self.model.dense_part(numerical, features, wide)
            loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=label, logits=logits))
            scaled = loss * (self.loss_scale / self.world)
        grads = tape.gradient(scaled, variables + [features, wide])
        return loss, grads[:-2], grads[-2:]

    def _train_step_impl(self, categorical, numerical, label, lr):
        local_batch = self.global_batch // self.world
        with tf.GradientTape() as tape:  # lookups, model-parallel bottom MLP, alltoall
            local_numerical, features, wide = self.model.features(categorical, numerical, local_batch)
        loss, dense_grads, feature_grads = self._dense_step(local_numerical, features, wide, label)
        # The alltoall's gradient brings every rank's share back to the owners.
        owned = list(
            tape.gradient([features, wide], [v for _, v in self.owned], output_gradients=feature_grads)
        )
        n_rep = len(dense_grads)
        extra = [loss / self.world]  # summed with the gradients: the global-batch mean loss
        if self.compute_dtype == tf.float16:  # every rank must agree on skipping a step
            finite = tf.reduce_all(
                [
                    tf.reduce_all(tf.math.is_finite(g.values if isinstance(g, tf.IndexedSlices) else g))
                    for g in owned
                ]
                or [True]
            )
            extra.append(1.0 - tf.cast(finite, tf.float32))
        summed = self.comm.allreduce_sum(list(dense_grads) + extra, name="dlrm_gradients")
        replicated, global_loss = list(summed[:n_rep]), summed[n_rep]
        if self.compute_dtype != tf.float16:
            self.optimizer.apply(replicated + owned, lr)
            return global_loss
        # float16 (GPU): unscale; skip the step and halve the scale when any rank overflowed.
        grads = [g / self.loss_scale for g in replicated] + [
            tf.IndexedSlices(g.values / self.loss_scale, g.indices, g.dense_shape)
            if isinstance(g, tf.IndexedSlices)
            else g / self.loss_scale
            for g in owned
        ]
        ok = tf.logical_and(
            tf.equal(summed[n_rep + 1], 0.0),
            tf.reduce_all([tf.reduce_all(tf.math.is_finite(g)) for g in replicated]),
        )

        def apply():
            self.optimizer.apply(grads, lr)
            return tf.constant(True)

        tf.cond(ok, apply, lambda: tf.constant(False))
        self.loss_scale.assign(tf.where(ok, self.loss_scale, self.loss_scale / 2.0))
        return global_loss

    def _predict_step_impl(self, categorical, numerical, label):
        local_batch = self.eval_batch // self.world
        probabilities = tf.sigmoid(self.model(categorical, numerical, local_batch))
        return (
            self.comm.allgather(probabilities, name="dlrm_eval_probabilities"),
            self.comm.allgather(label, name="dlrm_eval_labels"),
        )
