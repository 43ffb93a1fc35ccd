"""How well a pipeline run said where it was: progress lines' gaps and the ETA's error per stage.

Reads a finished run's workdir (its log, its stages' progress channels and manifests) and
prints, per stage that ran:

* the progress lines the log got between ``<stage> running`` and ``<stage> ran`` and the
  longest gap between two of them (from the log's millisecond timestamps);
* the ETA the display showed (replayed from the channel's records through the same
  ``StageEstimate``) against the time that was really left, as ETA / actual: at the first
  report with 10% of the stage done, and the worst over every report from 10% on while at
  least ``--min-left`` seconds were left (at the very end both numbers are near zero and
  their ratio says nothing).

Usage (the run, then this on its workdir)::

    ./run_pipeline.sh --workdir /tmp/tb --config tb.yaml > tb.out 2> tb.err
    .venv/bin/python bench/bench_progress.py /tmp/tb

The last stdout line is the table as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from dlrm_contracts.progress import ChannelReader, StageEstimate  # noqa: E402
from dlrm_contracts.config import STAGES  # noqa: E402


def log_lines(workdir: Path) -> list[tuple[float, str]]:
    """(epoch seconds, message) of every INFO line of the run's logs, oldest log first."""
    out = []
    for path in sorted((workdir / "logs").glob("pipeline-*.log")):
        for line in path.read_text().splitlines():
            stamp, level, message = (line.split(" ", 2) + ["", ""])[:3]
            if level == "INFO":
                out.append((datetime.fromisoformat(stamp).timestamp(), message))
    return out


def line_gaps(lines: list[tuple[float, str]], stage: str) -> tuple[int, float] | None:
    """(progress lines, longest gap in s) from the stage's last ``running`` to its ``ran``."""
    starts = [i for i, (_, m) in enumerate(lines) if m.startswith(f"{stage:<10} running")]
    if not starts:
        return None
    start = starts[-1]
    end = next((i for i in range(start, len(lines)) if lines[i][1].startswith(f"{stage:<10} ran")), None)
    if end is None:
        return None
    marks = [lines[start][0]]
    count = 0
    for stamp, message in lines[start + 1 : end]:
        if message.startswith(stage) and " · elapsed " in message:
            marks.append(stamp)
            count += 1
    marks.append(lines[end][0])
    return count, max(b - a for a, b in zip(marks, marks[1:]))


def _badness(ratio: float) -> float:
    """How far from right, whichever way: 2 for half or twice the time left."""
    return max(ratio, 1 / ratio) if ratio > 0 else float("inf")


def eta_errors(workdir: Path, stage: str, min_left: float) -> dict | None:
    """ETA / actual time left, replayed from the stage's channel and manifest."""
    channel = workdir / "logs" / f"{stage}.progress.jsonl"
    manifest = workdir / "manifests" / f"{stage}.json"
    if not channel.exists() or not manifest.exists():
        return None
    meta = json.loads(manifest.read_text())
    started = datetime.strptime(meta["started"], "%Y-%m-%dT%H:%M:%S%z").timestamp()
    ended = started + meta["seconds"]
    estimate = StageEstimate(stage, started=started)
    at_10, worst, samples = None, None, 0
    for record in ChannelReader(channel, stage).read():
        estimate.update(record, now=record.time)
        eta, left = estimate.eta(now=record.time), ended - record.time
        if record.fraction is None or record.fraction < 0.10 or eta is None or left < min_left:
            continue
        ratio = eta / left
        samples += 1
        if at_10 is None:
            at_10 = {
                "fraction": round(record.fraction, 3),
                "eta_s": round(eta, 1),
                "left_s": round(left, 1),
                "ratio": round(ratio, 2),
            }
        if worst is None or _badness(ratio) > _badness(worst):
            worst = ratio
    return {
        "seconds": round(meta["seconds"], 1),
        "at_10_percent": at_10,
        "worst_ratio": None if worst is None else round(worst, 2),
        "reports_judged": samples,
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("workdir", type=Path)
    parser.add_argument(
        "--min-left",
        type=float,
        default=30.0,
        help="judge the ETA only while at least this many seconds were left",
    )
    args = parser.parse_args()
    lines = log_lines(args.workdir)
    table = {}
    print(
        f"{'stage':<11}{'seconds':>9}{'lines':>7}{'max gap s':>11}   ETA/actual at 10%"
        "            worst from 10% on"
    )
    for stage in STAGES:
        gaps = line_gaps(lines, stage)
        if gaps is None:
            continue
        errors = eta_errors(args.workdir, stage, args.min_left) or {}
        table[stage] = {"progress_lines": gaps[0], "max_gap_s": gaps[1], **errors}
        at_10 = errors.get("at_10_percent")
        shown = (
            f"{at_10['ratio']:.2f} (ETA {at_10['eta_s']:.0f} s, left {at_10['left_s']:.0f} s)"
            if at_10
            else "-"
        )
        worst = errors.get("worst_ratio")
        print(
            f"{stage:<11}{errors.get('seconds', float('nan')):>9.1f}{gaps[0]:>7}{gaps[1]:>11.0f}"
            f"   {shown:<29}{'-' if worst is None else f'{worst:.2f}':>6}"
            f"  ({errors.get('reports_judged', 0)} reports)"
        )
    print(json.dumps(table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
