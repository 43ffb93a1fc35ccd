"""Writes docs/sizing.md: every number in it comes from the project's own tools, not by hand.

    python docs/make_sizing.py --workdir W [--raw RAW --run-preprocess] \
        [--facts ../shared/data/criteo_terabyte_facts.md] [--out docs/sizing.md]

- Table sizes and embedding memory: the threshold planner (``python -m converters plan
  --json``) on ``W/counts`` (a generated dataset preprocessed by spark_jobs) and on a counts
  histogram built from the Terabyte logs' published per-column unique-value counts. That
  histogram only knows that every value occurs at least once, so it answers threshold 1 only:
  the upper bound.
- GPUs needed: the trainer's own placement (``trainer.placement.plan_placement``, the same
  greedy placement and column split the trainer uses) for growing rank counts, until the
  fullest rank fits a GPU's memory minus a reserve.
- Disk and shuffle: measured on W (file sizes; Spark's event log for shuffle bytes written and
  spilled) and scaled per row to the Terabyte row count.
- The dictionary index (parquet/dictionary_index): its exact bytes per kept value, the
  Terabyte's index at threshold 1 (the published unique counts) and at thresholds 3 and 15
  (kept values estimated by a per-column Zipf law calibrated to those counts, see
  ``kept_by_calibrated_zipf``), the time to copy it to a node, and, with ``--bench-log``, the
  preprocessing cost per node from the CPU seconds per row that ``bench/bench_spark.py
  --high-cardinality`` printed.
With ``--run-preprocess`` the script first runs ``python -m spark_jobs`` on RAW into W with the
event log on, and records the wall time.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from dlrm_contracts.config import TrainConfig  # noqa: E402
from dlrm_contracts.layout import WorkdirLayout  # noqa: E402
from dlrm_contracts.schema import CAT_COLUMNS, NUM_INTEGER  # noqa: E402
from trainer.placement import plan_placement  # noqa: E402  (numpy only; no TensorFlow)

GIB = 2**30
RUN_RECORD = lambda workdir: workdir / "make_sizing_preprocess.json"  # noqa: E731
GPU_MEMORY_GIB = (16, 32, 40, 80)
# weights, + Adagrad's accumulator, + Adam's two moment tables per weight
OPTIMIZER_STATE = {"sgd": 1, "adagrad": 2, "adam": 3}
INDEX_THRESHOLDS = (1, 3, 15)
NODE_CORES = (16, 32, 64)
COPY_RATES_MB_S = (200, 1000)  # a shared filesystem's read rate per node, low and high


def default_dims() -> tuple[int, tuple[int, ...], tuple[int, ...]]:
    """The trainer's default DLRM preset (embedding dim, bottom MLP, top MLP)."""
    from trainer.model import PRESETS  # imports TensorFlow: the dims have one home

    dims = PRESETS["default"]
    return dims.embedding_dim, tuple(dims.bottom_mlp), tuple(dims.top_mlp)


# ---------------------------------------------------------------- inputs
def terabyte_facts(path: Path) -> tuple[int, dict[str, int]]:
    """(rows, unique values per column) parsed from the shared facts file."""
    text = path.read_text()
    rows = int(re.search(r"([\d,]+) rows in all", text).group(1).replace(",", ""))
    block = text[text.index("Unique values per categorical column") :]
    numbers = re.search(r":\s*([\d,\s]+?)\s*\(", block).group(1)
    uniques = [int(n) for n in re.split(r",\s*", numbers.strip()) if n]
    if len(uniques) != len(CAT_COLUMNS):
        raise ValueError(f"{path}: expected {len(CAT_COLUMNS)} unique counts, found {len(uniques)}")
    return rows, dict(zip(CAT_COLUMNS, uniques))


def _kept_fraction_sum(size: int, occurrences: float, exponent: float, threshold: int) -> float:
    """Expected number of a column's values seen at least ``threshold`` times, when
    ``occurrences`` draws follow a bounded Zipf law over ``size`` values (each value's count
    is Poisson). Summed over log-spaced blocks of ranks: the summand varies slowly with the rank."""
    import math

    import numpy as np

    edges = np.unique(
        np.floor(np.concatenate([np.arange(1, min(size, 2000) + 1), np.geomspace(2000, size + 1, 20000)]))
    )
    edges = np.append(edges[edges <= size], size + 1)
    lo, hi = edges[:-1], edges[1:]
    rank = np.sqrt(lo * hi)
    a, top = 1.0 - exponent, size + 1.0
    share = (rank**a - (rank + 1) ** a) / (1 - top**a) if abs(a) > 1e-9 else np.log1p(1 / rank) / np.log(top)
    lam = occurrences * share
    below = sum(np.exp(-lam) * lam**i / math.factorial(i) for i in range(threshold))
    return float(((1 - below) * (hi - lo)).sum())


