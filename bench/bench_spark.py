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
    .venv/bin/python bench/bench_spark.py --high-cardinality       # 4 x 2.5M rows, ordinary vs five
                                                                   # columns uniform over 2.5M values
    .venv/bin/python bench/bench_spark.py --high-cardinality --rows-per-day 5000000 \
        --uniform-values 5000000                                   # the same, twice the values

High-cardinality mode (Arrow engine): two inputs of the same rows, one of the generator's
ordinary cardinality and one whose columns ``--uniform-columns`` (default C1, C10, C11, C21, C23:
big columns that are rarely missing) are drawn uniformly over ``--uniform-values`` values, so
at threshold 2 each keeps ~90% of them (as the Terabyte's big columns keep millions at
threshold 15). They run alternately in fresh processes; the script prints both rates per
phase, their ratio, CPU-s per 1M rows, the Python workers' peak RSS and the dictionary
index's bytes on disk and resident in the page cache after the run.

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

REFERENCE_SECONDS_8M = (355.5, 397.0)  # the seed's flow, 8M rows, this machine type
REFERENCE_ROWS_PER_SECOND = 8_000_000 / REFERENCE_SECONDS_8M[0]


HIGH_CARDINALITY_COLUMNS = ("C1", "C10", "C11", "C21", "C23")


def ensure_input(
    root: Path, days: int, rows_per_day: int, seed: int, uniform: tuple[tuple[str, int], ...] = ()
) -> Path:
    """The generated input (made once): ``uniform`` columns drawn uniformly over N values."""
    name = f"raw_{days}x{rows_per_day}_s{seed}"
    if uniform:
        sizes = {n for _, n in uniform}
        name += (
            f"_uniform{sizes.pop()}"
            if len(sizes) == 1
            else "_uniform" + "_".join(f"{c}{n}" for c, n in uniform)
        )
    raw = root / name
    if not (raw / f"day_{days - 1}").exists():
        shutil.rmtree(raw, ignore_errors=True)
        flags = [f"--uniform-column={c}={n}" for c, n in uniform]
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pipeline.generate",
                "--out",
                str(raw),
                "--days",
                str(days),
                "--rows-per-day",
                str(rows_per_day),
                "--seed",
                str(seed),
                *flags,
            ],
            check=True,
            cwd=REPO,
        )
    return raw


