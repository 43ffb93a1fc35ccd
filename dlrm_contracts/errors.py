"""Failure kinds of a pipeline run and their exit codes (documented in docs/pipeline.md).

Schedulers branch on these: a held lock (another run is working) is not the same as bad
input data, and neither is a crashed training job.
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    FAILED = 1             # an unexpected error (a bug): see the log
    USAGE = 2              # bad flags, config file or threshold spec
    LOCKED = 3             # another run holds the workdir's lock
    INPUT_DATA = 4         # missing/empty day files, reject rate over its limit
    PREPROCESS = 5         # the Spark job failed
    CONVERT = 6            # parquet → binary conversion or threshold raise failed
    DATASET_INVALID = 7    # the binary dataset did not verify
    TRAIN = 8              # training failed
    EVAL = 9               # evaluation failed
    EXPORT = 10            # the SavedModel export failed (or the model is too big to export)
    SCORE = 11             # batch scoring failed
    DISK_FULL = 12         # a write failed for lack of space (ENOSPC / quota) at any stage
    INTERRUPTED = 130      # SIGINT / SIGTERM


class PipelineError(Exception):
    """A failure with a known kind: its message is meant for the user, without a traceback."""

    def __init__(self, message: str, code: ExitCode = ExitCode.FAILED, kind: str | None = None):
        super().__init__(message)
        self.code = code
        # The summary's status word; the exit code's name unless a finer one helps a scheduler
        # (exit 4 is both bad input data and a preflight refusal).
        self.kind = kind or code.name.lower()
