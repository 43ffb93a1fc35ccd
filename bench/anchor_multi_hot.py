"""Anchor: our multi-hot materialization against the MLPerf DLRMv2 reference script, value for value.

Runs ``materialize_synthetic_multihot_dataset.py`` (mlcommons/training,
``recommendation_v2/torchrec_dlrm``; a checkout given by --reference) in a separate Python
with torch (--anchor-python) on one-hot ids written as TorchRec's ``day_<d>_sparse.npy``
(int64, rows x 26), then compares every ``day_<d>_sparse_multi_hot.npz`` it writes with
``dlrm_contracts.multi_hot`` on the same ids, and, with --ours, with the files our converter
wrote (``convert.formats: [binary, mlperf_multihot]``) from a split binary dataset, which the
reference reader's own loader (``data/multi_hot_criteo.py``) then reads back. The ids
are those of --dataset (a split binary dataset: its rows in the reference's day order) or
random ids below the table sizes. Needs the anchor environment (a venv with torch and numpy,
outside the repository), so it is never part of the test suite; see bench/README.md for the
command and result. Exits 1 when any array differs.

    python bench/anchor_multi_hot.py --table-sizes 40000,39060,... --rows 200000
    python bench/anchor_multi_hot.py --dataset WORKDIR/binary --ours WORKDIR/mlperf_multihot
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from dlrm_contracts.binary_format import read_info
from dlrm_contracts.multi_hot import DEFAULT_SEED, MultiHotSpec, iter_tables, materialize
from dlrm_contracts.schema import NUM_CATEGORICAL

REFERENCE_DAYS = 24  # torchrec.datasets.criteo.DAYS: the reference script reads every day
MLPERF_SIZES = "3,2,1,2,6,1,1,1,1,7,3,8,1,6,9,5,1,1,1,12,100,27,10,3,1,1"
SCRIPT = "scripts/materialize_synthetic_multihot_dataset.py"


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


def _dataset_days(dataset: Path) -> tuple[list[np.ndarray], list[int]]:
    """A split binary dataset's one-hot ids as the reference's days (our mlperf_multihot
    day mapping: train in 23 contiguous parts, then test + validation as the last day). Use a
    one-hot dataset of the same parquet for ids independent of our materialization."""
    from converters.mlperf_multihot import day_slices  # the layout's own rule

    info = read_info(dataset)
    widths = info.multi_hot_sizes
    columns = []
    for split in ("train", "test", "validation"):
        # a multi-hot row starts with its one-hot id (row r of a lookup table starts with r)
        columns.append(
            np.stack(
                [
                    np.fromfile(info.file(split, f"cat_{i}.bin"), info.cat_dtypes[i])
                    .reshape(info.splits[split], widths[i])[:, 0]
                    .astype(np.int64)
                    for i in range(NUM_CATEGORICAL)
                ],
                axis=1,
            ).reshape(info.splits[split], NUM_CATEGORICAL)
        )
    train, last = columns[0], np.concatenate(columns[1:])
    days = [train[s] for s in day_slices(len(train))] + [last]
    return days, list(info.table_sizes)


def _random_days(rows: int, table_sizes: list[int], seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    ids = np.stack([rng.integers(0, t, rows) for t in table_sizes], axis=1)
    return np.array_split(ids, REFERENCE_DAYS)


# What the reference script imports from torchrec, for an environment where torchrec does not
# import (its fbgemm-gpu is built for another torch): the constant it uses and two types it
# never calls while materializing.
STAND_IN = {
    "torchrec/__init__.py": "",
    "torchrec/datasets/__init__.py": "",
    "torchrec/datasets/criteo.py": (
        "DAYS = 24\nCAT_FEATURE_COUNT = 26\nDEFAULT_CAT_NAMES = [f'cat_{i}' for i in range(26)]\n"
    ),
    "torchrec/datasets/utils.py": "class Batch:\n    pass\n\n\nPATH_MANAGER_KEY = 'torchrec'\n",
    "torchrec/sparse/__init__.py": "",
    "torchrec/sparse/jagged_tensor.py": "class KeyedJaggedTensor:\n    pass\n",
}


def stand_in(folder: Path) -> str:
    for name, text in STAND_IN.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    return str(folder)


# The reference reader's own loader of one npz entry (MultiHotCriteoIterDataPipe.
# _load_from_npz: stored entry, header offset rule, memory map), run in the anchor environment
# on our files; the reader's other imports (iopath, pyre_extensions) are not needed for it.
READER = """
import json, sys, types
from pathlib import Path
import numpy as np
for name in ("iopath", "iopath.common", "iopath.common.file_io", "pyre_extensions"):
    sys.modules[name] = types.ModuleType(name)
sys.modules["iopath.common.file_io"].PathManager = object
sys.modules["iopath.common.file_io"].PathManagerFactory = object
sys.modules["pyre_extensions"].none_throws = lambda x: x
if not hasattr(np.lib.format, "_read_array_header"):  # numpy 2 moved the private helper
    from numpy.lib import _format_impl
    np.lib.format._read_array_header = _format_impl._read_array_header
