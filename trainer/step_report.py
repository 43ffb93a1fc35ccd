"""The training loop's report of each logged step: the loss, the learning rate and samples per
second since the last report (and an ETA), to the run's log and the pipeline's progress; and the
run's own samples per second for its summary.
"""

from __future__ import annotations

import time
from typing import Any

import tensorflow as tf

from trainer.run_log import RunLog


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


class StepReport:
    """Logs a step every ``log_every`` steps (the loop decides when) through its clock.

    Args:
        log: the run's log (its records and progress lines).
        reporter: the pipeline's progress reporter (trainer/progress.py).
        global_batch: the samples of one step over all ranks.
    """

    def __init__(self, log: RunLog, reporter: Any, global_batch: int):
        self.log, self.reporter, self.global_batch = log, reporter, global_batch
        self.clock = ThroughputClock(global_batch)

    def report(self, step: int, total: int, epoch: int, loss: tf.Tensor, lr: float) -> float:
        """Log the loss, learning rate and samples/s since the last report; returns the loss."""
        value = float(loss.numpy())
        rate = self.clock.window_rate()
        self.log.record(
            {"step": step, "epoch": epoch, "loss": value, "lr": lr, "samples_per_s": round(rate, 1)}, step
        )
        self.reporter.loss(value)
        eta = (total - step) * self.global_batch / max(rate, 1e-9)
        self.log.progress(
            f"step {step}/{total} epoch {epoch} loss {value:.5f} lr {lr:.4g} {rate:,.0f} samples/s eta {eta:,.0f}s"
        )
        self.clock.restart_window()
        return value
