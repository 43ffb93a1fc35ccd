"""Benchmark of the Arrow engine with its input and workdir on an S3-compatible server (a local
moto server, ``.venv/bin/moto_server``) against the same input and workdir on local paths: rows
per second per phase, their ratio, and the requests and bytes per phase the object-store run
made (counted by the engine's ``remote`` module, ``CRITEO_DLRM_IO_LOG``; moto's own request
log is counted beside them as a check).

Each run is a fresh process (cold JVM, fresh workdir) that drives the engine's phases as the
preprocess job does (count, rejects, totals, dictionaries, transform). Usage:

    .venv/bin/python bench/bench_object_store.py                         # 4 days x 2.5M rows (10M)
    .venv/bin/python bench/bench_object_store.py --high-cardinality      # + five columns of 2.5M values
    .venv/bin/python bench/bench_object_store.py --rows-per-day 500000   # smaller
    .venv/bin/python bench/bench_object_store.py --runs local,s3,s3:shuffle,s3:files

Runs: ``local`` (both on local paths, the exchange the engine picks: files), ``s3`` (both in a
bucket, the engine's pick for a URL under this benchmark's local master: local, the partial
files on this host's disk), ``s3:shuffle`` / ``s3:files`` / ``local:shuffle`` (the exchange
forced: ``s3:shuffle`` is what a cluster of several nodes runs; the designs side by side on the
same input); any run with
``@<preprocess field>=<value>`` appended runs with that setting (``s3@arrow_input_copy_mb=0``).
The input is read once before the first run (a warm page cache for every run), and each
bucket run is set against the local run just before it (the machine's load drifts).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

BUCKET = "criteo-bench"
PHASES = ("count", "dictionaries", "transform")


@dataclass(frozen=True)
class UrlDay:
    """A day file behind a URL (``spark_jobs.inputs.DayFile``'s fields the engine reads)."""

    day: int
    path: str

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[-1]

    @property
    def gzipped(self) -> bool:
        return self.path.endswith(".gz")


def url_days(url: str) -> list[UrlDay]:
    import re

    from spark_jobs.engines.arrow import remote

    days = []
    for path in remote.list_files(url):
        match = re.match(r"^day_(\d+)(\.gz)?$", path.rsplit("/", 1)[-1])
        if match:
            days.append(UrlDay(int(match.group(1)), path))
    return sorted(days, key=lambda d: d.day)


def join(base: str, *parts: str) -> str:
    from spark_jobs.engines.arrow import remote

    return remote.join(base, *parts) if remote.is_url(base) else str(Path(base, *parts))


def _path(text: str):
    from spark_jobs.engines.arrow import remote

    return text if remote.is_url(text) else Path(text)


def run_engine(
    session,
    input_dir: str,
    workdir: str,
    cfg,
    on_phase=None,
    chunk_bytes: int | None = None,
    publish: bool = False,
) -> dict:
    """The Arrow engine's phases on ``input_dir`` into ``workdir`` (paths or URLs), as the
    preprocess job calls them: counts under ``counts/``, dictionaries and index under
    ``parquet/``, the splits in ``parquet/.splits-staging`` or (``publish``) put in place as
    the job does (renamed locally, published by their markers at a URL). Returns the rows per
    split and the seconds per phase; ``on_phase(name)`` is called as each phase starts and at
    the end. ``chunk_bytes``: chunks smaller than the config's floor of a megabyte (tests)."""
    from dlrm_contracts.schema import SPLITS
    from dlrm_contracts.storage import location_of
    from dlrm_contracts.thresholds import parse_threshold_spec
    from spark_jobs.dictionaries import table_sizes
    from spark_jobs.engine import ByCount
    from spark_jobs.engines.arrow.engine import ArrowEngine
    from spark_jobs.inputs import discover_days
    from spark_jobs.splits import settle_split_dirs, split_staging, train_files

    days = discover_days(input_dir)
    spec = parse_threshold_spec(cfg.frequency_threshold)
    engine = ArrowEngine(session, days, cfg)
    if chunk_bytes:
        from spark_jobs.engines.arrow.chunks import plan_chunks

        engine.chunks = plan_chunks(days, chunk_bytes)
    seconds = {}
    counts = _path(join(workdir, "counts"))
    try:
        start = time.perf_counter()
        on_phase and on_phase("count")
        stats = engine.count([d.day for d in days], counts)
        engine.write_rejects(stats, _path(join(workdir, "rejects")))
        histogram = engine.count_totals(counts, None, frequency_ids=spec)
        seconds["count"] = time.perf_counter() - start
        start = time.perf_counter()
        on_phase and on_phase("dictionaries")
        sizes = table_sizes(histogram, spec)
        engine.write_dictionaries(
            ByCount(spec, sizes),
            _path(join(workdir, "parquet", "dictionaries")),
            _path(join(workdir, "parquet", "dictionary_index")),
        )
        seconds["dictionaries"] = time.perf_counter() - start
        start = time.perf_counter()
        on_phase and on_phase("transform")
        partitions = train_files(cfg, sum(stats[d.day].rows_valid for d in days[:-1]))
        parquet = location_of(join(workdir, "parquet"))
        staging = split_staging(parquet) if publish else _path(join(workdir, "parquet", ".splits-staging"))
        engine.write_splits(
            stats,
            sizes,
            _path(join(workdir, "parquet", "dictionaries")),
            _path(join(workdir, "parquet", "dictionary_index")),
            staging,
            partitions,
        )
        if publish:
            settle_split_dirs(staging, {s: parquet / s for s in SPLITS}, cfg.compression)
        seconds["transform"] = time.perf_counter() - start
        on_phase and on_phase("end")
    finally:
        engine.close()
    rows_in = sum(s.rows_read for s in stats.values())
    return {"rows_in": rows_in, "sizes": sizes, "seconds": seconds}


# ---------------------------------------------------------------- the moto server


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MotoServer:
    """``moto_server`` on a loopback port for the benchmark's lifetime (stopped by its pid);
    its request log kept in ``log``."""

    def __init__(self, log: Path):
        self.port = free_port()
        self.log = log
        self.process = None

    def __enter__(self):
        moto = Path(sys.executable).parent / "moto_server"
        self.process = subprocess.Popen(
            [str(moto), "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=open(self.log, "w"),
            stderr=subprocess.STDOUT,
        )
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), 1).close()
                break
            except OSError:
                time.sleep(0.2)
        return self

    def env(self) -> dict[str, str]:
        return {
            "AWS_ACCESS_KEY_ID": "bench",
            "AWS_SECRET_ACCESS_KEY": "bench",
            "AWS_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": f"http://127.0.0.1:{self.port}",
        }

    def __exit__(self, *exc):
        self.process.terminate()
        self.process.wait(30)


