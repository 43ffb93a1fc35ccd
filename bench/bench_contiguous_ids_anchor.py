"""Anchor check: contiguous ids (``preprocess.ids: contiguous``) equal TorchRec's own scripts.

The dataset MLPerf DLRMv2 trains on is made by TorchRec's scripts in sequence
(mlcommons/training ``recommendation_v2/torchrec_dlrm/scripts/process_Criteo_1TB_Click_Logs_dataset.sh``):
``npy_preproc_criteo`` (day files → ``.npy``), ``contiguous_preproc_criteo --frequency_threshold 0``
(ids by first appearance), then the shuffle of the train days; ``dlrm_main.py``'s reader
(``InMemoryBinaryCriteoIterDataPipe``) takes each id modulo ``--num_embeddings_per_feature``.
This script runs those two scripts unchanged, as modules of the TorchRec installation of
another environment (a Python with torch and torchrec, outside this repository), on the same
24 day files as our preprocess job, and the reader with the caps; then compares label and 26
ids row for row with our splits, for each variant:

- ``mlperf``: threshold 0, MLPerf DLRMv2's caps (the ids ``dlrm_main.py`` trains on);
- ``t0``: threshold 0, no caps (the contiguous ids themselves);
- ``t3``: ``--frequency_threshold 3`` (rare values → 1), no caps.

Train days are compared as multisets (our train split is in its own seeded order; TorchRec's
shuffle is a separate step neither side's ids depend on), the last day in line order (our
test split then validation). The numerical columns are not compared (``tsv_to_npys`` shifts
each file's integers by its minimum, docs/spark_jobs.md, "Capped ids").

The input: 23 days written by the project's generator, then the 200 real rows
(``shared/data/criteo_real_sample.tsv``) as day 23 (the scripts read exactly day_0..day_23).
TorchRec's reader indexes 40 fields, so it gets the real rows' short lines padded with empty
fields (what they mean); our engines read them as they are.

Usage::

    python bench/bench_contiguous_ids_anchor.py [--torchrec-python /work/anchors/.venv/bin/python]
        [--workdir /tmp/contiguous-ids-anchor] [--rows-per-day 2000] [--engines arrow,sql]
        [--variants mlperf,t0,t3]

Prints one JSON line: rows compared per variant and engine, and ``equal``; exits 1 on a
difference, 2 when the TorchRec environment is missing. The part that runs in TorchRec's
environment is this same file (``--torchrec-side``): it imports only the standard library
until then, so it needs nothing of this repository.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

# MLPerf DLRMv2's --num_embeddings_per_feature, recorded once beside its source (the capped
# anchor imports only the standard library, so the TorchRec side may import it too)
from bench_capped_ids_anchor import CAPS

ANCHORS_PYTHON = "/work/anchors/.venv/bin/python"
DAYS = 24  # what npy_preproc_criteo and contiguous_preproc_criteo read: day_0 .. day_23
VARIANTS = {"mlperf": (0, CAPS), "t0": (0, None), "t3": (3, None)}


def torchrec_side(npy_dir: str, contig_dir: str, caps: list[int] | None, out: str) -> None:
    """In TorchRec's environment: the contiguous sparse files renamed into place as the MLPerf
    script does, read by the in-memory reader (with ``hashes`` when capped); writes ``out``
    (.npz: per day, label and ids [rows, 27])."""
    import numpy as np
    from torchrec.datasets.criteo import InMemoryBinaryCriteoIterDataPipe

    staged = Path(out).parent / "staged"
    shutil.rmtree(staged, ignore_errors=True)
    staged.mkdir(parents=True)
    for k in range(DAYS):
        for kind in ("dense", "labels"):
            (staged / f"day_{k}_{kind}.npy").symlink_to(Path(npy_dir) / f"day_{k}_{kind}.npy")
        (staged / f"day_{k}_sparse.npy").symlink_to(Path(contig_dir) / f"day_{k}_sparse_contig_freq.npy")
    paths = {
        kind: [str(staged / f"day_{k}_{kind}.npy") for k in range(DAYS)]
        for kind in ("dense", "sparse", "labels")
    }
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
            f"day_{k}": np.concatenate([labels.reshape(-1, 1), sparse], axis=1)
            for k, (labels, sparse) in enumerate(zip(pipe.labels_arrs, pipe.sparse_arrs))
        },
    )


def _days(workdir: Path, rows_per_day: int, real_sample: Path) -> tuple[Path, Path]:
    """(our input directory, TorchRec's): 23 generated days, then the real rows (padded to 40
    fields for TorchRec's reader)."""
    from dlrm_contracts.config import GeneratorConfig
    from pipeline.synthetic import generate

    ours, theirs = workdir / "raw", workdir / "torchrec_raw"
    for d in (ours, theirs):
        shutil.rmtree(d, ignore_errors=True)
    generate(ours, GeneratorConfig(days=DAYS - 1, rows_per_day=rows_per_day, seed=37))
    real = [line for line in real_sample.read_text().split("\n") if line]
    (ours / f"day_{DAYS - 1}").write_text("".join(line + "\n" for line in real))
    theirs.mkdir(parents=True)
    for k in range(DAYS - 1):
        (theirs / f"day_{k}").symlink_to((ours / f"day_{k}").resolve())
    (theirs / f"day_{DAYS - 1}").write_text(
        "".join(line + "\t" * (39 - line.count("\t")) + "\n" for line in real)
    )
    return ours, theirs


def _ours(raw: Path, workdir: Path, engine: str, threshold: int, caps) -> dict:
    """Our splits' label and ids [rows, 27] from a contiguous-ids preprocess run."""
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
        PreprocessConfig(ids="contiguous", frequency_threshold=str(threshold), caps=caps, engine=engine),
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


def _torchrec(python: str, env: dict, theirs_raw: Path, workdir: Path, variants: list[str]) -> dict:
    """Run npy_preproc_criteo once and contiguous_preproc_criteo per threshold in TorchRec's
    environment; the reader's [rows, 27] per day for each variant."""
    import numpy as np

    npy = workdir / "torchrec" / "npy"
    shutil.rmtree(workdir / "torchrec", ignore_errors=True)
    npy.mkdir(parents=True)
    subprocess.run(
        [
            python,
            "-m",
            "torchrec.datasets.scripts.npy_preproc_criteo",
            "--input_dir",
            str(theirs_raw),
            "--output_dir",
            str(npy),
        ],
        check=True,
        env=env,
        stdout=subprocess.DEVNULL,
    )
    out = {}
    for name in variants:
        threshold, caps = VARIANTS[name]
        contig = workdir / "torchrec" / f"contig_t{threshold}"
        if not contig.is_dir():
            contig.mkdir()
            subprocess.run(
                [
                    python,
                    "-m",
                    "torchrec.datasets.scripts.contiguous_preproc_criteo",
                    "--input_dir",
                    str(npy),
                    "--output_dir",
                    str(contig),
                    "--frequency_threshold",
                    str(threshold),
                ],
                check=True,
                env=env,
                stdout=subprocess.DEVNULL,
            )
        npz = workdir / "torchrec" / name / "ids.npz"
        npz.parent.mkdir(parents=True)
        subprocess.run(
            [python, __file__, "--torchrec-side", str(npy), str(contig), json.dumps(caps), str(npz)],
            check=True,
            env=env,
        )
        data = np.load(npz)
        out[name] = [data[f"day_{k}"].astype(np.int64) for k in range(DAYS)]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--torchrec-python", default=ANCHORS_PYTHON)
    p.add_argument("--workdir", default="/tmp/contiguous-ids-anchor")
    p.add_argument("--rows-per-day", type=int, default=2_000)
    p.add_argument("--engines", default="arrow,sql")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument(
        "--torchrec-path",
        default="",
        help="PYTHONPATH for TorchRec's environment (e.g. a directory holding iopath)",
    )
    p.add_argument(
        "--real-sample",
        default=str(Path(__file__).resolve().parents[2] / "shared" / "data" / "criteo_real_sample.tsv"),
    )
    p.add_argument(
        "--torchrec-side", nargs=4, metavar=("NPY", "CONTIG", "CAPS_JSON", "OUT"), help=argparse.SUPPRESS
    )
    args = p.parse_args(argv)
    if args.torchrec_side:
        npy, contig, caps, out = args.torchrec_side
        torchrec_side(npy, contig, json.loads(caps), out)
        return 0
    if not Path(args.torchrec_python).is_file():
        print(f"no TorchRec environment at {args.torchrec_python} (--torchrec-python)", file=sys.stderr)
        return 2
    import numpy as np

    variants = args.variants.split(",")
    workdir = Path(args.workdir)
    ours_raw, theirs_raw = _days(workdir, args.rows_per_day, Path(args.real_sample))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if args.torchrec_path:
        env["PYTHONPATH"] = args.torchrec_path
    theirs = _torchrec(args.torchrec_python, env, theirs_raw, workdir, variants)
    report, equal = {}, True
    for name in variants:
        threshold, caps = VARIANTS[name]
        their_days = theirs[name]
        for engine in args.engines.split(","):
            ours = _ours(ours_raw, workdir / f"ours_{name}_{engine}", engine, threshold, caps)
            train_same = np.array_equal(
                _sorted_rows(ours["train"]), _sorted_rows(np.concatenate(their_days[:-1]))
            )
            last_same = np.array_equal(np.concatenate([ours["test"], ours["validation"]]), their_days[-1])
            equal &= train_same and last_same
            report[f"{name}/{engine}"] = {
                "threshold": threshold,
                "capped": caps is not None,
                "train_rows": len(ours["train"]),
                "train_equal": bool(train_same),
                "last_day_rows": len(their_days[-1]),
                "last_day_equal": bool(last_same),
                "highest_id": int(max(ours[s][:, 1:].max() for s in ours if len(ours[s]))),
            }
    print(
        json.dumps({"days": DAYS, "rows_per_day": args.rows_per_day, "results": report, "equal": bool(equal)})
    )
    return 0 if equal else 1


if __name__ == "__main__":
    sys.exit(main())
