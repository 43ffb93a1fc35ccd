"""Benchmark of scheduled daily runs on drifting data: a warm-started model (``train.init:
previous``) against one trained from scratch on the same window, day after day, by the
next-day AUC (the newest day's test half, which no step trained on) and the wall clock.

    .venv/bin/python bench/bench_daily.py [--days 7] [--rows-per-day 100000] [--window 3]
        [--drift C1=0.001,C3=0.001,...] [--seed 2626] [--data-root /tmp/daily_bench]
        [--modes window,scratch] [--one-day]

The day files are generated once with drift (``--drift-column``: each day the popularity
order of those columns moves on by the fraction of their values, so frequent values fade and
newcomers appear, as in the real logs). Then the days land one after another in one workdir
per mode (stable ids, a window of ``--window`` days), each run preprocessing, converting, training and
evaluating; the workdirs differ only in how they train (``--modes``: ``window`` = warm start
on the whole window, ``new`` = warm start on the days the previous model has not seen
(``train.days: new``), ``scratch`` = from scratch on the window). It prints one line per day
landed and the mean difference of each mode's next-day AUC from the last mode's (the
reference, by default scratch) from the first day all trained.

``--one-day`` first runs days 0-1 from scratch in a fresh workdir: half of it is the cost of
one day, and every run's line then gives its cost in days (whole run, and preprocess + convert
+ train from the run's summary): issue 25's target is <= 1.5 days whatever the window.
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
# --modes: (train.init, train.days) of each workdir
MODES = {"window": ("previous", "window"), "new": ("previous", "new"),
         "scratch": ("scratch", "window")}


def generate(args, raw: Path) -> None:
    if (raw / "generator_meta.json").is_file():
        return
    flags = [f"--drift-column={item}" for item in args.drift.split(",") if item]
    subprocess.run([sys.executable, "-m", "pipeline.generate", "--out", str(raw),
                    "--days", str(args.days), "--rows-per-day", str(args.rows_per_day),
                    "--seed", str(args.seed), *flags], check=True, cwd=REPO)


def config_text(mode: str, window: int) -> str:
    init, days = MODES[mode]
    return (f"preprocess: {{frequency_threshold: \"2\", ids: stable, window_days: {window}}}\n"
            f"spark: {{driver_memory: 4g}}\n"
            f"train: {{init: {init}, days: {days}}}\n")


def stage_seconds(summary: dict, stages=("preprocess", "convert", "train")) -> float:
    """The seconds the stages took in this run (the pipeline's summary)."""
    return sum(float((summary.get("stages") or {}).get(stage, {}).get("seconds") or 0.0)
               for stage in stages)


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
            "init": summary.get("init"), "days_trained": summary.get("days_trained"),
            "pct_seconds": stage_seconds(summary)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--days", type=int, default=7)
    parser.add_argument("--rows-per-day", type=int, default=100_000)
    parser.add_argument("--window", type=int, default=3)
    parser.add_argument("--drift", default=DEFAULT_DRIFT)
    parser.add_argument("--seed", type=int, default=2626)
    parser.add_argument("--data-root", default="/tmp/daily_bench")
    parser.add_argument("--modes", default="window,scratch",
                        help="comma-separated workdirs: window, new, scratch; the last is the "
                             "reference of the AUC differences")
    parser.add_argument("--one-day", action="store_true",
                        help="first measure one day's cost (half a fresh 2-day run)")
    args = parser.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    unknown = [m for m in modes if m not in MODES]
    if unknown or not modes:
        parser.error(f"--modes: unknown {unknown}; known: {', '.join(MODES)}")
    root = Path(args.data_root)
    raw = root / f"raw_{args.days}x{args.rows_per_day}_s{args.seed}_{args.drift.replace(',', '_')}"
    generate(args, raw)
    unit = one_day(root, raw, args.window) if args.one_day else None
    dirs = {}
    for mode in modes:
        work, landed = root / f"work_{mode}", root / f"landed_{mode}"
        for path in (work, landed):
            shutil.rmtree(path, ignore_errors=True)
        landed.mkdir(parents=True)
        config = root / f"daily_{mode}.yaml"
        config.write_text(config_text(mode, args.window))
        dirs[mode] = (work, landed, config)
    print(f"{args.days} days x {args.rows_per_day:,} rows, window {args.window}, drift "
          f"{args.drift}; stages {STAGES}; modes {', '.join(modes)}", flush=True)
    differences: dict[str, list[float]] = {m: [] for m in modes[:-1]}
    for day in range(args.days):
        row = {}
        for mode, (work, landed, config) in dirs.items():
            os.link(raw / f"day_{day}", landed / f"day_{day}")
            if day + 1 < args.window:
                continue                      # the window's first run waits for W days
            row[mode] = run_day(work, landed, config)
        if not row:
            continue
        reference = row[modes[-1]]
        parts = []
        for mode in modes:
            r = row[mode]
            part = (f"{mode} ({r['init']}, days {r['days_trained']}): next-day AUC "
                    f"{r['next_day_auc']:.4f} in {r['seconds']:.1f} s")
            if unit:
                part += (f" = {r['seconds'] / unit[0]:.2f} days (preprocess+convert+train "
                         f"{r['pct_seconds'] / unit[1]:.2f})")
            if mode != modes[-1] and r["init"] == "previous":
                differences[mode].append(r["next_day_auc"] - reference["next_day_auc"])
                part += f", {differences[mode][-1]:+.4f} against {modes[-1]}"
            parts.append(part)
        print(f"day {day} landed: " + "; ".join(parts), flush=True)
    for mode, diffs in differences.items():
        if diffs:
            print(f"{mode} - {modes[-1]} next-day AUC over {len(diffs)} warm-started days: mean "
                  f"{sum(diffs) / len(diffs):+.4f}, worst {min(diffs):+.4f}")
    return 0


def one_day(root: Path, raw: Path, window: int) -> tuple[float, float]:
    """(whole run, preprocess + convert + train) seconds of one day: half a fresh workdir's
    run on days 0-1 from scratch."""
    work, landed = root / "work_one_day", root / "landed_one_day"
    for path in (work, landed):
        shutil.rmtree(path, ignore_errors=True)
    landed.mkdir(parents=True)
    for day in (0, 1):
        os.link(raw / f"day_{day}", landed / f"day_{day}")
    config = root / "daily_one_day.yaml"
    config.write_text(config_text("scratch", window))
    result = run_day(work, landed, config)
    unit = (result["seconds"] / 2, result["pct_seconds"] / 2)
    print(f"one day (half of days 0-1 from scratch): {unit[0]:.1f} s whole run, "
          f"{unit[1]:.1f} s preprocess+convert+train", flush=True)
    return unit

if __name__ == "__main__":
    sys.exit(main())
