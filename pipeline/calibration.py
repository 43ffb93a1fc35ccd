"""How fast this machine's cores are, against the machine the preflight's rates were measured on.

The preflight estimates a stage's time from per-core rates (``config.preflight``) measured on
one machine. A core of another CPU can be several times slower or faster, so the rates are
scaled by a calibration made on the machine itself: three short single-threaded
micro-benchmarks of the work each rate stands for, run once in a child process (so their
thread settings cannot leak into this one) and cached per machine:

- ``parse``: Criteo lines parsed from tab-separated text and their categorical values counted
  (Arrow's CSV reader and hash kernels), the preprocess stage's work per row;
- ``matmul``: float32 matrix products of a dense layer's shape, the trainer's work per sample
  (its time goes to the MLPs' products forward and backward);
- ``convert``: columns written to parquet, read back and cast to the binary dataset's types,
  the converter's work per row.

The cache is ``$CRITEO_DLRM_CACHE`` (default ``~/.cache/criteo-dlrm``) ``/calibration/<key>.json``;
the key is the CPU model, the core count and ``CALIBRATION_VERSION`` (raised whenever a
benchmark changes), so another machine, or a copied home directory on other hardware,
calibrates afresh. A calibration that cannot run leaves the rates as configured, with a
warning.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

CALIBRATION_VERSION = 1
FIGURES = ("parse_rows_per_s", "matmul_gflops", "convert_rows_per_s")
# Long enough for a steady figure, short enough that the three take a few seconds in all.
_MEASURE_S = 0.4
_CHILD_TIMEOUT_S = 300
_ONE_THREAD = {
    name: "1" for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "ARROW_NUM_THREADS")
}


@dataclass(frozen=True)
class Speed:
    """This machine's per-core speed over the reference machine's, per kind of work (1.0: the
    same; 0.4: a core 2.5 times slower)."""

    parse: float = 1.0
    train: float = 1.0
    convert: float = 1.0
    source: str = "the configured rates as they are"


# ---------------------------------------------------------------- the machine and its cache
def cpu_model() -> str:
    """The CPU's model name as the OS reports it."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Processor", "cpu model"):
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def machine_key(model: str | None = None, cores: int | None = None) -> str:
    """What a calibration holds for: the CPU model, its core count, the benchmarks' version."""
    fields = [
        model if model is not None else cpu_model(),
        cores if cores is not None else (os.cpu_count() or 1),
        CALIBRATION_VERSION,
    ]
    return hashlib.sha256(json.dumps(fields).encode()).hexdigest()[:16]


def cache_dir() -> Path:
    root = os.environ.get("CRITEO_DLRM_CACHE") or Path.home() / ".cache" / "criteo-dlrm"
    return Path(root) / "calibration"


def load_or_measure(key: str | None = None, measure: Callable[[], dict[str, float]] | None = None) -> dict:
    """This machine's calibration record (figures, key, CPU, when), from the cache or measured
    now and cached. Raises OSError, ValueError, KeyError or a SubprocessError when it can be
    neither read nor made."""
    key = key or machine_key()
    path = cache_dir() / f"{key}.json"
    try:
        record = json.loads(path.read_text())
        if record.get("key") == key and all(float(record["figures"][f]) > 0 for f in FIGURES):
            return record
    except (OSError, ValueError, KeyError, TypeError):
        pass  # absent or damaged: measured again
    figures = (measure or measure_in_child)()
    record = {
        "key": key,
        "cpu": cpu_model(),
        "cores": os.cpu_count() or 1,
        "version": CALIBRATION_VERSION,
        "figures": figures,
        "measured": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(record, indent=1) + "\n")
    os.replace(tmp, path)  # a concurrent preflight writes the same figures' kind: last one wins
    return record


def speed(preflight, warn: Callable[[str], None] | None = None) -> Speed:
    """The ratios the preflight scales its rates by (``preflight``: a PreflightConfig)."""
    if not preflight.calibrate:
        return Speed(source="the configured rates (preflight.calibrate: false)")
    try:
        record = load_or_measure()
    except (OSError, ValueError, KeyError, subprocess.SubprocessError) as exc:
        if warn is not None:
            warn(f"the machine's calibration failed ({exc}): the configured rates are used")
        return Speed(source="the configured rates (calibration failed)")
    here = record["figures"]
    return Speed(
        parse=here["parse_rows_per_s"] / preflight.reference_parse_rows_per_s,
        train=here["matmul_gflops"] / preflight.reference_matmul_gflops,
        convert=here["convert_rows_per_s"] / preflight.reference_convert_rows_per_s,
        source=f"rates scaled to this machine's calibration ({cache_dir()}/"
        f"{record['key']}.json, {record.get('measured')})",
    )


