"""Anchor: our TorchRec .npy output against TorchRec's own scripts on the same raw days.

The files ``convert.formats: [binary, torchrec]`` writes must equal what
TorchRec's ``npy_preproc_criteo`` + ``contiguous_preproc_criteo`` make of the same raw logs.
This script builds 24 raw days (TorchRec's scripts read exactly ``day_0 .. day_23``): generated
days, with the 200 real rows of ``shared/data/criteo_real_sample.tsv`` put first in day 23,
runs both, and compares them value for value.

What "equal" can mean, from TorchRec's code (``BinaryCriteoUtils.tsv_to_npys``,
``sparse_to_contiguous``):

* **labels**: the same values, day 23 row for row; train as the same multiset of rows (our
  train split is one seeded shuffle of all train days, cut into 23 files; TorchRec keeps each
  day's line order).
* **sparse**: TorchRec numbers a column's values by first appearance (from 2; seen fewer than
  ``--threshold`` times -> 1; a missing value is the value 0 and gets a number of its own);
  ours by count descending (from 1; rare or missing -> 0). Both are checked against the same
  canonical form: the value's 32-bit hex integer where the value is kept, 0 where it is rare
  or missing. Equal canonical forms in every cell = the same kept sets and the same rows.
  With ``--cap N`` ours are capped ids instead (``preprocess.ids: modulo``, cap N for every
  column), compared with TorchRec's raw ids modulo N, what its reader computes with
  ``--num_embeddings_per_feature N,...``: equal cell for cell.
* **dense**: TorchRec computes ``log(x - m + 2)`` in float32, with missing -> 0 first and m
  the smallest integer in the whole day file (so its shift changes from day to day with the
  data: ``log(x + 3)`` only on a day whose minimum is -1); we store ``log(x + 3)`` for every
  day (missing or x <= -3 -> 0: the parquet keeps no missing flag, so TorchRec's
  ``log(2 - m)`` for a missing value cannot be rebuilt from it). The script checks TorchRec's
  side against that formula recomputed from the raw lines, and ours against TorchRec's own
  computation (int32, log in float32) at the fixed shift +3 on the cells we take the log of,
  and reports how many cells equal TorchRec's files as they are.
* **real rows**: 39 of the 200 lines lost their trailing empty fields; TorchRec's row mapper
  indexes all 40 fields and raises IndexError on them, so its input gets those lines padded
  with empty fields (what they mean); ours reads the lines as they are.

Usage (the anchors environment is described in /work/anchors/README.txt)::

    python bench/bench_torchrec_anchor.py --out /tmp/anchor --anchors /work/anchors \\
        [--rows-per-day 20000] [--threshold 3] [--seed 37] [--cap N]

Exit 0 when every check holds, 1 otherwise; the last stdout line is a JSON summary.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from converters.torchrec_format import DAYS, EVAL_DAY, day_file  # noqa: E402
from dlrm_contracts.schema import CAT_COLUMNS  # noqa: E402

REAL_SAMPLE = ROOT.parent / "shared" / "data" / "criteo_real_sample.tsv"
FIELDS = 40


def run(command: list[str], **kwargs) -> None:
    print("+", " ".join(str(c) for c in command), flush=True)
    subprocess.run([str(c) for c in command], check=True, **kwargs)


def raw_days(out: Path, rows_per_day: int, seed: int, real_sample: Path) -> tuple[Path, Path]:
    """Generated days 0..23, the real rows first in day 23: as they are (ours) and padded to
    40 fields (TorchRec's)."""
    gen = out / "gen"
    if not (gen / "generator_meta.json").exists():
        run(
            [
                sys.executable,
                "-m",
                "pipeline.generate",
                "--out",
                gen,
                "--days",
                DAYS,
                "--rows-per-day",
                rows_per_day,
                "--seed",
                seed,
            ],
            cwd=ROOT,
        )
    ours, padded = out / "raw", out / "raw_padded"
    real = real_sample.read_text().splitlines()
    if (padded / f"day_{EVAL_DAY}").exists():  # made before: a rewrite would redo preprocess
        return ours, padded
    for target, lines in (
        (ours, real),
        (padded, [line + "\t" * (FIELDS - 1 - line.count("\t")) for line in real]),
    ):
        target.mkdir(exist_ok=True)
        for day in range(DAYS):
            source = gen / f"day_{day}"
            if day != EVAL_DAY:
                shutil.copyfile(source, target / f"day_{day}")
            else:
                (target / f"day_{day}").write_text("\n".join(lines) + "\n" + source.read_text())
    return ours, padded


def ours(out: Path, raw: Path, threshold: int, cap: int | None = None) -> Path:
    """Our pipeline's preprocess and convert: frequency ids at ``threshold``, or capped ids
    (``preprocess.ids: modulo``, every column's cap ``cap``) in a workdir of their own."""
    work = out / ("work" if cap is None else f"work_cap{cap}")
    config = out / ("ours.yaml" if cap is None else f"ours_cap{cap}.yaml")
    ids = f"  frequency_threshold: {threshold}\n" if cap is None else f"  ids: modulo\n  caps: {cap}\n"
    config.write_text(f"preprocess:\n{ids}convert:\n  formats: [binary, torchrec]\n")
    run(
        [
            ROOT / "run_pipeline.sh",
            "--input",
            raw,
            "--workdir",
            work,
            "--stages",
            "preprocess,convert",
            "--config",
            config,
        ],
        cwd=ROOT,
    )
    return work


def torchrec(out: Path, padded: Path, threshold: int, python: Path) -> tuple[Path, Path]:
    npy, contig = out / "torchrec_npy", out / "torchrec_contig"
    for directory in (npy, contig):
        directory.mkdir(exist_ok=True)
    if not (npy / day_file(EVAL_DAY, "labels")).exists():
        run(
            [
                python,
                "-m",
                "torchrec.datasets.scripts.npy_preproc_criteo",
                "--input_dir",
                padded,
                "--output_dir",
                npy,
            ]
        )
    if not (contig / f"day_{EVAL_DAY}_sparse_contig_freq.npy").exists():
        run(
            [
                python,
                "-m",
                "torchrec.datasets.scripts.contiguous_preproc_criteo",
                "--input_dir",
                npy,
                "--output_dir",
                contig,
                "--frequency_threshold",
                threshold,
            ]
        )
    return npy, contig


def parse_ints(day: Path) -> tuple[np.ndarray, np.ndarray]:
    """The 13 integers of every line (missing -> 0) and where they were missing."""
    values, missing = [], []
    for line in day.read_text().splitlines():
        fields = (line.split("\t") + [""] * FIELDS)[1:14]
        values.append([int(f) if f else 0 for f in fields])
        missing.append([not f for f in fields])
    return np.array(values, dtype=np.int64), np.array(missing)


def dictionaries(work: Path) -> list[np.ndarray]:
    """Per column, id -> the value's integer (0 at id 0, rare or missing); the dictionaries
    hold the values as their 8 hex digits."""
    tables = []
    for column in CAT_COLUMNS:
        part = pq.read_table(work / "parquet" / "dictionaries" / f"column={column}").to_pydict()
        lookup = np.zeros(max(part["id"], default=0) + 1, dtype=np.int64)
        lookup[np.array(part["id"], dtype=np.int64)] = [int(v, 16) for v in part["value"]]
        tables.append(lookup)
    return tables


def load_days(directory: Path, part: str, days) -> np.ndarray:
    return np.concatenate([np.load(directory / day_file(d, part)) for d in days])


def canonical_ours(sparse: np.ndarray, lookup: list[np.ndarray]) -> np.ndarray:
    return np.stack([lookup[i][sparse[:, i]] for i in range(len(CAT_COLUMNS))], axis=1)


def canonical_torchrec(raw: np.ndarray, contig: np.ndarray) -> np.ndarray:
    """The raw value where TorchRec kept it (contiguous id >= 2), else 0 (rare or missing:
    TorchRec's raw 0 is a missing field)."""
    return np.where(contig >= 2, raw, 0)


def row_order(labels: np.ndarray, canonical: np.ndarray) -> np.ndarray:
    """A content order of rows (label, then the 26 canonical values): the same rows in any
    order come out in the same order."""
    return np.lexsort(np.column_stack([labels.reshape(-1, 1), canonical]).T[::-1])


def compare(work: Path, npy: Path, contig: Path, padded: Path, cap: int | None = None) -> dict:
    """Ours against TorchRec's. Frequency ids: both sides as canonical values (above).
    Capped ids: our ids against TorchRec's raw ids modulo the cap, which is what its reader
    (InMemoryBinaryCriteoIterDataPipe with the caps as hashes) feeds the model."""
    mine = work / "binary" / "torchrec"
    lookup = dictionaries(work) if cap is None else None
    result: dict = {}
    for name, days in (("train", range(EVAL_DAY)), ("day_23", [EVAL_DAY])):
        labels_o, labels_t = load_days(mine, "labels", days), load_days(npy, "labels", days)
        if cap is None:
            canon_o = canonical_ours(load_days(mine, "sparse", days), lookup)
            canon_t = canonical_torchrec(
                load_days(npy, "sparse", days),
                np.concatenate([np.load(contig / f"day_{d}_sparse_contig_freq.npy") for d in days]),
            )
        else:
            canon_o = load_days(mine, "sparse", days)
            canon_t = load_days(npy, "sparse", days) % cap
        dense_o, dense_t = load_days(mine, "dense", days), load_days(npy, "dense", days)
        if name == "train":  # same rows, other order: compare in content order
            order_o, order_t = row_order(labels_o, canon_o), row_order(labels_t, canon_t)
        else:
            order_o = order_t = np.arange(len(labels_t))
        ints, missing, expected_t = [], [], []
        for d in days:
            x, miss = parse_ints(padded / f"day_{d}")
            shifted = (x.astype(np.int32) - (x.min() - 2)).astype(np.int32)
            expected_t.append(np.log(shifted, dtype=np.float32))
            ints.append(x)
            missing.append(miss)
        ints_t, missing_t = np.concatenate(ints)[order_t], np.concatenate(missing)[order_t]
        same_rows = len(labels_o) == len(labels_t)
        d_o = dense_o[order_o]
        # TorchRec's own computation (int32, then log in float32) at the shift of a day whose
        # minimum is -1, on the cells where our rule takes the log (present, x > -3)
        present = (~missing_t) & (ints_t > -3)
        at_shift_3 = np.log(np.where(present, ints_t + 3, 1).astype(np.int32), dtype=np.float32)
        result[name] = {
            "rows": [int(len(labels_o)), int(len(labels_t))],
            "labels_equal": bool(same_rows and np.array_equal(labels_o[order_o], labels_t[order_t])),
            "sparse_equal": bool(same_rows and np.array_equal(canon_o[order_o], canon_t[order_t])),
            "torchrec_dense_is_its_formula": bool(np.array_equal(dense_t, np.concatenate(expected_t))),
            "day_minimum": sorted({int(i.min()) for i in ints}),
            "dense_cells_equal_to_torchrec": float(np.mean(d_o == dense_t[order_t])) if same_rows else None,
            "dense_cells_logged": float(np.mean(present)),
            "dense_equal_to_torchrec_rule_at_shift_3": float(np.mean((d_o == at_shift_3)[present]))
            if same_rows
            else None,
            "dense_max_abs_diff_to_torchrec_rule_at_shift_3": float(
                np.max(np.abs(d_o - at_shift_3)[present], initial=0.0)
            )
            if same_rows
            else None,
            # ours is log in float64 rounded once; numpy's float32 log may be 1 ulp off it
            "dense_max_ulps_to_torchrec_rule_at_shift_3": int(
                np.max(
                    np.abs(d_o.view(np.int32).astype(np.int64) - at_shift_3.view(np.int32))[present],
                    initial=0,
                )
            )
            if same_rows
            else None,
            "dense_elsewhere_ours_zero": bool(same_rows and not d_o[~present].any()),
        }
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--anchors", type=Path, default=Path("/work/anchors"))
    parser.add_argument("--rows-per-day", type=int, default=20_000)
    parser.add_argument("--threshold", type=int, default=3)
    parser.add_argument("--seed", type=int, default=37)
    parser.add_argument(
        "--cap",
        type=int,
        default=None,
        help="compare capped ids (preprocess.ids: modulo, this cap for every "
        "column) instead of frequency ids",
    )
    parser.add_argument("--real-sample", type=Path, default=REAL_SAMPLE)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    raw, padded = raw_days(args.out, args.rows_per_day, args.seed, args.real_sample)
    work = ours(args.out, raw, args.threshold, args.cap)
    npy, contig = torchrec(args.out, padded, args.threshold, args.anchors / ".venv/bin/python")
    result = compare(work, npy, contig, padded, args.cap)
    ok = all(
        r["labels_equal"]
        and r["sparse_equal"]
        and r["torchrec_dense_is_its_formula"]
        and r["dense_elsewhere_ours_zero"]
        and r["dense_max_ulps_to_torchrec_rule_at_shift_3"] is not None
        and r["dense_max_ulps_to_torchrec_rule_at_shift_3"] <= 1
        for r in result.values()
    )
    print(
        json.dumps(
            {
                "ok": ok,
                "threshold": args.threshold,
                "cap": args.cap,
                "rows_per_day": args.rows_per_day,
                "seconds": round(time.perf_counter() - start, 1),
                **result,
            }
        )
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