from data.multi_hot_criteo import MultiHotCriteoIterDataPipe
ours, checked = Path(sys.argv[1]), 0
for d in range(24):
    path = ours / f"day_{d}_sparse_multi_hot.npz"
    plain = np.load(path)
    for c in range(26):
        mapped = MultiHotCriteoIterDataPipe._load_from_npz(None, str(path), f"{c}.npy")
        assert mapped.dtype == np.int32 and np.array_equal(np.asarray(mapped), plain[str(c)]), (d, c)
        checked += mapped.size
print(json.dumps(checked))
"""


def run_reader(args, work: Path) -> int:
    """The reference reader's loader over every entry of our files; the ids it read."""
    shim = stand_in(work / "stand_in") if args.shim == "stand-in" else args.shim
    (work / "reader.py").write_text(READER)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([shim, str(args.reference)]))
    done = subprocess.run(
        [args.anchor_python, str(work / "reader.py"), str(args.ours)],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    return int(done.stdout.strip().splitlines()[-1])


def run_reference(args, days: list[np.ndarray], table_sizes: list[int], work: Path) -> float:
    """Write the days, run the reference script on them; returns its seconds."""
    inp, out = work / "in", work / "out"
    inp.mkdir()
    for d, ids in enumerate(days):
        np.save(inp / f"day_{d}_sparse.npy", ids.astype(np.int64))
    shim = stand_in(work / "stand_in") if args.shim == "stand-in" else args.shim
    env = dict(os.environ, PYTHONPATH=shim)
    command = [
        args.anchor_python,
        str(Path(args.reference) / SCRIPT),
        "--in_memory_binary_criteo_path",
        str(inp),
        "--output_path",
        str(out),
        "--num_embeddings_per_feature",
        ",".join(map(str, table_sizes)),
        "--multi_hot_sizes",
        args.sizes,
        "--multi_hot_distribution_type",
        args.distribution,
    ]
    start = time.perf_counter()
    subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def compare(args, days: list[np.ndarray], table_sizes: list[int], out: Path) -> dict:
    spec = MultiHotSpec(tuple(table_sizes), tuple(_ints(args.sizes)), DEFAULT_SEED, args.distribution)
    start = time.perf_counter()
    tables = dict(iter_tables(spec))
    ours_seconds = time.perf_counter() - start
    compared = mismatches = 0
    for d, ids in enumerate(days):
        theirs = np.load(out / f"day_{d}_sparse_multi_hot.npz")
        mine = np.load(Path(args.ours) / f"day_{d}_sparse_multi_hot.npz") if args.ours else None
        for c in range(NUM_CATEGORICAL):
            table = tables.get(c, np.arange(table_sizes[c], dtype=np.int32)[:, None])
            want = materialize(ids[:, c], table)
            got = theirs[str(c)]
            same = got.dtype == want.dtype and got.shape == want.shape and np.array_equal(got, want)
            if mine is not None:
                same = same and mine[str(c)].dtype == got.dtype and np.array_equal(mine[str(c)], got)
            mismatches += not same
            compared += got.size
            if not same:
                print(f"day {d} column {c}: differs", file=sys.stderr)
    return {
        "days": len(days),
        "rows": int(sum(len(d) for d in days)),
        "ids_compared": compared,
        "arrays_differing": mismatches,
        "tables_seconds_ours": round(ours_seconds, 2),
        "table_sizes": table_sizes,
        "multi_hot_sizes": args.sizes,
        "distribution": args.distribution,
        "ours_files": bool(args.ours),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--anchor-python", default="/work/anchors-mh/.venv/bin/python")
    parser.add_argument(
        "--reference",
        default="/work/anchors-mh/ref",
        help="the reference's directory (a mlcommons/training checkout's "
        "recommendation_v2/torchrec_dlrm: multi_hot.py and " + SCRIPT + ")",
    )
    parser.add_argument(
        "--shim",
        default="stand-in",
        help="PYTHONPATH for the reference: 'stand-in' writes the stand-in "
        "torchrec above; '' uses the anchor environment's torchrec",
    )
    parser.add_argument("--dataset", help="a split binary dataset whose ids to use")
    parser.add_argument("--ours", help="our converter's mlperf_multihot directory to compare too")
    parser.add_argument("--table-sizes", help="26 table sizes (random ids; not with --dataset)")
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--sizes", default=MLPERF_SIZES)
    parser.add_argument("--distribution", default="uniform", choices=["uniform", "pareto"])
    parser.add_argument("--seed", type=int, default=1, help="of the random ids")
    args = parser.parse_args()
    if args.dataset:
        days, table_sizes = _dataset_days(Path(args.dataset))
    else:
        table_sizes = _ints(args.table_sizes)
        days = _random_days(args.rows, table_sizes, args.seed)
    with tempfile.TemporaryDirectory(prefix="anchor-multi-hot-") as work:
        reference_seconds = run_reference(args, days, table_sizes, Path(work))
        result = compare(args, days, table_sizes, Path(work) / "out")
        if args.ours:
            result["ids_read_by_the_reference_reader"] = run_reader(args, Path(work))
    result["reference_seconds"] = round(reference_seconds, 2)
    result["equal"] = result["arrays_differing"] == 0
    print(json.dumps(result))
    sys.exit(0 if result["equal"] else 1)


if __name__ == "__main__":
    main()
