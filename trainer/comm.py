"""The collectives the trainer needs: Horovod across ranks, identities in one process.

A run started by ``horovodrun`` (it sets HOROVOD_RANK) uses Horovod over Gloo; a plain
``python -m trainer`` uses :class:`LocalComm`, so one process needs neither Horovod nor a
launcher and runs exactly the same model code with a world of one.

Every collective gets an explicit name. Horovod matches the ranks' operations by name, and
inside a ``tf.function`` the default name comes from the input tensor's graph name, which
differs between ranks whose graphs differ (the rank owning a model-parallel bottom MLP has more
ops): unnamed collectives would wait for each other forever.
"""

from __future__ import annotations

import math
import os
from typing import Sequence

import tensorflow as tf


class LocalComm:
    rank = 0
    size = 1
    local_size = 1

    def alltoall(self, tensor: tf.Tensor, splits: Sequence[int], name: str) -> tf.Tensor:
        return tensor

    def allreduce_sum(self, tensors: list[tf.Tensor], name: str) -> list[tf.Tensor]:
        return list(tensors)

    def allgather(self, tensor: tf.Tensor, name: str) -> tf.Tensor:
        return tensor

    def broadcast_variables(self, variables: Sequence[tf.Variable]) -> None:
        return None

    def barrier(self) -> None:
        return None


class HorovodComm:
    def __init__(self):
        import horovod.tensorflow as hvd

        hvd.init()
        self._hvd = hvd
        self.rank = hvd.rank()
        self.size = hvd.size()
        self.local_size = hvd.local_size()

    def alltoall(self, tensor: tf.Tensor, splits: Sequence[int], name: str) -> tf.Tensor:
        """1-D exchange: the first ``splits[0]`` values go to rank 0, the next to rank 1, ...

        The backward pass is the reverse alltoall (as Horovod's registered gradient), written
        out here only to give it a name of its own.
        """
        hvd = self._hvd

        @tf.custom_gradient
        def exchange(x):
            received, received_splits = hvd.alltoall(
                x, splits=tf.constant(list(splits), tf.int32), name=name, ignore_name_scope=True
            )

            def backward(upstream):
                sent_back, _ = hvd.alltoall(
                    upstream, splits=received_splits, name=f"{name}_grad", ignore_name_scope=True
                )
                return sent_back

            return received, backward

        return exchange(tensor)

    def allreduce_sum(self, tensors: list[tf.Tensor], name: str) -> list[tf.Tensor]:
        if not tensors:
            return []
        return self._hvd.grouped_allreduce(list(tensors), op=self._hvd.Sum, name=name, ignore_name_scope=True)

    def allgather(self, tensor: tf.Tensor, name: str) -> tf.Tensor:
        return self._hvd.allgather(tensor, name=name, ignore_name_scope=True)

    def broadcast_variables(self, variables: Sequence[tf.Variable]) -> None:
        if variables:
            self._hvd.broadcast_variables(list(variables), root_rank=0)

    def barrier(self) -> None:
        self._hvd.allreduce(tf.constant(0.0), op=self._hvd.Sum, name="barrier")


def launched_by_horovod() -> bool:
    return "HOROVOD_RANK" in os.environ


def make_comm():
    return HorovodComm() if launched_by_horovod() else LocalComm()


def shared_auc(comm, auc: float | None) -> float:
    """Rank 0's validation AUC on every rank (NaN when undefined): the only one computed, so
    that every rank takes the same decision at the same step (a collective: every rank calls
    it)."""
    mine = math.nan if auc is None else auc
    summed = comm.allreduce_sum(
        [tf.constant(mine if comm.rank == 0 else 0.0, tf.float64)], name="dlrm_early_stopping"
    )
    return float(summed[0])