def resident_bytes(paths) -> int:
    """Bytes of these files in the page cache: mincore over a read-only mapping of each."""
    import ctypes
    import mmap
    import os

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_long,
    ]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    total = 0
    for path in paths:
        size = os.path.getsize(path)
        if not size:
            continue
        fd = os.open(path, os.O_RDONLY)
        try:
            address = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
            pages = -(-size // mmap.PAGESIZE)
            vector = (ctypes.c_ubyte * pages)()
            libc.mincore(address, size, vector)
            libc.munmap(address, size)
        finally:
            os.close(fd)
        total += sum(b & 1 for b in bytes(vector)) * mmap.PAGESIZE
    return total


def csv_parse_seconds(raw: Path) -> float:
    """One multi-threaded pyarrow CSV parse of every day file: the same-run yardstick."""
    import pyarrow as pa
    import pyarrow.csv as pv

    from dlrm_contracts.schema import ALL_COLUMNS, CAT_COLUMNS

    names = list(ALL_COLUMNS)
    options = dict(
        read_options=pv.ReadOptions(column_names=names, block_size=64 << 20),
        parse_options=pv.ParseOptions(delimiter="\t", quote_char=False),
        convert_options=pv.ConvertOptions(column_types={c: pa.string() for c in CAT_COLUMNS}),
    )
    start = time.perf_counter()
    for path in sorted(raw.glob("day_*")):
        table = pv.read_csv(path, **options)
        del table
    return time.perf_counter() - start


def private_bytes(pid: int) -> int:
    """A process's anonymous resident memory (RssAnon): its own, unlike the pages of files it
    maps (the dictionary index, libraries), which the page cache shares between workers."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    return 0


class WorkerMemory:
    """Peak RSS of the Python workers (descendants of the JVM that run Python), and the peak
    of their private part."""

    def __init__(self):
        self.peak_single = 0
        self.peak_total = 0
        self.peak_private = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        import psutil

        me = psutil.Process()
        while not self._stop.wait(0.2):
            rss, private = [], []
            for process in me.children(recursive=True):
                try:
                    if "python" in process.name():
                        rss.append(process.memory_info().rss)
                        private.append(private_bytes(process.pid))
                except (psutil.Error, OSError):
                    pass
            if rss:
                self.peak_private = max(self.peak_private, max(private))
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
    from spark_jobs.preprocess import run_preprocess
    from spark_jobs.session import parse_conf_pairs
    from spark_jobs.timing import process_tree_cpu_seconds

    raw = Path(args.input)
    work = Path(args.data_root) / f"work_{raw.name}_{args.engine}"
    shutil.rmtree(work, ignore_errors=True)
    spark = SparkConfig(
        master=args.master, driver_memory=args.driver_memory, conf=parse_conf_pairs(args.conf)
    )
    # --caps: capped ids (ids: modulo), the same cap for every column; --ids contiguous: the
    # threshold applies and the caps (if any) after
    if args.ids == "contiguous":
        cfg = PreprocessConfig(
            frequency_threshold=args.threshold, engine=args.engine, ids="contiguous", caps=args.caps
        )
    elif args.caps:
        cfg = PreprocessConfig(engine=args.engine, ids="modulo", caps=args.caps)
    else:
        cfg = PreprocessConfig(frequency_threshold=args.threshold, engine=args.engine)
    start, cpu = time.perf_counter(), process_tree_cpu_seconds()
    with WorkerMemory() as memory:
        summary = run_preprocess(raw, work, spark, cfg)
    wall = time.perf_counter() - start
    total_cpu = process_tree_cpu_seconds() - cpu
    slots = sorted((work / "parquet" / "dictionary_index").glob("*/*.slots"))
    index_bytes = sum(p.stat().st_size for p in slots)
    index_resident = resident_bytes(slots)
    shutil.rmtree(work, ignore_errors=True)
    kept = sum(size - 1 for size in summary["table_sizes"].values())
    return {
        "engine": summary["engine"],
        "input": raw.name,
        "rows_in": summary["data_quality"]["rows_read"],
        "rows": summary["rows"],
        "wall_seconds": round(wall, 1),
        "cpu_seconds_total": round(total_cpu, 1),
        "timings": summary["timings"],
        "cpu_seconds": summary["cpu_seconds"],
        "worker_peak_rss_mb": round(memory.peak_single / 2**20),
        "workers_peak_rss_total_mb": round(memory.peak_total / 2**20),
        "worker_peak_private_mb": round(memory.peak_private / 2**20),
        "max_table_size": max(summary["table_sizes"].values()),
        "kept_values": kept,
        "columns_over_2m": sum(1 for size in summary["table_sizes"].values() if size > 2_000_000),
        "index_bytes": index_bytes,
        "index_resident_bytes": index_resident,
        "index_bytes_per_kept_value": round(index_bytes / max(kept, 1), 2),
    }


def print_run(result: dict, csv_seconds: float) -> None:
    n = result["rows_in"]
    t, c = result["timings"], result["cpu_seconds"]
    print(f"engine {result['engine']}: {n:,} rows")
    for stage in (s for s in ("count", "dictionaries", "transform") if s in t):  # capped: none
        print(
            f"  {stage:13s} {t[stage]:7.1f} s {n / t[stage]:>12,.0f} rows/s "
            f"{c[stage] / n * 1e6:7.2f} CPU-s per 1M rows"
        )
    wall = result["wall_seconds"]
    print(
        f"  {'end to end':13s} {wall:7.1f} s {n / wall:>12,.0f} rows/s "
        f"{result['cpu_seconds_total'] / n * 1e6:7.2f} CPU-s per 1M rows (session start included)"
    )
    csv = (
        f"; CSV ratio {wall / csv_seconds:.2f} (end to end / pyarrow CSV parse {csv_seconds:.1f} s)"
        if csv_seconds == csv_seconds
        else ""
    )
    print(
        f"  = {n / wall / REFERENCE_ROWS_PER_SECOND:.2f}x the reference's rows/s "
        f"({REFERENCE_ROWS_PER_SECOND:,.0f} rows/s: 8M rows in {REFERENCE_SECONDS_8M[0]} s){csv}"
    )
    print(
        f"  Python workers' peak RSS: {result['worker_peak_rss_mb']} MB for one worker "
        f"(private: {result.get('worker_peak_private_mb', '?')} MB at most; the rest is mapped "
        f"files, the index among them), {result['workers_peak_rss_total_mb']} MB for all together"
    )
    if result.get("index_bytes"):
        print(
            f"  dictionary index: {result['kept_values']:,} kept values "
            f"({result['columns_over_2m']} columns over 2M), {result['index_bytes'] / 2**20:.1f} MB "
            f"on disk = {result['index_bytes_per_kept_value']} bytes per kept value, "
            f"{result['index_resident_bytes'] / 2**20:.1f} MB resident after the run"
        )


def child_run(args, raw: str, engine: str) -> dict:
    """One preprocessing run in a fresh process (cold JVM); its result dict."""
    argv = [
        "--input",
        raw,
        "--engine",
        engine,
        "--threshold",
        args.threshold,
        "--master",
        args.master,
        "--driver-memory",
        args.driver_memory,
        "--data-root",
        args.data_root,
        *[f"--conf={c}" for c in args.conf],
        "--once",
        *(["--caps", str(args.caps)] if args.caps else []),
        "--ids",
        args.ids,
    ]
    out = subprocess.run(
        [sys.executable, __file__, *argv], check=True, cwd=REPO, stdout=subprocess.PIPE, text=True
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


PHASES = ("count", "dictionaries", "transform")


def high_cardinality(args) -> int:
    """Ordinary and high-cardinality inputs of the same rows, alternately: rates and ratios."""
    root = Path(args.data_root)
    uniform = tuple((c, args.uniform_values) for c in args.uniform_columns.split(","))
    inputs = {
        "ordinary": ensure_input(root, args.days, args.rows_per_day, args.seed),
        "high-cardinality": ensure_input(root, args.days, args.rows_per_day, args.seed, uniform),
    }
    print(
        f"inputs {', '.join(str(p) for p in inputs.values())}; threshold {args.threshold}, "
        f"master {args.master}, driver memory {args.driver_memory}",
        flush=True,
    )
    pairs = []
    for _ in range(args.repeat):
        pair = {}
        for label, raw in inputs.items():
            pair[label] = result = child_run(args, str(raw), "arrow")
            print(f"[{label}]", end=" ")
            print_run(result, float("nan"))
            print(json.dumps(result), flush=True)
        pairs.append(pair)
        print_ratios(pair)
    if len(pairs) > 1:
        for phase in (*PHASES, "end to end"):
            ratios = [_ratio(p, phase) for p in pairs]
            print(
                f"{phase}: rate ratio median {statistics.median(ratios):.2f} "
                f"(runs: {', '.join(f'{r:.2f}' for r in ratios)})"
            )
    return 0


def _seconds(result: dict, phase: str) -> float:
    return result["wall_seconds"] if phase == "end to end" else result["timings"][phase]


def _ratio(pair: dict, phase: str) -> float:
    """High-cardinality rate / ordinary rate (same rows): ordinary seconds / high seconds."""
    return _seconds(pair["ordinary"], phase) / _seconds(pair["high-cardinality"], phase)


def print_ratios(pair: dict) -> None:
    n = pair["ordinary"]["rows_in"]
    print("high-cardinality rate / ordinary rate, same rows:")
    for phase in (*PHASES, "end to end"):
        o, h = _seconds(pair["ordinary"], phase), _seconds(pair["high-cardinality"], phase)
        print(f"  {phase:13s} {n / o:>11,.0f} vs {n / h:>11,.0f} rows/s = {o / h:.2f}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--input", help="a directory of day files (default: generated)")
    p.add_argument("--days", type=int, default=4)
    p.add_argument("--rows-per-day", type=int, default=2_000_000)
    p.add_argument("--terabyte-shape", action="store_true", help="24 days x 1M rows")
    p.add_argument("--seed", type=int, default=20240601)
    p.add_argument("--data-root", default="/tmp/spark_jobs_bench")
    p.add_argument("--threshold", default=str(PreprocessConfig().frequency_threshold))
    p.add_argument("--engine", default="both", choices=["arrow", "sql", "both"])
    p.add_argument(
        "--caps",
        type=int,
        help="capped ids (preprocess.ids: modulo), this cap for every column; the threshold does not apply",
    )
    p.add_argument(
        "--ids",
        default="frequency",
        choices=["frequency", "contiguous"],
        help="contiguous: preprocess.ids: contiguous at --threshold (with --caps "
        "capped after); frequency with --caps: ids: modulo",
    )
    p.add_argument("--master", default="local[2]")
    p.add_argument("--driver-memory", default="12g")
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--repeat", type=int, default=1, help="fresh processes per engine")
    p.add_argument(
        "--high-cardinality",
        action="store_true",
        help="ordinary vs high-cardinality input of the same rows (Arrow engine)",
    )
    p.add_argument("--uniform-columns", default=",".join(HIGH_CARDINALITY_COLUMNS))
    p.add_argument("--uniform-values", type=int, default=2_500_000)
    p.add_argument("--once", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.once:
        print(json.dumps(run_once(args)))
        return 0
    if args.high_cardinality:
        if args.rows_per_day == 2_000_000:  # the default shape: 4 x 2.5M
            args.rows_per_day = 2_500_000
        return high_cardinality(args)
    if args.terabyte_shape:
        args.days, args.rows_per_day = 24, 1_000_000
    if not args.input:
        args.input = str(ensure_input(Path(args.data_root), args.days, args.rows_per_day, args.seed))
    print(
        f"input {args.input}, threshold {args.threshold}, master {args.master}, "
        f"driver memory {args.driver_memory}",
        flush=True,
    )
    engines = ["arrow", "sql"] if args.engine == "both" else [args.engine]
    results = {}
    for _ in range(args.repeat):
        for engine in engines:
            csv_seconds = csv_parse_seconds(Path(args.input))
            result = child_run(args, args.input, engine)
            result["csv_parse_seconds"] = round(csv_seconds, 2)
            results.setdefault(engine, []).append(result)
            print_run(result, csv_seconds)
            print(json.dumps(result), flush=True)
    for engine, runs in results.items():
        walls = [r["wall_seconds"] for r in runs]
        ratios = [r["wall_seconds"] / r["csv_parse_seconds"] for r in runs]
        print(
            f"{engine}: best {min(walls):.1f} s, median {statistics.median(walls):.1f} s "
            f"over {len(runs)} run(s); CSV ratio best {min(ratios):.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
