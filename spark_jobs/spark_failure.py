"""Spark and py4j failures as one line the user can act on, without a Java trace.

A failed Spark action surfaces as a py4j error whose text is the whole JVM stack, with the
cause that matters (a Python task's exception, a disk that filled, a damaged file) buried
inside; the preprocess job wraps its Spark work in :func:`spark_errors` so that it reaches the
user as a :class:`PreprocessJobError` naming that cause (exit 5).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager

from dlrm_contracts.errors import PipelineError
from spark_jobs.errors import PreprocessJobError

# pyarrow's exceptions are named ArrowInvalid, ArrowTypeError, ...
_PYTHON_ERROR = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?(\w*(?:Error|Exception)|Arrow\w+): (.*)$")


@contextmanager
def spark_errors() -> Iterator[None]:
    """Spark/py4j failures become one-line PreprocessJobErrors (no Java trace for the user)."""
    from py4j.protocol import Py4JError
    from pyspark.errors import PySparkException

    try:
        yield
    except PipelineError:
        raise
    except (PySparkException, Py4JError) as error:
        raise PreprocessJobError(spark_error_message(error)) from error


def spark_error_message(error: Exception) -> str:
    """The error's first telling line, with its innermost Java cause when that adds something."""
    # split on '\n' only: str.splitlines() also splits at NEL/U+2028 found in the input data;
    # py4j's own first line ("An error occurred while calling o170.collectToPython.") says nothing
    lines = [line.strip().lstrip(":").strip() for line in str(error).strip().split("\n")]
    lines = [line for line in lines if line and not line.startswith("An error occurred while calling")]
    first = python_worker_error(lines) or (lines[0] if lines else type(error).__name__)
    root = (java_root_cause(error) or "").split("\n")[0].strip()
    if root and root not in first:
        first = f"{first} ({root})"
    return f"Spark job failed: {first[:500]}"


def java_root_cause(error: Exception) -> str | None:
    """'Class: message' of the innermost Java cause of a py4j error, when there is one."""
    java = getattr(error, "java_exception", None)
    try:
        for _ in range(20):
            if java is None or java.getCause() is None:
                break
            java = java.getCause()
        if java is None:
            return None
        message = java.getMessage()
        return f"{java.getClass().getName()}: {message}" if message else java.getClass().getName()
    except Exception:  # noqa: BLE001 — the gateway may be gone
        return None


def python_worker_error(lines: list[str]) -> str | None:
    """'Error: message' of an exception raised in a Python task (the traceback's last such line)."""
    if not any(line.startswith("An exception was thrown from the Python worker") for line in lines):
        return None
    for line in reversed(lines):
        match = _PYTHON_ERROR.match(line)
        if match:
            return f"{match.group(1)}: {match.group(2)}"
    return None
