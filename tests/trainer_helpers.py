"""Shared helpers of the trainer tests: datasets, configs, reading metrics and checkpoints, the
trainer's command line in this process, and many two-rank command lines in one horovodrun launch."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from dlrm_contracts.config import LaunchConfig, TrainConfig
from dlrm_contracts.dataset_identity import DICTIONARIES_FINGERPRINT_KEY, dictionaries_fingerprint
from dlrm_contracts.schema import CAT_COLUMNS, SPLITS
from pipeline.stages import GLOO_TIMEOUT_ENV
from trainer.checkpoint import TABLE_KEY, CheckpointReader, latest_checkpoint
from trainer.metrics import read_metrics
from trainer.synthetic import write_planted_dataset

VENV_BIN = Path(sys.executable).parent
SMALL_ROWS = {"train": 4096, "test": 1000, "validation": 777}

# A tiny binary dataset written with numpy as docs/architecture.md specifies (not by the
# trainer's own writer): the launch and stage tests' input.
TINY_TABLE_SIZES = [3, 17, 40, 120, 129, 300] + [5 + 7 * i for i in range(20)]


def _dtype(size: int) -> str:
    return "<i1" if size <= 2**7 else "<i2" if size <= 2**15 else "<i4"


def write_tiny_dataset(path: Path, rows: dict[str, int], seed: int = 3) -> None:
    """A complete split binary dataset (docs/architecture.md), label tied to C2 and I1."""
    rng = np.random.default_rng(seed)
    weight = rng.normal(0, 1.5, TINY_TABLE_SIZES[1])
    for split in SPLITS:
        n, folder = rows[split], path / split
        folder.mkdir(parents=True)
        numerical = rng.normal(0, 1, (n, 13)).astype("<f2")
        cats = [rng.integers(0, size, n) for size in TINY_TABLE_SIZES]
        logit = weight[cats[1]] + numerical[:, 0].astype(np.float32) - 1.0
        label = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype("<u1")
        label.tofile(folder / "label.bin")
        numerical.tofile(folder / "numerical.bin")
        for i, (ids, size) in enumerate(zip(cats, TINY_TABLE_SIZES)):
            ids.astype(_dtype(size)).tofile(folder / f"cat_{i}.bin")
    model_size = dict(zip(CAT_COLUMNS, TINY_TABLE_SIZES))
    (path / "model_size.json").write_text(json.dumps(model_size))
    (path / "dataset.json").write_text(
        json.dumps(
            {
                "format_version": 1,
                "splits": rows,
                "table_sizes": TINY_TABLE_SIZES,
                "cat_dtypes": [np.dtype(_dtype(s)).name for s in TINY_TABLE_SIZES],
                "label_dtype": "uint8",
                "numerical_dtype": "float16",
                "num_numerical": 13,
                "threshold_spec": "1",
                "source_fingerprint": f"tests/trainer_helpers.py seed {seed}",
            }
        )
    )
    (path / "_SUCCESS").write_text("")


# MLPerf DLRMv2's ids per row of C1..C26, its 100 (C21) cut to 20 to keep the tests small.
DLRMV2_MULTI_HOT = (3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 20, 27, 10, 3, 1, 1)

# The capped-ids tests' tables (small caps for a model trained in the tests; cap 1: every
# value is id 0) and rows.
# fmt: off
CAPS = (
    3, 20, 20, 50, 200, 997, 4000, 7, 100, 300, 128, 129, 2,
    60, 500, 1, 3300, 10, 30, 90, 400, 15, 250, 700, 4, 1500,
)
# fmt: on
CAPPED_ROWS = {"train": 2048, "test": 300, "validation": 200}

# The days of one stream with stable ids: day 2's tables are day 1's, some grown.
# fmt: off
STREAM_SIZES_1 = (
    3, 20, 20, 50, 200, 300, 3000, 7, 100, 300, 128, 129, 2,
    60, 500, 500, 900, 10, 30, 90, 400, 15, 250, 700, 4, 1500,
)
# fmt: on
STREAM_GROWN = {1: 24, 4: 260, 6: 3500, 16: 1000}  # C2 (planted interaction), C5, C7, C17
STREAM_SIZES_2 = tuple(STREAM_GROWN.get(i, s) for i, s in enumerate(STREAM_SIZES_1))
STREAM_SIGNAL = 99  # one planted signal for every day of the stream


def stream_day(
    path: Path,
    seed: int,
    sizes: tuple[int, ...] = STREAM_SIZES_1,
    rows: dict[str, int] = SMALL_ROWS,
    dictionaries: Path | None = None,
) -> Path:
    """One day of the stream; with ``dictionaries``, append-only dictionaries for these sizes
    are written there and their fingerprint recorded, as convert records it."""
    extra = {}
    if dictionaries is not None:
        write_stable_dictionaries(dictionaries, sizes)
        extra = {DICTIONARIES_FINGERPRINT_KEY: dictionaries_fingerprint(dictionaries)}
    write_planted_dataset(path, rows, seed=seed, table_sizes=sizes, signal_seed=STREAM_SIGNAL, extra=extra)
    return path


def write_stable_dictionaries(root: Path, sizes: tuple[int, ...]) -> None:
    """Dictionaries whose id i has the same value whatever the sizes (stable ids)."""
    import shutil

    import pyarrow as pa
    import pyarrow.parquet as pq

    shutil.rmtree(root, ignore_errors=True)
    for c, (column, size) in enumerate(zip(CAT_COLUMNS, sizes)):
        if size <= 1:
            continue
        folder = root / f"column={column}"
        folder.mkdir(parents=True)
        ids = np.arange(1, size, dtype=np.int64)
        pq.write_table(
            pa.table({"value": [f"{c:02x}{i:06x}" for i in ids], "id": ids}), folder / "part-0.parquet"
        )


def pairwise_auc(labels, scores) -> float:
    """ROC AUC by its definition, every positive against every negative (ties count one half):
    the independent reference of trainer.metrics.roc_auc's rank formula."""
    pos, neg = scores[labels == 1], scores[labels == 0]
    diff = pos[:, None] - neg[None, :]
    return float(((diff > 0) + 0.5 * (diff == 0)).mean())


