"""Benchmark of model quality: the DLRM's test AUC beside a tuned logistic regression's.

The question a new user asks first: does the default configuration learn what a plain model
learns from the same split? Both models see the same binary dataset (``DIR/binary``, written
by the pipeline):

* **DLRM**: ``python -m trainer`` with the default configuration (or ``--trainer-args``), in a
  fresh workdir; its summary's test AUC (the best validation AUC's checkpoint, with early
  stopping).
* **logistic regression**: scikit-learn's ``LogisticRegression`` (L2, lbfgs) on one-hot ids of
  the 26 columns (each table's ids, id 0 = rare or missing included) and the 13 numericals
  (the dataset's log-transformed values, standardised on train). The regularisation C is
  chosen on the validation split from a grid, as the DLRM's checkpoint is; the test AUC of
  that C is reported (and, for comparison only, the C a pick by test AUC would have made).
* **the difference** (when both ran, one process): DLRM test AUC minus the logistic
  regression's, with a paired bootstrap 95% interval (both models scored on the same resampled
  test rows, ``--bootstrap`` rounds). On test splits of some thousands of rows the interval is
  about a hundredth of AUC wide on each side: a gap of a few thousandths is then a tie, not a
  win or a loss.

scikit-learn is a benchmark-only dependency (``pip install -e '.[bench]'``); the product never
imports it.

Usage::

    .venv/bin/python bench/bench_quality.py --dataset DIR/binary
    .venv/bin/python bench/bench_quality.py --dataset DIR/binary --trainer-args "--epochs 1"
    .venv/bin/python bench/bench_quality.py --dataset DIR/binary --skip-dlrm   # baseline only
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dlrm_contracts.binary_format import NUM_CATEGORICAL, NUM_NUMERICAL  # noqa: E402
from trainer.data import open_dataset  # noqa: E402
from trainer.metrics import roc_auc  # noqa: E402

C_GRID = (0.003, 0.01, 0.03, 0.1, 0.3, 1.0)


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime + children.ru_utime + children.ru_stime


def read_split(dataset: Path, split: str):
    """(numericals float32 [n, 13], one column of ids per table, labels) of one split."""
    ds = open_dataset(dataset, verify="none")
    info = json.loads((dataset / "dataset.json").read_text())
    rows = ds.rows[split]
    numerical = np.fromfile(dataset / split / "numerical.bin", "<f2").reshape(rows, NUM_NUMERICAL)
    label = np.fromfile(dataset / split / "label.bin", "u1")
    ids = [
        np.fromfile(dataset / split / f"cat_{i}.bin", info["cat_dtypes"][i]).astype(np.int64)
        for i in range(NUM_CATEGORICAL)
    ]
    return numerical.astype(np.float32), ids, label.astype(np.float32), list(ds.table_sizes)


def one_hot_design(numerical, ids, table_sizes, mean, std):
    """CSR [n, 13 + sum(table sizes)]: standardised numericals, then one 1 per table."""
    from scipy import sparse

    rows = numerical.shape[0]
    offsets = np.concatenate([[0], np.cumsum(table_sizes)[:-1]]) + NUM_NUMERICAL
    columns = np.empty((rows, NUM_NUMERICAL + NUM_CATEGORICAL), np.int64)
    columns[:, :NUM_NUMERICAL] = np.arange(NUM_NUMERICAL)
    for i, column in enumerate(ids):
        columns[:, NUM_NUMERICAL + i] = offsets[i] + np.minimum(column, table_sizes[i] - 1)
    values = np.ones((rows, NUM_NUMERICAL + NUM_CATEGORICAL), np.float32)
    values[:, :NUM_NUMERICAL] = (numerical - mean) / std
    indptr = np.arange(0, columns.size + 1, columns.shape[1])
    return sparse.csr_matrix(
        (values.ravel(), columns.ravel(), indptr), shape=(rows, NUM_NUMERICAL + int(sum(table_sizes)))
    )


def logistic_regression(dataset: Path, grid=C_GRID, max_iter: int = 300) -> dict:
    """Fit one model per C on train; pick C on validation; report test AUC of that model."""
    from sklearn.linear_model import LogisticRegression

    start, cpu = time.perf_counter(), cpu_seconds()
    splits = {split: read_split(dataset, split) for split in ("train", "validation", "test")}
    train_x, _, train_y, sizes = splits["train"]
    mean, std = train_x.mean(axis=0), train_x.std(axis=0) + 1e-6
    design = {split: one_hot_design(x, ids, sizes, mean, std) for split, (x, ids, _, _) in splits.items()}
    tried, test_scores = [], {}
    for c in grid:
        model = LogisticRegression(C=c, max_iter=max_iter, solver="lbfgs")
        model.fit(design["train"], train_y)
        test_scores[c] = model.decision_function(design["test"])
        tried.append(
            {
                "C": c,
                "validation_auc": roc_auc(
                    splits["validation"][2], model.decision_function(design["validation"])
                ),
                "test_auc": roc_auc(splits["test"][2], test_scores[c]),
            }
        )
        print(json.dumps({"logistic_regression": tried[-1]}), flush=True)
    best = max(tried, key=lambda t: t["validation_auc"])
    # Shown beside the fair figure, never instead of it: the C a test-set pick would choose.
    by_test = max(tried, key=lambda t: t["test_auc"])
    return {
        "model": "logistic regression (one-hot ids + numericals, L2)",
        **best,
        "test_picked": {"C": by_test["C"], "test_auc": by_test["test_auc"]},
        "grid": tried,
        "seconds": round(time.perf_counter() - start, 1),
        "cpu_seconds": round(cpu_seconds() - cpu, 1),
        "test_scores": (splits["test"][2], test_scores[best["C"]]),
    }


def paired_difference(
    labels: np.ndarray, first: np.ndarray, second: np.ndarray, rounds: int = 1000, seed: int = 0
) -> dict:
    """AUC(first) - AUC(second) on the same rows, and its paired bootstrap 95% interval.

    Both models are scored on each resample of the rows, so the noise of which rows the split
    happens to hold (most of the spread between seeds) cancels in the difference; what is left
    says whether a gap of a few thousandths is more than the split's luck.
    """
    rng = np.random.default_rng(seed)
    diffs = np.empty(rounds)
    for k in range(rounds):
        rows = rng.integers(0, labels.size, labels.size)
        diffs[k] = roc_auc(labels[rows], first[rows]) - roc_auc(labels[rows], second[rows])
    low, high = np.percentile(diffs, [2.5, 97.5]) if rounds else (np.nan, np.nan)
    return {
        "difference": roc_auc(labels, first) - roc_auc(labels, second),
        "ci95": [float(low), float(high)],
        "rounds": rounds,
        "share_below_zero": float((diffs < 0).mean()) if rounds else None,
    }


def dlrm_test_predictions(dataset: Path, trainer_args: list[str], workdir: str):
    """(labels, probabilities) of the test split from the run's model (its best checkpoint),
    in this process: the scores behind the summary's test AUC, for the paired difference."""
    from trainer.cli import config_from_args, parser
    from trainer.loop import Trainer

    args = parser().parse_args(["--dataset", str(dataset), "--workdir", workdir, *trainer_args])
    trainer = Trainer(config_from_args(args), dataset, workdir)
    trainer.restore_best(required=True)
    return trainer.predictions("test")


