"""The training loop of one rank, the same code for one process and N ranks: where a run
starts (scratch, resume, the previous model), which steps and rows it trains, when it logs,
validates, stops early and saves, and the summary of each mode (train, eval, inference
benchmark). The model's parts, the checkpoints' lifecycle, evaluation, the log and the step
reports are modules of their own (trainer/assembly.py, checkpoint_lifecycle.py, evaluation.py,
run_log.py, step_report.py).
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import tensorflow as tf

from dlrm_contracts.atomic import write_text_atomic
from dlrm_contracts.config import ConfigError, PreflightConfig, TrainConfig, config_to_dict
from dlrm_contracts.layout import WorkdirLayout
from trainer.checkpoint import best_checkpoint
from trainer.assembly import assemble
from trainer.checkpoint_lifecycle import CheckpointedModel, CheckpointLifecycle
from trainer.comm import make_comm, shared_auc
from trainer.data import Batch, BinaryDataset, SplitReader, open_dataset, prefetch
from trainer.early_stopping import EarlyStopping
from trainer.evaluation import EvalResult, Evaluator, as_served, eval_line, eval_record, summary_record
from trainer.model import model_dims
from trainer.optim import learning_rate
from trainer.progress import NoProgress, make_progress
from trainer.run_log import RunLog
from trainer.run_state import RunState
from trainer.step_plan import batch_plan, run_length
from trainer.step_report import StepReport, ThroughputClock
from trainer.train_days import DayPlan, plan_days
from trainer.warm_start import StartPlan, plan_start

MODES = ("train", "eval", "inference_benchmark")


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
            print(
                "trainer: note: --amp with --xla on a CPU: XLA's CPU dots do not use the "
                "bfloat16 instructions that TensorFlow's own (oneDNN) matmuls use, so this "
                "runs at about float32 speed; drop --xla to train at bfloat16 speed",
                file=sys.stderr,
            )
        return tf.bfloat16
    print("trainer: --amp asked but this CPU has no bfloat16 support; training in float32", file=sys.stderr)
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


class Trainer:
    """One rank's share of a DLRM run: the training loop over parts it holds. The model, the
    optimizer and the step functions (trainer/assembly.py), the checkpoints' lifecycle
    (trainer/checkpoint_lifecycle.py), evaluation (trainer/evaluation.py), the log
    (trainer/run_log.py) and the step reports (trainer/step_report.py)."""

    def __init__(self, config: TrainConfig, dataset_path: str | Path, workdir: str | Path, comm=None):
        self.config = config
        self.comm = comm or make_comm()
        self.rank, self.world = self.comm.rank, self.comm.size
        set_threads(config, self.comm.local_size)
        self.layout = WorkdirLayout.at(workdir)
        self.dataset = open_dataset(
            dataset_path,
            threshold=config.frequency_threshold,
            counts_dir=config.counts_dir or (self.layout.counts if config.frequency_threshold else None),
            verify=config.verify_dataset,
        )
        self.dims = model_dims(config)
        self.global_batch, self.eval_batch = checked_batch_sizes(config, self.world)
        self.log = RunLog(self.layout.logs, self.rank)
        self.reporter = NoProgress()  # run() gives rank 0 one (trainer/progress.py)
        self.run = RunState(EarlyStopping(config.early_stopping_patience, config.early_stopping_min_delta))
        self._build_model()

    def _build_model(self) -> None:
        """This rank's parts (trainer/assembly.py), and the parts that save and evaluate them."""
        config = self.config
        self.compute_dtype = compute_dtype(config)
        parts = assemble(
            config,
            self.dataset,
            self.dims,
            self.comm,
            (self.global_batch, self.eval_batch),
            self.compute_dtype,
        )
        self.placement, self.model, self.view = parts.placement, parts.model, parts.view
        self.optimizer, self.steps, self.state = parts.optimizer, parts.steps, parts.state
        # The model's shape as checkpoints record it: the dims, and with multi-hot rows the
        # dataset's record of their materialization (sizes, seed, distribution): a checkpoint
        # trained on other rows is not restored for these (its embeddings were pooled over
        # other ids), and the export rebuilds the same rows from raw values.
        dims = {**self.dims.meta(), **self.dataset.multi_hot_record}
        self.checkpoints = CheckpointLifecycle(
            self.layout,
            self.comm,
            config,
            self.dataset,
            CheckpointedModel(self.placement, dims, self.state),
            self.run,
            self.log.progress,
        )
        self.evaluator = Evaluator(
            self.steps.predict, self.view, self.dataset, self.eval_batch, config.prefetch_batches, self.rank
        )

    def train_on_batch(self, batch: Batch, lr: float) -> tf.Tensor:
        """One optimizer step; returns the global-batch mean loss (before the update)."""
        return self.steps.train_on_batch(batch, lr)

    def _owned_state(self) -> list[tuple[str, tf.Variable]]:
        return self.state.owned_state()

    def _replicated_state(self) -> list[tuple[str, tf.Variable]]:
        return self.state.replicated_state()

    # -- checkpoints (trainer/checkpoint_lifecycle.py) -------------------------------------
    def restore_latest(self, required: bool = False) -> Path | None:
        """The newest checkpoint (where training resumes), with its run's state."""
        return self.checkpoints.restore("latest", required)

    def restore_best(self, required: bool = False) -> Path | None:
        """The run's model (``best_checkpoint``: the best validation AUC's, else the latest)."""
        return self.checkpoints.restore("best", required)

    def _start(self) -> StartPlan:
        """Scratch, resume or warm start (trainer/warm_start.py decides from the checkpoints)."""
        plan = plan_start(self.layout.checkpoints, self.dataset.identity, self.config)
        if plan.note:
            self.log.progress(f"trainer: {plan.note}")
        self.checkpoints.start(plan)
        return plan

    # -- where the run stands (trainer/run_state.py) ----------------------------------------
    @property
    def step(self) -> int:
        return self.run.step

    @property
    def run_start(self) -> int:
        return self.run.run_start

    @property
    def day_plan(self) -> DayPlan | None:
        return self.run.day_plan

    # -- the training loop -----------------------------------------------------------------
    @property
    def train_rows(self) -> int:
        """The rows this run trains on: the whole train split, or its new days (train.days)."""
        return self.dataset.rows["train"] if self.day_plan is None else self.day_plan.rows

    def plan_train_days(self) -> DayPlan:
        """The train rows of the run that starts from the model now loaded (train.days)."""
        plan = plan_days(
            self.config.days, self.dataset.train_days, self.dataset.rows["train"], self.run.days_seen_before
        )
        if plan.note:
            self.log.progress(f"trainer: {plan.note}")
        self.run.day_plan = plan
        return plan

    def total_steps(self) -> tuple[int, int]:
        """(steps this run trains, steps per epoch): trainer/step_plan.py's run_length."""
        return run_length(
            self.train_rows,
            self.dataset.rows["train"],
            self.global_batch,
            self.config,
            self.day_plan is not None and self.day_plan.rows == 0,
        )

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
        self.run.covering_steps = min(planned, steps_per_epoch)
        total = self.run_start + planned
        if self.run.early_stopping.stopped:
            self.log.progress(self.run.early_stopping.stopped_before_line())
            total = self.step
        eval_every = max(1, steps_per_epoch // max(1, self.config.evals_per_epoch))
        warm = start.kind == "previous" and self.config.evaluate_previous
        self.reporter.start_training(
            self.step - self.run_start,
            total - self.run_start,
            eval_every,
            final_eval,
            self.dataset.rows.get("test", 0) if warm else 0,
        )
        if warm:
            self.run.warm_start.previous_test_auc = self._evaluate_previous()
        batches = self._train_batches(total, steps_per_epoch)
        report = StepReport(self.log, self.reporter, self.global_batch)
        clock = report.clock
        last_loss, evals = None, []
        for batch in batches:
            lr = learning_rate(self._schedule_step(batch.step), self.config)
            loss = self.train_on_batch(batch, lr)
            self.run.step = batch.step + 1
            done = self.step - self.run_start  # steps of this run
            clock.step_done(loss)
            self.reporter.step(done)
            if done % max(1, self.config.log_every) == 0 or self.step == total:
                last_loss = report.report(self.step, total, (done - 1) // steps_per_epoch, loss, lr)
            if self.run.early_stopping.validates_at(done, total - self.run_start, eval_every):
                evals.append(self.evaluate("validation"))
                if self._stop_early(evals[-1]):
                    batches.close()  # the read-ahead threads stop too
                    break
            if (
                self.config.checkpoint_every
                and done % self.config.checkpoint_every == 0
                and self.checkpoints.saved_step != self.step
            ):
                self.checkpoints.save()
        if planned == 0 and start.kind == "previous":
            # The previous model, its tables grown to this dataset's, saved for it so that eval
            # and export read this dataset's model (the same step: no step was trained).
            self.checkpoints.save()
        summary = self._finish_training(clock, last_loss, evals, final_eval)
        summary["init"] = self.run.start_record(start.kind)
        # the run has ended: its days count as trained (as its model's checkpoint records)
        summary["train_days"] = {
            "mode": self.config.days,
            "rows": self.train_rows,
            **self.day_plan.to_meta(True),
        }
        if self.run.warm_start is not None:
            summary["previous_model_test_auc"] = self.run.warm_start.previous_test_auc
        return summary

    def _stop_early(self, result: EvalResult) -> bool:
        """Early stopping's record of a validation AUC: a checkpoint when it is the best so far;
        True when the run should stop. Every rank decides from rank 0's AUC (the only one
        computed), so all of them stop at the same step."""
        stopping = self.run.early_stopping
        if not stopping.enabled:
            return False
        if stopping.update(self.step, shared_auc(self.comm, result.auc)):
            self.checkpoints.save()
        elif stopping.stopped:
            self.log.progress(stopping.stopping_line(self.step))
        return stopping.stopped

    def _schedule_step(self, step: int) -> int:
        """The step the learning-rate schedule is at: counted over every run when a warm
        start continues the optimizer, from this run's start when it restarts it."""
        restarted = self.run.warm_start is not None and self.run.warm_start.optimizer == "restart"
        return step - self.run_start if restarted else step

    def _train_batches(self, total: int, steps_per_epoch: int) -> Iterable[Batch]:
        """This rank's batches from the current step to ``total``, read ahead by a thread."""
        reader = SplitReader(
            self.dataset, "train", self.day_plan.ranges if self.day_plan is not None else None
        )
        plan = batch_plan(
            self.step, total, self.run_start, steps_per_epoch, self.train_rows, self.global_batch, self.config
        )
        return prefetch(reader, self.view, plan, self.global_batch, self.config.prefetch_batches)

    def _finish_training(
        self, clock: ThroughputClock, last_loss: float | None, evals: list[EvalResult], final_eval: bool
    ) -> dict[str, Any]:
        """Last checkpoint, final evaluations and the summary of the run."""
        samples_per_s = clock.run_rate()  # before the final save and evaluations
        last_step = self.step
        if clock.steps and self.checkpoints.saved_step != self.step:
            self.checkpoints.save()
        self.checkpoints.record_days_of_best()
        stopping = self.run.early_stopping
        # The run's model: the best validation AUC's checkpoint with early stopping.
        if stopping.best_step is not None and stopping.best_step != self.step:
            self.log.progress(stopping.restoring_line())
            self.restore_best()
        checkpoint = best_checkpoint(self.layout.checkpoints)
        finals = [self.evaluate("test"), self.evaluate("validation")] if final_eval else []
        extra = {
            "train_loss": last_loss,
            "steps_run": clock.steps,
            "train_samples_per_s": samples_per_s,
            "checkpoint": str(checkpoint) if checkpoint else None,
            "periodic_validation_auc": [e.auc for e in evals],
            **stopping.summary_fields(last_step),
        }
        return self.summary("train", finals, extra)

    # -- evaluation (trainer/evaluation.py) ------------------------------------------------
    def predictions(self, split: str, dataset: BinaryDataset | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(labels, probabilities) of a whole split in row order (on every rank); ``dataset``
        reads it at other table sizes (ids past them as 0)."""
        return self.evaluator.predictions(split, dataset, self.reporter.eval_rows)

    def evaluate(
        self, split: str, dataset: BinaryDataset | None = None, model: str | None = None
    ) -> EvalResult:
        """AUC and log loss of a split (on rank 0), logged unless the split is empty; ``model``
        names a model other than the run's own in the log."""
        result = self.evaluator.evaluate(split, dataset, self.reporter.eval_rows)
        if result.rows:
            self.reporter.evaluated_split(split, self.step, result.auc)
            self.log.record(eval_record(result, self.step, model), self.step)
            self.log.progress(eval_line(result, self.step, model))
        return result

    def _evaluate_previous(self) -> float | None:
        """The previous model (just loaded, before any step) on this run's test split, as it
        is served: a value it had no row for reads as id 0, not as a fresh row."""
        if self.dataset.rows.get("test", 0) == 0:
            return None
        served = as_served(self.dataset, self.run.warm_start.served_sizes(self.dataset.table_sizes))
        return self.evaluate("test", dataset=served, model="previous").auc

    def summary(self, mode: str, evals: Iterable[EvalResult], extra: dict[str, Any]) -> dict[str, Any]:
        return summary_record(
            {
                "mode": mode,
                "step": self.step,
                "ranks": self.world,
                "global_batch": self.global_batch,
                "preset": self.config.preset,
                "compute_dtype": self.compute_dtype.name,
                "xla": self.config.xla,
            },
            evals,
            extra,
        )


def run(
    config: TrainConfig,
    dataset: str | Path,
    workdir: str | Path,
    mode: str = "train",
    comm=None,
    eval_speedup: float = PreflightConfig().eval_speedup,
) -> dict[str, Any]:
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
    trainer.reporter = make_progress(
        trainer.rank, mode, trainer.global_batch, dict(trainer.dataset.rows), eval_speedup
    )
    if trainer.rank == 0:
        logs = trainer.layout.logs
        logs.mkdir(parents=True, exist_ok=True)
        write_text_atomic(
            logs / "trainer_config.json",
            json.dumps(
                {
                    "mode": mode,
                    "dataset": str(dataset),
                    "ranks": trainer.world,
                    "train": config_to_dict(config),
                    "placement": trainer.placement.describe(),
                    "table_sizes": list(trainer.dataset.table_sizes),
                    "written_table_sizes": list(trainer.dataset.written_table_sizes),
                },
                indent=1,
            )
            + "\n",
            fsync=False,
        )
    if mode == "train":
        return trainer.train()
    if mode == "eval":
        return evaluate_model(trainer)
    return benchmark_inference(trainer)


def evaluate_model(trainer: Trainer) -> dict[str, Any]:
    """The eval mode: the run's model (its best checkpoint) on the test and validation splits."""
    trainer.restore_best(required=True)
    return trainer.summary("eval", [trainer.evaluate("test"), trainer.evaluate("validation")], {})


def benchmark_inference(trainer: Trainer) -> dict[str, Any]:
    """The inference-benchmark mode: the eval step's samples per second, on the run's model when
    there is one."""
    trainer.restore_best(required=False)
    rate = trainer.evaluator.inference_rate(max(2, trainer.config.inference_steps))
    return trainer.summary(
        "inference_benchmark",
        [],
        {"inference_samples_per_s": round(rate, 1), "batch_size": trainer.eval_batch},
    )


def nan_to_none(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: nan_to_none(v) for k, v in value.items()}
    if isinstance(value, list):
        return [nan_to_none(v) for v in value]
    return value
