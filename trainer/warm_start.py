"""Where a training run starts: from scratch, resumed, or warm-started from the previous model.

A checkpoint records the dataset it was trained on (``dataset_identity`` in its meta.json).
The newest checkpoint of the workdir decides:

- none: from scratch;
- trained on this dataset: an interrupted (or finished) run of it, resumed (``train.resume``);
- trained on another dataset (yesterday's window): with ``train.init: previous`` a new run
  starts from that run's model (its best checkpoint with early stopping, else its last); with
  ``init: scratch`` and ``resume`` the trainer refuses, rather than silently continuing another
  dataset's run.

A warm start copies the MLPs and every table's rows into the new, possibly larger, tables: ids
are stable (``preprocess.ids: stable``), so row i still means the value it meant, and the rows
past the old size keep the values a fresh model gets (new values start as at the start). A
table that shrank means the ids moved, and is refused. The optimizer state and the step follow
``train.init_optimizer`` (continue or restart); either way the new run's checkpoints are
numbered on from the previous model's step, so the newest checkpoint is always the newest model.

With capped ids (``preprocess.ids: modulo``) an id is the value's hex value modulo its column's
cap, the table size: equal caps carry every row over as it is. A cap that became a multiple
of the previous one (k x old) is remapped exactly: every value whose new id is s had id
s mod old, so new row s starts as old row s mod old (and its optimizer state likewise). Any
other change of a cap, or of the kind of ids (capped on one day, dictionary ids on the other),
is refused: no row of the new table means what one row of the old meant.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from dlrm_contracts.config import ConfigError, TrainConfig
from dlrm_contracts.dataset_identity import IDENTITY_KEY, capped, trained_on
from dlrm_contracts.layout import (
    CHECKPOINT_META,
    checkpoint_dir,
    checkpoint_run,
    complete_checkpoints,
    read_checkpoint_meta,
    run_checkpoints,
)
from dlrm_contracts.binary_format import MULTI_HOT_SIZES_KEY
from dlrm_contracts.superseded import set_aside
from dlrm_contracts.schema import CAT_COLUMNS
from trainer.checkpoint import TABLE_KEY, CheckpointError, CheckpointReader

# meta.json keys of a run that began with a warm start (resume reads them back)
RUN_START_KEY = "run_start_step"
WARM_START_KEY = "warm_start"


@dataclass
class StartPlan:
    """How a run starts: ``kind`` is scratch, resume or previous; ``path`` the checkpoint."""

    kind: str
    path: Path | None = None
    note: str = ""


@dataclass
class WarmStart:
    """What a warm start took from the previous model (recorded in every checkpoint's meta and
    in the summary)."""

    source: str
    source_step: int
    optimizer: str  # continue | restart
    old_table_sizes: list[int]
    grown: dict[str, list[int]] = field(default_factory=dict)  # column -> [old, new] rows
    # The previous model's AUC on this run's test split before any step (rank 0; kept in the
    # meta so that a resumed run reports it too)
    previous_test_auc: float | None = None
    # capped ids: the grown tables were remapped (row s from old row s mod old), not padded
    capped: bool = False

    def to_meta(self) -> dict[str, Any]:
        return {
            "from": self.source,
            "from_step": self.source_step,
            "optimizer": self.optimizer,
            "old_table_sizes": self.old_table_sizes,
            "grown_tables": self.grown,
            "previous_model_test_auc": self.previous_test_auc,
            **({"capped_ids": True} if self.capped else {}),
        }

    @classmethod
    def from_meta(cls, meta: dict[str, Any] | None) -> WarmStart | None:
        if not isinstance(meta, dict) or "from_step" not in meta:
            return None
        return cls(
            str(meta.get("from")),
            int(meta["from_step"]),
            str(meta.get("optimizer")),
            [int(s) for s in meta.get("old_table_sizes", [])],
            dict(meta.get("grown_tables") or {}),
            meta.get("previous_model_test_auc"),
            bool(meta.get("capped_ids", False)),
        )

    def served_sizes(self, table_sizes: tuple[int, ...]) -> tuple[int, ...]:
        """The table sizes at which this run's dataset reads as the previous model serves it
        (its evaluation before any step): an id past an old table is a value the previous
        model had no row for, id 0; with capped ids every remapped row is the previous
        model's own (the served model takes the value modulo the old cap), so none is."""
        if self.capped:
            return tuple(table_sizes)
        return tuple(min(a, b) for a, b in zip(self.old_table_sizes, table_sizes))


