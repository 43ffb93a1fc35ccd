"""Failures the user can act on; the CLI prints their message on one line, without a trace."""

from __future__ import annotations

from dlrm_contracts.errors import BadInputError, ExitCode, PipelineError, UsageError


class PreprocessInputError(BadInputError):
    """The raw input is unusable: missing/empty/ambiguous day files, too many rejected lines."""


class PreprocessConfigError(UsageError):
    """A setting that cannot work (bad --conf, missing RAPIDS jar, a threshold change under
    stable ids)."""


class PreprocessJobError(PipelineError):
    """Spark failed, or an output check (rows in = rows out + rejected) did not hold."""

    default_code = ExitCode.PREPROCESS
