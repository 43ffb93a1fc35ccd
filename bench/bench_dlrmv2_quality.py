"""Quality: TorchRec's dlrm_main.py (DCN) beside our DCNv2 and dot trainers, one epoch, same rows.

The DLRMv2 quality check: on the same generated multi-hot data and the same rows, the test AUC
of MLPerf DLRMv2's reference trainer (mlcommons/training ``recommendation_v2/torchrec_dlrm``
``dlrm_main.py``, DCN interaction, on CPU) beside our trainer with ``train.interaction: dcn``
and with the dot interaction, one epoch each, small dimensions.

"The same data", literally:

1. ``bench_torchrec_anchor.py``'s 24 raw days (generated, the 200 real rows first in day 23)
   go through our pipeline (frequency ids at ``--threshold``) with
   ``convert.formats: [binary, torchrec]``: our split binary dataset and, beside it, the same
   rows in TorchRec's layout (``DIR/binary/torchrec``).
2. The reference's ``materialize_synthetic_multihot_dataset.py`` turns those TorchRec files
   into its multi-hot dataset (``day_<k>_sparse_multi_hot.npz``, the MLPerf sizes, uniform).
3. Those multi-hot ids are written as our multi-hot split binary dataset (the labels and
   numericals of our one-hot dataset, row for row; ``dataset.json`` gains
   ``multi_hot_sizes``), so both trainers read the same ids in the same order.
4. ``dlrm_main.py --synthetic_multi_hot_criteo_path`` trains on days 0-22 and scores day 23's
   second half at the end (its "test" stage), which is our validation split; our trainers'
   ``validation_auc`` is read on the same rows, and ``test_auc`` (day 23's first half,
   TorchRec's "val" stage) is shown too.

Both sides use the same model and optimizer: embedding dim ``--dim``, bottom MLP
``64,<dim>``, top MLP ``64,32,1``, 3 cross layers of rank ``--dim`` (dot: pairwise dot
products), Adagrad (eps 1e-8, initial accumulator 0, as dlrm_main.py fixes them) at
``--lr`` for tables and MLPs, batch ``--batch``, one epoch in the data's order (batches not
shuffled: dlrm_main.py's default), no schedule.

Usage::

    python bench/bench_dlrmv2_quality.py --out /tmp/anchor --anchors /work/anchors \\
        [--rows-per-day 20000] [--threshold 3] [--dim 16] [--batch 1024] [--lr 0.05]

The last stdout line is a JSON summary; bench/README.md records a run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import bench_torchrec_anchor as anchor  # noqa: E402
from converters.torchrec_format import DAYS, EVAL_DAY  # noqa: E402
from dlrm_contracts.binary_format import CHECKSUMS_KEY, MULTI_HOT_KEY, checksum_text  # noqa: E402
from dlrm_contracts.binary_format import file_key, new_checksum  # noqa: E402
from dlrm_contracts.schema import CAT_COLUMNS  # noqa: E402

MULTI_HOT = [3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1]
REFERENCE_DIR = Path("src/mlcommons+training/recommendation_v2/torchrec_dlrm")


def materialize(anchors: Path, torchrec_dir: Path, out: Path, table_sizes: list[int]) -> Path:
    """The reference's multi-hot dataset from our TorchRec files (with labels and dense)."""
    target = out / "multi_hot_npz"
    if not (target / f"day_{EVAL_DAY}_sparse_multi_hot.npz").exists():
        script = anchors / REFERENCE_DIR / "scripts" / "materialize_synthetic_multihot_dataset.py"
        anchor.run(
            [
                anchors / ".venv/bin/python",
                script,
                "--in_memory_binary_criteo_path",
                torchrec_dir,
                "--output_path",
                target,
                "--copy_labels_and_dense",
                "--num_embeddings_per_feature",
                ",".join(map(str, table_sizes)),
                "--multi_hot_sizes",
                ",".join(map(str, MULTI_HOT)),
                "--multi_hot_distribution_type",
                "uniform",
            ],
            cwd=anchors / REFERENCE_DIR,
            env={**os.environ, "PYTHONPATH": ""},
        )
    return target


def multi_hot_dataset(one_hot: Path, npz_dir: Path, out: Path) -> Path:
    """Our multi-hot split binary dataset holding the reference's multi-hot ids: train =
    days 0-22 in order, test = day 23's first rows, validation = the rest (as convert lays
    them out in the TorchRec files)."""
    target = out / "binary_multi_hot"
    description = json.loads((one_hot / "dataset.json").read_text())
    if (target / "_SUCCESS").exists():
        return target
    shutil.rmtree(target, ignore_errors=True)
    splits = description["splits"]
    columns = {j: [] for j in range(len(CAT_COLUMNS))}
    for day in range(DAYS):
        with np.load(npz_dir / f"day_{day}_sparse_multi_hot.npz") as npz:
            for j in columns:
                columns[j].append(npz[str(j)])
    bounds = {
        "train": (0, splits["train"]),
        "test": (splits["train"], splits["train"] + splits["test"]),
        "validation": (splits["train"] + splits["test"], sum(splits.values())),
    }
    checksums = dict(description[CHECKSUMS_KEY])
    for split, (lo, hi) in bounds.items():
        (target / split).mkdir(parents=True)
        for name in ("label.bin", "numerical.bin"):
            shutil.copyfile(one_hot / split / name, target / split / name)
        for j, parts in columns.items():
            ids = np.concatenate(parts)[lo:hi].astype(description["cat_dtypes"][j])
            assert ids.shape == (hi - lo, MULTI_HOT[j]), (split, j, ids.shape)
            data = ids.tobytes()
            (target / split / f"cat_{j}.bin").write_bytes(data)
            digest = new_checksum()
            digest.update(data)
            checksums[file_key(split, f"cat_{j}.bin")] = checksum_text(digest)
    description[MULTI_HOT_KEY] = MULTI_HOT
    description[CHECKSUMS_KEY] = checksums
    (target / "dataset.json").write_text(json.dumps(description, indent=1))
    shutil.copyfile(one_hot / "model_size.json", target / "model_size.json")
    (target / "_SUCCESS").write_text("")
    return target