def _meta(path: Path) -> dict[str, Any]:
    try:
        meta = json.loads((path / CHECKPOINT_META).read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(
            f"{path / CHECKPOINT_META} is unreadable ({exc}); delete {path} to start from an older checkpoint"
        ) from None
    return meta if isinstance(meta, dict) else {}


def holds_previous_model(meta: dict[str, Any]) -> bool:
    """Whether a checkpoint is the previous model saved unchanged for its dataset: a
    warm-started run that trained no step (``train.days: new`` with no new day) saves the model
    it started from, at the same step, for eval and export. It is then the only copy of that
    model (it replaced the checkpoint it was loaded from), so a rerun of its dataset must start
    from it rather than drop it with the dataset's own checkpoints."""
    return (
        isinstance(meta.get(WARM_START_KEY), dict)
        and "step" in meta
        and meta.get(RUN_START_KEY) == meta["step"]
    )


def previous_model(root: Path, identity: dict[str, Any]) -> Path | None:
    """The model of the newest run on another dataset: its best checkpoint (early stopping)
    when that one is still there, else its newest checkpoint; or, newer than any such, the
    previous model saved unchanged for this dataset (``holds_previous_model``)."""
    for step, path in reversed(run_checkpoints(root)):
        meta = _meta(path)
        if trained_on(meta, identity):
            if holds_previous_model(meta):
                return path
            continue
        best = (meta.get("early_stopping") or {}).get("best_step")
        if isinstance(best, int) and not isinstance(best, bool) and best != step:
            candidate = checkpoint_dir(root, best)
            if (candidate / CHECKPOINT_META).exists() and not trained_on(_meta(candidate), identity):
                return candidate
        return path
    return None


def plan_start(root: Path, identity: dict[str, Any], config: TrainConfig) -> StartPlan:
    """Scratch, resume or a warm start, from the checkpoints under ``root`` (see the module
    docstring). Every rank computes the same plan from the same files."""
    found = run_checkpoints(root)  # the current run's: never a stray at a higher step
    if not found:
        note = (
            "train.init: previous, but no checkpoint under "
            f"{root} to start from: training from scratch (the first run of a daily job)"
            if config.init == "previous"
            else ""
        )
        return StartPlan("scratch", note=note)
    latest = found[-1][1]
    if trained_on(_meta(latest), identity):
        if config.resume:
            return StartPlan("resume", latest)
        if config.init == "previous":  # --no-resume: this dataset's run is set aside
            base = previous_model(root, identity)
            if base is not None:
                return StartPlan("previous", base)
        return StartPlan("scratch")
    if config.init == "previous":
        return StartPlan("previous", previous_model(root, identity))
    if config.resume:
        raise CheckpointError(
            f"the newest checkpoint {latest} was trained on another dataset than "
            f"{identity.get('source_fingerprint') or 'this one'} (a new preprocess or convert "
            "run, e.g. a new day): resuming would continue another dataset's run. Set "
            "train.init: previous to start a new run from its weights, or train from scratch "
            "with --no-resume (or an empty checkpoint directory)"
        )
    return StartPlan("scratch")


def check_warm_start(
    meta: dict[str, Any],
    path: Path,
    table_sizes: list[int],
    dims: dict[str, Any],
    config: TrainConfig,
    identity: dict[str, Any] | None = None,
) -> dict[str, list[int]]:
    """Refuse a previous model that cannot seed this run; returns the tables that grow
    (with capped ids: that are remapped to a multiple of their cap). ``identity``: this
    run's dataset's (None: a dataset of dictionary ids).

    Raises:
        CheckpointError: other model dims, a table that shrank, another kind of ids, a cap
            changed other than to a multiple of itself, or another optimizer's state asked to
            continue.
    """
    old = [int(s) for s in meta.get("table_sizes", [])]
    if len(old) != len(table_sizes):
        raise CheckpointError(
            f"{path / CHECKPOINT_META} names {len(old)} table sizes, the "
            f"dataset has {len(table_sizes)} tables"
        )
    if meta.get("dims") != dims:
        raise CheckpointError(
            f"the previous model {path} has dims {meta.get('dims')}, this run "
            f"{dims}: a warm start keeps the model's shape (train.init: "
            "scratch to train the new shape)"
        )
    was_capped, is_capped = capped(meta.get(IDENTITY_KEY)), capped(identity)
    if was_capped != is_capped:
        kinds = {
            True: "capped ids (preprocess.ids: modulo)",
            False: "dictionary ids (preprocess.ids: frequency or stable)",
        }
        raise CheckpointError(
            f"the previous model {path} was trained on {kinds[was_capped]}, this dataset has "
            f"{kinds[is_capped]}: its rows mean other values. Train from scratch with "
            "train.init: scratch"
        )
    if is_capped:
        _check_caps(path, old, table_sizes, dims)
    shrunk = {c: [o, n] for c, o, n in zip(CAT_COLUMNS, old, table_sizes) if n < o}
    if shrunk:
        raise CheckpointError(
            f"tables shrank since the previous model {path} ({_listed(shrunk)}): its rows no "
            "longer mean the same values (ids moved: a threshold raise, or ids by frequency). "
            "A warm start needs ids that only grow (preprocess.ids: stable, one threshold); "
            "train from scratch with train.init: scratch"
        )
    if config.init_optimizer == "continue" and meta.get("optimizer") != config.optimizer:
        raise CheckpointError(
            f"the previous model {path} was trained with {meta.get('optimizer')}, this run uses "
            f"{config.optimizer}: its optimizer state cannot continue (set "
            "train.init_optimizer: restart to take the weights only)"
        )
    return {c: [o, n] for c, o, n in zip(CAT_COLUMNS, old, table_sizes) if n > o}


def _check_caps(path: Path, old: list[int], new: list[int], dims: dict[str, Any]) -> None:
    """Capped ids: a cap may stay or become a multiple of itself (the remap is then exact);
    a multi-hot model's caps must stay, since its rows of ids are drawn over the table sizes."""
    changed = {c: [o, n] for c, o, n in zip(CAT_COLUMNS, old, new) if n != o}
    if not changed:
        return
    if dims.get(MULTI_HOT_SIZES_KEY):
        raise CheckpointError(
            f"preprocess.caps changed since the previous model {path} ({_listed(changed)}) and "
            "the model is multi-hot: its rows of ids are drawn over the table sizes, so none "
            "carries over. Keep the caps, or train from scratch with train.init: scratch"
        )
    uneven = {c: on for c, on in changed.items() if on[1] % on[0]}
    if uneven:
        raise CheckpointError(
            f"preprocess.caps changed since the previous model {path} ({_listed(uneven)}) to "
            "caps that are not multiples of the old ones: the values of a new id had several "
            "old ids, so no old row stands for them. Keep the caps (or make each new cap a "
            "multiple of its old one: its rows are then remapped exactly), or train from "
            "scratch with train.init: scratch"
        )


def _listed(tables: dict[str, list[int]], limit: int = 4) -> str:
    shown = [f"{c} {o} -> {n} rows" for c, (o, n) in list(tables.items())[:limit]]
    more = len(tables) - limit
    return ", ".join(shown) + (f" and {more} more" if more > 0 else "")


def check_schedule(start_step: int, config: TrainConfig) -> None:
    """A continued schedule whose decay ended before this run would train at rate 0."""
    if config.init_optimizer != "continue" or config.decay_start_step is None or not config.decay_steps:
        return
    end = config.decay_start_step + config.decay_steps
    if start_step >= end:
        raise ConfigError(
            f"the learning-rate schedule, continued from the previous model's step {start_step}, "
            f"ended at step {end} (decay_start_step + decay_steps): this run would train at "
            "rate 0. Set train.init_optimizer: restart (the schedule starts again) or move the "
            "decay"
        )


def load_grown(reader: CheckpointReader, variables: list[tuple[str, Any]], old_sizes: list[int]) -> None:
    """Assign every variable its saved value; a table (or its optimizer slot) saved with fewer
    rows gets them as its first rows, the rest keeping the values it was created with; with
    capped ids (a cap now a multiple of the saved one, ``check_warm_start``) row s gets saved
    row s mod the old size instead."""
    remap = capped(reader.meta.get(IDENTITY_KEY))
    for name, var in variables:
        shape = tuple(var.shape)
        match = TABLE_KEY.match(name)
        if match is None:
            var.assign(reader.value(name, shape).astype(var.dtype.as_numpy_dtype))
            continue
        rows = old_sizes[int(match[1])]
        if rows == shape[0]:
            var.assign(reader.value(name, shape).astype(var.dtype.as_numpy_dtype))
            continue
        saved = reader.value(name, (rows,) + shape[1:])
        if remap:
            var.assign(saved[np.arange(shape[0]) % rows].astype(var.dtype.as_numpy_dtype))
            continue
        value = np.array(var.numpy())
        value[:rows] = saved
        var.assign(value)


def superseded(root: Path, source_step: int) -> list[Path]:
    """Checkpoints newer than the model a warm start began from: the previous run's own
    checkpoints past its best one (or a run set aside with --no-resume). The new run numbers
    its checkpoints on from ``source_step``, so they must go before it saves; nothing reads
    them (eval and export use a run's best checkpoint)."""
    return [path for step, path in complete_checkpoints(root) if step > source_step]


def remove_superseded(root: Path, source_step: int, log: Callable[[str], None]) -> None:
    """The previous model's own run past it goes (its model is the one kept); any other run's
    checkpoints there (one set aside with --no-resume, a copy) are moved to ``superseded/``."""
    source_run = checkpoint_run(read_checkpoint_meta(checkpoint_dir(root, source_step)))
    others = []
    for path in superseded(root, source_step):
        if checkpoint_run(read_checkpoint_meta(path)) != source_run:
            others.append(path)
            continue
        log(
            f"trainer: removing {path}: the previous run's checkpoint past the model this run "
            "starts from (this run's checkpoints are numbered on from it)"
        )
        shutil.rmtree(path, ignore_errors=True)
    record = set_aside(
        root, others, "checkpoints of another run past the previous model a warm start began from"
    )
    if record:
        log(
            f"trainer: {len(record['checkpoints'])} checkpoints of another run moved to "
            f"{record['path']} (remove them with: {record['remove_with']})"
        )
