"""Checkpoints: every rank saves its own tables, rank 0 the replicated part and the step.

Layout (under ``DIR/checkpoints/``)::

    step-000000120/rank-0.npz        tables (column slices) owned by rank 0 + their optimizer slots
    step-000000120/rank-1.npz        ... rank 1
    step-000000120/replicated.npz    MLPs replicated on all ranks + their slots + optimizer counters
    step-000000120/meta.json         step, placement, table sizes, dims: written last

A checkpoint is written into ``.step-N.tmp`` and renamed once every rank has finished, so a killed
run leaves either a complete checkpoint or none (the latest complete one is used on restart).
Table entries are named ``table/<t>/<first col>-<end col>``; a rank restoring a piece copies the
overlapping columns of every saved slice of that table, so a checkpoint can be restored with a
different number of ranks or a different placement. The directory must be visible to all ranks
(one host, or a shared filesystem).
"""

from __future__ import annotations

import json
import re
import shutil
import zipfile
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from dlrm_contracts.atomic import replace_directory
from dlrm_contracts.config import TrainConfig
from dlrm_contracts.dataset_identity import IDENTITY_KEY
from dlrm_contracts.layout import CHECKPOINT_META as META
from dlrm_contracts.layout import (best_checkpoint, checkpoint_dir,  # noqa: F401 — re-exported
                                   complete_checkpoints, latest_checkpoint)

TABLE_KEY = re.compile(r"^table/(\d+)/(\d+)-(\d+)(/.*)?$")


class CheckpointError(RuntimeError):
    """A checkpoint that does not fit the model being restored."""


def save_checkpoint(root: Path, step: int, comm, owned: dict[str, np.ndarray],
                    replicated: dict[str, np.ndarray], meta: dict[str, Any], keep: int,
                    protect: Iterable[int | None] = ()) -> Path:
    """Collective: every rank calls it with its own state; returns the final directory.

    The newest ``keep`` checkpoints stay, and those of the steps in ``protect`` (the best so
    far; the previous model a warm-started run began from).
    """
    kept = {p for p in protect if p is not None}
    final = checkpoint_dir(root, step)
    tmp = root / f".step-{step:09d}.tmp"
    if comm.rank == 0:
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
    comm.barrier()
    np.savez(tmp / f"rank-{comm.rank}.npz", **owned)
    if comm.rank == 0:
        np.savez(tmp / "replicated.npz", **replicated)
    comm.barrier()
    if comm.rank == 0:
        (tmp / META).write_text(json.dumps({**meta, "step": step}, indent=1) + "\n")
        # flushes every rank's file (the other ranks have passed the barrier above) before
        # the rename, and the rename before older checkpoints are pruned below
        replace_directory(tmp, final)
        for old_step, old in complete_checkpoints(root)[:-max(1, keep)]:
            if old_step not in kept:
                shutil.rmtree(old, ignore_errors=True)
        for stale in root.glob(".step-*.tmp"):  # left by a run killed while saving another step
            shutil.rmtree(stale, ignore_errors=True)
    comm.barrier()
    return final


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
        error = CheckpointError(f"{what}; delete {self.path} to resume from an older checkpoint, "
                                "or use --no-resume")
        error.damage = what  # the file and what is wrong with it, for another mode's own fix
        return error

    def _read(self, file, key: str) -> np.ndarray:
        try:
            return file[key]
        except _DAMAGED_ARRAY as exc:
            raise self._damaged(f"{self.path}: {key!r} is unreadable (truncated or corrupt: "
                                f"{exc})") from None

    def check_compatible(self, table_sizes: list[int], dims: dict[str, Any]) -> None:
        if list(self.meta.get("table_sizes", [])) != list(table_sizes):
            raise CheckpointError(f"{self.path} was saved for table sizes {self.meta.get('table_sizes')}"
                                  f", the dataset has {list(table_sizes)}")
        if self.meta.get("dims") != dims:
            raise CheckpointError(f"{self.path} was saved for model dims {self.meta.get('dims')}, "
                                  f"this run uses {dims}")

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
                out[:, lo - start:hi - start] = self._read(file, key)[
                    :, lo - int(saved[2]):hi - int(saved[2])]
                covered[lo - start:hi - start] = True
        if not covered.all():
            raise CheckpointError(f"{self.path} does not hold all columns of {name!r}")
        return out

    def close(self) -> None:
        for f in self._files:
            f.close()


def checkpoint_meta(config: TrainConfig, placement_description: dict, table_sizes: list[int],
                    dims: dict[str, Any], dataset_identity: dict[str, Any] | None = None
                    ) -> dict[str, Any]:
    return {"placement": placement_description, "table_sizes": list(table_sizes), "dims": dims,
            "optimizer": config.optimizer, "seed": config.seed,
            IDENTITY_KEY: dict(dataset_identity or {})}
