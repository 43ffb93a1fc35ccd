"""Benchmark of scheduled daily runs on drifting data: a warm-started model (``train.init:
previous``) against one trained from scratch on the same window, day after day, by the
next-day AUC (the newest day's test half, which no step trained on) and the wall clock.

    .venv/bin/python bench/bench_daily.py [--days 7] [--rows-per-day 100000] [--window 3]
        [--drift C1=0.001,C3=0.001,...] [--seed 2626] [--data-root /tmp/daily_bench]

The day files are generated once with drift (``--drift-column``: each day the popularity
order of those columns moves on by the fraction of their values, so frequent values fade and
newcomers appear, as in the real logs). Then the days land one after another in two workdirs
(stable ids, a window of ``--window`` days), each run preprocessing, converting, training and
evaluating; the two differ only in ``train.init``. It prints one line per day landed and
the mean difference of the next-day AUCs (warm - scratch) from the first day both trained.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_DRIFT = "C1=0.001,C3=0.001,C10=0.001,C12=0.001,C20=0.001"
STAGES = "preprocess,convert,train,eval"


def generate(args, raw: Path) -> None:
    if (raw / "generator_meta.json").is_file():
        return
    flags = [f"--drift-column={item}" for item in args.drift.split(",") if item]
    subprocess.run([sys.executable, "-m", "pipeline.generate", "--out", str(raw),
                    "--days", str(args.days), "--rows-per-day", str(args.rows_per_day),
                    "--seed", str(args.seed), *flags], check=True, cwd=REPO)


def config_text(init: str, window: int) -> str:
    return (f"preprocess: {{frequency_threshold: \"2\", ids: stable, window_days: {window}}}\n"
            f"spark: {{driver_memory: 4g}}\n"
            f"train: {{init: {init}}}\n")


def run_day(workdir: Path, landed: Path, config: Path) -> dict:
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pipeline", "--input", str(landed),
                           "--workdir", str(workdir), "--config", str(config),
                           "--stages", STAGES], cwd=REPO, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{workdir}: exit {proc.returncode}\n{proc.stderr[-3000:]}")
    summary = json.loads((workdir / "summary.json").read_text())
    return {"seconds": seconds, "next_day_auc": summary.get("next_day_auc"),
            "init": summary.get("init")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--days", type=int, default=7)
    parser.add_argument("--rows-per-day", type=int, default=100_000)
    parser.add_argument("--window", type=int, default=3)
    parser.add_argument("--drift", default=DEFAULT_DRIFT)
    parser.add_argument("--seed", type=int, default=2626)
    parser.add_argument("--data-root", default="/tmp/daily_bench")
    args = parser.parse_args()
    root = Path(args.data_root)
    raw = root / f"raw_{args.days}x{args.rows_per_day}_s{args.seed}_{args.drift.replace(',', '_')}"
    generate(args, raw)
    modes = {}
    for init in ("previous", "scratch"):
        work, landed = root / f"work_{init}", root / f"landed_{init}"
        for path in (work, landed):
            shutil.rmtree(path, ignore_errors=True)
        landed.mkdir(parents=True)
        config = root / f"daily_{init}.yaml"
        config.write_text(config_text(init, args.window))
        modes[init] = (work, landed, config)
    print(f"{args.days} days x {args.rows_per_day:,} rows, window {args.window}, drift "
          f"{args.drift}; stages {STAGES}", flush=True)
    differences = []
    for day in range(args.days):
        row = {}
        for init, (work, landed, config) in modes.items():
            os.link(raw / f"day_{day}", landed / f"day_{day}")
            if day + 1 < args.window:
                continue                      # the window's first run waits for W days
            row[init] = run_day(work, landed, config)
        if not row:
            continue
        warm, cold = row["previous"], row["scratch"]
        line = (f"day {day} landed: warm-started ({warm['init']}) next-day AUC "
                f"{warm['next_day_auc']:.4f} in {warm['seconds']:.1f} s, from scratch "
                f"{cold['next_day_auc']:.4f} in {cold['seconds']:.1f} s")
        if warm["init"] == "previous":
            differences.append(warm["next_day_auc"] - cold["next_day_auc"])
            line += f", difference {differences[-1]:+.4f}"
        print(line, flush=True)
    if differences:
        print(f"warm - scratch next-day AUC over {len(differences)} warm-started days: mean "
              f"{sum(differences) / len(differences):+.4f}, worst {min(differences):+.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
