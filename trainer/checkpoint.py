"""Checkpoints: every rank saves its own tables, rank 0 the replicated part and the step.

Layout (under ``DIR/checkpoints/``)::

    step-000000120/rank-0.npz        tables (column slices) owned by rank 0 + their optimizer slots
    step-000000120/rank-1.npz        ... rank 1
    step-000000120/replicated.npz    MLPs replicated on all ranks + their slots + optimizer counters
    step-000000120/meta.json         step, placement, table sizes, dims, the dataset and the
                                     run (its id, its settings of the model): written last
    run.json                         the current run's id (written with its checkpoints)
    superseded/<time>/               earlier runs' checkpoints set aside, with why.json

A checkpoint is written into ``.step-N.tmp`` and renamed once every rank has finished, so a killed
run leaves either a complete checkpoint or none (the latest complete one is used on restart).
Table entries are named ``table/<t>/<first col>-<end col>``; a rank restoring a piece copies the
overlapping columns of every saved slice of that table, so a checkpoint can be restored with a
different number of ranks or a different placement. The directory must be visible to all ranks
(one host, or a shared filesystem).

Each checkpoint names its run. Resuming, retention, eval and export use the current run's
checkpoints (``run.json``), never the highest step number: a run restarted at step 0 below an
older run's checkpoints keeps its own, and a stray ``step-999999999/`` is not taken for the model.
"""

from __future__ import annotations

import json
import re
import shutil
import time
import uuid
import zipfile
from pathlib import Path
from dataclasses import dataclass
from typing import Any, Iterable

import numpy as np

from dlrm_contracts.atomic import replace_directory, write_json_atomic
from dlrm_contracts.config import TrainConfig, train_model_settings
from dlrm_contracts.dataset_identity import IDENTITY_KEY
from dlrm_contracts.layout import CHECKPOINT_META as META
from dlrm_contracts.layout import CURRENT_RUN_JSON, RUN_KEY, checkpoint_run, current_run, read_checkpoint_meta
from dlrm_contracts.layout import complete_checkpoints

# re-exported: the trainer's callers find the checkpoint paths beside the checkpoints
from dlrm_contracts.layout import best_checkpoint, checkpoint_dir, latest_checkpoint  # noqa: F401

TABLE_KEY = re.compile(r"^table/(\d+)/(\d+)-(\d+)(/.*)?$")


class CheckpointError(RuntimeError):
    """A checkpoint that does not fit the model being restored."""

    # Set on a damaged file's error only (CheckpointReader._damaged): which file, what is wrong
    # with it. Annotated, not given a default, so that hasattr tells the two kinds apart.
    damage: str


@dataclass(frozen=True)
class Retention:
    """Which checkpoints stay once a run saved one: the newest ``keep`` of the run, those of
    the steps in ``protect`` (None entries ignored), and of other runs all but the history
    the run was numbered on from (steps below ``run_start``)."""

    keep: int
    protect: Iterable[int | None] = ()
    run_start: int = 0


def save_checkpoint(
    root: Path,
    step: int,
    comm,
    owned: dict[str, np.ndarray],
    replicated: dict[str, np.ndarray],
    meta: dict[str, Any],
    retention: Retention,
) -> Path:
    """Collective: every rank calls it with its own state; returns the final directory.

    The checkpoint names its run (``meta["run"]``), which becomes the current run
    (``run.json``). Retention is by run, not by step number: the newest ``retention.keep``
    checkpoints of this run stay, with those of the steps in ``retention.protect`` (the best so
    far; the previous model a warm-started run began from); of other runs only the history
    this run was numbered on from (steps below ``retention.run_start``, a warm start's earlier
    days) goes. An older run's checkpoints at higher steps, or a stray
    ``step-999999999/``, are never taken for this run's.
    """
    kept = {p for p in retention.protect if p is not None}
    final = checkpoint_dir(root, step)
    tmp = root / f".step-{step:09d}.tmp"
    if comm.rank == 0:
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
    comm.barrier()
    # numpy's stub types a ** mapping's values against allow_pickle (bool) too
    np.savez(tmp / f"rank-{comm.rank}.npz", **owned)  # type: ignore[arg-type]
    if comm.rank == 0:
        np.savez(tmp / "replicated.npz", **replicated)  # type: ignore[arg-type]
    comm.barrier()
    if comm.rank == 0:
        (tmp / META).write_text(json.dumps({**meta, "step": step}, indent=1) + "\n")
        # flushes every rank's file (the other ranks have passed the barrier above) before
        # the rename, and the rename before older checkpoints are pruned below
        replace_directory(tmp, final)
        run_id = checkpoint_run(meta)
        if current_run(root) != run_id:
            write_json_atomic(root / CURRENT_RUN_JSON, {"id": run_id})
        for old in retired(root, run_id, retention.keep, kept, retention.run_start):
            shutil.rmtree(old, ignore_errors=True)
        for stale in root.glob(".step-*.tmp"):  # left by a run killed while saving another step
            shutil.rmtree(stale, ignore_errors=True)
    comm.barrier()
    return final


