"""Running a wing as a child process, its output kept in a stage log.

Each wing runs in its own process group so that an interrupted pipeline takes the whole tree
down with it (a Spark JVM or a horovodrun with its ranks), and so that the JVM's or TensorFlow's
memory is returned between stages. The child's last stdout line is its JSON summary.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shlex
import signal
import subprocess
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from dlrm_contracts.atomic import open_append

log = logging.getLogger("pipeline")


@dataclass
class ChildResult:
    returncode: int
    summary: dict[str, Any] | None
    tail: list[str]
    # The one-line errors of every command (KNOWN_ERROR) anywhere in the output, in order: a
    # multi-rank child's first known error may be followed by more lines of tracebacks (the
    # other ranks', horovodrun's) than the tail holds.
    errors: list[str] = field(default_factory=list)


# horovodrun prefixes each rank's lines with "[rank]<stdout>:" (or <stderr>).
_RANK_PREFIX = re.compile(r"^\[\d+\]<std(?:out|err)>:")
# The one line every command prints for a failure (dlrm_contracts.errors.run_cli), possibly
# behind horovodrun's prefix; group 1 is the line itself.
KNOWN_ERROR = re.compile(
    r"^(?:\[\d+\]<std\w+>:)?"
    r"([\w.]+ ?[\w.-]*: (?:error|unexpected error)\b.*)$"
)
# Known errors kept of one child's output: the first are the cause, the rest their echoes.
_ERRORS_KEPT = 20


def _last_json_line(lines: list[str]) -> dict[str, Any] | None:
    for line in reversed(lines):
        line = _RANK_PREFIX.sub("", line.strip()).strip()
        if line.startswith("{") and line.endswith("}"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                continue
    return None


_current: subprocess.Popen | None = None


class StageLog:
    """A child's output file, line-buffered so `tail -f logs/<stage>.log` follows a long stage.

    When the file cannot be written (a full disk), the child's output is still read (a child
    blocked on a full pipe would hang) and its last lines kept in memory for the error message.
    """

    def __init__(self, path: Path):
        self.path = path
        self._fh: TextIO | None = None
        try:
            self._fh = open_append(path, buffering=1)  # never through a planted link
        except OSError as exc:
            self._give_up(exc)

    def _give_up(self, exc: OSError) -> None:
        self._fh = None
        log.warning(
            "stage log %s cannot be written (%s): its output is not kept", self.path, exc.strerror or exc
        )

    def write(self, text: str) -> None:
        if self._fh is None:
            return
        try:
            self._fh.write(text)
        except OSError as exc:
            self._close_quietly()
            self._give_up(exc)

    def _close_quietly(self) -> None:
        if self._fh is None:
            return
        try:
            self._fh.close()
        except OSError:
            pass

    def close(self) -> None:
        if self._fh is not None:
            self._close_quietly()
            self._fh = None


def _die_with_parent() -> None:
    """In the child, before exec: ask Linux to SIGKILL it when the pipeline process dies.

    A pipeline killed with SIGKILL cannot stop its children itself; without this, an orphaned
    Spark job or trainer would keep writing into the workdir after the lock is released.
    (The Spark JVM exits by itself when its Python driver goes: it watches its stdin.)
    """
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def terminate_current_child() -> None:
    """Stop the running child's whole process group (called from signal handlers)."""
    child = _current
    if child is not None and child.poll() is None:
        try:
            os.killpg(child.pid, signal.SIGTERM)
            child.wait(timeout=20)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(child.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def run_child(
    argv: list[str], log_path: Path, env: dict[str, str] | None = None, cwd: Path | None = None
) -> ChildResult:
    """Run ``argv``, append its combined output to ``log_path``, return code + JSON summary."""
    global _current
    try:
        log_path.parent.mkdir(parents=True, exist_ok=True)
    except OSError:
        pass  # StageLog says so
    log.info("running: %s", shlex.join(argv))
    tail: deque[str] = deque(maxlen=200)
    errors: list[str] = []
    sink = StageLog(log_path)
    sink.write(f"\n$ {shlex.join(argv)}\n")
    child = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, **(env or {})},
        cwd=cwd,
        start_new_session=True,
        bufsize=1,
        errors="replace",
        preexec_fn=_die_with_parent,
    )
    _current = child
    try:
        assert child.stdout is not None
        for line in child.stdout:
            sink.write(line)
            tail.append(line.rstrip("\n"))
            known = KNOWN_ERROR.match(tail[-1]) if len(errors) < _ERRORS_KEPT else None
            if known:
                errors.append(known.group(1))
        child.wait()
    finally:
        if child.poll() is None:
            terminate_current_child()
        _current = None
        sink.close()
    lines = list(tail)
    return ChildResult(child.returncode, _last_json_line(lines), lines[-25:], errors)
