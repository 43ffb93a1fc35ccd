"""Training, evaluation and the inference benchmark, the same code for one process and N ranks.

Gradient bookkeeping (global batch B over N ranks, local loss L_r = mean over rank r's B/N
samples, global loss L = mean_r L_r): each rank differentiates L_r / N. Replicated variables
(MLPs) get their gradients summed by one grouped allreduce -> dL/dθ. Owned variables (tables,
a model-parallel bottom MLP) receive through the alltoall's gradient the sum over ranks of
d(L_r / N)/dθ = dL/dθ as well. So every update equals the single-process update on the whole
global batch, up to float rounding.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import summary_pb2

from dlrm_contracts.atomic import write_text_atomic
from dlrm_contracts.config import (ConfigError, PreflightConfig, TrainConfig, changed_settings,
                                   config_to_dict, train_model_settings)
from dlrm_contracts.dataset_identity import IDENTITY_KEY, capped
from dlrm_contracts.layout import (CHECKPOINT_META, WorkdirLayout, checkpoint_dir, checkpoint_run,
                                   run_checkpoints)
from dlrm_contracts.superseded import set_aside
from trainer.checkpoint import (CheckpointError, CheckpointReader, best_checkpoint,
                                checkpoint_meta, complete_checkpoints, latest_checkpoint,
                                new_run_id, recorded_settings, save_checkpoint)
from trainer.comm import make_comm
from trainer.data import (Batch, BinaryDataset, RankView, SplitReader, batch_starts, open_dataset,
                          prefetch)
from trainer.dictionary_lineage import LINEAGE_KEY, lineage_of
from trainer.early_stopping import EarlyStopping
from trainer.metrics import MetricsLog, log_loss, roc_auc
from trainer.model import DLRM, model_dims
from trainer.optim import learning_rate, make_optimizer
from trainer.row_l2 import row_penalties
from trainer.placement import plan_placement
from trainer.progress import NoProgress, make_progress
from trainer.train_days import TRAIN_DAYS_KEY, DayPlan, days_before, plan_days, trained_days
from trainer.warm_start import (RUN_START_KEY, WARM_START_KEY, StartPlan, WarmStart,
                                check_schedule, check_warm_start, load_grown, plan_start,
                                remove_superseded)

MODES = ("train", "eval", "inference_benchmark")
# TensorBoard's scalar plugin tag, written with TensorFlow's own summary op so that the
# tensorboard package is not needed to produce the event files (only to view them).
SCALAR_METADATA = summary_pb2.SummaryMetadata(
    plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars"))


def cpu_supports_bfloat16() -> bool:
    """True when the CPU has bfloat16 dot instructions and oneDNN may use them.

    ``ONEDNN_MAX_CPU_ISA`` below AVX-512 (e.g. ``AVX2``, set to reproduce another CPU's
    kernels) leaves TensorFlow's bfloat16 matmul without a kernel: it ends the process with a
    segmentation fault instead of an error, so such a cap means float32.
    """
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    cap = os.environ.get("ONEDNN_MAX_CPU_ISA", "").strip().upper()
    if cap and cap not in ("ALL", "DEFAULT") and not cap.startswith(("AVX512", "AVX10")):
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def compute_dtype(config: TrainConfig) -> tf.DType:
    """float32, or with --amp: float16 on a GPU (loss scaled), bfloat16 on a CPU that has it."""
    if not config.amp:
        return tf.float32
    if tf.config.list_physical_devices("GPU"):
        return tf.float16
    if cpu_supports_bfloat16():
        if config.xla:
            print("trainer: note: --amp with --xla on a CPU: XLA's CPU dots do not use the "
                  "bfloat16 instructions that TensorFlow's own (oneDNN) matmuls use, so this "
                  "runs at about float32 speed; drop --xla to train at bfloat16 speed",
                  file=sys.stderr)
        return tf.bfloat16
    print("trainer: --amp asked but this CPU has no bfloat16 support; training in float32",
          file=sys.stderr)
    return tf.float32


def set_threads(config: TrainConfig, local_size: int) -> None:
    threads = config.intra_op_threads or max(1, (os.cpu_count() or 1) // max(1, local_size))
    try:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        inter_op = config.inter_op_threads or max(2, threads)
        tf.config.threading.set_inter_op_parallelism_threads(inter_op)
    except RuntimeError:  # the runtime already started (several trainers in one process)
        pass


def checked_batch_sizes(config: TrainConfig, world: int) -> tuple[int, int]:
    """The global train and eval batch sizes, refused unless each splits evenly over the ranks
    (their ranges are TrainConfig's own checks).

    Returns:
        (train batch, eval batch); the eval batch defaults to the train batch.
    """
    if config.batch_size % world:
        raise ConfigError(f"batch size {config.batch_size} must divide by {world} ranks")
    eval_batch = config.eval_batch_size or config.batch_size
    if eval_batch % world:
        raise ConfigError(f"eval batch size {eval_batch} must divide by {world} ranks")
    return config.batch_size, eval_batch


class ThroughputClock:
    """Samples per second of training: over the window since the last report, and over the run.

    The run's rate starts after the first step, which traces the step functions (and with --xla
    compiles them): that one-off cost would otherwise understate the steady rate.
    """

    def __init__(self, batch_size: int):
        self.batch_size = batch_size
        self.steps = 0
        self.run_start = self.window_start = time.perf_counter()
        self.window_steps = 0

    def step_done(self, loss: tf.Tensor) -> None:
        self.steps += 1
        self.window_steps += 1
        if self.steps == 1:
            loss.numpy()  # the clock starts once the first step has surely finished
            self.run_start = time.perf_counter()

    def window_rate(self) -> float:
        elapsed = time.perf_counter() - self.window_start
        return self.window_steps * self.batch_size / max(elapsed, 1e-9)

    def restart_window(self) -> None:
        self.window_start, self.window_steps = time.perf_counter(), 0

    def run_rate(self) -> float | None:
        """None when fewer than two steps ran: no step was timed."""
        if self.steps < 2:
            return None
        elapsed = time.perf_counter() - self.run_start
        return round((self.steps - 1) * self.batch_size / max(elapsed, 1e-9), 1)


@dataclass
class EvalResult:
    split: str
    rows: int
    auc: float | None
    logloss: float | None


class Trainer:
    """One rank's share of a DLRM run: data view, variables, step functions, loops."""

    def __init__(self, config: TrainConfig, dataset_path: str | Path, workdir: str | Path,
                 comm=None):
        self.config = config
        self.comm = comm or make_comm()
        self.rank, self.world = self.comm.rank, self.comm.size
        set_threads(config, self.comm.local_size)
        self.layout = WorkdirLayout.at(workdir)
        self.dataset = open_dataset(dataset_path, threshold=config.frequency_threshold,
                                    counts_dir=config.counts_dir
                                    or (self.layout.counts if config.frequency_threshold else None),
                                    verify=config.verify_dataset)
        self.dims = model_dims(config)
        self.global_batch, self.eval_batch = checked_batch_sizes(config, self.world)
        self._build_model()
        self._build_step_functions()
        self.metrics = MetricsLog(self.layout.logs / "metrics.jsonl" if self.rank == 0 else None)
        self._summary = None
        self.reporter = NoProgress()  # run() gives rank 0 one (trainer/progress.py)

    def _build_model(self) -> None:
        """Placement, this rank's variables and data view, the optimizer; replicas start equal."""
        config = self.config
        self.placement = plan_placement(
            self.dataset.table_sizes, self.dims.embedding_dim, self.world,
            bottom_data_parallel=config.bottom_mlp_data_parallel,
            split_threshold_bytes=config.column_split_threshold_mb * 2**20,
            force_split=tuple(config.force_column_split))
        self.compute_dtype = compute_dtype(config)
        self.model = DLRM(self.dims, self.placement, self.rank, self.global_batch, config.seed,
                          self.comm, self.compute_dtype, xla=config.xla)
        numerical = ("local" if self.placement.bottom_owner is None
                     else "global" if self.placement.bottom_owner == self.rank else "none")
        self.view = RankView(self.world, self.rank, self.model.tables_read, numerical)
        self.replicated = self.model.replicated_variables()
        self.owned = self.model.owned_variables()
        self.optimizer = make_optimizer(
            self.replicated + self.owned, config,
            row_penalties(config, self.model, self.dataset, self.global_batch),
            {name: config.wide_learning_rate_factor for name in self.model.wide_names()})
        self.loss_scale = tf.Variable(2.0**15 if self.compute_dtype == tf.float16 else 1.0,
                                      trainable=False, name="loss_scale")
        self.step = 0
        # The run's first step: 0 from scratch, the previous model's step after a warm start.
        # Epochs, evaluations and max_steps count from it; the checkpoints' numbers go on.
        self.run_start = 0
        self.warm_start: WarmStart | None = None
        # The train days the starting model had seen (checkpoint meta "train_days"): () from
        # scratch, None when not recorded; the rows of this run follow (train.days).
        self.days_seen_before: tuple[int, ...] | None = ()
        self.day_plan: DayPlan | None = None
        self._covering_steps = 0  # steps after which the run's days count as trained
        self.early_stopping = EarlyStopping(config.early_stopping_patience,
                                            config.early_stopping_min_delta)
        self._saved_step: int | None = None
        # The run the checkpoints name (meta "run"): a new id when a run starts (from scratch or
        # from the previous model), the checkpoint's when it resumes. Rank 0's is the one
        # written (it writes the meta and does the retention).
        self.run_id: str | None = None
        self._lineage: tuple[str | None] | None = None   # (lineage,) once read
        self.comm.broadcast_variables([v for _, v in self.replicated])

    def _build_step_functions(self) -> None:
        # --xla compiles the dense part only: it holds no Horovod op (see _dense_gradients).
        self._dense_step = (tf.function(self._dense_gradients, jit_compile=True)
                            if self.config.xla else self._dense_gradients)
        self._train_step = tf.function(self._train_step_impl)
        self._predict_step = tf.function(self._predict_step_impl)

    # -- step functions --------------------------------------------------------------------
    def _dense_gradients(self, numerical, features, wide, label):
        """Loss, replicated-variable gradients and the gradients w.r.t. the exchanged features
        and wide sum.

        The whole dense forward and backward pass, so that --xla compiles both into one
        cluster; it contains no Horovod op.
        """
        variables = [v for _, v in self.replicated]
        with tf.GradientTape() as tape:
            tape.watch([features, wide])
            logits = self.model.dense_part(numerical, features, wide)
            loss = tf.reduce_mean(
                tf.nn.sigmoid_cross_entropy_with_logits(labels=label, logits=logits))
            scaled = loss * (self.loss_scale / self.world)
        grads = tape.gradient(scaled, variables + [features, wide])
        return loss, grads[:-2], grads[-2:]

    def _train_step_impl(self, categorical, numerical, label, lr):
        local_batch = self.global_batch // self.world
        with tf.GradientTape() as tape:  # lookups, model-parallel bottom MLP, alltoall
            local_numerical, features, wide = self.model.features(categorical, numerical,
                                                                  local_batch)
        loss, dense_grads, feature_grads = self._dense_step(local_numerical, features, wide, label)
        # The alltoall's gradient brings every rank's share back to the owners.
        owned = list(tape.gradient([features, wide], [v for _, v in self.owned],
                                   output_gradients=feature_grads))
        n_rep = len(dense_grads)
        extra = [loss / self.world]  # summed with the gradients: the global-batch mean loss
        if self.compute_dtype == tf.float16:  # every rank must agree on skipping a step
            finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(
                g.values if isinstance(g, tf.IndexedSlices) else g)) for g in owned] or [True])
            extra.append(1.0 - tf.cast(finite, tf.float32))
        summed = self.comm.allreduce_sum(list(dense_grads) + extra, name="dlrm_gradients")
        replicated, global_loss = list(summed[:n_rep]), summed[n_rep]
        if self.compute_dtype != tf.float16:
            self.optimizer.apply(replicated + owned, lr)
            return global_loss
        # float16 (GPU): unscale; skip the step and halve the scale when any rank overflowed.
        grads = [g / self.loss_scale for g in replicated] + [
            tf.IndexedSlices(g.values / self.loss_scale, g.indices, g.dense_shape)
            if isinstance(g, tf.IndexedSlices) else g / self.loss_scale for g in owned]
        ok = tf.logical_and(tf.equal(summed[n_rep + 1], 0.0), tf.reduce_all(
            [tf.reduce_all(tf.math.is_finite(g)) for g in replicated]))

        def apply():
            self.optimizer.apply(grads, lr)
            return tf.constant(True)

        tf.cond(ok, apply, lambda: tf.constant(False))
        self.loss_scale.assign(tf.where(ok, self.loss_scale, self.loss_scale / 2.0))
        return global_loss

    def _predict_step_impl(self, categorical, numerical, label):
        local_batch = self.eval_batch // self.world
        probabilities = tf.sigmoid(self.model(categorical, numerical, local_batch))
        return (self.comm.allgather(probabilities, name="dlrm_eval_probabilities"),
                self.comm.allgather(label, name="dlrm_eval_labels"))

    @staticmethod
    def _tensors(batch: Batch):
        return ([tf.convert_to_tensor(c) for c in batch.categorical],
                tf.convert_to_tensor(batch.numerical), tf.convert_to_tensor(batch.label))

    def train_on_batch(self, batch: Batch, lr: float) -> tf.Tensor:
        """One optimizer step; returns the global-batch mean loss (before the update)."""
        categorical, numerical, label = self._tensors(batch)
        return self._train_step(categorical, numerical, label, tf.constant(lr, tf.float32))

    # -- checkpoints -----------------------------------------------------------------------
    def _owned_state(self) -> list[tuple[str, tf.Variable]]:
        out = list(self.owned)
        for name, _ in self.owned:
            out += self.optimizer.state_for(name)
        return out

    def _replicated_state(self) -> list[tuple[str, tf.Variable]]:
        out = list(self.replicated)
        for name, _ in self.replicated:
            out += self.optimizer.state_for(name)
        return out + self.optimizer.state() + [("loss_scale", self.loss_scale)]

    def _dims_meta(self) -> dict[str, Any]:
        """The model's shape as checkpoints record it: the dims, and with multi-hot rows the
        dataset's record of their materialization (sizes, seed, distribution): a checkpoint
        trained on other rows is not restored for these (its embeddings were pooled over
        other ids), and the export rebuilds the same rows from raw values."""
        return {**self.dims.meta(), **self.dataset.multi_hot_record}

    def save(self) -> Path:
        if self.run_id is None:  # a save outside train() (tests, tools): one run all the same
            self.run_id = new_run_id()
        owned = {name: v.numpy() for name, v in self._owned_state()}
        replicated = ({name: v.numpy() for name, v in self._replicated_state()}
                      if self.rank == 0 else {})
        meta = checkpoint_meta(self.config, self.placement.describe(),
                               list(self.dataset.table_sizes), self._dims_meta(),
                               self.dataset.identity, self.run_id)
        if self.early_stopping.enabled:
            meta["early_stopping"] = self.early_stopping.to_meta()
        meta[RUN_START_KEY] = self.run_start
        if self.day_plan is not None:
            covered = self.step - self.run_start >= self._covering_steps
            meta[TRAIN_DAYS_KEY] = self.day_plan.to_meta(covered)
        if self.rank == 0:  # the one rank that writes the meta (an export may then extend it)
            meta[LINEAGE_KEY] = self._dictionaries_lineage()
        # The previous model outlives keep_checkpoints while this run is not over: a rerun of
        # this dataset (another setting, --force) starts from it again.
        protect = [self.early_stopping.best_step]
        if self.warm_start is not None:
            meta[WARM_START_KEY] = self.warm_start.to_meta()
            protect.append(self.warm_start.source_step)
        self._saved_step = self.step
        return save_checkpoint(self.layout.checkpoints, self.step, self.comm, owned, replicated,
                               meta, self.config.keep_checkpoints, protect=protect,
                               run_start=self.run_start)

    def _dictionaries_lineage(self) -> str | None:
        """The stable dictionaries' lineage (trainer/dictionary_lineage.py), read once a run."""
        if self._lineage is None:
            self._lineage = (lineage_of(self.layout.dictionaries, self.dataset.identity),)
        return self._lineage[0]

    def restore(self, path: Path) -> dict[str, Any]:
        """Load a checkpoint's variables and step; returns its meta."""
        meta = self._load(path)
        self.comm.broadcast_variables([v for _, v in self._replicated_state()])
        return meta

    def _load(self, path: Path) -> dict[str, Any]:
        """This rank's part of ``restore``: no collective, so a rank that fails here does not
        leave the others waiting in one."""
        reader = CheckpointReader(path)
        try:
            reader.check_compatible(list(self.dataset.table_sizes), self._dims_meta())
            for name, var in self._owned_state() + self._replicated_state():
                var.assign(reader.value(name, tuple(var.shape)).astype(var.dtype.as_numpy_dtype))
            self.step = int(reader.meta["step"])
            self.run_id = checkpoint_run(reader.meta)
            self.run_start = int(reader.meta.get(RUN_START_KEY, 0))
            self.warm_start = WarmStart.from_meta(reader.meta.get(WARM_START_KEY))
            self.days_seen_before = days_before(reader.meta) \
                if TRAIN_DAYS_KEY in reader.meta else None
        finally:
            reader.close()
        return reader.meta

    def _resume_intact(self, newest: Path) -> Path:
        """Resume from the newest checkpoint of this run that every rank can read. One with a
        damaged or missing file (a disk, a copy cut short) is moved aside as
        ``damaged-step-N`` when an older one of the same run is intact, so the damage costs
        the steps since that one, not the run; with none intact, the first damage is the
        error. The ranks agree on each candidate before any collective."""
        candidates = [newest, *self._older_of_this_run(newest)]
        first_error: CheckpointError | None = None
        for k, path in enumerate(candidates):
            try:
                meta, error = self._load(path), None
            except CheckpointError as exc:
                meta, error = None, exc
            failing = int(self.comm.allreduce_sum(
                [tf.constant([0.0 if error is None else 1.0])], name=f"resume_check_{k}")[0].numpy()[0])
            if not failing:
                self.comm.broadcast_variables([v for _, v in self._replicated_state()])
                self.early_stopping = EarlyStopping.from_meta(
                    self.config.early_stopping_patience, meta.get("early_stopping"),
                    self.config.early_stopping_min_delta)
                self._set_aside(candidates[:k], first_error)
                return path
            first_error = first_error or error
        raise first_error or CheckpointError(f"{newest} is damaged on another rank (its log says how)")

    def _older_of_this_run(self, newest: Path) -> list[Path]:
        """The current run's complete checkpoints before ``newest`` trained on this dataset,
        newest first."""
        from dlrm_contracts.dataset_identity import trained_on

        older = []
        for _, path in reversed(run_checkpoints(self.layout.checkpoints)):
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

    def _set_aside(self, damaged: list[Path], error: CheckpointError | None) -> None:
        if not damaged:
            return
        self._progress(f"trainer: {', '.join(str(p) for p in damaged)} damaged "
                       f"({error or 'on another rank'}): moved aside as damaged-*, resuming from "
                       "the newest intact checkpoint")
        self.comm.barrier()
        if self.rank == 0:
            for path in damaged:
                path.rename(path.with_name(f"damaged-{path.name}"))
        self.comm.barrier()

    def restore_previous(self, path: Path) -> WarmStart:
        """Start a new run from the previous model at ``path`` (trained on another dataset):
        tables grown to this dataset's sizes, the MLPs copied, the optimizer state and the
        step continued or restarted (train.init_optimizer). See trainer/warm_start.py."""
        reader = CheckpointReader(path)
        try:
            meta = reader.meta
            grown = check_warm_start(meta, path, list(self.dataset.table_sizes),
                                     self._dims_meta(), self.config, self.dataset.identity)
            source_step = int(meta["step"])
            check_schedule(source_step, self.config)
            continued = self.config.init_optimizer == "continue"
            variables = (self._owned_state() + self._replicated_state() if continued
                         else list(self.owned) + list(self.replicated))
            old_sizes = [int(s) for s in meta["table_sizes"]]
            load_grown(reader, variables, old_sizes)
        finally:
            reader.close()
        self.comm.broadcast_variables([v for _, v in self._replicated_state()])
        self.step = self.run_start = source_step
        self.days_seen_before = trained_days(meta)
        self.early_stopping = EarlyStopping(self.config.early_stopping_patience,
                                            self.config.early_stopping_min_delta)
        self.warm_start = WarmStart(str(path), source_step, self.config.init_optimizer,
                                    old_sizes, grown, capped=capped(meta.get(IDENTITY_KEY)))
        self.comm.barrier()  # every rank has read the checkpoints before any is removed
        if self.rank == 0:
            remove_superseded(self.layout.checkpoints, source_step, self._progress)
        self.comm.barrier()
        return self.warm_start

    def restore_latest(self, required: bool = False) -> Path | None:
        """The newest checkpoint (where training resumes), with its early-stopping state."""
        path = latest_checkpoint(self.layout.checkpoints)
        if path is None:
            if required:
                raise CheckpointError(f"no complete checkpoint under {self.layout.checkpoints}")
            return None
        meta = self.restore(path)
        self.early_stopping = EarlyStopping.from_meta(self.config.early_stopping_patience,
                                                      meta.get("early_stopping"),
                                                      self.config.early_stopping_min_delta)
        return path

    def restore_best(self, required: bool = False) -> Path | None:
        """The run's model (``best_checkpoint``: the best validation AUC's, else the latest).

        A damaged one is moved aside for the newest intact checkpoint of the run, as training
        would resume from it; with none intact, the error names the damage and says to train
        again (deleting a checkpoint or --no-resume, train's fixes, are no fix here)."""
        path = best_checkpoint(self.layout.checkpoints)
        if path is None:
            if required:
                raise CheckpointError(f"no complete checkpoint under {self.layout.checkpoints}")
            return None
        try:
            return self._resume_intact(path)
        except CheckpointError as exc:
            if not hasattr(exc, "damage"):
                raise
            raise CheckpointError(f"{exc.damage}, and no older checkpoint of this run is intact: "
                                  "train again (--stages train,eval --force)") from None

    # -- logging ---------------------------------------------------------------------------
    def _log(self, record: dict[str, Any]) -> None:
        if self.rank != 0:
            return
        self.metrics.write(record)
        if self._summary is None:
            self._summary = tf.summary.create_file_writer(str(self.layout.logs / "tensorboard"))
        with self._summary.as_default():
            for key, value in record.items():
                if key not in ("step", "epoch", "event", "split") and isinstance(value, (int, float)):
                    prefix = record.get("split", "train")
                    tf.summary.write(f"{prefix}/{key}", tf.constant(float(value), tf.float32),
                                     step=record.get("step", self.step), metadata=SCALAR_METADATA)
        self._summary.flush()

    def _progress(self, text: str) -> None:
        if self.rank == 0:
            print(text, file=sys.stderr, flush=True)

    # -- loops -----------------------------------------------------------------------------
    def _train_plan(self, total: int, steps_per_epoch: int) -> list[tuple[int, int]]:
        """(global step, first row of this run's rows) of every batch left; epochs count from
        the run's start. The order is reproducible (seed, epoch) over the rows the run trains."""
        plan, starts, epoch = [], None, None
        for step in range(self.step, total):
            local = step - self.run_start
            if local // steps_per_epoch != epoch:
                epoch = local // steps_per_epoch
                starts = batch_starts(self.train_rows, self.global_batch, epoch=epoch,
                                      seed=self.config.seed, shuffle=self.config.shuffle_batches)
            plan.append((step, int(starts[local % steps_per_epoch])))
        return plan

    @property
    def train_rows(self) -> int:
        """The rows this run trains on: the whole train split, or its new days (train.days)."""
        return self.dataset.rows["train"] if self.day_plan is None else self.day_plan.rows

    def plan_train_days(self) -> DayPlan:
        """The train rows of the run that starts from the model now loaded (train.days)."""
        self.day_plan = plan_days(self.config.days, self.dataset.train_days,
                                  self.dataset.rows["train"], self.days_seen_before)
        if self.day_plan.note:
            self._progress(f"trainer: {self.day_plan.note}")
        return self.day_plan

    def total_steps(self) -> tuple[int, int]:
        """(steps this run trains, steps per epoch): epochs or max_steps from the run's start;
        (0, 1) when train.days: new finds no day the model has not seen."""
        if self.day_plan is not None and self.day_plan.rows == 0:
            return 0, 1
        steps_per_epoch = self.train_rows // self.global_batch
        if steps_per_epoch == 0:
            which = "the train split" if self.train_rows == self.dataset.rows["train"] else \
                "the new train days (train.days: new)"
            raise ConfigError(f"{which} have {self.train_rows} rows, fewer than one global "
                              f"batch of {self.global_batch}")
        total = steps_per_epoch * self.config.epochs
        if self.config.max_steps is not None:
            total = min(total, self.config.max_steps)
        return total, steps_per_epoch

    def train(self, final_eval: bool = True) -> dict[str, Any]:
        """Train this run's planned steps: from scratch, from where an interrupted run of this
        dataset stopped (resume), or from the previous model (train.init: previous).

        Args:
            final_eval: evaluate the test and validation splits at the end (the summary's AUCs).
        Returns:
            The summary record: step, losses, samples/s, the last checkpoint, the AUCs, how the
            run started (``init``) and, after a warm start, the previous model's test AUC.
        """
        start = self._start()
        self.plan_train_days()
        planned, steps_per_epoch = self.total_steps()
        self._covering_steps = min(planned, steps_per_epoch)
        total = self.run_start + planned
        if self.early_stopping.stopped:
            self._progress(f"trainer: stopped early before (best validation AUC "
                           f"{self.early_stopping.best_auc} at step "
                           f"{self.early_stopping.best_step}): nothing to train")
            total = self.step
        eval_every = max(1, steps_per_epoch // max(1, self.config.evals_per_epoch))
        warm = start.kind == "previous" and self.config.evaluate_previous
        self.reporter.start_training(self.step - self.run_start, total - self.run_start,
                                     eval_every, final_eval,
                                     self.dataset.rows.get("test", 0) if warm else 0)
        if warm:
            self.warm_start.previous_test_auc = self._evaluate_previous()
        batches = self._train_batches(total, steps_per_epoch)
        clock = ThroughputClock(self.global_batch)
        last_loss, evals = None, []
        for batch in batches:
            lr = learning_rate(self._schedule_step(batch.step), self.config)
            loss = self.train_on_batch(batch, lr)
            self.step = batch.step + 1
            done = self.step - self.run_start  # steps of this run
            clock.step_done(loss)
            self.reporter.step(done)
            if done % max(1, self.config.log_every) == 0 or self.step == total:
                last_loss = self._report_step(loss, lr, (done - 1) // steps_per_epoch, total,
                                              clock)
            if self._validates_at(done, total - self.run_start, eval_every):
                evals.append(self.evaluate("validation"))
                if self._stop_early(evals[-1]):
                    batches.close()  # the read-ahead threads stop too
                    break
            if self.config.checkpoint_every and done % self.config.checkpoint_every == 0 \
                    and self._saved_step != self.step:
                self.save()
        if planned == 0 and start.kind == "previous":
            # The previous model, its tables grown to this dataset's, saved for it so that eval
            # and export read this dataset's model (the same step: no step was trained).
            self.save()
        summary = self._finish_training(clock, last_loss, evals, final_eval)
        summary["init"] = self._init_record(start)
        # the run has ended: its days count as trained (as its model's checkpoint records)
        summary["train_days"] = {"mode": self.config.days, "rows": self.train_rows,
                                 **self.day_plan.to_meta(True)}
        if self.warm_start is not None:
            summary["previous_model_test_auc"] = self.warm_start.previous_test_auc
        return summary

    def _validates_at(self, step: int, total: int, eval_every: int) -> bool:
        """Every ``eval_every`` steps. Without early stopping the end has its own evaluation;
        with it, the last step's model is one of the candidates too."""
        if self.early_stopping.enabled:
            return step % eval_every == 0 or step == total
        return step % eval_every == 0 and step < total

    def _stop_early(self, result: EvalResult) -> bool:
        """Early stopping's record of a validation AUC: a checkpoint when it is the best so far;
        True when the run should stop. Every rank decides from rank 0's AUC (the only one
        computed), so all of them stop at the same step."""
        if not self.early_stopping.enabled:
            return False
        auc = math.nan if result.auc is None else result.auc
        shared = self.comm.allreduce_sum([tf.constant(auc if self.rank == 0 else 0.0, tf.float64)],
                                         name="dlrm_early_stopping")[0]
        if self.early_stopping.update(self.step, float(shared)):
            self.save()
        elif self.early_stopping.stopped:
            self._progress(f"trainer: validation AUC has not improved for "
                           f"{self.early_stopping.patience} evaluations: stopping at step "
                           f"{self.step}, best {self.early_stopping.best_auc} at step "
                           f"{self.early_stopping.best_step}")
        return self.early_stopping.stopped

    def _start(self) -> StartPlan:
        """Scratch, resume or warm start (trainer/warm_start.py decides from the checkpoints)."""
        plan = plan_start(self.layout.checkpoints, self.dataset.identity, self.config)
        if plan.note:
            self._progress(f"trainer: {plan.note}")
        if plan.kind == "resume":
            self._check_same_model(plan.path)
        else:
            self.run_id = new_run_id()
        if plan.kind == "scratch":
            self._set_aside_other_runs()
        if plan.kind == "resume":
            path = self._resume_intact(plan.path)
            self._progress(f"trainer: resumed from {path} at step {self.step}")
        elif plan.kind == "previous":
            warm = self.restore_previous(plan.path)
            grown = ", ".join(f"{c} {o}->{n}" for c, (o, n) in warm.grown.items()) or "none"
            self._progress(f"trainer: warm start from the previous model {plan.path} (step "
                           f"{warm.source_step}), optimizer state {warm.optimizer}; tables grown: "
                           f"{grown}")
        return plan

    def _check_same_model(self, path: Path) -> None:
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
                f"the checkpoints in {self.layout.checkpoints} are another model's run "
                f"({'; '.join(changed)}): resuming would mix the two. Restore those settings "
                f"to resume it, or rerun with --no-resume to start anew (its checkpoints are "
                f"moved to {self.layout.superseded}/, not deleted)")

    def _set_aside_other_runs(self) -> None:
        """A run from scratch continues none of the checkpoints there: rank 0 moves them to
        ``superseded/`` (never deletes them), after every rank has planned its start."""
        found = complete_checkpoints(self.layout.checkpoints)
        if not found:
            return
        self.comm.barrier()
        if self.rank == 0:
            record = set_aside(self.layout.checkpoints, [p for _, p in found],
                               "a new run from scratch (--no-resume, or train.resume: false)")
            if record:
                self._progress(f"trainer: {len(record['checkpoints'])} checkpoints of earlier "
                               f"runs moved to {record['path']} (remove them with: "
                               f"{record['remove_with']})")
        self.comm.barrier()

    def _schedule_step(self, step: int) -> int:
        """The step the learning-rate schedule is at: counted over every run when a warm
        start continues the optimizer, from this run's start when it restarts it."""
        restarted = self.warm_start is not None and self.warm_start.optimizer == "restart"
        return step - self.run_start if restarted else step

    def _evaluate_previous(self) -> float | None:
        """The previous model (just loaded, before any step) on this run's test split, as it
        is served: a value it had no row for reads as id 0, not as a fresh row."""
        if self.dataset.rows.get("test", 0) == 0:
            return None
        as_served = dataclasses.replace(self.dataset, table_sizes=self.warm_start.served_sizes(
            self.dataset.table_sizes))
        return self.evaluate("test", dataset=as_served, model="previous").auc

    def _init_record(self, start: StartPlan) -> dict[str, Any]:
        """How the run started, for the summary (a resumed warm start says both)."""
        record: dict[str, Any] = {"mode": start.kind, "run_start_step": self.run_start}
        if self.warm_start is not None:
            record.update(self.warm_start.to_meta())
            record.pop("previous_model_test_auc")  # a summary field of its own
        return record

    def _train_batches(self, total: int, steps_per_epoch: int) -> Iterable[Batch]:
        """This rank's batches from the current step to ``total``, read ahead by a thread."""
        reader = SplitReader(self.dataset, "train", self.day_plan.ranges
                             if self.day_plan is not None else None)
        plan = self._train_plan(total, steps_per_epoch)
        return prefetch(reader, self.view, plan, self.global_batch, self.config.prefetch_batches)

    def _report_step(self, loss: tf.Tensor, lr: float, epoch: int, total: int,
                     clock: ThroughputClock) -> float:
        """Log the loss, learning rate and samples/s since the last report; returns the loss."""
        value = float(loss.numpy())
        rate = clock.window_rate()
        self._log({"step": self.step, "epoch": epoch, "loss": value, "lr": lr,
                   "samples_per_s": round(rate, 1)})
        self.reporter.loss(value)
        eta = (total - self.step) * self.global_batch / max(rate, 1e-9)
        self._progress(f"step {self.step}/{total} epoch {epoch} loss {value:.5f} lr {lr:.4g} "
                       f"{rate:,.0f} samples/s eta {eta:,.0f}s")
        clock.restart_window()
        return value

    def _finish_training(self, clock: ThroughputClock, last_loss: float | None,
                         evals: list[EvalResult], final_eval: bool) -> dict[str, Any]:
        """Last checkpoint, final evaluations and the summary of the run."""
        samples_per_s = clock.run_rate()  # before the final save and evaluations
        last_step = self.step
        if clock.steps and self._saved_step != self.step:
            self.save()
        self._record_days_of_best()
        # The run's model: the best validation AUC's checkpoint with early stopping.
        stopping = self.early_stopping
        if stopping.best_step is not None and stopping.best_step != self.step:
            self._progress(f"trainer: restoring the best model (validation AUC "
                           f"{stopping.best_auc} at step {stopping.best_step})")
            self.restore_best()
        checkpoint = best_checkpoint(self.layout.checkpoints)
        finals = [self.evaluate("test"), self.evaluate("validation")] if final_eval else []
        extra = {"train_loss": last_loss, "steps_run": clock.steps,
                 "train_samples_per_s": samples_per_s,
                 "checkpoint": str(checkpoint) if checkpoint else None,
                 "periodic_validation_auc": [e.auc for e in evals]}
        if stopping.enabled:
            extra.update(last_step=last_step, stopped_early=stopping.stopped,
                         best_validation_auc=stopping.best_auc)
        return self._summary_record("train", finals, extra)

    def _record_days_of_best(self) -> None:
        """The run has ended (its steps done, or stopped early): early stopping's best
        checkpoint, saved mid-run and perhaps before one pass over the run's days, is the run's
        model, and its days count as trained (more passes over them did not help). Rank 0
        rewrites that checkpoint's record; a killed run never gets here."""
        best = self.early_stopping.best_step
        if self.rank != 0 or self.day_plan is None or best is None:
            return
        path = checkpoint_dir(self.layout.checkpoints, best) / CHECKPOINT_META
        if not path.exists():
            return
        meta = json.loads(path.read_text())
        done = self.day_plan.to_meta(True)
        if meta.get(TRAIN_DAYS_KEY) != done:
            meta[TRAIN_DAYS_KEY] = done
            write_text_atomic(path, json.dumps(meta, indent=1) + "\n")

    def predictions(self, split: str, dataset: BinaryDataset | None = None
                    ) -> tuple[np.ndarray, np.ndarray]:
        """(labels, probabilities) of a whole split in row order (on every rank); ``dataset``
        reads it at other table sizes (ids past them as 0)."""
        reader = SplitReader(dataset or self.dataset, split)
        starts = batch_starts(reader.rows, self.eval_batch, drop_remainder=False)
        labels, scores = [], []
        for batch in prefetch(reader, self.view, list(enumerate(starts.tolist())),
                              self.eval_batch, self.config.prefetch_batches):
            categorical, numerical, label = self._tensors(batch)
            probabilities, gathered = self._predict_step(categorical, numerical, label)
            scores.append(probabilities.numpy()[: batch.valid])
            labels.append(gathered.numpy()[: batch.valid])
            self.reporter.eval_rows(split, sum(map(len, scores)), reader.rows)
        if not scores:
            return np.zeros(0, np.float32), np.zeros(0, np.float32)
        return np.concatenate(labels), np.concatenate(scores)

    def evaluate(self, split: str, dataset: BinaryDataset | None = None,
                 model: str | None = None) -> EvalResult:
        """AUC and log loss of a split (on rank 0); ``model`` names a model other than the
        run's own in the log (the previous model before a warm-started run trains)."""
        labels, scores = self.predictions(split, dataset)
        if labels.size == 0:
            return EvalResult(split, 0, None, None)
        auc = roc_auc(labels, scores) if self.rank == 0 else None
        if auc is not None and math.isnan(auc):
            auc = None  # one class only: the AUC is undefined, reported as null, never a number
        loss = log_loss(labels, scores) if self.rank == 0 else None
        result = EvalResult(split, int(labels.size), auc, loss)
        self.reporter.evaluated_split(split, self.step, auc)
        record = {"event": "eval", "split": split, "step": self.step, "rows": result.rows,
                  "auc": auc, "logloss": loss}
        self._log({**record, "model": model} if model else record)
        shown = "undefined (the split has one class only)" if auc is None else auc
        whose = f" ({model} model)" if model else ""
        self._progress(f"eval {split}{whose} at step {self.step}: auc {shown} logloss {loss} "
                       f"({result.rows} rows)")
        return result

    def run_eval(self) -> dict[str, Any]:
        self.restore_best(required=True)
        return self._summary_record("eval", [self.evaluate("test"), self.evaluate("validation")], {})

    def run_inference_benchmark(self) -> dict[str, Any]:
        self.restore_best(required=False)
        split = "test" if self.dataset.rows["test"] >= self.eval_batch else "train"
        reader = SplitReader(self.dataset, split)
        starts = batch_starts(reader.rows, self.eval_batch)
        if len(starts) == 0:
            raise ConfigError(f"the {split} split has fewer rows than one batch of {self.eval_batch}")
        steps = max(2, self.config.inference_steps)
        plan = [(i, int(starts[i % len(starts)])) for i in range(steps)]
        first = None
        for i, batch in enumerate(prefetch(reader, self.view, plan, self.eval_batch,
                                           self.config.prefetch_batches)):
            probabilities, _ = self._predict_step(*self._tensors(batch))
            probabilities.numpy()
            if i == 0:  # the first step traces and compiles: not timed
                first = time.perf_counter()
        rate = (steps - 1) * self.eval_batch / max(time.perf_counter() - first, 1e-9)
        return self._summary_record("inference_benchmark", [], {
            "inference_samples_per_s": round(rate, 1), "batch_size": self.eval_batch})

    def _summary_record(self, mode: str, evals: Iterable[EvalResult],
                        extra: dict[str, Any]) -> dict[str, Any]:
        record: dict[str, Any] = {"mode": mode, "step": self.step, "ranks": self.world,
                                  "global_batch": self.global_batch, "preset": self.config.preset,
                                  "compute_dtype": self.compute_dtype.name, "xla": self.config.xla}
        for result in evals:
            record[f"{result.split}_auc"] = result.auc
            record[f"{result.split}_logloss"] = result.logloss
            record[f"{result.split}_rows"] = result.rows
        record.update(extra)
        return record


