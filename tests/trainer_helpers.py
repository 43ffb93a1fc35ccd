"""Shared helpers of the trainer tests: datasets, configs, reading metrics and checkpoints."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from dlrm_contracts.config import TrainConfig
from trainer.checkpoint import TABLE_KEY, CheckpointReader, latest_checkpoint
from trainer.metrics import read_metrics

VENV_BIN = Path(sys.executable).parent
SMALL_ROWS = {"train": 4096, "test": 1000, "validation": 777}


def small_config(**overrides) -> TrainConfig:
    """A quick, deterministic config (small preset, SGD, every step logged, no early stopping)."""
    base = dict(preset="small", batch_size=256, optimizer="sgd", learning_rate=0.5,
                learning_rate_scaling="none", warmup_steps=5, epochs=1, evals_per_epoch=1,
                early_stopping_patience=0, log_every=1, seed=7, shuffle_batches=True,
                intra_op_threads=1)
    base.update(overrides)
    return TrainConfig(**base)


def config_flags(config: TrainConfig) -> list[str]:
    """The CLI flags that reproduce ``small_config`` settings in a subprocess."""
    flags = ["--preset", config.preset, "--batch-size", str(config.batch_size),
             "--learning-rate", repr(config.learning_rate), "--warmup-steps", str(config.warmup_steps),
             "--epochs", str(config.epochs), "--log-every", str(config.log_every),
             "--seed", str(config.seed), "--shuffle-batches", str(config.shuffle_batches),
             "--bottom-mlp-data-parallel", str(config.bottom_mlp_data_parallel),
             "--optimizer", config.optimizer,
             "--learning-rate-scaling", config.learning_rate_scaling,
             "--evals-per-epoch", str(config.evals_per_epoch),
             "--early-stopping-patience", str(config.early_stopping_patience)]
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
    return flags


def step_losses(workdir: Path) -> dict[int, float]:
    """step -> loss of every training record of ``workdir/logs/metrics.jsonl`` (last one wins)."""
    return {r["step"]: r["loss"] for r in read_metrics(workdir / "logs" / "metrics.jsonl")
            if "loss" in r}


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


def run_trainer_cli(args: list[str], ranks: int = 1, timeout: int = 240,
                    env: dict | None = None) -> tuple[dict, subprocess.CompletedProcess]:
    """Run ``python -m trainer`` (under horovodrun when ranks > 1); returns the JSON summary."""
    command = [str(VENV_BIN / "python"), "-m", "trainer", *args]
    if ranks > 1:
        command = [str(VENV_BIN / "horovodrun"), "-np", str(ranks), "-H", f"localhost:{ranks}",
                   "--gloo", *command]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env,
                          cwd=Path(__file__).resolve().parent.parent)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-6000:]
    last = [line for line in proc.stdout.splitlines() if line.strip()][-1]
    return json.loads(last[last.index("{"):]), proc
