"""What the binary dataset's checksums cost: while converting, and before a derivation.

The convert stage hashes (xxh3-128) every byte it writes, and a threshold raise reads the whole
source dataset back to check it before reusing its files (``convert.verify_checksums``). This
prints, on a dataset of ``--rows`` rows made from generated parquet (bench_converters.py's
input):

* convert: seconds, and the hashing's own share (the same bytes hashed from memory);
* the check before a derivation: reading every file and hashing it, warm (page cache) and
  cold (each file's cached pages dropped first with posix_fadvise, so this disk's read speed);
* rethreshold with the check and without it.

Usage::

    .venv/bin/python bench/bench_checksums.py --rows 30000000 [--workdir DIR] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from bench_converters import make_parquet_workdir

from converters.convert import convert_parquet
from converters.rethreshold import rethreshold
from dlrm_contracts.binary_format import CHECKSUM_CHUNK_BYTES, all_files, file_key, new_checksum
from dlrm_contracts.config import ConvertConfig
from dlrm_contracts.schema import SPLITS
from dlrm_contracts.verify import verify_checksums


def _files(binary: Path) -> list[Path]:
    return [binary / file_key(split, name) for split in SPLITS for name in all_files()]


def _drop_cache(files: list[Path]) -> None:
    """Evict the files' clean pages (no privileges needed), so the next read hits the disk."""
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _hash_in_memory(files: list[Path]) -> float:
    """CPU seconds to hash the files' bytes already in memory: the convert stage's added work
    (CPU time, so other loads on the machine do not inflate it)."""
    total = 0.0
    for path in files:
        data = path.read_bytes()
        view = memoryview(data)
        start = time.process_time()
        digest = new_checksum()
        for offset in range(0, len(data), CHECKSUM_CHUNK_BYTES):
            digest.update(view[offset : offset + CHECKSUM_CHUNK_BYTES])
        total += time.process_time() - start
    return total


def _timed(call) -> tuple[float, float, object]:
    """(wall seconds, CPU seconds of this process's threads, result)."""
    start, cpu = time.perf_counter(), time.process_time()
    result = call()
    return time.perf_counter() - start, time.process_time() - cpu, result


def bench(root: Path, rows: int, threshold: str, config: ConvertConfig) -> dict:
    if not (root / "parquet" / "_SUCCESS").exists():
        seconds, _, _ = _timed(lambda: make_parquet_workdir(root, rows))
        print(f"input: {rows:,} rows of parquet written in {seconds:.1f} s", flush=True)
    binary = root / "binary"
    shutil.rmtree(binary, ignore_errors=True)
    convert_s, convert_cpu, summary = _timed(lambda: convert_parquet(root / "parquet", binary, config))
    files = _files(binary)
    size = sum(p.stat().st_size for p in files)
    hash_cpu = _hash_in_memory(files)
    warm_s, warm_cpu, _ = _timed(lambda: verify_checksums(binary, config.workers))
    _drop_cache(files)
    cold_s, cold_cpu, _ = _timed(lambda: verify_checksums(binary, config.workers))
    result = {
        "rows": sum(summary["rows"].values()),
        "binary_GB": round(size / 1e9, 3),
        "convert_s": round(convert_s, 2),
        "convert_cpu_s": round(convert_cpu, 2),
        "hash_cpu_s": round(hash_cpu, 2),
        "hash_GB_per_cpu_s": round(size / hash_cpu / 1e9, 2),
        "hash_share_of_convert_cpu": round(hash_cpu / convert_cpu, 4),
        "check_warm_s": round(warm_s, 2),
        "check_warm_cpu_s": round(warm_cpu, 2),
        "check_cold_s": round(cold_s, 2),
        "check_cold_cpu_s": round(cold_cpu, 2),
        "check_cold_GB_per_s": round(size / cold_s / 1e9, 2),
    }
    for verify in (True, False):
        target = root / "derived"
        shutil.rmtree(target, ignore_errors=True)
        _drop_cache(files)
        options = ConvertConfig(
            workers=config.workers,
            batch_rows=config.batch_rows,
            progress=False,
            fsync=config.fsync,
            verify_checksums=verify,
        )
        seconds, cpu, _ = _timed(lambda: rethreshold(binary, root / "counts", threshold, target, options))
        tag = "checked" if verify else "unchecked"
        result[f"rethreshold_cold_s_{tag}"] = round(seconds, 2)
        result[f"rethreshold_cpu_s_{tag}"] = round(cpu, 2)
        shutil.rmtree(target, ignore_errors=True)
    result["load_average_1min"] = round(os.getloadavg()[0], 1)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=30_000_000)
    parser.add_argument("--workdir", help="reuse (or make) the parquet input here")
    parser.add_argument("--rethreshold", default="15", help="threshold spec to derive")
    parser.add_argument("--workers", type=int, default=ConvertConfig().workers)
    parser.add_argument("--keep", action="store_true", help="keep the generated workdir")
    args = parser.parse_args()
    config = ConvertConfig(workers=args.workers, progress=False)
    root = Path(args.workdir or tempfile.mkdtemp(prefix="bench_checksums_"))
    try:
        print(json.dumps(bench(root, args.rows, args.rethreshold, config)), flush=True)
    finally:
        if not (args.keep or args.workdir):
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
