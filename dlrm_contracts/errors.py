"""Failure kinds and their exit codes (documented in docs/pipeline.md), for every CLI.

Schedulers branch on these: a held lock (another run is working) is not the same as bad
input data, and neither is a crashed training job. Every command line (the pipeline,
spark_jobs, converters, trainer, trainer.score, the generator) ends through :func:`run_cli`,
so an exception means the same exit code whichever of them raised it:

- a :class:`PipelineError` (and its subclasses: bad usage, bad input, a broken dataset ...)
  exits with its ``code``, its message on one line, no traceback;
- an OSError caused by a full disk (ENOSPC, EDQUOT) exits 12;
- an OSError for a path this user may not write or read (EACCES, EPERM, EROFS), where a
  file stands in place of a directory or the reverse (ENOTDIR, EISDIR: a damaged workdir
  layout), or a symbolic link planted where a workdir file is written (ELOOP: never followed)
  exits 2, the path named: the user fixes it or picks another directory;
- an object store that cannot be reached or refuses the credentials (what pyarrow's S3, GCS
  and Azure clients and boto3 say then) exits 2, the store's first line of it shown: the user
  fixes the endpoint or the credentials in the environment;
- SIGINT exits 130;
- anything else is a bug: exit 1, with its traceback on stderr (the stage log).
"""

from __future__ import annotations

import errno
import sys
import traceback
from contextlib import contextmanager
from enum import IntEnum
from typing import Callable, Iterator


class ExitCode(IntEnum):
    OK = 0
    FAILED = 1  # an unexpected error (a bug): see the log
    USAGE = 2  # bad flags, config file or threshold spec; a path not writable
    LOCKED = 3  # another run holds the workdir's lock
    INPUT_DATA = 4  # missing/empty day files, reject rate over its limit
    PREPROCESS = 5  # the Spark job failed
    CONVERT = 6  # parquet → binary conversion or threshold raise failed
    DATASET_INVALID = 7  # the binary dataset did not verify, or changed since it was written
    TRAIN = 8  # training failed
    EVAL = 9  # evaluation failed
    EXPORT = 10  # the export failed (too big, other dictionaries, damaged checkpoint)
    SCORE = 11  # batch scoring failed (unreadable input, label unknown, rejects)
    DISK_FULL = 12  # a write failed for lack of space (ENOSPC / quota) at any stage
    INTERRUPTED = 130  # SIGINT / SIGTERM


class PipelineError(Exception):
    """A failure with a known kind: its message is meant for the user, without a traceback."""

    default_code = ExitCode.FAILED

    def __init__(self, message: str, code: ExitCode | None = None, kind: str | None = None):
        super().__init__(message)
        self.code = ExitCode(code if code is not None else self.default_code)
        # The summary's status word; the exit code's name unless a finer one helps a scheduler
        # (exit 4 is both bad input data and a preflight refusal).
        self.kind = kind or self.code.name.lower()


class UsageError(PipelineError):
    """Flags, a config file or a setting that cannot work; the user changes the command."""

    default_code = ExitCode.USAGE


class BadInputError(PipelineError):
    """Input data the user must fix or replace (missing, empty, malformed)."""

    default_code = ExitCode.INPUT_DATA


_DISK_FULL_TEXT = ("no space left on device", "disk quota exceeded", "enospc", "edquot")
_DISK_FULL_ERRNOS = {errno.ENOSPC, errno.EDQUOT}


def says_disk_full(text: str) -> bool:
    """Whether a message reads like ENOSPC / EDQUOT (as the OS, the JVM, pyarrow and
    TensorFlow print it)."""
    lowered = text.lower()
    return any(words in lowered for words in _DISK_FULL_TEXT)


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc``, then its cause or else its context, and so on (each once)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def disk_full_cause(exc: BaseException) -> BaseException | None:
    """The ENOSPC/EDQUOT error in ``exc``'s chain (causes and contexts), if there is one."""
    for current in _chain(exc):
        if isinstance(current, OSError) and current.errno in _DISK_FULL_ERRNOS:
            return current
        if says_disk_full(str(current)):
            return current
    return None


_NOT_PERMITTED_ERRNOS = {errno.EACCES, errno.EPERM, errno.EROFS}
_WRONG_KIND_ERRNOS = {errno.ENOTDIR, errno.EISDIR}  # a file where a directory belongs, or the reverse
# a symbolic link where a workdir file is written: never followed (dlrm_contracts.atomic)
_LINK_ERRNOS = {errno.ELOOP}
_PATH_ERRNOS = _NOT_PERMITTED_ERRNOS | _WRONG_KIND_ERRNOS | _LINK_ERRNOS


