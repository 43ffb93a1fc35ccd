"""Command line of the synthetic Criteo generator (``python -m pipeline.generate``).

Defaults come from ``GeneratorConfig`` (optionally a YAML ``--config``'s ``generator``
section); flags override them.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from dlrm_contracts.config import ConfigError, GeneratorConfig, flag_overrides, load_config
from dlrm_contracts.errors import run_cli
from pipeline.synthetic import generate

__all__ = ["generate", "main", "build_config"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m pipeline.generate",
        description="Write synthetic click logs in the Criteo Terabyte layout (day_0..day_N-1) "
        "plus generator_meta.json (seed, parameters, Bayes-optimal AUC).",
    )
    p.add_argument("--out", required=True, help="output directory (created if missing)")
    p.add_argument("--config", help="YAML file; its 'generator' section sets the defaults")
    p.add_argument("--days", type=int)
    p.add_argument("--rows-per-day", type=int)
    p.add_argument("--seed", type=int)
    p.add_argument("--gzip", action="store_true", default=None, help="write day_k.gz")
    p.add_argument("--gzip-level", type=int)
    p.add_argument("--cardinality-scale", type=float, help="factor on the Terabyte per-column vocabularies")
    p.add_argument("--cardinality-floor", type=int)
    p.add_argument("--zipf-exponent", type=float)
    p.add_argument("--click-rate", type=float)
    p.add_argument("--signal-strength", type=float)
    p.add_argument("--chunk-rows", type=int)
    p.add_argument(
        "--uniform-column",
        action="append",
        metavar="COLUMN=VALUES",
        default=None,
        help="draw COLUMN uniformly over VALUES values (repeatable), e.g. C1=2500000",
    )
    p.add_argument(
        "--drift-column",
        action="append",
        metavar="COLUMN=FRACTION",
        default=None,
        help="move COLUMN's popularity order on by FRACTION of its values each day "
        "(repeatable), e.g. C3=0.05",
    )
    p.add_argument("--workers", type=int, help="processes (does not change the output)")
    return p


def build_config(args: argparse.Namespace) -> GeneratorConfig:
    """The config file's generator section (or the defaults), overridden by given flags."""
    config = load_config(args.config).generator if args.config else GeneratorConfig()
    uniform = None
    if args.uniform_column:
        uniform = {**config.uniform_columns, **dict(_column_size(x) for x in args.uniform_column)}
    drift = None
    if args.drift_column:
        drift = {**config.drift_columns, **dict(_column_rate(x) for x in args.drift_column)}
    return flag_overrides(config, args, uniform_columns=uniform, drift_columns=drift)


def _column_size(flag: str) -> tuple[str, int]:
    column, sep, size = flag.partition("=")
    if not sep or not size.strip().isdigit():
        raise ConfigError(f"--uniform-column {flag!r} must look like C1=2500000")
    return column.strip(), int(size)


def _column_rate(flag: str) -> tuple[str, float]:
    column, sep, rate = flag.partition("=")
    try:
        value = float(rate) if sep else None
    except ValueError:
        value = None
    if value is None:
        raise ConfigError(f"--drift-column {flag!r} must look like C3=0.05")
    return column.strip(), value


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    return run_cli("generate", lambda: _generate(args))


def _generate(args: argparse.Namespace) -> int:
    start = time.perf_counter()
    meta = generate(args.out, build_config(args))
    elapsed = time.perf_counter() - start
    summary = {
        "out": args.out,
        "rows": meta["rows"],
        "days": len(meta["days"]),
        "click_rate": round(meta["click_rate"], 5),
        "bayes_auc": None if meta["bayes_auc"] is None else round(meta["bayes_auc"], 5),
        "seconds": round(elapsed, 2),
        "rows_per_second": round(meta["rows"] / elapsed),
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