def small_config(**overrides) -> TrainConfig:
    """A quick, deterministic config (small preset, SGD, every step logged, no early stopping,
    the DLRM without the wide term: the tests of the wide term turn it on)."""
    base = dict(
        preset="small",
        wide=False,
        batch_size=256,
        optimizer="sgd",
        learning_rate=0.5,
        learning_rate_scaling="none",
        warmup_steps=5,
        epochs=1,
        evals_per_epoch=1,
        early_stopping_patience=0,
        log_every=1,
        seed=7,
        shuffle_batches=True,
        intra_op_threads=1,
    )
    base.update(overrides)
    return TrainConfig(**base)


def config_flags(config: TrainConfig) -> list[str]:
    """The CLI flags that reproduce ``small_config`` settings in a subprocess."""
    flags = [
        "--preset",
        config.preset,
        "--batch-size",
        str(config.batch_size),
        "--learning-rate",
        repr(config.learning_rate),
        "--warmup-steps",
        str(config.warmup_steps),
        "--epochs",
        str(config.epochs),
        "--log-every",
        str(config.log_every),
        "--seed",
        str(config.seed),
        "--shuffle-batches",
        str(config.shuffle_batches),
        "--bottom-mlp-data-parallel",
        str(config.bottom_mlp_data_parallel),
        "--optimizer",
        config.optimizer,
        "--learning-rate-scaling",
        config.learning_rate_scaling,
        "--evals-per-epoch",
        str(config.evals_per_epoch),
        "--early-stopping-patience",
        str(config.early_stopping_patience),
        "--wide",
        str(config.wide),
        "--table-l2",
        repr(config.table_l2),
        "--wide-l2",
        repr(config.wide_l2),
        "--row-l2-scaling",
        config.row_l2_scaling,
        "--wide-learning-rate-factor",
        repr(config.wide_learning_rate_factor),
    ]
    if config.max_steps is not None:
        flags += ["--max-steps", str(config.max_steps)]
    if config.force_column_split:
        flags += ["--force-column-split", ",".join(config.force_column_split)]
    if config.checkpoint_every:
        flags += ["--checkpoint-every", str(config.checkpoint_every)]
    if config.xla:
        flags += ["--xla"]
    if config.intra_op_threads:
        flags += ["--intra-op-threads", str(config.intra_op_threads)]
    if config.interaction != "dot":
        flags += [
            "--interaction",
            config.interaction,
            "--dcn-layers",
            str(config.dcn_layers),
            "--dcn-rank",
            str(config.dcn_rank),
        ]
    if config.embedding_dim:
        flags += ["--embedding-dim", str(config.embedding_dim)]
    if config.bottom_mlp:
        flags += ["--bottom-mlp", ",".join(map(str, config.bottom_mlp))]
    if config.top_mlp:
        flags += ["--top-mlp", ",".join(map(str, config.top_mlp))]
    if config.init != "scratch":
        flags += ["--init", config.init, "--init-optimizer", config.init_optimizer]
    return flags


