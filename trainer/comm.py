"""The collectives the trainer needs: Horovod across ranks, identities in one process.

A run started by ``horovodrun`` (it sets HOROVOD_RANK) uses Horovod over Gloo; a plain
``python -m trainer`` uses :class:`LocalComm`, so one process needs neither Horovod nor a
launcher and runs exactly the same model code with a world of one.
"""

from __future__ import annotations

import os
from typing import Sequence

import tensorflow as tf


class LocalComm:
    rank = 0
    size = 1
    local_size = 1

    def alltoall(self, tensor: tf.Tensor, splits: Sequence[int]) -> tf.Tensor:
        return tensor

    def allreduce_sum(self, tensors: list[tf.Tensor]) -> list[tf.Tensor]:
        return list(tensors)

    def allgather(self, tensor: tf.Tensor) -> tf.Tensor:
        return tensor

    def broadcast_variables(self, variables: Sequence[tf.Variable]) -> None:
        return None

    def barrier(self) -> None:
        return None

    def allreduce_max_int(self, value: int) -> int:
        return int(value)


class HorovodComm:
    def __init__(self):
        import horovod.tensorflow as hvd

        hvd.init()
        self._hvd = hvd
        self.rank = hvd.rank()
        self.size = hvd.size()
        self.local_size = hvd.local_size()

    def alltoall(self, tensor: tf.Tensor, splits: Sequence[int]) -> tf.Tensor:
        """1-D exchange: ``splits[j]`` leading values go to rank j; gradient is registered."""
        received, _ = self._hvd.alltoall(tensor, splits=tf.constant(list(splits), tf.int32))
        return received

    def allreduce_sum(self, tensors: list[tf.Tensor]) -> list[tf.Tensor]:
        if not tensors:
            return []
        return self._hvd.grouped_allreduce(list(tensors), op=self._hvd.Sum)

    def allgather(self, tensor: tf.Tensor) -> tf.Tensor:
        return self._hvd.allgather(tensor)

    def broadcast_variables(self, variables: Sequence[tf.Variable]) -> None:
        if variables:
            self._hvd.broadcast_variables(list(variables), root_rank=0)

    def barrier(self) -> None:
        self._hvd.allreduce(tf.constant(0.0), op=self._hvd.Sum, name="barrier")

    def allreduce_max_int(self, value: int) -> int:
        return int(self._hvd.allreduce(tf.constant(int(value), tf.int64), op=self._hvd.Max).numpy())


def launched_by_horovod() -> bool:
    return "HOROVOD_RANK" in os.environ


def make_comm():
    return HorovodComm() if launched_by_horovod() else LocalComm()