# ---------------------------------------------------------------- the benchmarks
def measure_in_child() -> dict[str, float]:
    """The benchmarks in a fresh single-threaded interpreter; their figures."""
    env = {**os.environ, **_ONE_THREAD}
    done = subprocess.run(
        [sys.executable, "-m", "pipeline.calibration"],
        env=env,
        capture_output=True,
        text=True,
        timeout=_CHILD_TIMEOUT_S,
    )
    if done.returncode != 0:
        raise ValueError(f"exit {done.returncode}: {done.stderr.strip()[-300:]}")
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    return {f: float(figures[f]) for f in FIGURES}


def _best_rate(work: Callable[[], int]) -> float:
    """Units per CPU-second of ``work`` (it returns the units it did), the best of repeats over
    about ``_MEASURE_S`` of CPU: the core's own speed. CPU time, not wall time: on a machine
    other jobs share, the wall clock would measure their load, which comes and goes, and
    the cache would keep it."""
    work()  # warm: imports, allocations, caches
    best, spent = 0.0, 0.0
    while spent < _MEASURE_S:
        start = time.process_time()
        units = work()
        took = max(time.process_time() - start, 1e-6)
        spent += took
        best = max(best, units / took)
    return best


def _criteo_text(rows: int, seed: int = 20240601) -> bytes:
    import numpy as np

    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, rows)
    ints = rng.integers(0, 5000, (rows, 13))
    cats = rng.zipf(1.3, (rows, 26)) % 2**32
    lines = [
        "\t".join([str(labels[i]), *map(str, ints[i]), *(f"{v:08x}" for v in cats[i])]) for i in range(rows)
    ]
    return ("\n".join(lines) + "\n").encode()


def parse_rows_per_s(rows: int = 20_000) -> float:
    import io

    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.csv as csv

    text = _criteo_text(rows)
    names = ["label", *(f"I{i}" for i in range(1, 14)), *(f"C{i}" for i in range(1, 27))]
    types = {n: pa.string() for n in names[14:]}

    def work() -> int:
        table = csv.read_csv(
            io.BytesIO(text),
            read_options=csv.ReadOptions(column_names=names, use_threads=False),
            parse_options=csv.ParseOptions(delimiter="\t"),
            convert_options=csv.ConvertOptions(column_types=types),
        )
        for name in names[14:]:
            pc.value_counts(table[name])
        return table.num_rows

    return _best_rate(work)


def matmul_gflops(batch: int = 256, width: int = 1024) -> float:
    import numpy as np

    rng = np.random.default_rng(1)
    a = rng.standard_normal((batch, width), dtype=np.float32)
    b = rng.standard_normal((width, width), dtype=np.float32)

    def work() -> int:
        for _ in range(4):
            a @ b
        return 4 * 2 * batch * width * width

    return _best_rate(work) / 1e9


def convert_rows_per_s(rows: int = 50_000) -> float:
    import io

    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(2)
    columns: dict[str, np.ndarray] = {f"I{i}": rng.random(rows, dtype=np.float32) * 100 for i in range(1, 14)}
    columns.update({f"C{i}": rng.integers(0, 100_000, rows, dtype=np.int32) for i in range(1, 27)})
    table = pa.table(columns)
    sink = io.BytesIO()
    pq.write_table(table, sink, use_dictionary=False)
    data = sink.getvalue()

    def work() -> int:
        read = pq.read_table(io.BytesIO(data), use_threads=False)
        numeric = np.stack([np.log1p(read[f"I{i}"].to_numpy()) for i in range(1, 14)], axis=1)
        numeric.astype(np.float16).tobytes()
        for i in range(1, 27):
            read[f"C{i}"].to_numpy().astype(np.uint32).tobytes()
        return read.num_rows

    return _best_rate(work)


def measure() -> dict[str, float]:
    """The three figures, in this process (``measure_in_child`` sets it single-threaded)."""
    import pyarrow as pa

    pa.set_cpu_count(1)
    pa.set_io_thread_count(1)
    return {
        "parse_rows_per_s": parse_rows_per_s(),
        "matmul_gflops": matmul_gflops(),
        "convert_rows_per_s": convert_rows_per_s(),
    }


if __name__ == "__main__":
    print(json.dumps(measure()), flush=True)