def step_losses(workdir: Path) -> dict[int, float]:
    """step -> loss of every training record of ``workdir/logs/metrics.jsonl`` (last one wins)."""
    return {r["step"]: r["loss"] for r in read_metrics(workdir / "logs" / "metrics.jsonl") if "loss" in r}


def checkpoint_arrays(workdir: Path) -> dict[str, np.ndarray]:
    """Every variable of the latest checkpoint, tables assembled whole from their slices."""
    reader = CheckpointReader(latest_checkpoint(workdir / "checkpoints"))
    try:
        out = {}
        tables: dict[int, tuple[int, int]] = {}
        for key in reader.keys():
            match = TABLE_KEY.match(key)
            if match is None:
                out[key] = np.asarray(reader.value(key, ()))
            elif not match[4]:
                rows = reader.saved(key).shape[0]
                tables[int(match[1])] = (rows, max(tables.get(int(match[1]), (0, 0))[1], int(match[3])))
        for table, (rows, dim) in tables.items():
            out[f"table/{table}"] = reader.value(f"table/{table}/0-{dim}", (rows, dim))
        return out
    finally:
        reader.close()


def horovod_env(env: dict | None = None) -> dict:
    """The environment of a horovodrun that a test starts itself (``env``, else this
    process's), with the Gloo timeout the pipeline gives its ranks
    (``launch.gloo_timeout_seconds``) unless it names one: Gloo's own 30 s ends a run whose
    other rank a loaded machine (the suite's two workers) holds up that long."""
    base = dict(os.environ if env is None else env)
    base.setdefault(GLOO_TIMEOUT_ENV, str(LaunchConfig().gloo_timeout_seconds))
    return base


def last_json_line(stdout: str) -> dict:
    """The JSON summary a trainer command line prints last (after horovodrun's prefix, if any)."""
    last = [line for line in stdout.splitlines() if line.strip()][-1]
    return json.loads(last[last.index("{") :])


def trainer_main(args: list[str]) -> tuple[int, str, str]:
    """``python -m trainer ARGS`` run in this process: ``trainer.cli.main``, the function that
    module runs, with its stdout and stderr captured. Returns (exit code, stdout, stderr).
    For a test of the command line's outcome that needs no process of its own: TensorFlow's
    import is not paid again."""
    from trainer.cli import main

    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(args)
    return code, out.getvalue(), err.getvalue()


def trainer_main_summary(args: list[str]) -> dict:
    """The summary of a ``trainer_main`` run that must succeed."""
    code, out, err = trainer_main(args)
    assert code == 0, out[-4000:] + err[-6000:]
    return last_json_line(out)


HOROVOD_SCRIPTS = Path(__file__).resolve().parent / "horovod_scripts"