def torchrec_run(anchors: Path, npz_dir: Path, table_sizes: list[int], args) -> dict:
    command = [
        anchors / ".venv/bin/torchrun",
        "--standalone",
        "--nproc_per_node",
        "1",
        "dlrm_main.py",
        "--synthetic_multi_hot_criteo_path",
        npz_dir,
        "--num_embeddings_per_feature",
        ",".join(map(str, table_sizes)),
        "--embedding_dim",
        args.dim,
        "--dense_arch_layer_sizes",
        f"64,{args.dim}",
        "--over_arch_layer_sizes",
        "64,32,1",
        "--interaction_type",
        "dcn",
        "--dcn_num_layers",
        3,
        "--dcn_low_rank_dim",
        args.dim,
        "--adagrad",
        "--learning_rate",
        args.lr,
        "--batch_size",
        args.batch,
        "--test_batch_size",
        args.batch,
        "--epochs",
        1,
        "--evaluate_on_training_end",
        "--seed",
        args.seed,
    ]
    start = time.perf_counter()
    print("+", " ".join(map(str, command)), flush=True)
    proc = subprocess.run(
        [str(c) for c in command],
        cwd=anchors / REFERENCE_DIR,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": "", "OMP_NUM_THREADS": "2"},
    )
    if proc.returncode != 0:
        sys.exit(f"dlrm_main.py failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    found = dict(re.findall(r"AUROC over (\w+) set: ([0-9]+\.[0-9]+)", proc.stdout))
    return {
        "model": "TorchRec dlrm_main.py, DCN",
        "validation_auc": float(found["test"]),
        "test_auc": None,
        "seconds": round(time.perf_counter() - start, 1),
    }


def ours_run(dataset: Path, interaction: str, out: Path, args) -> dict:
    config = out / f"trainer_{interaction}{args.tag}.yaml"
    config.write_text(
        "train:\n"
        f"  embedding_dim: {args.dim}\n  bottom_mlp: [64, {args.dim}]\n  top_mlp: [64, 32, 1]\n"
        f"  interaction: {interaction}\n  dcn_layers: 3\n  dcn_rank: {args.dim}\n"
        "  wide: false\n  optimizer: adagrad\n"
        f"  learning_rate: {args.lr}\n  learning_rate_scaling: none\n"
        "  adagrad_initial_accumulator: 0.0\n  adagrad_epsilon: 1.0e-8\n  warmup_steps: 0\n"
        f"  batch_size: {args.batch}\n  epochs: 1\n  early_stopping_patience: 0\n"
        "  evals_per_epoch: 1\n  shuffle_batches: false\n"
    )
    workdir = out / f"trainer_{interaction}{args.tag}"
    shutil.rmtree(workdir, ignore_errors=True)
    start = time.perf_counter()
    command = [
        sys.executable,
        "-m",
        "trainer",
        "--dataset",
        dataset,
        "--workdir",
        workdir,
        "--config",
        config,
        "--seed",
        args.seed,
    ]
    print("+", " ".join(map(str, command)), flush=True)
    proc = subprocess.run([str(c) for c in command], cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"our trainer failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    summary = json.loads((workdir / "logs" / "summary_train.json").read_text())
    return {
        "model": f"ours, {interaction}",
        "validation_auc": summary.get("validation_auc"),
        "test_auc": summary.get("test_auc"),
        "seconds": round(time.perf_counter() - start, 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--anchors", type=Path, default=Path("/work/anchors"))
    parser.add_argument("--rows-per-day", type=int, default=20_000)
    parser.add_argument("--threshold", type=int, default=3)
    parser.add_argument("--seed", type=int, default=37)
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--models", default="torchrec,dcn,dot")
    parser.add_argument(
        "--tag", default="", help="suffix of the trainers' workdirs (runs side by side in one --out)"
    )
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    raw, _padded = anchor.raw_days(args.out, args.rows_per_day, args.seed, anchor.REAL_SAMPLE)
    work = anchor.ours(args.out, raw, args.threshold)
    one_hot = work / "binary"
    table_sizes = json.loads((one_hot / "torchrec" / "torchrec.json").read_text())[
        "num_embeddings_per_feature"
    ]
    npz_dir = materialize(args.anchors, one_hot / "torchrec", args.out, table_sizes)
    dataset = multi_hot_dataset(one_hot, npz_dir, args.out)
    results = []
    for model in args.models.split(","):
        result = (
            torchrec_run(args.anchors, npz_dir, table_sizes, args)
            if model == "torchrec"
            else ours_run(dataset, model, args.out, args)
        )
        print(json.dumps(result), flush=True)
        results.append(result)
    print(
        json.dumps(
            {
                "rows": json.loads((one_hot / "dataset.json").read_text())["splits"],
                "dim": args.dim,
                "batch": args.batch,
                "lr": args.lr,
                "results": results,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
