"""A tqdm bar on a terminal, and nothing at all in logs, pipes and tests."""

from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import Any, Iterator


class _Silent:
    def update(self, n: int = 1) -> None:
        pass


@contextmanager
def progress_bar(total: int, description: str, enabled: bool = True) -> Iterator[Any]:
    if not (enabled and sys.stderr.isatty()):
        yield _Silent()
        return
    from tqdm import tqdm

    with tqdm(total=total, desc=description, unit="rows", unit_scale=True,
              file=sys.stderr, dynamic_ncols=True) as bar:
        yield bar