def kept_by_calibrated_zipf(uniques: dict[str, int], rows: int, thresholds=(1, 3, 15)) -> dict:
    """Kept values per threshold, summed over columns: for each column whose values cannot all
    be frequent, the Zipf exponent is chosen so that the expected distinct values over all rows
    is the published unique count; smaller columns keep every value. An estimate: the real
    counts are not published."""
    from pipeline.synthetic.shape import CATEGORICAL_MISSING_RATES

    kept = {t: 0.0 for t in thresholds}
    for column, missing in zip(CAT_COLUMNS, CATEGORICAL_MISSING_RATES):
        size, occurrences = uniques[column], rows * (1 - missing)
        if size * 100 < occurrences:  # each value seen ~100+ times on average
            for t in thresholds:
                kept[t] += size
            continue
        lo, hi = 0.05, 3.0  # a flatter law (lower exponent) has more distinct values
        for _ in range(50):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if _kept_fraction_sum(size, occurrences, mid, 1) > 0.99 * size else (lo, mid)
        for t in thresholds:
            kept[t] += size if t == 1 else _kept_fraction_sum(size, occurrences, (lo + hi) / 2, t)
    return kept


def write_lower_bound_histogram(uniques: dict[str, int], directory: Path) -> Path:
    """A histogram.parquet saying: column c has U_c values, each seen at least once."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = directory / "histogram.parquet"
    pq.write_table(
        pa.table(
            {"column": list(uniques), "count": [1] * len(uniques), "num_values": list(uniques.values())},
            schema=pa.schema([("column", pa.string()), ("count", pa.int64()), ("num_values", pa.int64())]),
        ),
        path,
    )
    return path


def run_planner(counts: Path, thresholds: str, dim: int) -> tuple[list[dict], str]:
    argv = [
        sys.executable,
        "-m",
        "converters",
        "plan",
        "--counts",
        str(counts),
        "--thresholds",
        thresholds,
        "--embedding-dim",
        str(dim),
        "--json",
    ]
    out = subprocess.run(argv, capture_output=True, text=True, check=True, cwd=REPO).stdout
    return json.loads(out.strip().splitlines()[-1]), " ".join(["python"] + argv[1:])


def run_preprocess(raw: Path, workdir: Path, threshold: str, driver_memory: str) -> tuple[float, str]:
    events = workdir / "eventlog"
    events.mkdir(parents=True, exist_ok=True)
    argv = [
        sys.executable,
        "-m",
        "spark_jobs",
        "--input",
        str(raw),
        "--workdir",
        str(workdir),
        "--frequency-threshold",
        threshold,
        "--driver-memory",
        driver_memory,
        "--conf",
        "spark.eventLog.enabled=true",
        "--conf",
        f"spark.eventLog.dir={events.as_uri()}",
    ]
    started = time.perf_counter()
    subprocess.run(argv, check=True, cwd=REPO)
    return time.perf_counter() - started, " ".join(["python"] + argv[1:])


def shuffle_totals(workdir: Path) -> dict[str, int]:
    """Shuffle bytes written and bytes spilled, summed over the tasks of the event log(s)."""
    import io

    import pyarrow as pa

    totals = {"shuffle_write": 0, "disk_spill": 0, "memory_spill": 0}
    # Spark 4 writes rolling logs (eventlog_v2_*/events_N_*), zstd-compressed by default.
    for log in sorted((workdir / "eventlog").rglob("events_*")):
        compression = "zstd" if log.suffix == ".zstd" else None
        with pa.input_stream(str(log), compression=compression) as raw:
            for line in io.TextIOWrapper(io.BytesIO(raw.read()), encoding="utf-8"):
                if '"SparkListenerTaskEnd"' not in line:
                    continue
                metrics = json.loads(line).get("Task Metrics") or {}
                totals["shuffle_write"] += metrics.get("Shuffle Write Metrics", {}).get(
                    "Shuffle Bytes Written", 0
                )
                totals["disk_spill"] += metrics.get("Disk Bytes Spilled", 0)
                totals["memory_spill"] += metrics.get("Memory Bytes Spilled", 0)
    if not any(totals.values()) and any((workdir / "eventlog").rglob("*")):
        raise ValueError(f"no task metrics found in {workdir / 'eventlog'}")
    return totals


def count_entries(counts: Path) -> int:
    """(column, value, day) rows of DIR/counts/values, from the parquet footers."""
    import pyarrow.parquet as pq

    return sum(pq.ParquetFile(f).metadata.num_rows for f in (counts / "values").rglob("*.parquet"))


def tree_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.exists() else 0


# ---------------------------------------------------------------- derived figures
def dense_parameters(dims, features: int = len(CAT_COLUMNS) + 1) -> int:
    dim, bottom, top = dims
    params, width = 0, NUM_INTEGER
    for units in bottom:
        params += width * units + units
        width = units
    width = dim + features * (features - 1) // 2  # bottom output + dot-interaction pairs
    for units in top:
        params += width * units + units
        width = units
    return params


def binary_bytes_per_row(cat_dtypes: dict[str, str]) -> int:
    sizes = {"int8": 1, "int16": 2, "int32": 4}
    return 1 + 2 * NUM_INTEGER + sum(sizes[cat_dtypes[c]] for c in CAT_COLUMNS)


def ranks_needed(
    table_sizes: list[int], dim: int, gpu_gib: float, reserve_gib: float, state: int, limit: int = 4096
) -> tuple[int, float] | None:
    """Fewest ranks whose fullest one holds its tables (x optimizer state) in the GPU's memory."""
    train = TrainConfig()
    budget = (gpu_gib - reserve_gib) * GIB
    world = 1
    while world <= limit:
        placement = plan_placement(
            table_sizes, dim, world, split_threshold_bytes=train.column_split_threshold_mb * 2**20
        )
        fullest = max(sum(p.rows * p.width for p in rank) for rank in placement.pieces) * 4 * state
        if fullest <= budget:
            return world, fullest / GIB
        world = world + 1 if world < 16 else world + max(1, world // 8)
    return None


# ---------------------------------------------------------------- the document
def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def gib(n: float) -> str:
    return f"{n / GIB:,.2f} GiB" if n < 100 * GIB else f"{n / GIB:,.0f} GiB"


def gpu_table(cases: list[tuple[str, list[int]]], dim: int, reserve: float) -> str:
    rows = []
    for label, sizes in cases:
        for optimizer, state in OPTIMIZER_STATE.items():
            cells = []
            for memory in GPU_MEMORY_GIB:
                found = ranks_needed(sizes, dim, memory, reserve, state)
                cells.append("> 4096" if found is None else f"{found[0]} ({found[1]:.1f} GiB)")
            rows.append([label, optimizer] + cells)
    return table(["tables", "optimizer"] + [f"{m} GB GPUs" for m in GPU_MEMORY_GIB], rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workdir", type=Path, required=True, help="preprocessed generated data")
    parser.add_argument("--raw", type=Path, help="raw generated days (for --run-preprocess and sizes)")
    parser.add_argument("--run-preprocess", action="store_true")
    parser.add_argument("--preprocess-threshold", default="1")
    parser.add_argument("--driver-memory", default="8g")
    parser.add_argument("--thresholds", default="1,2,5,15,25")
    parser.add_argument("--embedding-dim", type=int, help="default: the trainer's default preset")
    parser.add_argument(
        "--reserve-gib",
        type=float,
        default=6.0,
        help="GPU memory kept for TensorFlow, NCCL, activations and the dense part",
    )
    parser.add_argument(
        "--facts", type=Path, default=REPO.parent / "shared" / "data" / "criteo_terabyte_facts.md"
    )
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "sizing.md")
    parser.add_argument("--note", default="", help="free text about the machine and its load")
    parser.add_argument(
        "--bench-log",
        type=Path,
        action="append",
        default=[],
        help="output of bench/bench_spark.py --high-cardinality (repeatable)",
    )
    args = parser.parse_args(argv)

    preprocess_seconds, preprocess_command = None, None
    if args.run_preprocess:
        if not args.raw:
            parser.error("--run-preprocess needs --raw")
        preprocess_seconds, preprocess_command = run_preprocess(
            args.raw, args.workdir, args.preprocess_threshold, args.driver_memory
        )
        RUN_RECORD(args.workdir).write_text(
            json.dumps({"seconds": preprocess_seconds, "command": preprocess_command})
        )
    elif RUN_RECORD(args.workdir).exists():  # regenerate the page without rerunning Spark
        record = json.loads(RUN_RECORD(args.workdir).read_text())
        preprocess_seconds, preprocess_command = record["seconds"], record["command"]
    dims = default_dims()
    dim = args.embedding_dim or dims[0]
    generated, plan_command = run_planner(args.workdir / "counts", args.thresholds, dim)
    tb_rows, uniques = terabyte_facts(args.facts)
    with tempfile.TemporaryDirectory() as tmp:
        histogram = write_lower_bound_histogram(uniques, Path(tmp))
        (terabyte,), _ = run_planner(histogram, "1", dim)
    meta = json.loads((args.workdir / "parquet" / "preprocess.json").read_text())
    split_rows = meta["rows"]
    rows = sum(split_rows.values())

    text = render(
        args,
        generated,
        terabyte,
        tb_rows,
        rows,
        split_rows,
        plan_command,
        preprocess_seconds,
        preprocess_command,
        dims,
    )
    text += index_section(args.workdir, uniques, tb_rows, args.bench_log)
    args.out.write_text(text)
    print(f"wrote {args.out}")
    return 0


def render(
    args,
    generated,
    terabyte,
    tb_rows,
    rows,
    split_rows,
    plan_command,
    preprocess_seconds,
    preprocess_command,
    dims,
) -> str:
    dim = generated[0]["embedding_dim"]
    thresholds = [r["threshold_spec"] for r in generated]
    size_rows = [
        [c] + [f"{r['table_sizes'][c]:,}" for r in generated] + [f"{terabyte['table_sizes'][c]:,}"]
        for c in CAT_COLUMNS
    ]
    size_rows.append(
        ["**total rows**"]
        + [f"**{r['total_rows']:,}**" for r in generated]
        + [f"**{terabyte['total_rows']:,}**"]
    )
    size_rows.append(
        [f"**fp32 tables, dim {dim}**"]
        + [f"**{gib(r['embedding_bytes'])}**" for r in generated]
        + [f"**{gib(terabyte['embedding_bytes'])}**"]
    )
    size_rows.append(
        ["Adagrad (x2)"]
        + [gib(2 * r["embedding_bytes"]) for r in generated]
        + [gib(2 * terabyte["embedding_bytes"])]
    )
    size_rows.append(
        ["Adam (x3)"]
        + [gib(3 * r["embedding_bytes"]) for r in generated]
        + [gib(3 * terabyte["embedding_bytes"])]
    )
    sizes_table = table(
        ["column"] + [f"generated T={t}" for t in thresholds] + ["Terabyte T=1 (bound)"], size_rows
    )

    cases = [
        (f"generated T={r['threshold_spec']}", [r["table_sizes"][c] for c in CAT_COLUMNS])
        for r in generated
        if r["threshold_spec"] in ("1", "15")
    ]
    cases.append(("Terabyte T=1", [terabyte["table_sizes"][c] for c in CAT_COLUMNS]))
    gpus = gpu_table(cases, dim, args.reserve_gib)

    work = args.workdir
    raw_bytes = tree_bytes(args.raw) if args.raw else 0
    disk = {
        "raw text": raw_bytes,
        "counts/": tree_bytes(work / "counts"),
        "parquet/": tree_bytes(work / "parquet"),
        "rejects/": tree_bytes(work / "rejects"),
    }
    shuffle = shuffle_totals(work)
    disk_rows = []
    entries = count_entries(work / "counts")
    per_entry = disk["counts/"] / entries if entries else 0
    tb_values = terabyte["total_rows"] - len(CAT_COLUMNS)
    disk_rows.append(
        [
            "counts/ (per value and day)",
            gib(disk["counts/"]),
            f"{per_entry:,.1f} per entry ({entries:,} entries)",
            f"{gib(per_entry * tb_values)} to {gib(per_entry * tb_values * 24)} (each value on 1 to 24 days)",
        ]
    )
    del disk["counts/"]
    for name, value in list(disk.items()) + [
        ("Spark shuffle written", shuffle["shuffle_write"]),
        ("Spark spill to disk", shuffle["disk_spill"]),
    ]:
        per_row = value / rows if rows else 0
        disk_rows.append([name, gib(value), f"{per_row:,.1f}", gib(per_row * tb_rows)])
    bin_gen = binary_bytes_per_row(generated[0]["cat_dtypes"])
    bin_tb = binary_bytes_per_row(terabyte["cat_dtypes"])
    disk_rows.append(
        [
            f"binary/ (T={thresholds[0]}, exact)",
            gib(bin_gen * rows),
            f"{bin_gen}",
            f"{gib(bin_tb * tb_rows)} ({bin_tb} B/row at T=1)",
        ]
    )
    disk_table = table(
        ["artifact", f"generated ({rows:,} rows)", "bytes per row", f"Terabyte estimate ({tb_rows:,} rows)"],
        disk_rows,
    )

    dense = dense_parameters(dims)
    features = len(CAT_COLUMNS) + 1
    mlp = (
        f"bottom MLP {'-'.join(map(str, (NUM_INTEGER,) + dims[1]))}, dot interaction of "
        f"{features} vectors, top MLP "
        f"{'-'.join(map(str, (dims[0] + features * (features - 1) // 2,) + dims[2]))}"
    )
    tb_sizes = [terabyte["table_sizes"][c] for c in CAT_COLUMNS]
    tb80 = {o: ranks_needed(tb_sizes, dim, 80, args.reserve_gib, st) for o, st in OPTIMIZER_STATE.items()}
    reading = (
        f"at threshold 1 the Terabyte tables need {tb80['sgd'][0]} GPUs of 80 GB with SGD, "
        f"{tb80['adagrad'][0]} with Adagrad (its accumulator doubles the memory) "
        f"and {tb80['adam'][0]} with Adam (its two moment tables triple it)"
    )
    ran = (
        f"`{preprocess_command}` took {preprocess_seconds:,.0f} s"
        if preprocess_seconds is not None
        else "(the preprocess run was made separately)"
    )
    if preprocess_seconds is not None and not args.run_preprocess:
        ran += " (timed by an earlier `--run-preprocess` run of this script on the same workdir)"
    command = "python docs/make_sizing.py " + shlex.join(sys.argv[1:])
    share = {c: terabyte["table_sizes"][c] / terabyte["total_rows"] for c in CAT_COLUMNS}
    big = [c for c in CAT_COLUMNS if share[c] >= 0.01]
    big_columns = (
        f"{', '.join(big)} hold {sum(share[c] for c in big):.1%} of the Terabyte table rows at threshold 1"
    )
    split_text = ", ".join(f"{k} {v:,}" for k, v in split_rows.items())
    return TEMPLATE.format(
        **locals(),
        split=split_text,
        note=args.note or "",
        reserve=args.reserve_gib,
        dense_mib=dense * 4 / 2**20,
        split_mb=TrainConfig().column_split_threshold_mb,
        tb_unique=terabyte["total_rows"] - len(CAT_COLUMNS),
        date=time.strftime("%Y-%m-%d"),
    )


TEMPLATE = """# Sizing: tables, model, GPUs and Spark disk from the counts

<!-- Generated by docs/make_sizing.py; do not edit the numbers by hand. -->

Everything here follows from the per-column value counts that `spark_jobs` writes to
`DIR/counts/` (docs/architecture.md). Run the same tools on your own counts before renting
hardware:

```bash
./run_pipeline.sh plan --workdir DIR --thresholds 1,2,5,15 --embedding-dim 128
python -m converters plan --counts DIR/counts --thresholds 1,2,5,15 --embedding-dim 128 --json
```

The tables below were produced on {date} by

```bash
{command}
```

which ran the project's threshold planner (`{plan_command}`), the trainer's placement
(`trainer.placement.plan_placement`) and, for the generated data, {ran}. {note}

## 1. Table sizes and model size

A value of column c is kept at threshold T when it occurs at least T times over all days; the
table size is the number of kept values + 1 (id 0 = rare or missing):
`size_c(T) = 1 + sum(num_values where count >= max(1, T))` over `DIR/counts/histogram.parquet`.
The embedding tables hold `sum_c size_c(T) x dim x 4` bytes in float32 (Adagrad keeps an
accumulator per weight: x2; Adam two moment tables: x3). The dense part of the default model ({mlp}) has {dense:,} parameters ({dense_mib:.1f} MiB), negligible
next to the tables, and is replicated on every rank.

Columns: a generated dataset ({rows:,} rows: {split}), preprocessed once by spark_jobs, at
several thresholds (the planner answers every threshold from the one set of counts), and the **upper bound for the Criteo Terabyte logs**: threshold 1 over the published
per-column unique-value counts of all 24 days ({tb_unique:,} values). That bound is fed to the
same planner as a counts histogram in which every value occurs at least once; it holds for
threshold 1 only (per-value counts are not published), and every higher threshold gives smaller
tables. The generator's vocabularies are the Terabyte ones scaled by 0.002 (with a floor), so the
generated columns rank like the real ones.

{sizes_table}

## 2. GPUs for the hybrid-parallel placement

The trainer places whole tables greedily (largest first, on the least-loaded rank) and splits
any table above `train.column_split_threshold_mb` ({split_mb:,.0f} MB) column-wise over all
ranks. Below: the fewest ranks (GPUs) whose fullest rank fits its tables, times the optimizer
state, into the GPU's memory less {reserve:g} GiB kept for TensorFlow, NCCL buffers,
activations and the dense part (`--reserve-gib`); in brackets the fullest rank's table
memory. Rank counts above 16 are searched in steps of about 12%.

{gpus}

Reading it: {reading}; raising the threshold is the cheap lever — run the planner on your
counts to see how far each threshold shrinks the large columns ({big_columns}). A per-column spec such as `15,C3:3` keeps small vocabularies whole while
cutting the large ones.

## 3. Disk for the datasets and Spark's shuffle

Measured on the generated dataset (sizes of the files; shuffle bytes written and spilled
summed from Spark's event log) and scaled per row to the Terabyte logs. Per-row scaling is
right for the raw text, the parquet and the binary dataset (the binary size is exact: label 1
B + 13 float16 + each column's id width). The counts grow with distinct values per day, not
rows, so they are scaled per (column, value, day) entry between the two bounds the published
unique counts allow; the count shuffle likewise grows with distinct values per partition, so
its per-row scaling over-estimates.

{disk_table}

Plan the disks as: raw text + parquet + binary + counts on the shared filesystem, and the
shuffle figure (plus its spill) on the executors' local disks (`spark.local.dir`,
`SPARK_LOCAL_DIRS`, YARN `local-dirs`), spread over executors, with 2x headroom because a
failed stage's retry writes its shuffle again before the old files are cleaned.
"""


def measure_index(workdir: Path) -> dict:
    """The generated run's index: bytes, kept values, and one timed per-node copy of it (the
    executors' copy, ``dictionary_index.local_copy``)."""
    from spark_jobs.engines.arrow import dictionary_index

    index_dir = WorkdirLayout.at(workdir).dictionary_index
    sizes = json.loads(WorkdirLayout.at(workdir).parquet_model_size.read_text())
    kept = sum(int(sizes[c]) - 1 for c in CAT_COLUMNS)
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        dictionary_index.local_copy(str(index_dir), tmp, "sizing")
        seconds = time.perf_counter() - start
    size = dictionary_index.index_bytes(index_dir)
    return {
        "bytes": size,
        "kept": kept,
        "per_value": size / max(kept, 1),
        "copy_mb_s": size / 2**20 / max(seconds, 1e-6),
    }


def bench_figures(logs: list[Path]) -> list[dict]:
    """The result lines (JSON) of bench_spark.py runs, in the order printed."""
    results = []
    for log in logs:
        for line in log.read_text().splitlines():
            if line.startswith("{") and '"cpu_seconds_total"' in line:
                results.append(json.loads(line))
    return results


def index_section(workdir: Path, uniques: dict[str, int], tb_rows: int, logs: list[Path]) -> str:
    from spark_jobs.engines.arrow.dictionary_index import INDEX_LOAD

    measured = measure_index(workdir)
    kept = kept_by_calibrated_zipf(uniques, tb_rows, INDEX_THRESHOLDS)
    per_value = 8 / INDEX_LOAD  # a slot is 8 bytes; page rounding vanishes at scale
    rows = [
        [
            f"T={t}",
            f"{kept[t] / 1e6:,.0f}M" + (" (published)" if t == 1 else " (estimate)"),
            gib(kept[t] * per_value),
        ]
        + [f"{kept[t] * per_value / 2**20 / rate:,.0f} s" for rate in COPY_RATES_MB_S]
        for t in INDEX_THRESHOLDS
    ]
    index_table = table(
        ["threshold", "kept values", "index"]
        + [f"copy per node at {rate:,} MB/s" for rate in COPY_RATES_MB_S],
        rows,
    )
    text = INDEX_TEMPLATE.format(
        bytes_mib=measured["bytes"] / 2**20,
        kept=measured["kept"],
        measured_per_value=measured["per_value"],
        per_value=per_value,
        load=INDEX_LOAD,
        copy_mb_s=measured["copy_mb_s"],
        index_table=index_table,
    )
    return text + cost_section(bench_figures(logs), tb_rows)


def cost_section(results: list[dict], tb_rows: int) -> str:
    if not results:
        return (
            "\nRun `python docs/make_sizing.py ... --bench-log LOG` with the output of "
            "`python bench/bench_spark.py --high-cardinality > LOG` for the cost per node.\n"
        )
    rows = []
    for r in results:
        n = r["rows_in"]
        cpu = r["cpu_seconds_total"] / n * 1e6
        core_hours = cpu * tb_rows / 1e6 / 3600
        label = "high-cardinality" if r.get("columns_over_2m") else "ordinary"
        rows.append(
            [
                f"{r['input']} ({label}, {r['kept_values']:,} kept)",
                f"{n:,}",
                f"{cpu:.2f}",
                f"{core_hours:,.0f}",
            ]
            + [f"{core_hours / cores:,.1f} h" for cores in NODE_CORES]
        )
    cost_table = table(
        ["input", "rows", "CPU-s per 1M rows", "Terabyte core-hours"]
        + [f"one {c}-core node" for c in NODE_CORES],
        rows,
    )
    return COST_TEMPLATE.format(cost_table=cost_table, tb_rows=tb_rows)


INDEX_TEMPLATE = """
## 4. The dictionary index, per node

The Arrow engine looks every categorical value up in the dictionary index
(`parquet/dictionary_index/`, docs/spark_jobs.md): per column an open-addressing table of
8-byte slots at {load} kept values per slot, so **{per_value:.1f} bytes per kept value** (the
generated run above: {bytes_mib:,.1f} MB for {kept:,} kept values, {measured_per_value:.2f}
bytes per value with its page-aligned regions). Every Python worker memory-maps it, so a node
holds one copy in its page cache whatever its number of workers; on a cluster each node first
copies it from the workdir into its local directory (docs/cluster.md). That copy runs at the
shared filesystem's read rate (here, from a warm page cache, {copy_mb_s:,.0f} MB/s; a cold
local disk gave 167 MB/s, docs/cluster.md), so the table gives it at two rates.

The Terabyte's index: at threshold 1 from the published unique counts; at 3 and 15 from a
per-column Zipf law calibrated to those counts (an estimate: per-value counts are not published).
Plan the page cache of every executor node for it, beside the executors' heaps.

{index_table}
"""

COST_TEMPLATE = """
## 5. Preprocessing cost per node

From `bench/bench_spark.py --high-cardinality` (ordinary and high-cardinality inputs of the same
rows, run alternately; CPU seconds of the driver, executors and Python workers per 1M input rows,
end to end), scaled to the Terabyte's {tb_rows:,} rows. The cost per row does not grow with the
dictionaries' size (docs/perf-history.md: doubling the big columns' values on twice the rows), so the
high-cardinality figure is the one for the Terabyte's big columns. Node hours assume the job
keeps every core busy and the cluster's cores are as fast as this machine's; shuffle and shared
filesystem bandwidth are not in them. The index at threshold 1 (section 4) is 500 times the
largest one measured here: a lookup there misses every cache level as it does at 20M values
(docs/perf-history.md: 18 ns at 2.27M, 21 ns at 20M kept values), so its cost per row should hold,
but that is an extrapolation.

{cost_table}
"""


if __name__ == "__main__":
    sys.exit(main())
