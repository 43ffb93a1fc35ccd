"""A ceiling for the trainer's step on this machine: a plain TensorFlow DLRM step, no trainer code.

Why: bench_trainer.py measures the trainer's own step; this script measures what TensorFlow
itself reaches on the same model, so that a samples/s target can be judged against what the
machine and this TensorFlow build can do. In one process, at the trainer's default dimensions
(``trainer.model.PRESETS``), float32, on batches held in memory, it times:

* matmul: one [B, 1024] x [1024, 1024] float32 matmul (the top MLP's widest layer), as
  GFLOP/s, and the arithmetic limit it implies: GFLOP/s / FLOPs of a sample's forward and
  backward pass (every MLP layer, the pairwise dots);
* dense: one ``tf.function`` step of bottom MLP, dot interaction, top MLP, sigmoid
  cross-entropy, gradients and an SGD update, with the embeddings given as an input tensor (no
  table lookups or table updates: less than any DLRM step must do);
* tables: the same plus the embedding tables, as one merged variable: one gather for all
  26 lookups and one scatter-subtract of the 26 gradients (the least a real step does);

each without and with XLA (``jit_compile=True``, the whole step in one cluster). Usage:

    .venv/bin/python bench/bench_dlrm_floor.py
    .venv/bin/python bench/bench_dlrm_floor.py --batch-size 4096 --steps 20 --repeat 2
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from dlrm_contracts.binary_format import NUM_NUMERICAL  # noqa: E402
from dlrm_contracts.schema import NUM_CATEGORICAL as NUM_TABLES  # noqa: E402


def flops_per_sample(embedding_dim: int, bottom: tuple[int, ...], top: tuple[int, ...]) -> float:
    """Forward + backward FLOPs of one sample: 3 matmuls per layer (forward, input and weight
    gradients; the bottom MLP's input gradient is not needed), 3 for the pairwise dots."""
    features = NUM_TABLES + 1
    top_in = embedding_dim + features * (features - 1) // 2
    macs = 0
    for fan_in, fan_out in zip((NUM_NUMERICAL,) + bottom[:-1], bottom):
        macs += fan_in * fan_out * 3
    macs -= NUM_NUMERICAL * bottom[0]
    for fan_in, fan_out in zip((top_in,) + top[:-1], top):
        macs += fan_in * fan_out * 3
    macs += features * features * embedding_dim * 3
    return 2.0 * macs


def timed(fn, args, steps: int) -> float:
    """Seconds per call after three warm-up calls (tracing, XLA compilation)."""
    for _ in range(3):
        out = fn(*args)
    _ = [o.numpy() for o in (out if isinstance(out, (list, tuple)) else [out])]
    start = time.perf_counter()
    for _ in range(steps):
        out = fn(*args)
    _ = [o.numpy() for o in (out if isinstance(out, (list, tuple)) else [out])]
    return (time.perf_counter() - start) / steps


def matmul_gflops(batch: int, steps: int) -> float:
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(0)
    a = tf.constant(rng.random((batch, 1024), dtype=np.float32))
    b = tf.constant(rng.random((1024, 1024), dtype=np.float32))
    seconds = timed(tf.function(lambda x, y: tf.matmul(x, y)), (a, b), steps)
    return 2.0 * batch * 1024 * 1024 / seconds / 1e9


def make_step(batch: int, dims, rows_per_table: int, with_tables: bool, xla: bool):
    """A fresh plain DLRM train step and its inputs."""
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(0)
    d, features = dims.embedding_dim, NUM_TABLES + 1

    def mlp(fan_in, sizes):
        layers = []
        for size in sizes:
            layers.append(
                (
                    tf.Variable(
                        rng.normal(0, (2.0 / (fan_in + size)) ** 0.5, (fan_in, size)).astype(np.float32)
                    ),
                    tf.Variable(np.zeros(size, np.float32)),
                )
            )
            fan_in = size
        return layers

    bottom = mlp(NUM_NUMERICAL, dims.bottom_mlp)
    top = mlp(d + features * (features - 1) // 2, dims.top_mlp)
    dense_vars = [v for layer in bottom + top for v in layer]
    rows, cols = np.tril_indices(features, -1)
    pairs = (rows * features + cols).astype(np.int32)
    table = tf.Variable(rng.uniform(-0.01, 0.01, (NUM_TABLES * rows_per_table, d)).astype(np.float32))

    def run(x, layers, final_relu):
        for i, (w, b) in enumerate(layers):
            x = tf.matmul(x, w) + b
            if final_relu or i < len(layers) - 1:
                x = tf.nn.relu(x)
        return x

    def step(numerical, embedded_or_ids, label):
        if with_tables:
            embedded = tf.reshape(tf.gather(table, embedded_or_ids), [batch, NUM_TABLES, d])
        else:
            embedded = embedded_or_ids
        with tf.GradientTape() as tape:
            tape.watch(embedded)
            x = run(numerical, bottom, True)
            f = tf.concat([x[:, None, :], embedded], axis=1)
            dots = tf.gather(tf.reshape(tf.matmul(f, f, transpose_b=True), [batch, -1]), pairs, axis=1)
            logits = run(tf.concat([x, dots], axis=1), top, False)[:, 0]
            loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=label, logits=logits))
        grads = tape.gradient(loss, dense_vars + [embedded])
        for v, g in zip(dense_vars, grads[:-1]):
            v.assign_sub(0.01 * g)
        if with_tables:
            table.scatter_sub(tf.IndexedSlices(0.01 * tf.reshape(grads[-1], [-1, d]), embedded_or_ids))
        return loss

    numerical = tf.constant(rng.normal(size=(batch, NUM_NUMERICAL)).astype(np.float32))
    label = tf.constant((rng.random(batch) < 0.3).astype(np.float32))
    if with_tables:
        offsets = np.arange(NUM_TABLES, dtype=np.int64) * rows_per_table
        ids = rng.integers(0, rows_per_table, (batch, NUM_TABLES)) + offsets
        second = tf.constant(ids.reshape(-1).astype(np.int32))
    else:
        second = tf.constant(rng.normal(size=(batch, NUM_TABLES, d)).astype(np.float32))
    return tf.function(step, jit_compile=xla), (numerical, second, label)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch-size", type=int, default=4096)
    p.add_argument("--steps", type=int, default=15)
    p.add_argument("--repeat", type=int, default=1, help="time every variant N times, in turn")
    p.add_argument("--rows-per-table", type=int, default=20_000)
    args = p.parse_args()
    if min(args.batch_size, args.steps, args.repeat, args.rows_per_table) < 1:
        p.error("--batch-size, --steps, --repeat and --rows-per-table must be at least 1")

    import os

    import tensorflow as tf

    from trainer.model import PRESETS

    dims = PRESETS["default"]
    threads = os.cpu_count() or 1
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(max(2, threads))
    flops = flops_per_sample(dims.embedding_dim, dims.bottom_mlp, dims.top_mlp)
    gflops = matmul_gflops(args.batch_size, args.steps)
    print(
        f"default dims (embedding {dims.embedding_dim}, bottom {dims.bottom_mlp}, top "
        f"{dims.top_mlp}), batch {args.batch_size}, float32, {threads} threads"
    )
    print(
        f"matmul [{args.batch_size},1024]x[1024,1024]: {gflops:.0f} GFLOP/s; a sample's forward "
        f"+ backward is {flops / 1e6:.2f} MFLOP: arithmetic limit {gflops * 1e9 / flops:,.0f} samples/s"
    )
    results: dict[str, list[float]] = {}
    for _ in range(args.repeat):
        for with_tables in (False, True):
            for xla in (False, True):
                name = f"{'tables' if with_tables else 'dense'}{' xla' if xla else ''}"
                fn, inputs = make_step(args.batch_size, dims, args.rows_per_table, with_tables, xla)
                seconds = timed(fn, inputs, args.steps)
                results.setdefault(name, []).append(args.batch_size / seconds)
                print(
                    f"{name:12s} {seconds * 1000:7.1f} ms/step {args.batch_size / seconds:>9,.0f} samples/s",
                    flush=True,
                )
    print(
        json.dumps(
            {
                "matmul_gflops": round(gflops, 1),
                "arithmetic_limit": round(gflops * 1e9 / flops),
                "samples_per_s": {k: [round(x) for x in v] for k, v in results.items()},
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
