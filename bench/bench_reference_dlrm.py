"""Benchmark: facebookresearch/dlrm (the reference DLRM) trained on our split binary dataset.

The one-epoch target: our trainer must stay at or above the reference on the same
data. This script makes "the same data" literal: it converts the train and test splits of a
dataset written by the pipeline (``DIR/binary``) into the reference's MLPerf binary input,
runs the reference's ``dlrm_s_pytorch.py`` (a checkout outside this repository, in its own
PyTorch environment) with its Terabyte recipe for one epoch, and prints the reference's test
AUC beside ours.

**The records.** The reference's ``--mlperf-bin-loader`` reads one file per split of int32
records: label, 13 integers, 26 ids (``data_loader_terabyte.CriteoBinDataset``), and the
table sizes from ``<raw-data-file>_fea_count.npz`` (key ``counts``). It applies ``log(x + 1)``
to the integers itself, where our pipeline stored ``v = log(x + 3)`` (x <= -3 or missing ->
0, as x = -2) in float16. We write ``k = round(exp(v)) - 1``: the reference then computes
``log(k + 1) = log(round(exp(v)))``, our own ``log(x + 3)`` again. Where float16 kept enough of
``v`` ``k + 1`` is ``x + 3`` exactly: every x from -2 to 258 (the first miss is 259), about
92% of the values of a generated 6M dataset; above, ``k + 1`` is the integer nearest
``exp(v)`` and ``log(k + 1)`` rounds back to the stored float16 ``v`` (checked on every value
of 200k rows; at most 0.002 apart in float32), which is all our trainer sees of it too. So
both models get the same numerical inputs; shifting by 2 instead of clipping negatives to 0
(the reference's own Criteo preprocessing) keeps -2, -1 and 0 apart, as our trainer does.
Labels and ids are copied unchanged (our ids are already 0..table_size-1 per column; id 0 =
rare or missing). The rows keep the split's order.

**The recipe** (``--recipe``): ``mlperf`` is the reference's ``bench/run_and_time.sh``
(embedding dim 128, bottom MLP 13-512-256-128, top 1024-1024-512-256-1, SGD lr 1.0, batch
2048, batch order shuffled); ``terabyte`` is its ``bench/dlrm_s_criteo_terabyte.sh`` (dim 64,
13-512-256-64, 512-512-256-1, SGD lr 0.1, batch 2048). Both as written, for one epoch, less
``--max-ind-range``: our tables (at most a few hundred thousand rows) are far below its
10-40M cap, where it would hash nothing. The test split is scored once, at the end
(``--test-freq`` past the epoch's end), as our one-epoch figure is; so the MLPerf stop rule
(``--mlperf-auc-threshold``, checked at test passes) is left out too: it could act only
there, after the last step. The terabyte recipe is the default: the MLPerf one costs several
times its CPU for the same epoch.

Usage::

    python bench/bench_reference_dlrm.py --dataset DIR/binary --reference /path/to/dlrm \\
        --python /path/to/torchenv/bin/python --workdir /tmp/refrun [--train-rows N] \\
        [--test-rows N] [--recipe mlperf] [--ours-auc 0.8078]

The reference at commit 090956e needs one line added before it runs with
``--mlperf-bin-loader``: ``CriteoBinDataset.__init__`` (data_loader_terabyte.py) must set
``self.num_samples = os.path.getsize(data_file) // (bytes_per_feature * self.tot_fea)``, which
dlrm_data_pytorch.py logs and the class never defines (AttributeError otherwise).

``--python`` is an environment with torch, numpy, scikit-learn, tqdm, tensorboard and
mlperf-logging (what ``dlrm_s_pytorch.py`` imports); this repository's environment needs none
of them. The conversion alone: ``--convert-only``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dlrm_contracts.binary_format import (  # noqa: E402
    LABEL_FILE,
    NUM_CATEGORICAL,
    NUM_NUMERICAL,
    NUMERICAL_FILE,
    DatasetError,
    cat_file,
    read_info,
    row_width,
)
from trainer.data import open_dataset  # noqa: E402

RECORD_WIDTH = 1 + NUM_NUMERICAL + NUM_CATEGORICAL  # label, 13 integers, 26 ids (int32 each)
CHUNK_ROWS = 1 << 18
INT32_MAX = np.iinfo(np.int32).max

# The reference's own recipes (its bench/ scripts), less the data paths and the flags named
# in the module docstring.
RECIPES = {
    "mlperf": [
        "--arch-sparse-feature-size=128",
        "--arch-mlp-bot=13-512-256-128",
        "--arch-mlp-top=1024-1024-512-256-1",
        "--learning-rate=1.0",
        "--mini-batch-size=2048",
        "--mlperf-bin-shuffle",
    ],
    "terabyte": [
        "--arch-sparse-feature-size=64",
        "--arch-mlp-bot=13-512-256-64",
        "--arch-mlp-top=512-512-256-1",
        "--learning-rate=0.1",
        "--mini-batch-size=2048",
    ],
}
# The reference scores the test split every --test-freq batches and after the last one; its
# default (-1) never does, so a period longer than any epoch means "once, at the end".
ONLY_AT_THE_END = 10**9
# --mlperf-logging is what makes the reference score AUC (else accuracy only); with
# --memory-map and --data-set=terabyte it selects the MLPerf binary loader.
COMMON = [
    "--data-generation=dataset",
    "--data-set=terabyte",
    "--loss-function=bce",
    "--round-targets=True",
    "--nepochs=1",
    f"--test-freq={ONLY_AT_THE_END}",
    "--test-mini-batch-size=16384",
    "--print-freq=64",
    "--print-time",
    "--memory-map",
    "--mlperf-logging",
    "--mlperf-bin-loader",
]
AUC_LINE = re.compile(r"\bauc ([0-9.]+), best auc")


def reference_ints(numerical: np.ndarray) -> np.ndarray:
    """Integers k whose ``log(k + 1)`` (the reference loader's transform) is our ``log(x + 3)``.

    Raises DatasetError for a value our pipeline never writes (below 0: ``log(x + 3)`` with
    x >= -2) or one the reference's int32 record cannot hold (x + 3 >= 2^31), instead of
    feeding the reference a log of 0 or a wrapped integer."""
    if numerical.size and numerical.min() < 0:
        raise DatasetError(
            f"a numerical of {float(numerical.min())} is below 0: not the "
            f"pipeline's log(x + 3), which the reference's records rebuild"
        )
    restored = np.rint(np.exp(numerical.astype(np.float64)))
    if restored.size and restored.max() > INT32_MAX:
        raise DatasetError(
            f"a numerical of {restored.max():.0f} (exp of the stored log) does "
            f"not fit the reference's int32 records"
        )
    return restored.astype(np.int32) - 1


def write_records(dataset: Path, split: str, out_path: Path, rows: int | None = None) -> int:
    """Write the first ``rows`` rows (None = all) of one split as reference records.

    Reads each of our column files in CHUNK_ROWS slices (memory-mapped), so a split of any size
    converts in a few hundred MB. Returns the rows written."""
    ds = open_dataset(dataset, verify="quick")
    available = ds.rows[split]
    rows = available if rows is None else min(rows, available)
    info = read_info(dataset)
    columns = {}
    for name in [LABEL_FILE, NUMERICAL_FILE] + [cat_file(i) for i in range(NUM_CATEGORICAL)]:
        dtype, width = row_width(name, info)
        mapped = np.memmap(dataset / split / name, dtype=dtype, mode="r")
        columns[name] = mapped.reshape(-1, width) if width > 1 else mapped
    out_path.parent.mkdir(parents=True, exist_ok=True)
    record = np.empty((CHUNK_ROWS, RECORD_WIDTH), np.int32)
    with open(out_path, "wb") as out:
        for start in range(0, rows, CHUNK_ROWS):
            stop = min(start + CHUNK_ROWS, rows)
            block = record[: stop - start]
            block[:, 0] = columns[LABEL_FILE][start:stop]
            block[:, 1 : 1 + NUM_NUMERICAL] = reference_ints(columns[NUMERICAL_FILE][start:stop])
            for i in range(NUM_CATEGORICAL):
                block[:, 1 + NUM_NUMERICAL + i] = columns[cat_file(i)][start:stop]
            out.write(block.tobytes())
    return rows


def write_counts(dataset: Path, out_path: Path) -> list[int]:
    """The reference's table sizes file: our table sizes, one per column."""
    sizes = list(open_dataset(dataset, verify="none").table_sizes)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(out_path, counts=np.asarray(sizes, np.int64))
    return sizes


def convert(dataset: Path, workdir: Path, train_rows: int | None, test_rows: int | None) -> dict:
    """The three files the reference's MLPerf loader opens, under ``workdir/input``."""
    started = time.perf_counter()
    data = workdir / "input"
    written = {
        "train": write_records(dataset, "train", data / "processed_train.bin", train_rows),
        "test": write_records(dataset, "test", data / "processed_test.bin", test_rows),
    }
    write_counts(dataset, data / "day_fea_count.npz")
    return {"rows": written, "seconds": round(time.perf_counter() - started, 1)}


def reference_command(python: str, reference: Path, workdir: Path, recipe: str) -> list[str]:
    data = workdir / "input"
    return [
        python,
        str(reference / "dlrm_s_pytorch.py"),
        *RECIPES[recipe],
        *COMMON,
        f"--raw-data-file={data / 'day'}",
        f"--processed-data-file={data / 'processed.npz'}",
    ]


def child_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_reference(command: list[str], reference: Path, log_path: Path, threads: int) -> dict:
    """Run the reference to its end; its last ``auc`` line is the test AUC after the epoch.

    ``threads`` caps PyTorch's OpenMP threads: on a loaded machine its threads spin waiting
    for each other (the Terabyte model's step: 0.17 CPU-s with 1 thread, 0.90 with 2, at load
    ~12 on 2 cores; the arithmetic is the same)."""
    started, cpu_before = time.perf_counter(), child_cpu_seconds()
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    with open(log_path, "w") as log:
        code = subprocess.run(
            command, cwd=reference, stdout=log, stderr=subprocess.STDOUT, env=env
        ).returncode
    text = log_path.read_text()
    aucs = AUC_LINE.findall(text)
    if code != 0 or not aucs:
        tail = "\n".join(text.splitlines()[-20:])
        raise SystemExit(
            f"the reference failed (exit {code}, {len(aucs)} AUC lines); log {log_path}:\n{tail}"
        )
    return {
        "test_auc": float(aucs[-1]),
        "wall_s": round(time.perf_counter() - started, 1),
        "cpu_s": round(child_cpu_seconds() - cpu_before, 1),
        "threads": threads,
        "log": str(log_path),
    }


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", type=Path, required=True, help="split binary dataset (DIR/binary)")
    p.add_argument(
        "--workdir", type=Path, required=True, help="where the records, the reference's log and the result go"
    )
    p.add_argument("--reference", type=Path, help="facebookresearch/dlrm checkout")
    p.add_argument("--python", default="python", help="python of the reference's environment")
    p.add_argument("--recipe", choices=sorted(RECIPES), default="terabyte")
    p.add_argument("--train-rows", type=int, help="first N train rows only (a quick check)")
    p.add_argument("--test-rows", type=int, help="first N test rows only")
    p.add_argument(
        "--ours-auc",
        type=float,
        help="our trainer's test AUC on the same dataset, printed beside (from "
        "bench/bench_quality.py --dataset DIR --trainer-args '--epochs 1')",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="OMP_NUM_THREADS of the reference (1: no spinning on a shared machine)",
    )
    p.add_argument("--convert-only", action="store_true")
    p.add_argument(
        "--reuse-records",
        action="store_true",
        help="keep records already in WORKDIR/input (same dataset and row counts)",
    )
    args = p.parse_args()
    if not args.convert_only and args.reference is None:
        p.error("--reference is needed unless --convert-only")
    return args


def records(args: argparse.Namespace) -> dict:
    """Convert, or with --reuse-records take the records a run with the same rows wrote."""
    marker = args.workdir / "input" / "converted.json"
    wanted = {
        "dataset": str(args.dataset.resolve()),
        "train_rows": args.train_rows,
        "test_rows": args.test_rows,
    }
    if args.reuse_records and marker.exists():
        earlier = json.loads(marker.read_text())
        if earlier["wanted"] == wanted:
            return earlier["conversion"]
    conversion = convert(args.dataset, args.workdir, args.train_rows, args.test_rows)
    marker.write_text(json.dumps({"wanted": wanted, "conversion": conversion}))
    return conversion


def report(result: dict) -> None:
    rows = result["conversion"]["rows"]
    print(f"\n| one epoch, {rows['train']:,} train rows; test AUC on {rows['test']:,} rows | AUC |")
    print("|---|---|")
    print(f"| facebookresearch/dlrm, recipe {result['recipe']} | {result['reference']['test_auc']:.4f} |")
    if result["ours_test_auc"] is not None:
        print(f"| ours (--ours-auc) | {result['ours_test_auc']:.4f} |")
    print(json.dumps(result, indent=2))


def main() -> int:
    args = parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    result = {"dataset": str(args.dataset), "recipe": args.recipe, "conversion": records(args)}
    print(f"records: {result['conversion']}", flush=True)
    if args.convert_only:
        return 0
    command = reference_command(args.python, args.reference, args.workdir, args.recipe)
    print(f"reference command: OMP_NUM_THREADS={args.threads}", " ".join(command), flush=True)
    result["reference"] = run_reference(command, args.reference, args.workdir / "reference.log", args.threads)
    result["ours_test_auc"] = args.ours_auc
    (args.workdir / "result.json").write_text(json.dumps(result, indent=2) + "\n")
    report(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
