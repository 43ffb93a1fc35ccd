"""Benchmark of the trainer: samples/s of the loader alone, the model alone, the full trainer.

* loader: ``trainer.data`` reading + converting whole global batches of one split (memory maps,
  prefetch threads), what one process with every table asks for;
* model: the trainer's own train step (``Trainer.train_on_batch``: lookups, exchange, dense part,
  gradients, optimizer) on a few batches held in memory;
* trainer: ``Trainer.train`` end to end (loader + prefetch + steps + metrics log), first step
  (tracing / XLA compilation) excluded, as is the model figure's.

At the seed's default dimensions (embedding 128, bottom 512-256-128, top 1024-1024-512-256-1)
and, by default, a batch of 4096, for float32, --xla and --amp (a variant can combine flags:
``amp+xla``; ``dcn`` trains the DCNv2 interaction, three cross layers of rank 512). Without
``--dataset`` it writes a synthetic dataset (trainer.synthetic) into a temporary directory,
multi-hot with ``--multi-hot-sizes`` (``mlperf``: MLPerf DLRMv2's ids per row).

Usage::

    .venv/bin/python bench/bench_trainer.py
    .venv/bin/python bench/bench_trainer.py --dataset DIR/binary --variants float32,xla,amp,amp+xla
    .venv/bin/python bench/bench_trainer.py --variants float32,dcn --multi-hot-sizes mlperf

The issue's reference figures on an idle machine of this type: a plain TF train step of the
default DLRM at batch 4096 runs ~10.3k samples/s (float32), ~12.9k with XLA.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dlrm_contracts.config import TrainConfig
from trainer.data import SplitReader, batch_starts, open_dataset, prefetch, single_process_view
from trainer.synthetic import write_planted_dataset


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def bench_loader(dataset: Path, batch: int, batches: int) -> dict:
    ds = open_dataset(dataset)
    reader = SplitReader(ds, "train")
    starts = batch_starts(ds.rows["train"], batch, shuffle=True, seed=1)
    plan = [(i, int(starts[i % len(starts)])) for i in range(batches)]
    cpu, t = cpu_seconds(), time.perf_counter()
    rows = sum(b.label.shape[0] for b in prefetch(reader, single_process_view(), plan, batch))
    wall, cpu = time.perf_counter() - t, cpu_seconds() - cpu
    return {
        "what": "loader",
        "samples_per_s": round(rows / wall),
        "samples_per_cpu_s": round(rows / max(cpu, 1e-9)),
        "batches": batches,
        "batch": batch,
    }


def bench_model(config: TrainConfig, dataset: Path, workdir: Path, steps: int) -> dict:
    from trainer.loop import Trainer

    trainer = Trainer(config, dataset, workdir)
    reader = SplitReader(trainer.dataset, "train")
    batches = [reader.read(trainer.view, i, i * config.batch_size, config.batch_size) for i in range(4)]
    trainer.train_on_batch(batches[0], 0.1).numpy()  # trace / compile
    trainer.train_on_batch(batches[1], 0.1).numpy()
    cpu, t = cpu_seconds(), time.perf_counter()
    for i in range(steps):
        loss = trainer.train_on_batch(batches[i % len(batches)], 0.1)
    loss.numpy()
    wall, cpu = time.perf_counter() - t, cpu_seconds() - cpu
    return {
        "what": "model",
        "samples_per_s": round(steps * config.batch_size / wall),
        "samples_per_cpu_s": round(steps * config.batch_size / cpu),
        "steps": steps,
    }


def bench_full(config: TrainConfig, dataset: Path, workdir: Path, steps: int) -> dict:
    from trainer.loop import Trainer

    config.max_steps = 1
    trainer = Trainer(config, dataset, workdir)
    trainer.train(final_eval=False)  # step 1: trace / compile, outside the measurement
    config.max_steps = steps + 2
    cpu = cpu_seconds()
    summary = trainer.train(final_eval=False)  # steps 2..steps+2; the first of them is untimed
    cpu = cpu_seconds() - cpu
    return {
        "what": "trainer",
        "samples_per_s": round(summary["train_samples_per_s"]),
        "samples_per_cpu_s": round((steps + 1) * config.batch_size / cpu),
        "steps": steps,
    }


# MLPerf DLRMv2's ids per row of C1..C26 (its multi-hot dataset)
MLPERF_MULTI_HOT = (3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1)


def multi_hot_sizes(text: str | None) -> tuple[int, ...] | None:
    if not text:
        return None
    return MLPERF_MULTI_HOT if text == "mlperf" else tuple(int(k) for k in text.split(","))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dataset", type=Path, help="split binary dataset (default: synthetic)")
    p.add_argument("--rows", type=int, default=300_000, help="train rows of the synthetic dataset")
    p.add_argument("--batch-size", type=int, default=4096)
    p.add_argument("--preset", default="default")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--loader-batches", type=int, default=300)
    p.add_argument(
        "--variants",
        default="float32,xla,amp",
        help="comma list of float32, xla, amp, dcn, or flags joined by '+' (amp+xla)",
    )
    p.add_argument(
        "--multi-hot-sizes",
        help="synthetic dataset: 26 comma-separated ids per row, or 'mlperf' (MLPerf DLRMv2's)",
    )
    args = p.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="bench_trainer_"))
    try:
        dataset = args.dataset
        if dataset is None:
            dataset = scratch / "binary"
            write_planted_dataset(
                dataset,
                {"train": args.rows, "test": 4096, "validation": 4096},
                multi_hot_sizes=multi_hot_sizes(args.multi_hot_sizes),
            )
        results = [bench_loader(dataset, args.batch_size, args.loader_batches)]
        print(json.dumps(results[-1]), flush=True)
        for variant in args.variants.split(","):
            flags = set(variant.split("+")) - {"float32"}
            if flags - {"xla", "amp", "dcn"}:
                p.error(f"unknown variant {variant!r}")
            # SGD without early stopping: the figures stay comparable from one version of the
            # trainer to the next, and no validation pass runs inside the timed steps.
            base = dict(
                preset=args.preset,
                batch_size=args.batch_size,
                log_every=10,
                optimizer="sgd",
                learning_rate=0.1,
                learning_rate_scaling="none",
                warmup_steps=0,
                early_stopping_patience=0,
                xla="xla" in flags,
                amp="amp" in flags,
                resume=False,
                interaction="dcn" if "dcn" in flags else "dot",
            )
            for bench in (bench_model, bench_full):
                result = bench(
                    TrainConfig(**base), dataset, scratch / f"{variant}_{bench.__name__}", args.steps
                )
                results.append({**result, "variant": variant})
                print(json.dumps(results[-1]), flush=True)
        load = os.getloadavg()[0]
        print(
            f"\nbatch {args.batch_size}, preset {args.preset}, 1-min load average {load:.1f} "
            f"on {os.cpu_count()} cores"
        )
        for r in results:
            print(
                f"{r['what']:8s} {r.get('variant', ''):8s} {r['samples_per_s']:>12,} samples/s "
                f"{r['samples_per_cpu_s']:>12,} samples/CPU-s"
            )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