# Lower-case fragments of what the stores' clients say when the store does not answer or
# refuses the credentials (pyarrow's S3 client through the AWS SDK, its GCS and Azure clients,
# boto3): an environment to fix, not a bug.
_STORE_ACCESS_TEXT = (
    "aws error network_connection",
    "aws error access_denied",
    "aws error no_such_bucket",
    "invalidaccesskeyid",
    "signaturedoesnotmatch",
    "unable to locate credentials",
    "could not connect to the endpoint url",
    "retry policy exhausted",
    "authenticationexception",
    "failed to get token",
    "authorizationfailure",
    "authorizationpermissionmismatch",
)


def store_access_cause(exc: BaseException) -> BaseException | None:
    """The error in ``exc``'s chain whose message says an object store could not be reached
    or refused the credentials, if there is one."""
    for current in _chain(exc):
        lowered = str(current).lower()
        if any(words in lowered for words in _STORE_ACCESS_TEXT):
            return current
    return None


def store_access_message(cause: BaseException) -> str:
    """One line: the client's first line, and where the settings come from."""
    first = (str(cause).strip().splitlines() or [type(cause).__name__])[0]
    return (
        f"the object store did not answer or refused the credentials: {first} (the endpoint "
        "and credentials come from the environment: docs/cluster.md §2.0.3)"
    )


def permission_cause(exc: BaseException) -> OSError | None:
    """The EACCES/EPERM/EROFS (or ENOTDIR/EISDIR, ELOOP) error in ``exc``'s chain (causes and
    contexts), if there is one: a path the user must fix, not a bug."""
    for current in _chain(exc):
        if isinstance(current, OSError) and current.errno in _PATH_ERRNOS:
            return current
    return None


def not_permitted_message(cause: OSError, what: str = "", under: str | None = None) -> str:
    """One line: which path, what the OS said, what to do. ``under``: the directory a
    relative file name is in (shutil.rmtree reports names relative to the one it walks)."""
    path = str(cause.filename or "a path")
    if under and not path.startswith("/"):
        path = f"{path} (under {under})"
    prefix = f"{what}: " if what else ""
    if cause.errno in _LINK_ERRNOS:
        return f"{prefix}{cause.strerror or path}"  # names the link (atomic.symlink_refused)
    if cause.errno in _WRONG_KIND_ERRNOS:
        return (
            f"{prefix}{path}: {cause.strerror or cause}: a file stands where the workdir's "
            "layout needs a directory, or the reverse (move it away, or pick another workdir)"
        )
    return (
        f"{prefix}{path} cannot be written or read ({cause.strerror or cause}): the workdir "
        "and everything under it must be writable by this user (check its permissions, "
        "or a read-only mount)"
    )


def exit_code_of(exc: BaseException) -> ExitCode:
    """The one exception -> exit code map (see the module docstring)."""
    if isinstance(exc, PipelineError):
        return exc.code
    if isinstance(exc, KeyboardInterrupt):
        return ExitCode.INTERRUPTED
    if isinstance(exc, Exception) and disk_full_cause(exc) is not None:
        return ExitCode.DISK_FULL
    if isinstance(exc, Exception) and permission_cause(exc) is not None:
        return ExitCode.USAGE
    if isinstance(exc, Exception) and store_access_cause(exc) is not None:
        return ExitCode.USAGE
    return ExitCode.FAILED


@contextmanager
def failing_as(code: ExitCode, *kinds: type[BaseException], what: str = "") -> Iterator[None]:
    """Known failures of a step (``kinds``) become that step's PipelineError with ``code``
    (the message prefixed with ``what``); anything else passes through untouched, so a bug
    stays a bug (exit 1)."""
    try:
        yield
    except kinds as exc:
        if isinstance(exc, PipelineError) and exc.code == code and not what:
            raise
        raise PipelineError(f"{what}: {exc}" if what else str(exc), code) from exc


def run_cli(prog: str, body: Callable[[], int]) -> int:
    """Run a command line's body and turn what it raises into its exit code."""
    try:
        return int(body())
    except (Exception, KeyboardInterrupt) as exc:  # noqa: BLE001 — sorted by exit_code_of
        code = exit_code_of(exc)
        if code == ExitCode.FAILED:
            traceback.print_exc(file=sys.stderr)
            print(
                f"{prog}: unexpected error (a bug, traceback above): {type(exc).__name__}: {exc}",
                file=sys.stderr,
                flush=True,
            )
        elif not isinstance(exc, PipelineError) and (denied := permission_cause(exc)) is not None:
            print(f"{prog}: error: {not_permitted_message(denied)}", file=sys.stderr, flush=True)
        elif not isinstance(exc, PipelineError) and (cause := store_access_cause(exc)) is not None:
            print(f"{prog}: error: {store_access_message(cause)}", file=sys.stderr, flush=True)
        else:
            print(f"{prog}: error: {exc}", file=sys.stderr, flush=True)
        return int(code)
