"""One run per workdir: an advisory file lock that dies with its holder.

flock is released by the kernel when the process exits, however it exits, so a killed run never
leaves a stale lock behind; the pid and start time written into the file are only for the
message the second run prints.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from pathlib import Path

from dlrm_contracts.errors import ExitCode, PipelineError


class WorkdirLock:
    def __init__(self, path: Path):
        self.path = path
        self._fh = None

    def __enter__(self) -> "WorkdirLock":
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fh = open(self.path, "a+", encoding="utf-8")
        except OSError as exc:  # a lock file of another user, a read-only workdir
            raise PipelineError(f"workdir {self.path.parent} cannot be written: its lock file "
                                f"{self.path} cannot be opened ({exc.strerror or exc})",
                                ExitCode.USAGE) from None
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            holder = fh.read().strip() or "unknown holder"
            fh.close()
            raise PipelineError(
                f"workdir {self.path.parent} is in use by another pipeline run ({holder}); "
                "wait for it to finish or use another --workdir", ExitCode.LOCKED) from None
        holder = json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                             "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
        os.ftruncate(fh.fileno(), 0)
        try:  # who holds the lock, for a second run's message: not worth failing over (full disk)
            os.pwrite(fh.fileno(), holder.encode(), 0)
        except OSError:
            os.ftruncate(fh.fileno(), 0)
        self._fh = fh
        return self

    def __exit__(self, *exc) -> None:
        if self._fh is not None:
            self._fh.seek(0)
            self._fh.truncate()
            fcntl.flock(self._fh.fileno(), fcntl.LOCK_UN)
            self._fh.close()
            self._fh = None
