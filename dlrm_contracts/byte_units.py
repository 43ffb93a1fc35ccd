"""Byte counts as people read them ("512 B", "3.2 GiB"): one rule for every message that names
a size (the pipeline's disk checks and report, the converter's plan, the preprocess job's
progress), so the same size reads the same wherever it is printed."""

from __future__ import annotations

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def human_bytes(n: float) -> str:
    """``n`` bytes in the largest binary unit below 1024 of it (TiB at most), one decimal."""
    for unit in _UNITS:
        if abs(n) < 1024 or unit == _UNITS[-1]:
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    raise AssertionError("unreachable")
