"""A run's checkpoints over its life, on every rank: save and retain them, restore the run's
model or where it stopped, recover from a damaged one across ranks, and set aside what a run
does not continue.

trainer/checkpoint.py holds the files (their layout, writing and reading one checkpoint);
this module holds the decisions a run makes about them, so that the training loop only says
when to save and which checkpoint it wants. Every method is called by every rank: the ranks
agree on each candidate before any collective, so a rank that cannot read one never leaves the
others waiting.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import tensorflow as tf

from dlrm_contracts.atomic import write_text_atomic
from dlrm_contracts.config import TrainConfig, changed_settings, train_model_settings
from dlrm_contracts.dataset_identity import IDENTITY_KEY, capped, trained_on
from dlrm_contracts.layout import (
    CHECKPOINT_META,
    WorkdirLayout,
    checkpoint_dir,
    checkpoint_run,
    run_checkpoints,
)
from dlrm_contracts.superseded import set_aside
from trainer.checkpoint import (
    CheckpointError,
    CheckpointReader,
    best_checkpoint,
    checkpoint_meta,
    complete_checkpoints,
    latest_checkpoint,
    new_run_id,
    Retention,
    recorded_settings,
    save_checkpoint,
)
from trainer.data import BinaryDataset
from trainer.dictionary_lineage import LINEAGE_KEY, lineage_of
from trainer.placement import Placement
from trainer.run_state import RunState
from trainer.train_days import TRAIN_DAYS_KEY
from trainer.warm_start import (
    StartPlan,
    WarmStart,
    check_schedule,
    check_warm_start,
    load_grown,
    remove_superseded,
)

Variables = list[tuple[str, tf.Variable]]


@dataclass
class ModelState:
    """The named variables a checkpoint holds: this rank's owned ones (tables, a model-parallel
    bottom MLP) and the replicated ones, each with its optimizer slots, and the optimizer's
    counters and the loss scale with the replicated part (rank 0 saves it)."""

    owned: Variables
    replicated: Variables
    optimizer: Any
    loss_scale: tf.Variable

    def owned_state(self) -> Variables:
        return self._with_slots(self.owned)

    def replicated_state(self) -> Variables:
        return self._with_slots(self.replicated) + self.optimizer.state() + [("loss_scale", self.loss_scale)]

    def _with_slots(self, variables: Variables) -> Variables:
        return list(variables) + [slot for name, _ in variables for slot in self.optimizer.state_for(name)]


@dataclass(frozen=True)
class CheckpointedModel:
    """The model as its checkpoints hold it: which rank holds which table piece (recorded in
    each), its shape as they record it (one saved for another shape is refused), and its
    variables (saved and restored)."""

    placement: Placement
    dims: dict[str, Any]
    state: ModelState


class CheckpointLifecycle:
    """Saves, restores and recovers one run's checkpoints under ``layout.checkpoints``.

    Args:
        layout: the workdir's layout (checkpoints, superseded, dictionaries).
        comm: the collectives.
        config: the train settings (retention, the model settings a run records, warm start).
        dataset: the run's dataset (its table sizes and identity).
        model: the placement, shape and variables of the model the checkpoints hold.
        run: where the run stands: each checkpoint records it, a restore sets it.
        progress: prints a line on rank 0.
    """

    def __init__(
        self,
        layout: WorkdirLayout,
        comm,
        config: TrainConfig,
        dataset: BinaryDataset,
        model: CheckpointedModel,
        run: RunState,
        progress: Callable[[str], None],
    ):
        self.layout, self.root = layout, layout.checkpoints
        self.comm, self.rank = comm, comm.rank
        self.config, self.dataset, self.placement = config, dataset, model.placement
        self.dims, self.state, self.run, self.progress = model.dims, model.state, run, progress
        # The run the checkpoints name (meta "run"): a new id when a run starts (from scratch or
        # from the previous model), the checkpoint's when it resumes. Rank 0's is the one
        # written (it writes the meta and does the retention).
        self.run_id: str | None = None
        self.saved_step: int | None = None
        self._lineage: tuple[str | None] | None = None  # (lineage,) once read

    # -- start ----------------------------------------------------------------------------
    def start(self, plan: StartPlan) -> None:
        """Scratch, resume or warm start, as trainer/warm_start.py planned it."""
        if plan.kind == "resume":
            assert plan.path is not None  # plan_start names the checkpoint it resumes
            path = self.resume(plan.path)
            self.progress(f"trainer: resumed from {path} at step {self.run.step}")
            return
        self.run_id = new_run_id()
        if plan.kind == "scratch":
            self.set_aside_other_runs()
        elif plan.kind == "previous":
            assert plan.path is not None  # plan_start names the previous model
            warm = self.restore_previous(plan.path)
            grown = ", ".join(f"{c} {o}->{n}" for c, (o, n) in warm.grown.items()) or "none"
            self.progress(
                f"trainer: warm start from the previous model {plan.path} (step "
                f"{warm.source_step}), optimizer state {warm.optimizer}; tables "
                f"grown: {grown}"
            )

    # -- save -----------------------------------------------------------------------------
    def save(self) -> Path:
        """Collective: this rank's variables at the run's step, with where the run stands
        beside the model's record; retention keeps the run's protected steps
        (trainer/checkpoint.py's save_checkpoint). Returns the checkpoint's directory."""
        if self.run_id is None:  # a save outside train() (tests, tools): one run all the same
            self.run_id = new_run_id()
        step = self.run.step
        owned = {name: v.numpy() for name, v in self.state.owned_state()}
        replicated = {name: v.numpy() for name, v in self.state.replicated_state()} if self.rank == 0 else {}
        meta = checkpoint_meta(
            self.config,
            self.placement.describe(),
            list(self.dataset.table_sizes),
            self.dims,
            self.dataset.identity,
            self.run_id,
        )
        meta.update(self.run.to_meta())
        if self.rank == 0:  # the one rank that writes the meta (an export may then extend it)
            meta[LINEAGE_KEY] = self._dictionaries_lineage()
        self.saved_step = step
        retention = Retention(self.config.keep_checkpoints, self.run.protected_steps(), self.run.run_start)
        return save_checkpoint(self.root, step, self.comm, owned, replicated, meta, retention)

    def _dictionaries_lineage(self) -> str | None:
        """The stable dictionaries' lineage (trainer/dictionary_lineage.py), read once a run."""
        if self._lineage is None:
            self._lineage = (lineage_of(self.layout.dictionaries, self.dataset.identity),)
        return self._lineage[0]

    def record_days_of_best(self) -> None:
        """The run has ended (its steps done, or stopped early): early stopping's best
        checkpoint, saved mid-run and perhaps before one pass over the run's days, is the run's
        model, and its days count as trained (more passes over them did not help). Rank 0
        rewrites that checkpoint's record; a killed run never gets here."""
        best, plan = self.run.early_stopping.best_step, self.run.day_plan
        if self.rank != 0 or plan is None or best is None:
            return
        path = checkpoint_dir(self.root, best) / CHECKPOINT_META
        if not path.exists():
            return
        meta = json.loads(path.read_text())
        days = plan.to_meta(True)
        if meta.get(TRAIN_DAYS_KEY) != days:
            meta[TRAIN_DAYS_KEY] = days
            write_text_atomic(path, json.dumps(meta, indent=1) + "\n")

    # -- restore --------------------------------------------------------------------------
    def restore(self, which: str, required: bool = False) -> Path | None:
        """The run's ``best`` checkpoint (its model: best_checkpoint, the best validation AUC's
        with early stopping, else the latest) or its ``latest``, and where its run stood;
        returns its path, or None when there is none and none is ``required``.

        A damaged one is moved aside for the newest intact checkpoint of the run, as training
        would resume from it; with none intact, the error names the damage and says to train
        again (deleting a checkpoint or --no-resume, train's fixes, are no fix here)."""
        path = {"best": best_checkpoint, "latest": latest_checkpoint}[which](self.root)
        if path is None:
            if required:
                raise CheckpointError(f"no complete checkpoint under {self.root}")
            return None
        try:
            return self.resume_intact(path)
        except CheckpointError as exc:
            if not hasattr(exc, "damage"):
                raise
            raise CheckpointError(
                f"{exc.damage}, and no older checkpoint of this run is intact: "
                "train again (--stages train,eval --force)"
            ) from None

    def resume(self, newest: Path) -> Path:
        """Continue this dataset's run whose newest checkpoint is ``newest``: refused when the
        run trained another model, else its newest intact checkpoint, as ``resume_intact``."""
        self.check_same_model(newest)
        return self.resume_intact(newest)

    def resume_intact(self, newest: Path) -> Path:
        """Restore the newest checkpoint of this run that every rank can read, and where its
        run stood; returns its path. One with a damaged or missing file (a disk, a copy cut short) is moved aside as
        ``damaged-step-N`` when an older one of the same run is intact, so the damage costs
        the steps since that one, not the run; with none intact, the first damage is the
        error. The ranks agree on each candidate before any collective."""
        candidates = [newest, *self.older_of_this_run(newest)]
        first_error: CheckpointError | None = None
        for k, path in enumerate(candidates):
            try:
                meta, error = self.load(path), None
            except CheckpointError as exc:
                meta, error = None, exc
            failing = int(
                self.comm.allreduce_sum(
                    [tf.constant([0.0 if error is None else 1.0])], name=f"resume_check_{k}"
                )[0].numpy()[0]
            )
            if not failing:
                assert meta is not None  # no rank failed, this one included
                self.broadcast()
                self.run.continue_from(meta)
                self.set_aside_damaged(candidates[:k], first_error)
                return path
            first_error = first_error or error
        raise first_error or CheckpointError(f"{newest} is damaged on another rank (its log says how)")

    def load(self, path: Path) -> dict[str, Any]:
        """This rank's part of a restore: its variables and the checkpoint's run; returns the
        meta. No collective, so a rank that fails here does not leave the others waiting in
        one."""
        reader = CheckpointReader(path)
        try:
            reader.check_compatible(list(self.dataset.table_sizes), self.dims)
            for name, var in self.state.owned_state() + self.state.replicated_state():
                var.assign(reader.value(name, tuple(var.shape)).astype(var.dtype.as_numpy_dtype))
            self.run_id = checkpoint_run(reader.meta)
        finally:
            reader.close()
        return reader.meta

    def broadcast(self) -> None:
        """Rank 0's replicated variables to every rank: the replicas start equal."""
        self.comm.broadcast_variables([v for _, v in self.state.replicated_state()])

    def older_of_this_run(self, newest: Path) -> list[Path]:
        """The current run's complete checkpoints before ``newest`` trained on this dataset,
        newest first."""
        older = []
        for _, path in reversed(run_checkpoints(self.root)):
            if path == newest or path.name > newest.name:
                continue
            try:
                meta = json.loads((path / CHECKPOINT_META).read_text())
            except (OSError, ValueError):
                continue
            if not trained_on(meta, self.dataset.identity):
                break
            older.append(path)
        return older

    def restore_previous(self, path: Path) -> WarmStart:
        """Start a new run from the previous model at ``path`` (trained on another dataset):
        tables grown to this dataset's sizes, the MLPs copied, the optimizer state continued or
        restarted (train.init_optimizer), the run at its step; then the checkpoints it
        supersedes are removed. See trainer/warm_start.py."""
        reader = CheckpointReader(path)
        try:
            meta = reader.meta
            grown = check_warm_start(
                meta, path, list(self.dataset.table_sizes), self.dims, self.config, self.dataset.identity
            )
            source_step = int(meta["step"])
            check_schedule(source_step, self.config)
            continued = self.config.init_optimizer == "continue"
            variables = (
                self.state.owned_state() + self.state.replicated_state()
                if continued
                else self.state.owned + self.state.replicated
            )
            old_sizes = [int(s) for s in meta["table_sizes"]]
            load_grown(reader, variables, old_sizes)
        finally:
            reader.close()
        self.broadcast()
        warm = WarmStart(
            str(path),
            source_step,
            self.config.init_optimizer,
            old_sizes,
            grown,
            capped=capped(meta.get(IDENTITY_KEY)),
        )
        self.run.start_from(warm, meta)
        self.comm.barrier()  # every rank has read the checkpoints before any is removed
        if self.rank == 0:
            remove_superseded(self.root, source_step, self.progress)
        self.comm.barrier()
        return warm

    # -- set aside ------------------------------------------------------------------------
    def set_aside_damaged(self, damaged: list[Path], error: CheckpointError | None) -> None:
        """Rank 0 renames each damaged checkpoint ``damaged-step-N`` (kept for a look, never
        read again), once every rank has stopped reading them."""
        if not damaged:
            return
        self.progress(
            f"trainer: {', '.join(str(p) for p in damaged)} damaged "
            f"({error or 'on another rank'}): moved aside as damaged-*, resuming from "
            "the newest intact checkpoint"
        )
        self.comm.barrier()
        if self.rank == 0:
            for path in damaged:
                path.rename(path.with_name(f"damaged-{path.name}"))
        self.comm.barrier()

    def check_same_model(self, path: Path) -> None:
        """Refuse to resume checkpoints whose run trained another model (its settings of the
        model differ: TRAIN_SETTING_KINDS): continuing them would mix two configurations.
        The pipeline's train stage sets such checkpoints aside before it starts the ranks."""
        try:
            meta = json.loads((path / CHECKPOINT_META).read_text())
        except (OSError, ValueError):
            return  # the resume reports the damage, and falls back to an intact checkpoint
        recorded = recorded_settings(meta) if isinstance(meta, dict) else None
        if recorded is None:
            return  # saved before checkpoints recorded their settings
        changed = changed_settings(recorded, train_model_settings(self.config))
        if changed:
            raise CheckpointError(
                f"the checkpoints in {self.root} are another model's run "
                f"({'; '.join(changed)}): resuming would mix the two. Restore those settings "
                f"to resume it, or rerun with --no-resume to start anew (its checkpoints are "
                f"moved to {self.layout.superseded}/, not deleted)"
            )

    def set_aside_other_runs(self) -> None:
        """A run from scratch continues none of the checkpoints there: rank 0 moves them to
        ``superseded/`` (never deletes them), after every rank has planned its start."""
        found = complete_checkpoints(self.root)
        if not found:
            return
        self.comm.barrier()
        if self.rank == 0:
            record = set_aside(
                self.root,
                [p for _, p in found],
                "a new run from scratch (--no-resume, or train.resume: false)",
            )
            if record:
                self.progress(
                    f"trainer: {len(record['checkpoints'])} checkpoints of earlier "
                    f"runs moved to {record['path']} (remove them with: "
                    f"{record['remove_with']})"
                )
        self.comm.barrier()
