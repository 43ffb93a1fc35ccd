"""Failures the user can act on; the CLI prints their message on one line, without a trace."""

from __future__ import annotations

from dlrm_contracts.errors import ExitCode, PipelineError


class PreprocessInputError(PipelineError):
    """The raw input is unusable: missing/empty/ambiguous day files, too many rejected lines."""

    def __init__(self, message: str):
        super().__init__(message, ExitCode.INPUT_DATA)


class PreprocessConfigError(PipelineError):
    """A setting that cannot work (bad --conf, missing RAPIDS jar, bad threshold spec)."""

    def __init__(self, message: str):
        super().__init__(message, ExitCode.USAGE)


class PreprocessJobError(PipelineError):
    """Spark failed, or an output check (rows in = rows out + rejected) did not hold."""

    def __init__(self, message: str):
        super().__init__(message, ExitCode.PREPROCESS)
