"""Run under horovodrun (by trainer_runs.py, around the trainer's lines): checks alltoall,
allreduce and DistributedGradientTape across ranks, and (rank 0) what ``horovodrun
--check-build`` reports.

``build_report()`` runs first in the process: before Horovod's thread runs (check_build forks)
and before any TensorFlow op (the trainer's first line sets the runtime's thread counts).
``report()`` runs after the trainer's lines: it asserts the exact values each rank must
receive and returns that rank's report; the test reads every rank's, so a rank that fails or
never reports fails the test.

``horovodrun --check-build`` loads Horovod's TensorFlow extension afresh in a forked child for
every line it prints (TensorFlow's import, eight times, most of its ~45 s); rank 0 runs the
same report here, after its own import, so each child finds the extension already loaded.
"""

import contextlib
import io
import os

import numpy as np


def build_report() -> str:
    """What ``horovodrun --check-build`` prints, on rank 0 ("" on the others)."""
    import horovod.tensorflow  # noqa: F401 - loaded here, so that check_build's children find it
    from horovod.runner.launch import check_build

    build = io.StringIO()
    if os.environ["HOROVOD_RANK"] == "0":
        with contextlib.redirect_stdout(build), contextlib.suppress(SystemExit):
            check_build(verbose=False)  # before hvd.init(): no Horovod thread runs yet to fork
    return build.getvalue()


def report(build: str) -> dict:
    """This rank's collectives checked, with ``build_report()``'s text."""
    import horovod.tensorflow as hvd
    import tensorflow as tf

    hvd.init()
    rank, size = hvd.rank(), hvd.size()

    # alltoall: rank r sends to rank j the row [r, j] (two values per destination).
    sent = tf.constant([[rank * 10 + j, rank * 100 + j] for j in range(size)], dtype=tf.float32)
    received = hvd.alltoall(sent).numpy()
    expected = np.array([[i * 10 + rank, i * 100 + rank] for i in range(size)], dtype=np.float32)
    np.testing.assert_array_equal(received, expected)

    # allreduce: sum and average of rank-dependent tensors.
    value = tf.constant([rank + 1.0, 2.0 * rank], dtype=tf.float32)
    total = hvd.allreduce(value, op=hvd.Sum).numpy()
    np.testing.assert_allclose(total, [sum(r + 1.0 for r in range(size)), sum(2.0 * r for r in range(size))])
    mean = hvd.allreduce(value, op=hvd.Average).numpy()
    np.testing.assert_allclose(mean, total / size)

    # DistributedGradientTape averages the per-rank gradients: d/dw (w * x_r) = x_r.
    w = tf.Variable(1.0)
    with tf.GradientTape() as tape:
        loss = w * float(rank + 1)
    tape = hvd.DistributedGradientTape(tape)
    (grad,) = tape.gradient(loss, [w])
    np.testing.assert_allclose(grad.numpy(), np.mean([r + 1.0 for r in range(size)]))

    return {"rank": rank, "size": size, "ok": True, "check_build": build}