def dlrm(dataset: Path, trainer_args: list[str], ranks: int, keep_scores: bool = False) -> dict:
    """``python -m trainer`` with the default configuration in a fresh workdir (with
    ``keep_scores``, one process: also its model's test labels and probabilities)."""
    command = [sys.executable, "-m", "trainer", "--dataset", str(dataset), *trainer_args]
    if ranks > 1:
        command = [
            str(Path(sys.executable).with_name("horovodrun")),
            "-np",
            str(ranks),
            "-H",
            f"localhost:{ranks}",
            "--gloo",
            *command,
        ]
    with tempfile.TemporaryDirectory(prefix="bench_quality_") as workdir:
        start, cpu = time.perf_counter(), cpu_seconds()
        proc = subprocess.run(command + ["--workdir", workdir], capture_output=True, text=True, cwd=ROOT)
        if proc.returncode != 0:
            sys.exit(f"bench_quality: the trainer failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
        summary = json.loads((Path(workdir) / "logs" / "summary_train.json").read_text())
        scores = dlrm_test_predictions(dataset, trainer_args, workdir) if keep_scores else None
    if scores is not None and abs(roc_auc(*scores) - summary["test_auc"]) > 1e-6:
        sys.exit(
            f"bench_quality: the test AUC of the run's model read back here "
            f"({roc_auc(*scores)}) is not the summary's ({summary['test_auc']})"
        )
    keep = (
        "test_auc",
        "validation_auc",
        "step",
        "last_step",
        "stopped_early",
        "periodic_validation_auc",
        "train_samples_per_s",
    )
    return {
        "model": "DLRM (" + (" ".join(trainer_args) or "default configuration") + ")",
        **{k: summary.get(k) for k in keep},
        "seconds": round(time.perf_counter() - start, 1),
        "cpu_seconds": round(cpu_seconds() - cpu, 1),
        "test_scores": scores,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dataset", type=Path, required=True, help="split binary dataset (DIR/binary)")
    p.add_argument("--trainer-args", default="", help="extra flags of python -m trainer")
    p.add_argument("--ranks", type=int, default=1, help="horovodrun ranks of the DLRM run")
    p.add_argument("--skip-dlrm", action="store_true")
    p.add_argument("--skip-baseline", action="store_true")
    p.add_argument(
        "--c-grid",
        default=",".join(map(str, C_GRID)),
        help="inverse L2 strengths tried (best on validation is reported)",
    )
    p.add_argument("--max-iter", type=int, default=300, help="lbfgs iterations per C")
    p.add_argument(
        "--bootstrap",
        type=int,
        default=1000,
        help="rounds of the paired bootstrap of the test AUC difference (0 = off; "
        "one process only; each round scores the test split twice)",
    )
    args = p.parse_args()
    try:
        import sklearn  # noqa: F401
    except ImportError:
        if not args.skip_baseline:
            sys.exit(
                "bench_quality: the baseline needs scikit-learn, a benchmark-only "
                "dependency: .venv/bin/pip install -e '.[bench]'"
            )
    rows = open_dataset(args.dataset, verify="none").rows
    paired = not args.skip_dlrm and not args.skip_baseline and args.ranks == 1 and args.bootstrap > 0
    results = []
    if not args.skip_dlrm:
        results.append(dlrm(args.dataset, shlex.split(args.trainer_args), args.ranks, paired))
        print(json.dumps(shown(results[-1])), flush=True)
    if not args.skip_baseline:
        grid = [float(c) for c in args.c_grid.split(",")]
        results.append(logistic_regression(args.dataset, grid, args.max_iter))
        print(json.dumps({k: v for k, v in shown(results[-1]).items() if k != "grid"}), flush=True)
    difference = None
    if paired:
        labels, dlrm_scores = results[0]["test_scores"]
        same_rows, lr_scores = results[1]["test_scores"]
        if not np.array_equal(labels, same_rows):
            sys.exit("bench_quality: the trainer's test rows are not the baseline's (row order)")
        difference = paired_difference(labels, dlrm_scores, lr_scores, args.bootstrap)
        print(json.dumps({"dlrm_minus_logistic_regression": difference}), flush=True)
    print(
        f"\n{args.dataset}: train {rows['train']:,} / validation {rows['validation']:,} / "
        f"test {rows['test']:,} rows; 1-min load average {os.getloadavg()[0]:.1f} on "
        f"{os.cpu_count()} cores"
    )
    for r in results:
        if "test_picked" in r:
            picked = r["test_picked"]
            print(
                f"(logistic regression with C picked on test instead: C={picked['C']}, test AUC "
                f"{picked['test_auc']:.4f}; not the reported baseline)"
            )
        extra = (
            f"C={r['C']}"
            if "C" in r
            else f"step {r['step']}"
            if r.get("last_step") is None
            else f"best at step {r['step']} of {r['last_step']}"
        )
        print(
            f"{r['model']:70s} test AUC {r['test_auc']:.4f}  validation AUC "
            f"{r['validation_auc']:.4f}  ({extra}, {r['seconds']} s, {r['cpu_seconds']} CPU-s)"
        )
    if difference is not None:
        low, high = difference["ci95"]
        print(
            f"{'DLRM - logistic regression, test AUC':70s} {difference['difference']:+.4f}  "
            f"paired bootstrap 95% interval [{low:+.4f}, {high:+.4f}] "
            f"({difference['rounds']} rounds)"
        )
    return 0


def shown(result: dict) -> dict:
    """A result without its per-row scores (kept for the paired difference, not printed)."""
    return {k: v for k, v in result.items() if k != "test_scores"}


if __name__ == "__main__":
    sys.exit(main())
