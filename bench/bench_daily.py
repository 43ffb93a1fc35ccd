"""Benchmark of scheduled daily runs on drifting data: a warm-started model (``train.init:
previous``) against one trained from scratch on the same window, day after day, by the
next-day AUC (the newest day's test half, which no step trained on) and the wall clock.

    .venv/bin/python bench/bench_daily.py [--days 7] [--rows-per-day 100000] [--window 3]
        [--drift C1=0.001,C3=0.001,...] [--seed 2626] [--data-root /tmp/daily_bench]
        [--modes window,scratch] [--one-day] [--epochs 1] [--patience 0]
        [--stages preprocess,convert,train,eval]

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
+ train from the run's summary): the daily target is <= 1.5 days whatever the window. Half
the 2-day run also halves the fixed costs (Spark and TensorFlow start-up, the evaluations)
that a daily run pays whole, and it trains one day, not two; so preprocess + convert + train
is also given against the whole 2-day run, the smallest run that trains one day, and against
the target's unit read literally: preprocessing and converting one day (half the 2-day run's)
plus training one day (the 2-day run's whole training, which is of day 0 alone).

Every workdir, the one-day reference's included, trains for a fixed length (``--epochs``,
default 1, early stopping off with ``--patience 0``): with early stopping a run's training
length follows its validation curve, not its rows, and a cost ratio would measure that
instead. Cost is given in CPU seconds as well as wall seconds, since the machine is usually
shared and CPU seconds move much less with its load. They are the summary's own
``cpu_seconds`` per stage (the pipeline's process tree while the stage ran, the Spark JVM
included), summed over the run's stages for the whole run; the pipeline process's reaped
descendants (``RUSAGE_CHILDREN`` around the run) are printed beside them, but miss the Spark
JVM, which is not waited for. Each run's line also gives the preprocess job's own CPU
seconds per phase (``parquet/preprocess.json``: count, which includes the merge of the
window's stored counts, dictionaries, transform). ``--stages preprocess`` measures the
preprocess job alone (no AUC then), e.g. how its count merge grows with the window.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_DRIFT = "C1=0.001,C3=0.001,C10=0.001,C12=0.001,C20=0.001"
STAGES = "preprocess,convert,train,eval"
# --modes: (train.init, train.days) of each workdir
MODES = {"window": ("previous", "window"), "new": ("previous", "new"), "scratch": ("scratch", "window")}


def generate(args, raw: Path) -> None:
    if (raw / "generator_meta.json").is_file():
        return
    flags = [f"--drift-column={item}" for item in args.drift.split(",") if item]
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pipeline.generate",
            "--out",
            str(raw),
            "--days",
            str(args.days),
            "--rows-per-day",
            str(args.rows_per_day),
            "--seed",
            str(args.seed),
            *flags,
        ],
        check=True,
        cwd=REPO,
    )


def config_text(mode: str, window: int, epochs: int, patience: int) -> str:
    init, days = MODES[mode]
    return (
        f'preprocess: {{frequency_threshold: "2", ids: stable, window_days: {window}}}\n'
        f"spark: {{driver_memory: 4g}}\n"
        f"train: {{init: {init}, days: {days}, epochs: {epochs}, "
        f"early_stopping_patience: {patience}}}\n"
    )


def stage_figure(summary: dict, key: str, stages=("preprocess", "convert", "train")) -> float:
    """The stages' total of one figure of the pipeline's summary ("seconds", "cpu_seconds")."""
    return sum(float((summary.get("stages") or {}).get(stage, {}).get(key) or 0.0) for stage in stages)


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_day(workdir: Path, landed: Path, config: Path, stages: str = STAGES) -> dict:
    start, cpu_start = time.perf_counter(), children_cpu()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipeline",
            "--input",
            str(landed),
            "--workdir",
            str(workdir),
            "--config",
            str(config),
            "--stages",
            stages,
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    seconds, cpu = time.perf_counter() - start, children_cpu() - cpu_start
    if proc.returncode != 0:
        raise SystemExit(f"{workdir}: exit {proc.returncode}\n{proc.stderr[-3000:]}")
    summary = json.loads((workdir / "summary.json").read_text())
    stages_done = summary.get("stages") or {}
    job = workdir / "parquet" / "preprocess.json"
    phases = json.loads(job.read_text()).get("cpu_seconds", {}) if job.is_file() else {}
    return {
        "seconds": seconds,
        "cpu": stage_figure(summary, "cpu_seconds", stages.split(",")),
        "reaped_cpu": cpu,
        "next_day_auc": summary.get("next_day_auc"),
        "init": summary.get("init"),
        "days_trained": summary.get("days_trained"),
        "pct_seconds": stage_figure(summary, "seconds"),
        "pct_cpu": stage_figure(summary, "cpu_seconds"),
        # per stage, to see which one grows with the window
        "stage_cpu": {name: (stages_done.get(name) or {}).get("cpu_seconds") for name in stages.split(",")},
        # the preprocess job's phases (the count includes the merge of stored counts)
        "phase_cpu": {k: v for k, v in phases.items() if k != "total"},
    }


def describe(r: dict, unit: dict | None) -> str:
    """A run's cost: CPU-s and wall s, and in days of the one-day reference when measured."""
    text = f"{r['cpu']:.1f} CPU-s ({r['reaped_cpu']:.1f} reaped), {r['seconds']:.1f} s wall"
    if unit:
        text += (
            f" = {r['cpu'] / unit['cpu']:.2f} days by CPU (preprocess+convert+train "
            f"{r['pct_cpu'] / unit['pct_cpu']:.2f}; {r['pct_cpu'] / unit['pair_pct_cpu']:.2f}"
            f" of the whole 2-day run; {r['pct_cpu'] / unit['day_pct_cpu']:.2f} of one "
            f"day's preprocess+convert and training), {r['seconds'] / unit['seconds']:.2f} "
            f"by wall (preprocess+convert+train {r['pct_seconds'] / unit['pct_seconds']:.2f})"
        )
    stage_cpu = ", ".join(f"{name} {cpu:.1f}" for name, cpu in r["stage_cpu"].items() if cpu is not None)
    phases = ", ".join(f"{name} {cpu:.1f}" for name, cpu in r["phase_cpu"].items())
    return text + f" [stage CPU-s: {stage_cpu}; preprocess job CPU-s: {phases}]"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--days", type=int, default=7)
    parser.add_argument("--rows-per-day", type=int, default=100_000)
    parser.add_argument("--window", type=int, default=3)
    parser.add_argument("--drift", default=DEFAULT_DRIFT)
    parser.add_argument("--seed", type=int, default=2626)
    parser.add_argument("--data-root", default="/tmp/daily_bench")
    parser.add_argument(
        "--modes",
        default="window,scratch",
        help="comma-separated workdirs: window, new, scratch; the last is the "
        "reference of the AUC differences",
    )
    parser.add_argument(
        "--one-day", action="store_true", help="first measure one day's cost (half a fresh 2-day run)"
    )
    parser.add_argument(
        "--epochs", type=int, default=1, help="train.epochs of every run (a fixed training length)"
    )
    parser.add_argument(
        "--patience", type=int, default=0, help="train.early_stopping_patience of every run (0 = off)"
    )
    parser.add_argument(
        "--stages", default=STAGES, help="the pipeline's stages of every run (without eval: no AUC)"
    )
    args = parser.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    unknown = [m for m in modes if m not in MODES]
    if unknown or not modes:
        parser.error(f"--modes: unknown {unknown}; known: {', '.join(MODES)}")
    root = Path(args.data_root)
    raw = root / f"raw_{args.days}x{args.rows_per_day}_s{args.seed}_{args.drift.replace(',', '_')}"
    generate(args, raw)
    print(
        f"training: epochs {args.epochs}, early stopping "
        f"{'patience ' + str(args.patience) if args.patience else 'off'} in every run",
        flush=True,
    )
    unit = one_day(root, raw, args) if args.one_day else None
    dirs = {}
    for mode in modes:
        work, landed = root / f"work_{mode}", root / f"landed_{mode}"
        for path in (work, landed):
            shutil.rmtree(path, ignore_errors=True)
        landed.mkdir(parents=True)
        config = root / f"daily_{mode}.yaml"
        config.write_text(config_text(mode, args.window, args.epochs, args.patience))
        dirs[mode] = (work, landed, config)
    print(
        f"{args.days} days x {args.rows_per_day:,} rows, window {args.window}, drift "
        f"{args.drift}; stages {args.stages}; modes {', '.join(modes)}",
        flush=True,
    )
    differences: dict[str, list[float]] = {m: [] for m in modes[:-1]}
    for day in range(args.days):
        row = {}
        for mode, (work, landed, config) in dirs.items():
            os.link(raw / f"day_{day}", landed / f"day_{day}")
            if day + 1 < args.window:
                continue  # the window's first run waits for W days
            row[mode] = run_day(work, landed, config, args.stages)
        if not row:
            continue
        reference = row[modes[-1]]
        parts = []
        for mode in modes:
            r = row[mode]
            auc = "n/a" if r["next_day_auc"] is None else f"{r['next_day_auc']:.4f}"
            part = (
                f"{mode} ({r['init']}, days {r['days_trained']}): next-day AUC {auc} in {describe(r, unit)}"
            )
            if (
                mode != modes[-1]
                and r["init"] == "previous"
                and r["next_day_auc"] is not None
                and reference["next_day_auc"] is not None
            ):
                differences[mode].append(r["next_day_auc"] - reference["next_day_auc"])
                part += f", {differences[mode][-1]:+.4f} against {modes[-1]}"
            parts.append(part)
        print(f"day {day} landed: " + "; ".join(parts), flush=True)
    for mode, diffs in differences.items():
        if diffs:
            print(
                f"{mode} - {modes[-1]} next-day AUC over {len(diffs)} warm-started days: mean "
                f"{sum(diffs) / len(diffs):+.4f}, worst {min(diffs):+.4f}"
            )
    return 0


