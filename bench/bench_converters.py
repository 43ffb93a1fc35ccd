"""Benchmark of converters: rows/s and MB/s of convert and of rethreshold.

Without ``--workdir`` it writes its own spark_jobs-shaped input with pyarrow (snappy parquet,
several files and row groups per split, Criteo-like table sizes from 4 to millions so every
id dtype occurs, Zipf-distributed ids, a count histogram consistent with the ids), then times

* convert: parquet → split binary dataset (``converters.convert.convert_parquet``);
* verify: full scan of the result;
* rethreshold: the dataset at a higher threshold from the binary one + the histogram.

Usage::

    .venv/bin/python bench/bench_converters.py --rows 1000000 4000000
    .venv/bin/python bench/bench_converters.py --workdir DIR --rethreshold 15
    .venv/bin/python bench/bench_converters.py --rows 1000000 --cap 500000 \
        --multi-hot-sizes 3,2,1,2,6,1,1,1,1,7,3,8,1,6,9,5,1,1,1,12,100,27,10,3,1,1
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from dlrm_contracts.config import ConvertConfig
from dlrm_contracts.schema import CAT_COLUMNS, INT_COLUMNS, SPLITS
from dlrm_contracts.table_sizes import write_histogram
from dlrm_contracts.verify import verify_dataset

# Criteo Terabyte unique values per column (docs: criteo_terabyte_facts.md), capped so the
# benchmark input stays laptop-sized while keeping int32 tables.
TERABYTE_UNIQUES = [
    227605432,
    39060,
    17295,
    7424,
    20265,
    3,
    7122,
    1543,
    63,
    130229467,
    3067956,
    405282,
    10,
    2209,
    11938,
    155,
    4,
    976,
    14,
    292775614,
    40790948,
    187188510,
    590152,
    12973,
    108,
    36,
]
CAP = 5_000_000


def _ids(rng: np.random.Generator, kept: int, n: int) -> np.ndarray:
    """Ids 0..kept with a Zipf-like popularity (low ids most frequent, as assigned by count)."""
    ranks = rng.zipf(1.15, n)
    return np.where(ranks > kept, 0, ranks).astype(np.int32)


def make_parquet_workdir(
    root: Path,
    rows: int,
    threshold: int = 2,
    files: int = 4,
    seed: int = 0,
    row_group_rows: int = 1_000_000,
    cap: int = CAP,
) -> Path:
    """A workdir with parquet/{train,test,validation} and counts/histogram.parquet."""
    rng = np.random.default_rng(seed)
    kept = [min(u, cap) for u in TERABYTE_UNIQUES]
    parquet = root / "parquet"
    split_rows = {"train": rows * 8 // 10, "test": rows // 10}
    split_rows["validation"] = rows - split_rows["train"] - split_rows["test"]
    for split in SPLITS:
        (parquet / split).mkdir(parents=True, exist_ok=True)
        bounds = np.linspace(0, split_rows[split], files + 1).astype(int)
        for f in range(files):
            n = int(bounds[f + 1] - bounds[f])
            columns = {"label": pa.array((rng.random(n) < 0.03).astype(np.int32))}
            for name in INT_COLUMNS:
                columns[name] = pa.array(np.log(rng.integers(0, 5000, n) + 3).astype(np.float32))
            for name, k in zip(CAT_COLUMNS, kept):
                columns[name] = pa.array(_ids(rng, k, n))
            pq.write_table(
                pa.table(columns),
                parquet / split / f"part-{f:05d}.snappy.parquet",
                row_group_size=max(1, min(n, row_group_rows)),
                compression="snappy",
            )
    (parquet / "model_size.json").write_text(json.dumps({c: k + 1 for c, k in zip(CAT_COLUMNS, kept)}))
    (parquet / "preprocess.json").write_text(json.dumps({"threshold_spec": str(threshold)}))
    (parquet / "_SUCCESS").write_text("")
    _write_histogram(root / "counts", kept, threshold, rng)
    return root


def _write_histogram(counts: Path, kept: list[int], threshold: int, rng: np.random.Generator) -> None:
    """Counts consistent with the ids: value of id i has a count that falls with i, >= T."""
    counts.mkdir(parents=True, exist_ok=True)
    histogram = {}
    for name, k in zip(CAT_COLUMNS, kept):
        per_id = np.maximum(threshold, (1e6 / np.arange(1, k + 1) ** 1.1).astype(np.int64))
        values, how_many = np.unique(per_id, return_counts=True)
        # values below the base threshold exist too
        histogram[name] = list(zip(values.tolist(), how_many.tolist())) + [(1, int(rng.integers(1, 1000)))]
    write_histogram(histogram, counts)


def _bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _run_cli(args: list[str]) -> dict:
    """Run ``python -m converters ...`` in a child (so its peak RSS is its own); JSON summary."""
    done = subprocess.run(
        [sys.executable, "-m", "converters", *args, "--json", "--no-progress"],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"converters {args[0]} failed: {done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # Linux: KiB


def _options(config: ConvertConfig) -> list[str]:
    return (
        ["--workers", str(config.workers), "--batch-rows", str(config.batch_rows)]
        + ([] if config.fsync else ["--no-fsync"])
        + (["--formats", ",".join(config.formats)] if config.formats != ["binary"] else [])
    )


def bench(workdir: Path, new_threshold: str, config: ConvertConfig) -> dict:
    parquet, binary = workdir / "parquet", workdir / "bench_binary"
    shutil.rmtree(binary, ignore_errors=True)
    cpu = _children_cpu_s()
    multi_hot = (
        ["--multi-hot-sizes", ",".join(map(str, config.multi_hot_sizes))] if config.multi_hot_sizes else []
    )
    summary = _run_cli(
        ["convert", "--parquet", str(parquet), "--output", str(binary), *_options(config), *multi_hot]
    )
    convert_rss = _peak_rss_mb()
    convert_cpu = _children_cpu_s() - cpu
    rows = sum(summary["rows"].values())
    out_mb = summary["bytes_written"] / 1e6
    result = {
        "rows": rows,
        "parquet_MB": round(_bytes(parquet) / 1e6, 1),
        "convert_s": summary["seconds"],
        "convert_rows_per_s": round(rows / summary["seconds"]),
        "convert_s_per_1M_rows": round(summary["seconds"] / rows * 1e6, 3),
        "convert_out_MB_per_s": round(out_mb / summary["seconds"], 1),
        "convert_cpu_s": round(convert_cpu, 2),
        "convert_cpu_s_per_1M_rows": round(convert_cpu / rows * 1e6, 3),
        "convert_peak_rss_MB": round(convert_rss),
        "binary_MB": round(out_mb, 1),
    }
    start = time.perf_counter()
    verify_dataset(binary, full=True, workers=config.workers)
    seconds = time.perf_counter() - start
    result.update(verify_s=round(seconds, 3), verify_MB_per_s=round(out_mb / seconds, 1))
    for link in (True, False):
        target = workdir / "bench_rethreshold"
        shutil.rmtree(target, ignore_errors=True)
        cpu = _children_cpu_s()
        re = _run_cli(
            [
                "rethreshold",
                "--source",
                str(binary),
                "--counts",
                str(workdir / "counts"),
                "--frequency-threshold",
                new_threshold,
                "--output",
                str(target),
                *_options(config),
            ]
            + ([] if link else ["--copy-unchanged"])
        )
        tag = "rethreshold" if link else "rethreshold_copy"
        result.update(
            {
                f"{tag}_s": re["seconds"],
                f"{tag}_rows_per_s": round(rows / re["seconds"]),
                f"{tag}_in_MB_per_s": round(out_mb / re["seconds"], 1),
                f"{tag}_cpu_s_process": round(_children_cpu_s() - cpu, 2),
                f"{tag}_MB_written": round(re["bytes_written"] / 1e6, 1),
            }
        )
        shutil.rmtree(target, ignore_errors=True)
    result["peak_rss_MB_any_child"] = round(_peak_rss_mb())
    result["load_average_1min"] = round(os.getloadavg()[0], 1)
    shutil.rmtree(binary, ignore_errors=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1_000_000, 4_000_000])
    parser.add_argument("--workdir", help="benchmark an existing workdir (parquet/ + counts/)")
    parser.add_argument("--rethreshold", default="15", help="threshold spec to derive")
    parser.add_argument("--workers", type=int, default=ConvertConfig().workers)
    parser.add_argument("--batch-rows", type=int, default=ConvertConfig().batch_rows)
    parser.add_argument("--no-fsync", action="store_true")
    parser.add_argument(
        "--row-group-rows",
        type=int,
        default=1_000_000,
        help="parquet row group size of the generated input (Spark: ~128 MB)",
    )
    parser.add_argument("--cap", type=int, default=CAP, help="largest table of the input")
    parser.add_argument("--multi-hot-sizes", help="convert multi-hot, e.g. MLPerf's 3,2,1,...")
    parser.add_argument("--formats", default="binary", help="e.g. binary,mlperf_multihot")
    args = parser.parse_args()
    config = ConvertConfig(
        workers=args.workers,
        batch_rows=args.batch_rows,
        progress=False,
        fsync=not args.no_fsync,
        formats=args.formats.split(","),
        multi_hot_sizes=[int(k) for k in args.multi_hot_sizes.split(",")] if args.multi_hot_sizes else None,
    )
    if args.workdir:
        print(json.dumps(bench(Path(args.workdir), args.rethreshold, config)))
        return
    for rows in args.rows:
        with tempfile.TemporaryDirectory(prefix="bench_converters_") as tmp:
            make_parquet_workdir(Path(tmp), rows, row_group_rows=args.row_group_rows, cap=args.cap)
            print(json.dumps(bench(Path(tmp), args.rethreshold, config)), flush=True)


if __name__ == "__main__":
    main()
