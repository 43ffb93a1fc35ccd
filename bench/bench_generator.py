"""Throughput of the synthetic Criteo generator: rows/s and MB/s of written day files.

    .venv/bin/python bench/bench_generator.py [--days 2] [--rows-per-day 500000]
        [--workers 2,1] [--gzip] [--keep DIR]

Each worker count writes the same data (same seed) into a fresh temporary directory; the
figure covers everything ``generate`` does (pool start, sampling, planted model, formatting,
compression, writing, Bayes AUC). Wall-clock rows/s depends on what else runs on the
machine, so the CPU seconds used (this process and its forked workers) and the load average
are printed too: rows per CPU-second times free cores is the figure on an idle machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import resource
import shutil
import tempfile
import time
from pathlib import Path

from dlrm_contracts.config import GeneratorConfig
from pipeline.synthetic import generate


def cpu_seconds() -> float:
    """User + system CPU of this process and its finished children (the forked workers)."""
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        total += usage.ru_utime + usage.ru_stime
    return total


def run_once(config: GeneratorConfig, out: Path) -> dict:
    cpu = cpu_seconds()
    start = time.perf_counter()
    meta = generate(out, config)
    seconds = time.perf_counter() - start
    cpu = cpu_seconds() - cpu
    size = sum(d["bytes"] for d in meta["days"])
    return {
        "workers": config.workers,
        "rows": meta["rows"],
        "seconds": seconds,
        "rows_per_s": meta["rows"] / seconds,
        "mb_per_s": size / seconds / 1e6,
        "mb": size / 1e6,
        "bayes_auc": meta["bayes_auc"],
        "cpu": cpu,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--days", type=int, default=2)
    p.add_argument("--rows-per-day", type=int, default=500_000)
    p.add_argument("--workers", default="2,1", help="comma-separated worker counts to measure")
    p.add_argument("--gzip", action="store_true")
    p.add_argument("--cardinality-scale", type=float, default=GeneratorConfig.cardinality_scale)
    p.add_argument("--keep", help="write here instead of a temporary directory (kept)")
    args = p.parse_args()
    base = GeneratorConfig(
        days=args.days,
        rows_per_day=args.rows_per_day,
        gzip=args.gzip,
        cardinality_scale=args.cardinality_scale,
    )
    print(
        f"generator benchmark: {args.days} days x {args.rows_per_day} rows, "
        f"gzip={args.gzip}, cardinality_scale={args.cardinality_scale}"
    )
    for workers in [int(w) for w in args.workers.split(",")]:
        config = dataclasses.replace(base, workers=workers)
        root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="bench-gen-"))
        out = root / f"workers{workers}"
        try:
            r = run_once(config, out)
        finally:
            if not args.keep:
                shutil.rmtree(root, ignore_errors=True)
        print(
            f"workers={r['workers']}: {r['rows']} rows in {r['seconds']:.2f} s = "
            f"{r['rows_per_s']:,.0f} rows/s, {r['mb_per_s']:.1f} MB/s "
            f"({r['mb']:.0f} MB, Bayes AUC {r['bayes_auc']:.4f}); CPU {r['cpu']:.1f} s = "
            f"{r['rows'] / r['cpu']:,.0f} rows per CPU-second; "
            f"1-min load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
        )


if __name__ == "__main__":
    main()
