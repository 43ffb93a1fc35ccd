"""The preflight's time estimate against what a finished run took, stage by stage.

Reads a finished run's workdir (its effective config, its dataset's rows, its summary's
seconds per stage) and works out, with today's ``preflight`` settings (``--config``), the
estimate the preflight gives for that run on this machine (the cached calibration,
``pipeline.calibration``) under a given load: ``--load`` is
the other jobs' load as the run started (the 1-minute load average then, less one for the
preflight itself); without it, the load now. Prints per stage the estimate (the likely
figure; the bound in brackets when early stopping makes them differ), the actual seconds and
their ratio, then the same as one JSON line.

Usage (the run, then this on its workdir)::

    uptime; .venv/bin/python -m pipeline --workdir /tmp/w > w.out 2> w.err
    .venv/bin/python bench/bench_preflight.py /tmp/w --load 1.3
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from dlrm_contracts.config import load_config  # noqa: E402
from pipeline import calibration  # noqa: E402
from pipeline.preflight_needs import other_load, time_needs  # noqa: E402

TIMED = ("preprocess", "convert", "train", "eval")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("workdir", type=Path)
    parser.add_argument("--load", type=float, help="other jobs' load as the run started")
    parser.add_argument(
        "--config",
        help="the preflight section to estimate with (default: the product's defaults, not the run's)",
    )
    args = parser.parse_args()
    summary = json.loads((args.workdir / "summary.json").read_text())
    ran = [s for s in TIMED if summary["stages"].get(s, {}).get("action") == "ran"]
    config = load_config(str(args.workdir / "manifests" / "effective_config.yaml"))
    # the run's settings, today's rates: an older run's effective config holds the rates of
    # its day
    config = dataclasses.replace(config, stages=ran, preflight=load_config(args.config).preflight)
    splits = summary["rows"]
    rows = sum(splits.values())
    speed = calibration.speed(config.preflight, print)
    load = other_load() if args.load is None else args.load
    needs = time_needs(config, rows, splits["test"] + splits["validation"], speed=speed, load=load)
    out = {"workdir": str(args.workdir), "load": load, "speed": dataclasses.asdict(speed), "stages": {}}
    print(f"{args.workdir}: {rows:,} rows, load {load:.1f}; {speed.source}")
    for part in needs.stages:
        actual = summary["stages"][part.stage]["seconds"]
        bound = f" [{part.seconds:.1f}]" if part.likely is not None else ""
        print(
            f"{part.stage:<10} estimate {part.expected:8.1f} s{bound:<10} actual "
            f"{actual:8.1f} s  actual/estimate {actual / part.expected:5.2f}"
        )
        out["stages"][part.stage] = {
            "estimate": round(part.expected, 1),
            "bound": round(part.seconds, 1),
            "actual": actual,
            "ratio": round(actual / part.expected, 2),
        }
    actual_total = sum(summary["stages"][s]["seconds"] for s in out["stages"])
    print(
        f"{'total':<10} estimate {needs.expected_total:8.1f} s{'':<10} actual "
        f"{actual_total:8.1f} s  actual/estimate {actual_total / needs.expected_total:5.2f}"
    )
    out["total"] = {"estimate": round(needs.expected_total, 1), "actual": round(actual_total, 1)}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
