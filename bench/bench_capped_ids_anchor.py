"""Anchor check: capped ids (``preprocess.ids: modulo``) equal TorchRec's own conversion.

TorchRec's Criteo path, which MLPerf DLRMv2's ``dlrm_main.py`` reads through, turns a day file
into ``.npy`` arrays with ``BinaryCriteoUtils.tsv_to_npys`` (a categorical is
``int(text or "0", 16)``) and caps the ids in ``InMemoryBinaryCriteoIterDataPipe`` (each column
modulo ``hashes``, the ``--num_embeddings_per_feature`` list). This script runs both on the
same day files as our preprocess job, in TorchRec's own environment (a Python with torch and
torchrec, outside this repository), and compares label and 26 ids row for row: train days as
multisets (our train split is in its seeded order), the last day in line order (our test split
then validation; TorchRec names its halves the other way round: ``val`` the first, ``test``
the second). The numerical columns are not compared: ``tsv_to_npys`` shifts each file's
integers by the file's minimum before the log, where every mode here takes ``log(x + 3)``
(docs/spark_jobs.md, "Capped ids").

The input: days written by the project's generator, then the 200 real rows
(``shared/data/criteo_real_sample.tsv``) as the last day. TorchRec's reader indexes 40
fields, so it gets the real rows' short lines padded with empty fields (what they mean);
our engines read them as they are.

Usage::

    python bench/bench_capped_ids_anchor.py [--torchrec-python /work/anchors/.venv/bin/python]
        [--torchrec-path DIR] [--workdir /tmp/capped-anchor] [--rows-per-day 5000]
        [--engines arrow,sql]

(``tsv_to_npys`` reads through iopath, TorchRec's ``datasets`` extra: ``pip install --target
DIR iopath`` with that environment's pip and pass ``--torchrec-path DIR`` if it lacks it.)

Prints one JSON line: rows compared per split and engine, and ``equal``; exits 1 on a
difference, 2 when the TorchRec environment is missing.

The part that runs in TorchRec's environment is this same file (``--torchrec-side``): it
imports only the standard library until then, so it needs nothing of this repository.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ANCHORS_PYTHON = "/work/anchors/.venv/bin/python"
# MLPerf DLRMv2's --num_embeddings_per_feature (mlcommons/training recommendation_v2 README):
# on 32-bit hex values every one of them folds values, the 40M ones too
CAPS = [
    40000000,
    39060,
    17295,
    7424,
    20265,
    3,
    7122,
    1543,
    63,
    40000000,
    3067956,
    405282,
    10,
    2209,
    11938,
    155,
    4,
    976,
    14,
    40000000,
    40000000,
    40000000,
    590152,
    12973,
    108,
    36,
]


def torchrec_side(days: list[str], caps: list[int], out: str) -> None:
    """In TorchRec's environment: each day through ``tsv_to_npys``, then the in-memory reader
    with ``hashes``; writes ``out`` (.npz: per day, label and ids [rows, 27])."""
    import numpy as np
    from torchrec.datasets.criteo import BinaryCriteoUtils, InMemoryBinaryCriteoIterDataPipe

    tmp = Path(out).parent
    paths = {k: [] for k in ("dense", "sparse", "labels")}
    for i, day in enumerate(days):
        names = {k: str(tmp / f"day_{i}_{k}.npy") for k in paths}
        BinaryCriteoUtils.tsv_to_npys(day, names["dense"], names["sparse"], names["labels"])
        for k in paths:
            paths[k].append(names[k])
    # stage "train" reads every file whole; the caps are applied on load (not mmap_mode)
    pipe = InMemoryBinaryCriteoIterDataPipe(
        "train",
        paths["dense"],
        paths["sparse"],
        paths["labels"],
        batch_size=1,
        rank=0,
        world_size=1,
        hashes=caps,
    )
    np.savez(
        out,
        **{
            f"day_{i}": np.concatenate([labels.reshape(-1, 1), sparse], axis=1)
            for i, (labels, sparse) in enumerate(zip(pipe.labels_arrs, pipe.sparse_arrs))
        },
    )


def _days(workdir: Path, rows_per_day: int, real_sample: Path) -> tuple[Path, Path]:
    """(our input directory, TorchRec's): generated days, then the real rows (padded for
    TorchRec's reader)."""
    import shutil

    from dlrm_contracts.config import GeneratorConfig
    from pipeline.synthetic import generate

    ours, theirs = workdir / "raw", workdir / "torchrec_raw"
    for d in (ours, theirs):
        shutil.rmtree(d, ignore_errors=True)
    generate(ours, GeneratorConfig(days=3, rows_per_day=rows_per_day, seed=31))
    days = sorted(
        (p for p in ours.iterdir() if p.name.startswith("day_")), key=lambda p: int(p.name.split("_")[1])
    )
    real = [line for line in real_sample.read_text().split("\n") if line]
    last = ours / f"day_{len(days)}"
    last.write_text("".join(line + "\n" for line in real))
    theirs.mkdir(parents=True)
    for day in days:
        (theirs / day.name).symlink_to(day.resolve())
    (theirs / last.name).write_text("".join(line + "\t" * (39 - line.count("\t")) + "\n" for line in real))
    return ours, theirs


def _ours(raw: Path, workdir: Path, engine: str) -> dict[str, "object"]:
    """Our splits' label and ids [rows, 27] from a capped-ids preprocess run."""
    import numpy as np
    import pyarrow.parquet as pq

    from dlrm_contracts.config import PreprocessConfig, SparkConfig
    from dlrm_contracts.layout import WorkdirLayout
    from dlrm_contracts.schema import CAT_COLUMNS, LABEL
    from spark_jobs.preprocess import run_preprocess

    run_preprocess(
        raw,
        workdir,
        SparkConfig(master="local[2]", driver_memory="2g"),
        PreprocessConfig(ids="modulo", caps=CAPS, engine=engine),
    )
    out = {}
    for split in ("train", "test", "validation"):
        files = sorted(WorkdirLayout.at(workdir).parquet_split(split).glob("part-*.parquet"))
        table = pq.read_table(files)
        out[split] = np.stack(
            [table.column(c).to_numpy().astype(np.int64) for c in (LABEL, *CAT_COLUMNS)], axis=1
        )
    return out


def _sorted_rows(rows):
    import numpy as np

    return rows[np.lexsort(rows.T[::-1])] if len(rows) else rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--torchrec-python", default=ANCHORS_PYTHON)
    p.add_argument("--workdir", default="/tmp/capped-ids-anchor")
    p.add_argument("--rows-per-day", type=int, default=5_000)
    p.add_argument("--engines", default="arrow,sql")
    p.add_argument(
        "--torchrec-path",
        default="",
        help="PYTHONPATH for TorchRec's environment, e.g. a directory holding iopath "
        "(torchrec[datasets]) when that environment lacks it",
    )
    p.add_argument(
        "--real-sample",
        default=str(Path(__file__).resolve().parents[2] / "shared" / "data" / "criteo_real_sample.tsv"),
    )
    p.add_argument("--torchrec-side", nargs=2, metavar=("DAYS_JSON", "OUT"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.torchrec_side:
        torchrec_side(json.loads(args.torchrec_side[0]), CAPS, args.torchrec_side[1])
        return 0
    if not Path(args.torchrec_python).is_file():
        print(f"no TorchRec environment at {args.torchrec_python} (--torchrec-python)", file=sys.stderr)
        return 2
    import numpy as np

    workdir = Path(args.workdir)
    ours_raw, theirs_raw = _days(workdir, args.rows_per_day, Path(args.real_sample))
    day_files = sorted((str(p) for p in theirs_raw.iterdir()), key=lambda s: int(s.rsplit("_", 1)[1]))
    npz = workdir / "torchrec" / "capped.npz"
    npz.parent.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if args.torchrec_path:
        env["PYTHONPATH"] = args.torchrec_path
    subprocess.run(
        [args.torchrec_python, __file__, "--torchrec-side", json.dumps(day_files), str(npz)],
        check=True,
        env=env,
    )
    theirs = np.load(npz)
    their_days = [theirs[f"day_{i}"].astype(np.int64) for i in range(len(day_files))]
    report, equal = {}, True
    for engine in args.engines.split(","):
        ours = _ours(ours_raw, workdir / f"ours_{engine}", engine)
        train_same = np.array_equal(
            _sorted_rows(ours["train"]), _sorted_rows(np.concatenate(their_days[:-1]))
        )
        last_same = np.array_equal(np.concatenate([ours["test"], ours["validation"]]), their_days[-1])
        equal &= train_same and last_same
        report[engine] = {
            "train_rows": len(ours["train"]),
            "train_equal": bool(train_same),
            "last_day_rows": len(their_days[-1]),
            "last_day_equal": bool(last_same),
        }
    print(json.dumps({"caps": CAPS, "engines": report, "equal": bool(equal)}))
    return 0 if equal else 1


if __name__ == "__main__":
    sys.exit(main())
