"""Peak disk use of a pipeline run, with and without the lean-disk mode (keep_parquet: false).

The workdir and Spark's local directory each get a tmpfs of their own (root only), so the
filesystem's used bytes, sampled every 5 ms, are exactly what the run holds there; the raw
input stays outside. Each variant runs preprocess, convert and a short train from scratch.
Prints one line per variant: peak and final bytes of the workdir, peak of spark.local.dir.

    python bench/bench_disk.py --raw RAW_DIR [--steps 20] [--size 8g]
    python -m pipeline.generate --out RAW_DIR --days 4 --rows-per-day 250000   # an input
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

CONFIG = """
spark:
  driver_memory: 4g
  local_dir: {local}
preprocess:
  keep_parquet: {keep}
train:
  preset: small
  batch_size: 1024
launch:
  np: 1
"""


def used(path: Path) -> int:
    st = os.statvfs(path)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


class PeakSampler(threading.Thread):
    def __init__(self, paths: list[Path], every: float = 0.005):
        super().__init__(daemon=True)
        self.paths, self.every = paths, every
        self.peaks = {p: used(p) for p in paths}
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(self.every):
            for p in self.paths:
                self.peaks[p] = max(self.peaks[p], used(p))


def mount(path: Path, size: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)


def one_run(raw: Path, keep: bool, steps: int, size: str, root: Path) -> dict:
    work, local = root / f"work-{keep}", root / f"local-{keep}"
    mount(work, size)
    mount(local, size)
    try:
        config = root / f"config-{keep}.yaml"
        config.write_text(CONFIG.format(local=local, keep=str(keep).lower()))
        sampler = PeakSampler([work, local])
        base = {p: used(p) for p in (work, local)}
        sampler.start()
        started = time.time()
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "pipeline",
                "--input",
                str(raw),
                "--workdir",
                str(work / "w"),
                "--config",
                str(config),
                "--stages",
                "preprocess,convert,train",
                "--max-steps",
                str(steps),
            ],
            capture_output=True,
            text=True,
        )
        sampler.stop.set()
        sampler.join()
        if proc.returncode != 0:
            sys.exit(f"run failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
        return {
            "keep_parquet": keep,
            "seconds": time.time() - started,
            "workdir_peak": sampler.peaks[work] - base[work],
            "workdir_final": used(work) - base[work],
            "local_peak": sampler.peaks[local] - base[local],
        }
    finally:
        for path in (work, local):
            subprocess.run(["umount", "-l", str(path)], check=False)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--raw", required=True, type=Path)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--size", default="8g", help="size of each tmpfs")
    args = parser.parse_args()
    mib = 2**20
    with tempfile.TemporaryDirectory(prefix="bench-disk-") as tmp:
        for keep in (True, False):
            r = one_run(args.raw.resolve(), keep, args.steps, args.size, Path(tmp))
            print(
                f"keep_parquet={str(keep).lower():<5}  workdir peak {r['workdir_peak'] / mib:8.1f} MiB"
                f"  final {r['workdir_final'] / mib:8.1f} MiB  spark.local.dir peak "
                f"{r['local_peak'] / mib:8.1f} MiB  ({r['seconds']:.0f} s)",
                flush=True,
            )


if __name__ == "__main__":
    main()
