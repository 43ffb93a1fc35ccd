"""Benchmark of spark_jobs: per stage rows/s and CPU-seconds per million rows, for each engine,
with the reference's figures and a same-run yardstick beside them.

The reference flow of the seed (NVIDIA's DLRM preproc, run_spark_cpu.sh steps with local[2]
and 12g) took 355.5-397.0 s for 8M rows (4 days x 2M) on this machine type: 20.2k-22.5k rows/s.
This machine's speed drifts between hours, so the script also times, in the same run, one
multi-threaded ``pyarrow.csv.read_csv`` of the same files (tab delimiter, 64 MB blocks) and
prints end to end / that parse (the "CSV ratio"; 6x the reference is about 5x here). Usage:

    .venv/bin/python bench/bench_spark.py                          # 4 days x 2M rows (8M), both engines
    .venv/bin/python bench/bench_spark.py --engine arrow           # one engine
    .venv/bin/python bench/bench_spark.py --terabyte-shape         # 24 days x 1M rows, day_23 eval
    .venv/bin/python bench/bench_spark.py --input /data/criteo     # your own day files
    .venv/bin/python bench/bench_spark.py --repeat 3               # 3 fresh JVMs per engine

Each engine runs in a fresh process (cold JVM) on a wiped workdir, so every day is counted from
scratch. CPU seconds are those of the process tree (JVM + Python workers) per stage. The Python
workers' peak RSS is sampled every 0.2 s.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from dlrm_contracts.config import PreprocessConfig, SparkConfig  # noqa: E402

REFERENCE_SECONDS_8M = (355.5, 397.0)        # the seed's flow, 8M rows, this machine type
REFERENCE_ROWS_PER_SECOND = 8_000_000 / REFERENCE_SECONDS_8M[0]


def ensure_input(root: Path, days: int, rows_per_day: int, seed: int) -> Path:
    raw = root / f"raw_{days}x{rows_per_day}_s{seed}"
    if not (raw / f"day_{days - 1}").exists():
        shutil.rmtree(raw, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "pipeline.generate", "--out", str(raw),
                        "--days", str(days), "--rows-per-day", str(rows_per_day),
                        "--seed", str(seed)], check=True, cwd=REPO)
    return raw


def csv_parse_seconds(raw: Path) -> float:
    """One multi-threaded pyarrow CSV parse of every day file: the same-run yardstick."""
    import pyarrow as pa
    import pyarrow.csv as pv

    from dlrm_contracts.schema import ALL_COLUMNS, CAT_COLUMNS

    names = list(ALL_COLUMNS)
    options = dict(read_options=pv.ReadOptions(column_names=names, block_size=64 << 20),
                   parse_options=pv.ParseOptions(delimiter="\t", quote_char=False),
                   convert_options=pv.ConvertOptions(column_types={c: pa.string() for c in CAT_COLUMNS}))
    start = time.perf_counter()
    for path in sorted(raw.glob("day_*")):
        table = pv.read_csv(path, **options)
        del table
    return time.perf_counter() - start


class WorkerMemory:
    """Peak RSS of the Python workers (descendants of the JVM that run Python)."""

    def __init__(self):
        self.peak_single = 0
        self.peak_total = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        import psutil

        me = psutil.Process()
        while not self._stop.wait(0.2):
            rss = []
            for process in me.children(recursive=True):
                try:
                    if "python" in process.name():
                        rss.append(process.memory_info().rss)
                except psutil.Error:
                    pass
            if rss:
                self.peak_single = max(self.peak_single, max(rss))
                self.peak_total = max(self.peak_total, sum(rss))

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def run_once(args) -> dict:
    """One engine, one fresh workdir, this process: the figures as a dict."""
    from spark_jobs.preprocess import process_tree_cpu_seconds, run_preprocess
    from spark_jobs.session import parse_conf_pairs

    raw = Path(args.input)
    work = Path(args.data_root) / f"work_{raw.name}_{args.engine}"
    shutil.rmtree(work, ignore_errors=True)
    spark = SparkConfig(master=args.master, driver_memory=args.driver_memory,
                        conf=parse_conf_pairs(args.conf))
    cfg = PreprocessConfig(frequency_threshold=args.threshold, engine=args.engine)
    start, cpu = time.perf_counter(), process_tree_cpu_seconds()
    with WorkerMemory() as memory:
        summary = run_preprocess(raw, work, spark, cfg)
    wall = time.perf_counter() - start
    total_cpu = process_tree_cpu_seconds() - cpu
    shutil.rmtree(work, ignore_errors=True)
    return {"engine": summary["engine"], "rows_in": summary["data_quality"]["rows_read"],
            "rows": summary["rows"], "wall_seconds": round(wall, 1),
            "cpu_seconds_total": round(total_cpu, 1), "timings": summary["timings"],
            "cpu_seconds": summary["cpu_seconds"],
            "worker_peak_rss_mb": round(memory.peak_single / 2**20),
            "workers_peak_rss_total_mb": round(memory.peak_total / 2**20),
            "max_table_size": max(summary["table_sizes"].values())}


def print_run(result: dict, csv_seconds: float) -> None:
    n = result["rows_in"]
    t, c = result["timings"], result["cpu_seconds"]
    print(f"engine {result['engine']}: {n:,} rows")
    for stage in ("count", "dictionaries", "transform"):
        print(f"  {stage:13s} {t[stage]:7.1f} s {n / t[stage]:>12,.0f} rows/s "
              f"{c[stage] / n * 1e6:7.2f} CPU-s per 1M rows")
    wall = result["wall_seconds"]
    print(f"  {'end to end':13s} {wall:7.1f} s {n / wall:>12,.0f} rows/s "
          f"{result['cpu_seconds_total'] / n * 1e6:7.2f} CPU-s per 1M rows (session start included)")
    print(f"  = {n / wall / REFERENCE_ROWS_PER_SECOND:.2f}x the reference's rows/s "
          f"({REFERENCE_ROWS_PER_SECOND:,.0f} rows/s: 8M rows in {REFERENCE_SECONDS_8M[0]} s); "
          f"CSV ratio {wall / csv_seconds:.2f} (end to end / pyarrow CSV parse {csv_seconds:.1f} s)")
    print(f"  Python workers' peak RSS: {result['worker_peak_rss_mb']} MB for one worker, "
          f"{result['workers_peak_rss_total_mb']} MB for all together")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--input", help="a directory of day files (default: generated)")
    p.add_argument("--days", type=int, default=4)
    p.add_argument("--rows-per-day", type=int, default=2_000_000)
    p.add_argument("--terabyte-shape", action="store_true", help="24 days x 1M rows")
    p.add_argument("--seed", type=int, default=20240601)
    p.add_argument("--data-root", default="/tmp/spark_jobs_bench")
    p.add_argument("--threshold", default=PreprocessConfig().frequency_threshold)
    p.add_argument("--engine", default="both", choices=["arrow", "sql", "both"])
    p.add_argument("--master", default="local[2]")
    p.add_argument("--driver-memory", default="12g")
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--repeat", type=int, default=1, help="fresh processes per engine")
    p.add_argument("--once", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.once:
        print(json.dumps(run_once(args)))
        return 0
    if args.terabyte_shape:
        args.days, args.rows_per_day = 24, 1_000_000
    if not args.input:
        args.input = str(ensure_input(Path(args.data_root), args.days, args.rows_per_day, args.seed))
    print(f"input {args.input}, threshold {args.threshold}, master {args.master}, "
          f"driver memory {args.driver_memory}", flush=True)
    engines = ["arrow", "sql"] if args.engine == "both" else [args.engine]
    results = {}
    for _ in range(args.repeat):
        for engine in engines:
            csv_seconds = csv_parse_seconds(Path(args.input))
            argv = ["--input", args.input, "--engine", engine, "--threshold", args.threshold,
                    "--master", args.master, "--driver-memory", args.driver_memory,
                    "--data-root", args.data_root, *[f"--conf={c}" for c in args.conf], "--once"]
            out = subprocess.run([sys.executable, __file__, *argv], check=True, cwd=REPO,
                                 stdout=subprocess.PIPE, text=True).stdout
            result = json.loads(out.strip().splitlines()[-1])
            result["csv_parse_seconds"] = round(csv_seconds, 2)
            results.setdefault(engine, []).append(result)
            print_run(result, csv_seconds)
            print(json.dumps(result), flush=True)
    for engine, runs in results.items():
        walls = [r["wall_seconds"] for r in runs]
        ratios = [r["wall_seconds"] / r["csv_parse_seconds"] for r in runs]
        print(f"{engine}: best {min(walls):.1f} s, median {statistics.median(walls):.1f} s "
              f"over {len(runs)} run(s); CSV ratio best {min(ratios):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
