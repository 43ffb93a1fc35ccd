"""Benchmark of spark_jobs: rows/s per stage and end to end, and the ratio to the reference.

The reference flow of the seed (count/dictionaries, then three separate transform jobs with a
re-sort for test/validation) ran 8M rows (4 days x 2M) in 355.5 s on this machine type:
22.5k rows/s. Usage:

    .venv/bin/python bench/bench_spark.py                       # 4 days x 2M rows (8M)
    .venv/bin/python bench/bench_spark.py --terabyte-shape      # 24 days x 1M rows, day_23 eval
    .venv/bin/python bench/bench_spark.py --days 4 --rows-per-day 250000   # quick look
    .venv/bin/python bench/bench_spark.py --repeat 3            # 3 fresh JVMs: best and median

On a shared VM the same run can vary by 15-20% within an hour: compare figures taken at the
same time, and prefer ``--repeat``.

Input is generated once (python -m pipeline.generate, default shape) under --data-root and
reused; the workdir is wiped before each run so counting is measured from scratch.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from pipeline.config import PreprocessConfig, SparkConfig  # noqa: E402

REFERENCE_ROWS_PER_SECOND = 22_500


def ensure_input(root: Path, days: int, rows_per_day: int, seed: int) -> Path:
    raw = root / f"raw_{days}x{rows_per_day}_s{seed}"
    if not (raw / f"day_{days - 1}").exists():
        shutil.rmtree(raw, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "pipeline.generate", "--out", str(raw),
                        "--days", str(days), "--rows-per-day", str(rows_per_day),
                        "--seed", str(seed)], check=True, cwd=REPO)
    return raw


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--days", type=int, default=4)
    p.add_argument("--rows-per-day", type=int, default=2_000_000)
    p.add_argument("--terabyte-shape", action="store_true", help="24 days x 1M rows")
    p.add_argument("--seed", type=int, default=20240601)
    p.add_argument("--data-root", default="/tmp/spark_jobs_bench")
    p.add_argument("--threshold", default=PreprocessConfig().frequency_threshold)
    p.add_argument("--master", default="local[2]")
    p.add_argument("--driver-memory", default="12g")
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--repeat", type=int, default=1,
                   help="run N times, each in a fresh process (cold JVM), and summarise")
    args = p.parse_args()
    if args.repeat > 1:
        return repeat(args.repeat)
    if args.terabyte_shape:
        args.days, args.rows_per_day = 24, 1_000_000
    root = Path(args.data_root)
    raw = ensure_input(root, args.days, args.rows_per_day, args.seed)
    work = root / f"work_{args.days}x{args.rows_per_day}"
    shutil.rmtree(work, ignore_errors=True)

    from spark_jobs.preprocess import run_preprocess
    from spark_jobs.session import parse_conf_pairs

    spark = SparkConfig(master=args.master, driver_memory=args.driver_memory,
                        conf=parse_conf_pairs(args.conf))
    start = time.perf_counter()
    summary = run_preprocess(raw, work, spark, PreprocessConfig(frequency_threshold=args.threshold))
    wall = time.perf_counter() - start

    rows_in = summary["data_quality"]["rows_read"]
    rows = summary["rows"]
    t = summary["timings"]
    stages = [("count (parse + stats + counts + histogram)", rows_in, t["count"]),
              ("dictionaries", rows_in, t["dictionaries"]),
              ("transform (train + test + validation, one query)",
               rows["train"] + rows["test"] + rows["validation"], t["transform"]),
              ("end to end (incl. session start)", rows_in, wall)]
    print(f"input: {args.days} days x {args.rows_per_day} rows = {rows_in} rows, "
          f"threshold {summary['threshold_spec']}, master {args.master}, "
          f"driver memory {args.driver_memory}")
    for name, n, seconds in stages:
        print(f"{name:45s} {n:>11,d} rows {seconds:8.1f} s {n / seconds:>12,.0f} rows/s")
    ratio = rows_in / wall / REFERENCE_ROWS_PER_SECOND
    print(f"ratio to the reference ({REFERENCE_ROWS_PER_SECOND:,} rows/s): {ratio:.2f}x")
    print(json.dumps({"rows_in": rows_in, "wall_seconds": round(wall, 1), "timings": t,
                      "rows": rows, "ratio_to_reference": round(ratio, 2),
                      "max_table_size": max(summary["table_sizes"].values())}))
    return 0


def repeat(times: int) -> int:
    """Run this script ``times`` times in fresh processes; print every run, the best, the median."""
    import statistics

    argv = [*sys.argv[1:], "--repeat", "1"]  # the same run once (argparse keeps the last value)
    runs = []
    for n in range(times):
        out = subprocess.run([sys.executable, __file__, *argv], check=True, cwd=REPO,
                             stdout=subprocess.PIPE, text=True).stdout
        result = json.loads(out.strip().splitlines()[-1])
        runs.append(result)
        t = result["timings"]
        print(f"run {n + 1}: end to end {result['wall_seconds']:.1f} s "
              f"(count {t['count']:.1f}, dictionaries {t['dictionaries']:.1f}, "
              f"transform {t['transform']:.1f}) = {result['ratio_to_reference']:.2f}x", flush=True)
    walls = sorted(r["wall_seconds"] for r in runs)
    best, median = walls[0], statistics.median(walls)
    rows_in = runs[0]["rows_in"]
    print(f"best {best:.1f} s = {rows_in / best / REFERENCE_ROWS_PER_SECOND:.2f}x, "
          f"median {median:.1f} s = {rows_in / median / REFERENCE_ROWS_PER_SECOND:.2f}x "
          f"the reference, over {times} runs")
    print(json.dumps({"runs": runs, "best_seconds": best, "median_seconds": median}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
