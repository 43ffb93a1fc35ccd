"""A tqdm bar on a terminal, and nothing at all in logs, pipes and tests."""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from typing import IO, Any, Iterator

# Set by the pipeline for a child whose own stderr goes to the stage log while the pipeline
# runs on a terminal: the child may draw its progress bar on /dev/tty.
PROGRESS_TTY_ENV = "CRITEO_DLRM_PROGRESS_TTY"



@contextmanager
def _terminal() -> Iterator[IO[str] | None]:
    """stderr when it is a terminal; else the controlling terminal when the pipeline, whose
    child this is, runs on one (the child's stderr is then the stage log)."""
    if sys.stderr.isatty():
        yield sys.stderr
        return
    tty = None
    if os.environ.get(PROGRESS_TTY_ENV) == "1":
        try:
            tty = open("/dev/tty", "w", encoding="utf-8")
        except OSError:
            tty = None
    try:
        yield tty
    finally:
        if tty is not None:
            tty.close()


class _Silent:
    def update(self, n: int = 1) -> None:
        pass


@contextmanager
def progress_bar(total: int | None, description: str, enabled: bool = True) -> Iterator[Any]:
    with _terminal() as stream:
        if not (enabled and stream is not None):
            yield _Silent()
            return
        from tqdm import tqdm

        with tqdm(total=total, desc=description, unit="rows", unit_scale=True,
                  file=stream, dynamic_ncols=True) as bar:
            yield bar