def run(config: TrainConfig, dataset: str | Path, workdir: str | Path, mode: str = "train",
        comm=None, eval_speedup: float = PreflightConfig().eval_speedup) -> dict[str, Any]:
    """Train, evaluate or benchmark inference: this process's share of the run.

    Args:
        config: the train section of the config.
        dataset: the split binary dataset.
        workdir: checkpoints and logs go in its layout (``logs/trainer_config.json`` first).
        mode: "train", "eval" (the latest checkpoint) or "inference_benchmark".
        comm: the collectives; None = Horovod under horovodrun, else a world of one.
        eval_speedup: evaluation's rate over training's, which weighs the evaluations in the
            progress reported to the pipeline (preflight.eval_speedup).

    Returns:
        The mode's summary. Read it on rank 0: the AUCs and log losses are computed there only.
    """
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; known: {', '.join(MODES)}")
    trainer = Trainer(config, dataset, workdir, comm=comm)
    trainer.reporter = make_progress(trainer.rank, mode, trainer.global_batch,
                                     dict(trainer.dataset.rows), eval_speedup)
    if trainer.rank == 0:
        logs = trainer.layout.logs
        logs.mkdir(parents=True, exist_ok=True)
        write_text_atomic(logs / "trainer_config.json", json.dumps(
            {"mode": mode, "dataset": str(dataset), "ranks": trainer.world,
             "train": config_to_dict(config), "placement": trainer.placement.describe(),
             "table_sizes": list(trainer.dataset.table_sizes),
             "written_table_sizes": list(trainer.dataset.written_table_sizes)},
            indent=1) + "\n", fsync=False)
    if mode == "train":
        return trainer.train()
    if mode == "eval":
        return trainer.run_eval()
    return trainer.run_inference_benchmark()


def nan_to_none(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: nan_to_none(v) for k, v in value.items()}
    if isinstance(value, list):
        return [nan_to_none(v) for v in value]
    return value