def one_day(root: Path, raw: Path, args) -> dict:
    """One day's cost (whole run and preprocess + convert + train; wall and CPU seconds): half
    a fresh workdir's run on days 0-1 from scratch, with the daily runs' training length."""
    work, landed = root / "work_one_day", root / "landed_one_day"
    for path in (work, landed):
        shutil.rmtree(path, ignore_errors=True)
    landed.mkdir(parents=True)
    for day in (0, 1):
        os.link(raw / f"day_{day}", landed / f"day_{day}")
    config = root / "daily_one_day.yaml"
    config.write_text(config_text("scratch", args.window, args.epochs, args.patience))
    result = run_day(work, landed, config, args.stages)
    unit = {key: result[key] / 2 for key in ("seconds", "cpu", "pct_seconds", "pct_cpu")}
    # The whole 2-day run is the smallest that trains one day (one train day, one test day),
    # fixed costs (Spark and TensorFlow start-up, evaluation) paid once, as a daily run pays
    # them: the second reference.
    unit["pair_pct_cpu"] = result["pct_cpu"]
    # The target's unit read literally: preprocessing and converting one day (half the 2-day
    # run's) and training one day (the 2-day run's whole training: it trains day 0 only).
    stage = {name: cpu or 0.0 for name, cpu in result["stage_cpu"].items()}
    unit["day_pct_cpu"] = (stage.get("preprocess", 0.0) + stage.get("convert", 0.0)) / 2 + stage.get(
        "train", 0.0
    )
    print(
        f"one day (half of days 0-1 from scratch): {unit['cpu']:.1f} CPU-s whole run, "
        f"{unit['pct_cpu']:.1f} CPU-s preprocess+convert+train; wall {unit['seconds']:.1f} s "
        f"and {unit['pct_seconds']:.1f} s [the 2-day run's stage CPU-s: "
        f"{result['stage_cpu']}]",
        flush=True,
    )
    return unit


if __name__ == "__main__":
    sys.exit(main())