def upload_input(raw: Path, env: dict[str, str], prefix: str, bucket: str = BUCKET) -> str:
    """The day files copied into ``bucket`` (with boto3, as a user's own tools would)."""
    import boto3

    client = boto3.client(
        "s3",
        endpoint_url=env["AWS_ENDPOINT_URL"],
        region_name="us-east-1",
        aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
    )
    try:
        client.create_bucket(Bucket=bucket)
    except client.exceptions.BucketAlreadyOwnedByYou:
        pass
    for path in sorted(raw.glob("day_*")):
        client.upload_file(str(path), bucket, f"{prefix}/{path.name}")
    return f"s3://{bucket}/{prefix}"


# ---------------------------------------------------------------- one run, in its own process


def one_run(args) -> dict:
    from pyspark.sql import SparkSession

    from dlrm_contracts.config import PreprocessConfig
    from spark_jobs.session import JVM_OPTIONS
    from spark_jobs.timing import process_tree_cpu_seconds

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    session = (
        SparkSession.builder.master(args.master)
        .appName("bench-object-store")
        .config("spark.driver.memory", args.driver_memory)
        .config("spark.driver.extraJavaOptions", JVM_OPTIONS)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "8")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    settings = {k: int(v) if v.lstrip("-").isdigit() else v for k, v in json.loads(args.settings).items()}
    cfg = PreprocessConfig(
        frequency_threshold=args.threshold, engine="arrow", arrow_exchange=args.exchange, **settings
    )
    marks = []
    log = os.environ.get("CRITEO_DLRM_IO_LOG")

    def on_phase(name):
        lines = sum(1 for _ in open(log)) if log and os.path.exists(log) else 0
        moto = sum(1 for _ in open(args.moto_log)) if args.moto_log else 0
        server = _cpu_seconds(args.moto_pid) if args.moto_pid else 0.0
        marks.append((name, lines, moto, process_tree_cpu_seconds(), server))

    start = time.perf_counter()
    result = run_engine(session, args.input, args.workdir, cfg, on_phase, publish=True)
    result["wall_seconds"] = time.perf_counter() - start
    result["marks"] = marks
    session.stop()
    return result


