"""Benchmark of serving: export time, serve_features / serve_lines throughput, and agreement.

Given a finished pipeline workdir (e.g. the embedded default: ``./run_pipeline.sh``):

1. agreement: exports the workdir's own model (the pipeline's export stage), scores the raw
   test-day lines with ``serve_lines`` and compares with the trainer's eval predictions of the
   same rows (max |difference|) and with the reported test AUC;
2. export time at the **default dims** with the workdir's tables: a one-step default-preset
   checkpoint in a scratch workdir, then ``python -m trainer --mode export`` timed (wall and
   CPU seconds of the child);
3. ``serve_features`` and ``serve_lines`` at batch 4096 (test-day rows), samples/s and samples
   per CPU-second, against the trainer's inference-benchmark mode (``Trainer.run_inference_
   benchmark``, the code of ``--mode inference_benchmark``) at the same dims and batch, the
   three alternated ``--rounds`` times in one process.

Usage::

    .venv/bin/python bench/bench_serving.py --workdir workdir [--batch 4096] [--steps 30]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dlrm_contracts.layout import latest_export  # noqa: E402 — after the path set-up


def child_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run(argv: list[str]) -> tuple[dict, float, float]:
    """Run a child; its JSON summary, wall seconds and CPU seconds."""
    cpu, wall = child_cpu(), time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT)
    wall, cpu = time.perf_counter() - wall, child_cpu() - cpu
    if proc.returncode != 0:
        sys.exit(f"failed: {' '.join(argv)}\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1]), wall, cpu


def test_day_lines(workdir: Path) -> list[bytes]:
    """The test split's raw lines: the first half of the last day (plain files only)."""
    from dlrm_contracts.config import load_config

    config = load_config(workdir / "manifests" / "effective_config.yaml")
    raw = Path(config.input) if config.input else workdir / "raw"
    days = sorted(raw.glob("day_*"), key=lambda p: int(p.name.split("_")[1].split(".")[0]))
    lines = days[-1].read_bytes().split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    return lines[: (len(lines) + 1) // 2]


def agreement(workdir: Path, lines: list[bytes]) -> dict:
    import numpy as np
    import tensorflow as tf

    from dlrm_contracts.config import load_config
    from trainer.loop import Trainer
    from trainer.metrics import roc_auc

    run([sys.executable, "-m", "pipeline", "--workdir", str(workdir), "--stages", "export"])
    model = tf.saved_model.load(str(latest_export(workdir / "export")))
    out = model.signatures["serve_lines"](lines=tf.constant(lines), has_label=tf.fill([len(lines)], True))
    probability = out["probability"].numpy()
    kept = probability[out["reject_reason"].numpy() == b""]
    config = load_config(workdir / "manifests" / "effective_config.yaml").train
    trainer = Trainer(config, workdir / "binary", workdir)
    trainer.restore_latest(required=True)
    labels, predictions = trainer.predictions("test")
    reported = json.loads((workdir / "eval.json").read_text())["test_auc"]
    return {
        "rows": int(kept.size),
        "trainer_rows": int(predictions.size),
        "max_abs_diff": float(np.abs(kept - predictions).max()),
        "serve_lines_auc": roc_auc(labels, kept),
        "reported_test_auc": reported,
    }


def default_dims_export(workdir: Path, scratch: Path, batch: int) -> dict:
    """Export time at the default dims with the workdir's tables (one-step checkpoint)."""
    (scratch / "parquet").symlink_to(workdir / "parquet")
    trainer = [
        sys.executable,
        "-m",
        "trainer",
        "--dataset",
        str(workdir / "binary"),
        "--workdir",
        str(scratch),
        "--preset",
        "default",
        "--batch-size",
        str(batch),
        "--eval-batch-size",
        str(batch),
    ]
    run(trainer + ["--max-steps", "1", "--epochs", "1"])
    summary, wall, cpu = run(trainer + ["--mode", "export"])
    return {
        "export_wall_s": round(wall, 2),
        "export_cpu_s": round(cpu, 2),
        "export_inner_s": summary["seconds"],
        "saved_model_bytes": summary["saved_model_bytes"],
    }


def _timed(call, repeats: int) -> tuple[float, float]:
    """(wall, CPU) seconds of ``repeats`` calls, after one untimed call (tracing)."""
    call()
    cpu, start = time.process_time(), time.perf_counter()
    for _ in range(repeats):
        call()
    return time.perf_counter() - start, time.process_time() - cpu


def serving_speed(
    workdir: Path, scratch: Path, lines: list[bytes], batch: int, steps: int, rounds: int
) -> dict:
    """serve_features / serve_lines against the trainer's inference-benchmark step, alternated
    in one process (same thread pools, same moment of a shared machine's load)."""
    import numpy as np
    import tensorflow as tf

    from dlrm_contracts.config import TrainConfig
    from trainer.loop import Trainer, benchmark_inference

    config = TrainConfig(preset="default", batch_size=batch, eval_batch_size=batch, inference_steps=steps)
    trainer = Trainer(config, workdir / "binary", scratch)  # first: it sets the thread pools
    model = tf.saved_model.load(str(latest_export(scratch / "export")))
    batch_lines = (lines * (batch // len(lines) + 1))[:batch]
    fields = [line.rstrip(b"\r").split(b"\t") + [b""] * 40 for line in batch_lines]
    ints = tf.constant(np.array([[int(f) if f else -(2**63) for f in row[1:14]] for row in fields], np.int64))
    cats = tf.constant(np.array([row[14:40] for row in fields], object))
    text = tf.constant(batch_lines)
    labelled = tf.fill([len(batch_lines)], True)
    features, parse = model.signatures["serve_features"], model.signatures["serve_lines"]
    calls = {
        "serve_features": lambda: features(int_features=ints, cat_features=cats)["probability"].numpy(),
        "serve_lines": lambda: parse(lines=text, has_label=labelled)["probability"].numpy(),
    }
    figures: dict[str, list] = {}
    for _ in range(rounds):
        cpu = time.process_time()
        rate = benchmark_inference(trainer)["inference_samples_per_s"]
        cpu = time.process_time() - cpu
        figures.setdefault("inference_benchmark_samples_per_s", []).append(rate)
        # the mode's own figure leaves out its first (tracing) step; its CPU figure does not
        figures.setdefault("inference_benchmark_samples_per_cpu_s", []).append(
            round(max(2, steps) * batch / cpu, 1)
        )
        for name, call in calls.items():
            wall, cpu = _timed(call, steps)
            figures.setdefault(f"{name}_samples_per_s", []).append(round(steps * batch / wall, 1))
            figures.setdefault(f"{name}_samples_per_cpu_s", []).append(round(steps * batch / cpu, 1))
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workdir", required=True, help="a finished pipeline workdir")
    parser.add_argument("--batch", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=20, help="batches per timing")
    parser.add_argument("--rounds", type=int, default=3, help="alternations of the three timings")
    parser.add_argument("--skip-agreement", action="store_true")
    args = parser.parse_args()
    workdir = Path(args.workdir).resolve()
    lines = test_day_lines(workdir)
    result = {
        "batch": args.batch,
        "load_average_1min": os.getloadavg()[0],
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    if not args.skip_agreement:
        result["agreement"] = agreement(workdir, lines)
    with tempfile.TemporaryDirectory(prefix="bench_serving_") as scratch:
        result["default_dims"] = default_dims_export(workdir, Path(scratch), args.batch)
        result["default_dims"].update(
            serving_speed(workdir, Path(scratch), lines, args.batch, args.steps, args.rounds)
        )
    result["load_average_1min_after"] = os.getloadavg()[0]
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
