"""One writer per workdir: an advisory file lock that every entry point writing a workdir takes.

The pipeline, ``python -m spark_jobs``, ``python -m converters`` (convert, rethreshold),
``python -m trainer`` and ``python -m trainer.score`` all take ``DIR/.pipeline.lock`` before
they touch the workdir, so two of them on one workdir never delete each other's index,
staging or checkpoints: the second ends with exit 3 naming the holder.

flock is released by the kernel when the process exits, however it exits, so a killed run never
leaves a stale lock behind; the pid, host and start time written into the file are only for the
message the second run prints.

The holder's own children (the pipeline runs the wings as child processes, horovodrun starts
several trainer ranks) must not be refused by the lock their parent holds: the holder puts a
random token in the file and in its environment (``LOCK_TOKEN_ENV``), which its children
inherit. A process that finds the lock held and the same token in the file and in its own
environment runs under that holder's lock instead of taking it. A token left in an environment
after its holder ended opens nothing: the lock is then free, and is taken as usual.

The lock file is opened with ``O_NOFOLLOW``: a symbolic link planted at its name is refused,
never written through (its target untouched).
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

from dlrm_contracts.errors import ExitCode, PipelineError
from dlrm_contracts.layout import WorkdirLayout

if TYPE_CHECKING:  # object_lock imports this module for LOCK_TOKEN_ENV
    from dlrm_contracts.object_lock import ObjectStoreLock
    from dlrm_contracts.storage import Location

# The environment variable through which the holder's children know its lock (see above).
LOCK_TOKEN_ENV = "DLRM_WORKDIR_LOCK_TOKEN"


def _holder_text(raw: str) -> tuple[str, str | None]:
    """(who holds the lock, for a message; its token) from the lock file's content."""
    try:
        holder = json.loads(raw)
    except ValueError:
        return raw.strip() or "unknown holder", None
    if not isinstance(holder, dict):
        return raw.strip() or "unknown holder", None
    token = holder.get("token")
    shown = {k: v for k, v in holder.items() if k != "token"}
    return json.dumps(shown), token if isinstance(token, str) else None


class WorkdirLock:
    """``with WorkdirLock(DIR/.pipeline.lock, "spark_jobs"):`` — held for the block's length.

    ``who`` names the entry point in the holder's record (the second run's message). Under a
    holder whose token this process inherited, entering takes nothing (``self.guest``).
    """

    lost: PipelineError | None = None  # flock cannot be taken from a live holder (object_lock's can)

    def __init__(self, path: Path, who: str = "pipeline"):
        self.path = Path(path)
        self.who = who
        self.guest = False
        self._fd: int | None = None
        self._token: str | None = None
        self._previous_env: str | None = None

    def __enter__(self) -> "WorkdirLock":
        fd = self._open()
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder, token = _holder_text(_read_all(fd))
            os.close(fd)
            inherited = os.environ.get(LOCK_TOKEN_ENV)
            if token is not None and inherited == token:
                self.guest = True  # a child of the holder: runs under its lock
                return self
            raise PipelineError(
                f"workdir {self.path.parent} is in use by another pipeline run ({holder}); wait "
                "for it to finish or use another workdir",
                ExitCode.LOCKED,
            ) from None
        self._token = uuid.uuid4().hex
        holder = json.dumps(
            {
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "by": self.who,
                "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "token": self._token,
            }
        )
        os.ftruncate(fd, 0)
        try:  # who holds the lock, for a second run's message: not worth failing over (full disk)
            os.pwrite(fd, holder.encode(), 0)
        except OSError:
            os.ftruncate(fd, 0)
        self._fd = fd
        self._previous_env = os.environ.get(LOCK_TOKEN_ENV)
        os.environ[LOCK_TOKEN_ENV] = self._token  # inherited by every child started now on
        return self

    def _open(self) -> int:
        """The lock file's descriptor: created if missing, never through a symbolic link."""
        flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            return os.open(self.path, flags, 0o644)
        except OSError as exc:  # a lock file of another user, a read-only workdir, a link
            if exc.errno == errno.ELOOP or self.path.is_symlink():
                why = (
                    f"is a symbolic link (to {os.readlink(self.path)}); the lock is never "
                    "taken through a link: remove it"
                )
            else:
                why = f"cannot be opened ({exc.strerror or exc})"
            raise PipelineError(
                f"workdir {self.path.parent} cannot be written: its lock file {self.path} {why}",
                ExitCode.USAGE,
            ) from None

    def __exit__(self, *exc: object) -> None:
        if self._fd is None:
            return
        if self._previous_env is None:
            os.environ.pop(LOCK_TOKEN_ENV, None)
        else:
            os.environ[LOCK_TOKEN_ENV] = self._previous_env
        try:
            os.ftruncate(self._fd, 0)
        except OSError:
            pass
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None


def _read_all(fd: int) -> str:
    return os.pread(fd, 4096, 0).decode("utf-8", errors="replace")


def workdir_lock(workdir: str | Path | Location, who: str) -> WorkdirLock | ObjectStoreLock:
    """The lock of the workdir ``workdir`` (``DIR/.pipeline.lock``): flock for a path, a
    conditional write for a workdir URL (dlrm_contracts.object_lock)."""
    from dlrm_contracts.storage import is_url

    if is_url(workdir):
        from dlrm_contracts.object_lock import ObjectStoreLock
        from dlrm_contracts.storage import resolve

        return ObjectStoreLock(resolve(workdir), who)
    return WorkdirLock(WorkdirLayout.at(workdir).lock_file, who)


def output_lock(output: str | Path, who: str) -> WorkdirLock | ObjectStoreLock:
    """The lock guarding an output directory written as a whole (a binary dataset, scores):
    the lock of the directory it sits in, which is the workdir's for ``DIR/binary``."""
    from dlrm_contracts.storage import is_url, resolve

    if is_url(output):
        return workdir_lock(str(resolve(output).parent), who)
    return workdir_lock(Path(output).absolute().parent, who)