def phase_requests(log: Path, moto_log: Path | None, marks) -> dict:
    """Requests (by kind) and bytes per phase from the accounting log's lines between marks;
    moto's own log lines (its request log) beside them."""
    lines = log.read_text().splitlines() if log.exists() else []
    moto = moto_log.read_text().splitlines() if moto_log and moto_log.exists() else []
    out = {}
    for (name, a, ma, *_), (_, b, mb, *_) in zip(marks, marks[1:]):
        kinds, nbytes = Counter(), Counter()
        for line in lines[a:b]:
            _, kind, size = line.split()
            kinds[kind] += 1
            nbytes[kind] += int(size)
        served = [m for m in moto[ma:mb] if '" 20' in m or '" 40' in m]
        out[name] = {"requests": dict(kinds), "bytes": dict(nbytes), "moto_requests": len(served)}
    return out


def parse_run(run: str) -> tuple[str, str, dict[str, str]]:
    """``<where>[:<exchange>][@<field>=<value>...]`` → (where, exchange, config overrides): e.g.
    ``s3@arrow_input_copy_mb=0`` (a preprocess setting changed for that run only)."""
    head, *settings = run.split("@")
    where, _, exchange = head.partition(":")
    return where, exchange or "auto", dict(s.split("=", 1) for s in settings)


_UPLOADED: dict[Path, str] = {}


def launch(run: str, raw: Path, args, server: MotoServer | None) -> dict:
    where, exchange, overrides = parse_run(run)
    tag = f"{raw.name}-{where}-{exchange}-{time.time_ns()}"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    io_log = Path(args.data_root) / f"io-{tag}.log"
    if where == "s3":
        env.update(server.env())
        env["CRITEO_DLRM_IO_LOG"] = str(io_log)
        if raw not in _UPLOADED:  # once per server: the runs only read it
            _UPLOADED[raw] = upload_input(raw, server.env(), f"input/{raw.name}")
        input_dir = _UPLOADED[raw]
        workdir = f"s3://{BUCKET}/work/{tag}"
    else:
        input_dir = str(raw)
        workdir = str(Path(args.data_root) / f"work-{tag}")
    command = [
        sys.executable,
        __file__,
        "--one",
        "--input",
        input_dir,
        "--workdir",
        workdir,
        "--exchange",
        exchange,
        "--threshold",
        args.threshold,
        "--master",
        args.master,
        "--driver-memory",
        args.driver_memory,
        "--settings",
        json.dumps(overrides),
    ]
    if where == "s3":
        command += ["--moto-log", str(server.log), "--moto-pid", str(server.process.pid)]
    server_cpu = _cpu_seconds(server.process.pid) if server else 0.0
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    server_cpu = _cpu_seconds(server.process.pid) - server_cpu if server else 0.0
    if done.returncode:
        sys.stderr.write(done.stderr[-4000:])
        raise SystemExit(f"run {run} failed")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    if where == "s3":
        result["io"] = phase_requests(io_log, server.log, result["marks"])
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    result["run"] = run
    # the S3 server runs on the same cores: its CPU is part of what the run waited for
    result["server_cpu_seconds"] = round(server_cpu, 1) if where == "s3" else 0.0
    result["cpu_seconds"] = {
        m[0]: round(n[3] - m[3], 1) for m, n in zip(result["marks"], result["marks"][1:])
    }
    result["server_cpu_by_phase"] = {
        m[0]: round(n[4] - m[4], 1) for m, n in zip(result["marks"], result["marks"][1:])
    }
    return result


def warm_page_cache(raw: Path) -> None:
    """Every day file read once before any run is timed: the first run must not be the one
    that pays for a cold page cache (the bucket's copy is sent from it too)."""
    for path in sorted(raw.glob("day_*")):
        with open(path, "rb", buffering=0) as fh:
            while fh.read(64 << 20):
                pass


def beside(results: list[dict], k: int) -> dict | None:
    """The local run just before run ``k`` (or, for a run before any, the one just after): the
    machine's load drifts, so a run is set against its neighbour, not a mean."""
    before = [r for r in results[:k] if r["run"] == "local"]
    after = [r for r in results[k + 1 :] if r["run"] == "local"]
    return before[-1] if before else after[0] if after else None


