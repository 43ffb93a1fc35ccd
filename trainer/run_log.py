"""What a run tells as it goes: a record per report in ``logs/metrics.jsonl`` and as
TensorBoard scalars, and progress lines on stderr. Rank 0 only, so N ranks write one log.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import tensorflow as tf
from tensorflow.core.framework import summary_pb2

from trainer.metrics import MetricsLog

# TensorBoard's scalar plugin tag, written with TensorFlow's own summary op so that the
# tensorboard package is not needed to produce the event files (only to view them).
SCALAR_METADATA = summary_pb2.SummaryMetadata(
    plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars")
)
# fields of a record that label it rather than measure something
LABELS = ("step", "epoch", "event", "split")


class RunLog:
    """Rank 0's metrics log, TensorBoard event files (under ``logs/tensorboard``) and stderr."""

    def __init__(self, logs: Path, rank: int):
        self.logs, self.rank = logs, rank
        self.metrics = MetricsLog(logs / "metrics.jsonl" if rank == 0 else None)
        self._summary: Any = None  # the event file (tf.summary), opened by the first record

    def record(self, record: dict[str, Any], step: int) -> None:
        """One line of metrics.jsonl; its numbers as scalars tagged ``<split or train>/<key>``
        at the record's step (``step`` when it names none)."""
        if self.rank != 0:
            return
        self.metrics.write(record)
        if self._summary is None:
            self._summary = tf.summary.create_file_writer(str(self.logs / "tensorboard"))
        with self._summary.as_default():
            for key, value in record.items():
                if key not in LABELS and isinstance(value, (int, float)):
                    prefix = record.get("split", "train")
                    tf.summary.write(
                        f"{prefix}/{key}",
                        tf.constant(float(value), tf.float32),
                        step=record.get("step", step),
                        metadata=SCALAR_METADATA,
                    )
        self._summary.flush()

    def progress(self, text: str) -> None:
        if self.rank == 0:
            print(text, file=sys.stderr, flush=True)