def retired(root: Path, run_id: str, keep: int, protect: set[int], run_start: int) -> list[Path]:
    """The checkpoints retention removes after run ``run_id`` saved one (see save_checkpoint)."""
    found = [
        (step, path, checkpoint_run(read_checkpoint_meta(path))) for step, path in complete_checkpoints(root)
    ]
    mine = [(step, path) for step, path, run in found if run == run_id]
    out = [path for step, path in mine[: -max(1, keep)] if step not in protect]
    return out + [
        path for step, path, run in found if run != run_id and step < run_start and step not in protect
    ]


# what numpy raises on a truncated or corrupt .npz member
_DAMAGED_ARRAY = (OSError, ValueError, EOFError, zipfile.BadZipFile)


class CheckpointReader:
    """Reads named arrays of a checkpoint, assembling table slices saved by any rank."""

    def __init__(self, path: Path):
        self.path = path
        try:
            self.meta = json.loads((path / META).read_text())
        except (OSError, ValueError) as exc:
            raise self._damaged(f"{path / META} is unreadable ({exc})") from None
        if not isinstance(self.meta, dict) or not isinstance(self.meta.get("step"), int):
            raise self._damaged(f"{path / META} has no integer 'step'")
        self._files = []
        for file in sorted(path.glob("*.npz")):
            try:
                self._files.append(np.load(file))
            except _DAMAGED_ARRAY as exc:
                self.close()
                raise self._damaged(f"{file} is unreadable (truncated or corrupt: {exc})") from None
        self._where = {key: f for f in self._files for key in f.files}

    def _damaged(self, what: str) -> CheckpointError:
        error = CheckpointError(
            f"{what}; delete {self.path} to resume from an older checkpoint, or use --no-resume"
        )
        error.damage = what  # the file and what is wrong with it, for another mode's own fix
        return error

    def _read(self, file, key: str) -> np.ndarray:
        try:
            return file[key]
        except _DAMAGED_ARRAY as exc:
            raise self._damaged(f"{self.path}: {key!r} is unreadable (truncated or corrupt: {exc})") from None

    def check_compatible(self, table_sizes: list[int], dims: dict[str, Any]) -> None:
        if list(self.meta.get("table_sizes", [])) != list(table_sizes):
            raise CheckpointError(
                f"{self.path} was saved for table sizes {self.meta.get('table_sizes')}"
                f", the dataset has {list(table_sizes)}"
            )
        if self.meta.get("dims") != dims:
            raise CheckpointError(
                f"{self.path} was saved for model dims {self.meta.get('dims')}, this run uses {dims}"
            )

    def keys(self) -> list[str]:
        """Every array saved, a table slice under its own key (``table/<t>/<a>-<b>``)."""
        return list(self._where)

    def saved(self, key: str) -> np.ndarray:
        """One array as saved (a slice stays a slice; :meth:`value` assembles tables)."""
        if key not in self._where:
            raise CheckpointError(f"{self.path} has no {key!r}")
        return self._read(self._where[key], key)

    def value(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        match = TABLE_KEY.match(name)
        if match is None:
            return self.saved(name)
        table, start, end, suffix = int(match[1]), int(match[2]), int(match[3]), match[4] or ""
        out = np.empty(shape, np.float32)
        covered = np.zeros(end - start, bool)
        for key, file in self._where.items():
            saved = TABLE_KEY.match(key)
            if saved is None or int(saved[1]) != table or (saved[4] or "") != suffix:
                continue
            lo, hi = max(start, int(saved[2])), min(end, int(saved[3]))
            if lo < hi:
                out[:, lo - start : hi - start] = self._read(file, key)[
                    :, lo - int(saved[2]) : hi - int(saved[2])
                ]
                covered[lo - start : hi - start] = True
        if not covered.all():
            raise CheckpointError(f"{self.path} does not hold all columns of {name!r}")
        return out

    def close(self) -> None:
        for f in self._files:
            f.close()


def checkpoint_meta(
    config: TrainConfig,
    placement_description: dict,
    table_sizes: list[int],
    dims: dict[str, Any],
    dataset_identity: dict[str, Any] | None = None,
    run_id: str | None = None,
) -> dict[str, Any]:
    """What meta.json records beside the arrays: the model's shape and placement, the dataset,
    and the run (its id and the settings of the model it trains, TRAIN_SETTING_KINDS)."""
    meta = {
        "placement": placement_description,
        "table_sizes": list(table_sizes),
        "dims": dims,
        "optimizer": config.optimizer,
        "seed": config.seed,
        IDENTITY_KEY: dict(dataset_identity or {}),
    }
    if run_id is not None:
        meta[RUN_KEY] = {"id": run_id, "settings": train_model_settings(config)}
    return meta


def new_run_id() -> str:
    """A run's id: when it started (UTC) and a random part, unique across workdirs."""
    return time.strftime("%Y%m%dT%H%M%SZ-", time.gmtime()) + uuid.uuid4().hex[:8]


def recorded_settings(meta: dict[str, Any]) -> dict[str, Any] | None:
    """The model settings a checkpoint's run recorded; None before checkpoints did."""
    run = meta.get(RUN_KEY)
    settings = run.get("settings") if isinstance(run, dict) else None
    return settings if isinstance(settings, dict) else None
