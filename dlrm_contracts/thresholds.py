"""Frequency-threshold specs: one global threshold plus per-column overrides.

Syntax (documented in README): ``T`` or ``T,COL:T,COL:T`` — for example ``15,C3:3,C20:40``.
A value of a categorical column is kept (gets an id ≥ 1) when it was seen at least the
column's threshold times over all input days; otherwise it maps to id 0. Thresholds 0 and 1
both keep every value seen. Whitespace around items is ignored; column names are C1..C26,
case-insensitive. The canonical form (``str(spec)``) lists overrides in column order and drops
overrides equal to the global value, so equal specs always print the same — manifests and
fingerprints rely on that.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dlrm_contracts.errors import UsageError
from dlrm_contracts.schema import CAT_COLUMNS


class ThresholdSpecError(UsageError, ValueError):
    """A threshold spec that cannot be parsed; the message says what was wrong."""


@dataclass(frozen=True)
class ThresholdSpec:
    default: int
    overrides: dict[str, int] = field(default_factory=dict)

    def for_column(self, column: str) -> int:
        return self.overrides.get(column, self.default)

    def per_column(self) -> dict[str, int]:
        return {c: self.for_column(c) for c in CAT_COLUMNS}

    def effective(self, column: str) -> int:
        """Threshold as a minimum count: 0 and 1 both mean 'keep every value seen'."""
        return max(1, self.for_column(column))

    def is_at_least(self, other: "ThresholdSpec") -> bool:
        """True when every column keeps a subset of what ``other`` keeps (the fast-path test)."""
        return all(self.effective(c) >= other.effective(c) for c in CAT_COLUMNS)

    def __str__(self) -> str:
        items = [str(self.default)]
        items += [
            f"{c}:{self.overrides[c]}"
            for c in CAT_COLUMNS
            if c in self.overrides and self.overrides[c] != self.default
        ]
        return ",".join(items)

    def __hash__(self) -> int:
        return hash(str(self))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ThresholdSpec) and str(self) == str(other)


def _parse_count(text: str, where: str) -> int:
    """Plain ASCII digits only: Python's int() would also take '1_0', '+5' or '１５'."""
    text = text.strip()
    if text.startswith("-") and text[1:].isascii() and text[1:].isdigit():
        raise ThresholdSpecError(f"{where}: threshold {text} is negative")
    if not (text.isascii() and text.isdigit()):
        raise ThresholdSpecError(f"{where}: {text!r} is not a whole number")
    return int(text)


def parse_threshold_spec(spec: str | int | ThresholdSpec) -> ThresholdSpec:
    """Parse ``T[,COL:T]...``; raise ThresholdSpecError with a readable reason otherwise."""
    if isinstance(spec, ThresholdSpec):
        return spec
    if isinstance(spec, int):
        spec = str(spec)
    items = [item.strip() for item in str(spec).split(",")]
    if not items or not items[0] or ":" in items[0]:
        raise ThresholdSpecError(
            f"threshold spec {spec!r} must start with the global threshold, e.g. '15,C3:3,C20:40'"
        )
    default = _parse_count(items[0], "global threshold")
    overrides: dict[str, int] = {}
    known = {c.upper(): c for c in CAT_COLUMNS}
    for item in items[1:]:
        if ":" not in item:
            raise ThresholdSpecError(f"override {item!r} must look like COLUMN:THRESHOLD, e.g. C3:3")
        name, _, value = item.partition(":")
        column = known.get(name.strip().upper())
        if column is None:
            raise ThresholdSpecError(f"override {item!r}: unknown column {name.strip()!r} (C1..C26)")
        if column in overrides:
            raise ThresholdSpecError(f"column {column} is given twice in {spec!r}")
        overrides[column] = _parse_count(value, f"override {item!r}")
    return ThresholdSpec(default, overrides)