@dataclass
class TrainerLaunch:
    """The command lines of one horovodrun launch of horovod_scripts/trainer_runs.py: per
    job, per line, every rank's exit code and what it printed (``ranks[r][job][i]``)."""

    root: Path  # the folder of the launch; tests give their jobs workdirs in it
    ranks: list[dict[str, list[dict]]]
    output: str  # horovodrun's own output, for a failure's message

    def lines(self, job: str) -> list[list[dict]]:
        """Each command line of ``job`` as every rank ran it; asserts every rank ran every
        line and exited 0, as a launch of that line alone had to."""
        runs = [rank[job] for rank in self.ranks]
        for rank, lines in enumerate(runs):
            for line in lines:
                assert line["returncode"] == 0, (
                    f"rank {rank}, {job}: {line['argv']} exited {line['returncode']}\n"
                    + line["stdout"][-3000:]
                    + line["stderr"][-6000:]
                )
        assert len({len(lines) for lines in runs}) == 1, f"{job}: the ranks ran different lines"
        return [list(calls) for calls in zip(*runs)]

    def summary(self, job: str, line: int = -1) -> dict:
        """The JSON summary rank 0 printed for line ``line`` of ``job``."""
        return last_json_line(self.lines(job)[line][0]["stdout"])

    def stderr(self, job: str, line: int = -1) -> str:
        """What rank 0 printed to stderr on line ``line`` of ``job`` (the trainer's progress)."""
        return self.lines(job)[line][0]["stderr"]


def launch_trainer_lines(
    jobs: dict[str, list[list[str]]],
    root: Path,
    ranks: int = 2,
    timeout: int = 3600,
    collectives: bool = False,
) -> TrainerLaunch:
    """Run every job's ``python -m trainer`` argument lists in ONE ``horovodrun -np ranks``
    launch (each line through the trainer's own CLI entry, in order; the jobs one after
    another): the ranks' start-up, TensorFlow's import and Gloo's rendezvous are paid once
    instead of once per line. With ``collectives``, horovod_scripts/collectives_check.py's
    checks run first, as the job ``collectives`` (its line's stdout: the rank's JSON report).
    Tests assert each job's lines through the result; the plan and the ranks' results go in
    ``root / "launch"``."""
    folder = root / "launch"
    folder.mkdir(parents=True, exist_ok=True)
    plan = folder / "plan.json"
    plan.write_text(
        json.dumps({"jobs": jobs, "results": str(folder / "results"), "collectives": collectives})
    )
    command = [
        str(VENV_BIN / "horovodrun"),
        "-np",
        str(ranks),
        "-H",
        f"localhost:{ranks}",
        "--gloo",
        str(VENV_BIN / "python"),
        str(HOROVOD_SCRIPTS / "trainer_runs.py"),
        str(plan),
    ]
    proc = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=horovod_env(),
        cwd=Path(__file__).resolve().parent.parent,
    )
    output = proc.stdout[-4000:] + proc.stderr[-6000:]
    files = [folder / "results" / f"rank-{r}.json" for r in range(ranks)]
    missing = [f.name for f in files if not f.exists()]
    assert not missing, f"the launch ended (exit {proc.returncode}) without {missing}:\n{output}"
    return TrainerLaunch(root, [json.loads(f.read_text()) for f in files], output)


def copied_workdir(source: Path, target: Path) -> Path:
    """A copy of a shared run's workdir for a test that trains or evaluates on in it."""
    shutil.copytree(source, target)
    return target


def write_histogram(counts_dir, column_counts: dict[str, dict[int, int]]):
    """A counts histogram (counts/histogram.parquet): per column, count -> how many values."""
    rows = [(c, n, v) for c, hist in column_counts.items() for n, v in hist.items()]
    counts_dir.mkdir(parents=True, exist_ok=True)
    pq.write_table(
        pa.table(
            {
                "column": [r[0] for r in rows],
                "count": [r[1] for r in rows],
                "num_values": [r[2] for r in rows],
            }
        ),
        counts_dir / "histogram.parquet",
    )