def _cores(master: str) -> int:
    """The cores of a ``local[N]`` master (``local[*]``: this machine's)."""
    inside = master.partition("[")[2].rstrip("]")
    return int(inside) if inside.isdigit() else os.cpu_count() or 1


def _without_server(result: dict, cores: int) -> float:
    """The run's wall time less the S3 server's CPU seconds spread over the cores: an estimate
    of the run against a store that does not share the run's cores (a real one); the moto
    server does, and answers a ranged GET with work in proportion to the whole object."""
    return result["wall_seconds"] - result["server_cpu_seconds"] / cores


def _cpu_seconds(pid: int) -> float:
    import psutil

    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--input")
    parser.add_argument("--workdir")
    parser.add_argument("--exchange", default="auto")
    parser.add_argument("--settings", default="{}", help=argparse.SUPPRESS)
    parser.add_argument("--moto-log")
    parser.add_argument("--moto-pid", type=int)
    parser.add_argument("--data-root", default="/tmp/bench_object_store")
    parser.add_argument("--days", type=int, default=4)
    parser.add_argument("--rows-per-day", type=int, default=2_500_000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--high-cardinality",
        action="store_true",
        help="the input whose five big columns are uniform over --uniform-values",
    )
    parser.add_argument("--uniform-values", type=int, default=2_500_000)
    parser.add_argument(
        "--runs",
        default="local,s3",
        help="comma-separated: local, s3, <where>:<files|shuffle>, and any of them with "
        "@<preprocess field>=<value> (that run's setting)",
    )
    parser.add_argument("--threshold", default="2")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--driver-memory", default="6g")
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(one_run(args)))
        return 0

    from bench_spark import HIGH_CARDINALITY_COLUMNS, ensure_input

    root = Path(args.data_root)
    root.mkdir(parents=True, exist_ok=True)
    uniform = (
        tuple((c, args.uniform_values) for c in HIGH_CARDINALITY_COLUMNS) if args.high_cardinality else ()
    )
    raw = ensure_input(root, args.days, args.rows_per_day, args.seed, uniform)
    warm_page_cache(raw)
    results = []
    with MotoServer(root / "moto.log") as server:
        for run in args.runs.split(","):
            result = launch(run, raw, args, server)
            results.append(result)
            rate = result["rows_in"] / result["wall_seconds"]
            print(
                f"{run:16s} {result['wall_seconds']:7.1f} s  {rate:9.0f} rows/s  "
                + "  ".join(f"{p} {result['seconds'][p]:.1f} s" for p in PHASES)
                + "  cpu "
                + " ".join(f"{p} {c}" for p, c in result["cpu_seconds"].items())
                + (
                    f"  S3 server cpu {result['server_cpu_seconds']} ("
                    + " ".join(f"{p} {c}" for p, c in result["server_cpu_by_phase"].items())
                    + ")"
                    if run.startswith("s3")
                    else ""
                ),
                flush=True,
            )
            for phase, io in result.get("io", {}).items():
                print(
                    f"    {phase:13s} requests {io['requests']}  bytes {io['bytes']}  "
                    f"(moto served {io['moto_requests']})",
                    flush=True,
                )
    cores = _cores(args.master)
    for k, r in enumerate(results):
        local = beside(results, k)
        if r["run"] == "local" or local is None:
            continue
        print(
            f"{r['run']} / the local run beside it: {local['wall_seconds'] / r['wall_seconds']:.2f}  "
            + "  ".join(f"{p} {local['seconds'][p] / r['seconds'][p]:.2f}" for p in PHASES)
            + f"  (CPU-s: local {sum(local['cpu_seconds'].values()):.1f}, this run "
            f"{sum(r['cpu_seconds'].values()):.1f} + the S3 server's {r['server_cpu_seconds']})"
        )
        if r["server_cpu_seconds"]:
            print(
                f"    not the headline, the S3 server's share taken out: wall less its "
                f"CPU / {cores} cores {local['wall_seconds'] / _without_server(r, cores):.2f}; "
                f"engine CPU only (local CPU-s / this run's) "
                f"{sum(local['cpu_seconds'].values()) / sum(r['cpu_seconds'].values()):.2f}"
            )
    (root / "last_results.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
