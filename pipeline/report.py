"""The run report: a Markdown page with PNG plots, written next to the outputs.

It reads only what the stages left behind (manifests, data-quality report, training metrics,
eval results), so it can be regenerated for any workdir with ``python -m pipeline.report DIR``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from dlrm_contracts.byte_units import human_bytes
from dlrm_contracts.atomic import atomic_file, write_text_atomic
from dlrm_contracts.config import STAGES
from dlrm_contracts.layout import WorkdirLayout
from pipeline.manifest import read_record


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save_figure(fig, out: Path) -> None:
    """A PNG written whole and renamed into place (never through a link planted there)."""
    with atomic_file(out, fsync=False) as temporary:
        fig.savefig(temporary, dpi=90, format="png")


def _read_metrics(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def _auc_points(metrics: list[dict[str, Any]]) -> dict[str, list[tuple[int, float]]]:
    series: dict[str, list[tuple[int, float]]] = {}
    for row in metrics:
        for key, value in row.items():
            if "auc" in key and isinstance(value, (int, float)) and "step" in row:
                name = f"{row['split']} {key}" if "split" in row else key
                if row.get("model"):  # the previous model, scored before a warm start
                    name += f" ({row['model']} model)"
                series.setdefault(name, []).append((row["step"], float(value)))
    return series


def split_final_points(
    points: list[tuple[int, float]],
) -> tuple[list[tuple[int, float]], list[tuple[int, float]]]:
    """(the curve, the final evaluations): the run's model is evaluated once more at its end,
    after the best checkpoint is restored, so that point comes back to an earlier step. Drawn
    on the curve it would run back from the last step; it is a marker of its own."""
    curve: list[tuple[int, float]] = []
    finals: list[tuple[int, float]] = []
    for step, value in points:
        (finals if curve and step <= curve[-1][0] else curve).append((step, value))
    return curve, finals


def smoothed(values: list[float], window: int) -> np.ndarray:
    """A trailing mean over ``window`` values (shorter at the start), the same length as
    ``values``: the per-step loss is too noisy to read a trend from."""
    sums = np.concatenate([[0.0], np.cumsum(np.asarray(values, dtype=np.float64))])
    ends = np.arange(1, len(values) + 1)
    starts = np.maximum(0, ends - window)
    return (sums[ends] - sums[starts]) / (ends - starts)


def _plot_training(metrics: list[dict[str, Any]], out: Path) -> bool:
    losses = [
        (r["step"], r["loss"])
        for r in metrics
        if "loss" in r and "step" in r and isinstance(r["loss"], (int, float))
    ]
    aucs = _auc_points(metrics)
    if not losses and not aucs:
        return False
    plt = _plt()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    if losses:
        steps, values = zip(*losses)
        left.plot(steps, values, lw=0.6, alpha=0.4, label="loss")
        window = max(1, len(values) // 50)
        left.plot(steps, smoothed(list(values), window), lw=1.5, label=f"mean of {window} logged steps")
        left.legend()
    left.set(title="training loss", xlabel="step", ylabel="log loss")
    for name, points in sorted(aucs.items()):
        curve, finals = split_final_points(points)
        line = right.plot(*zip(*curve), marker="o", label=name)[0]
        if finals:
            right.plot(
                *zip(*finals),
                ls="none",
                marker="*",
                markersize=12,
                color=line.get_color(),
                label=f"{name}, the run's model at its end",
            )
    right.set(title="ROC AUC", xlabel="step", ylabel="AUC")
    if aucs:
        right.legend()
    fig.tight_layout()
    _save_figure(fig, out)
    plt.close(fig)
    return True


def _stage_seconds(layout: WorkdirLayout) -> dict[str, float]:
    seconds = {}
    for stage in STAGES:
        manifest = read_record(layout.manifests / f"{stage}.json")
        if manifest:
            seconds[stage] = float(manifest.get("seconds", 0.0))
    return seconds


def _plot_stage_times(seconds: dict[str, float], out: Path) -> bool:
    if not seconds:
        return False
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 3))
    ax.barh(list(seconds), list(seconds.values()), color="tab:blue")
    ax.invert_yaxis()
    ax.set(title="time per stage (last run that did the work)", xlabel="seconds")
    fig.tight_layout()
    _save_figure(fig, out)
    plt.close(fig)
    return True


def _quality_totals(quality: dict[str, Any]) -> dict[str, Any]:
    totals = quality.get("totals", quality)
    return {k: v for k, v in totals.items() if isinstance(v, (int, float, dict))}


def _plot_quality(quality: dict[str, Any], out: Path) -> bool:
    totals = _quality_totals(quality)
    bars = {k: v for k, v in totals.items() if isinstance(v, (int, float)) and k != "reject_rate"}
    rejected = totals.get("rejected_by_reason") or totals.get("rejects_by_reason") or {}
    bars.update({f"rejected: {k}": v for k, v in rejected.items() if isinstance(v, (int, float))})
    if not bars:
        return False
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 0.4 * len(bars) + 1.2))
    ax.barh(list(bars), list(bars.values()), color="tab:orange")
    ax.invert_yaxis()
    ax.set_xscale("symlog")
    ax.set(title="data quality (rows)")
    fig.tight_layout()
    _save_figure(fig, out)
    plt.close(fig)
    return True


def _previous_model_words(summary: dict[str, Any]) -> str:
    """After a warm start: the model it replaced, on the same rows."""
    if summary.get("init") != "previous":
        return ""
    return (
        f" (warm start; the previous model scored {summary.get('previous_model_test_auc')} "
        "on the same rows before training)"
    )


def _stage_table(layout: WorkdirLayout) -> list[str]:
    lines = ["| stage | action | engine | seconds |", "|---|---|---|---|"]
    for stage in STAGES:
        manifest = read_record(layout.manifests / f"{stage}.json")
        if manifest:
            lines.append(
                f"| {stage} | {manifest.get('action')} | {manifest.get('engine')} | "
                f"{manifest.get('seconds')} |"
            )
    return lines


DAILY_COLUMNS = ("time", "status", "init", "next_day_auc", "previous_model_test_auc", "export_version")


def _daily_runs(layout: WorkdirLayout, limit: int = 30) -> list[dict[str, Any]]:
    """The runs of history.jsonl that measured a next-day AUC, oldest first (the last
    ``limit``): a scheduled job's record, one line per day."""
    runs = [
        r
        for r in _read_metrics(layout.manifests / "history.jsonl")
        if isinstance(r.get("next_day_auc"), (int, float))
    ]
    return runs[-limit:]


def _daily_section(layout: WorkdirLayout) -> list[str]:
    runs = _daily_runs(layout)
    if not runs:
        return []
    lines = [
        "",
        "## Daily runs",
        "",
        "next-day AUC: the model trained through day k scored on day k+1 (the test half "
        "of the newest day, never trained on); previous model: the model the run "
        "replaced, on the same rows before training (after a warm start).",
        "",
        "| " + " | ".join(DAILY_COLUMNS) + " |",
        "|" + "---|" * len(DAILY_COLUMNS),
    ]
    lines += ["| " + " | ".join(str(r.get(c, "")) for c in DAILY_COLUMNS) + " |" for r in runs]
    if len(runs) > 1 and _plot_daily(runs, layout.report / "next_day_auc.png"):
        lines += ["", "![next-day AUC per run](next_day_auc.png)"]
    return lines


def _plot_daily(runs: list[dict[str, Any]], out: Path) -> bool:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 3))
    ax.plot(range(1, len(runs) + 1), [r["next_day_auc"] for r in runs], marker="o", label="next-day AUC")
    previous = [
        (i + 1, r["previous_model_test_auc"])
        for i, r in enumerate(runs)
        if isinstance(r.get("previous_model_test_auc"), (int, float))
    ]
    if previous:
        ax.plot(*zip(*previous), marker="x", ls="--", label="previous model, same rows")
    ax.set(title="next-day AUC per run", xlabel="run (oldest first)", ylabel="AUC")
    ax.legend()
    fig.tight_layout()
    _save_figure(fig, out)
    plt.close(fig)
    return True


def _set_aside_section(summary: dict[str, Any]) -> list[str]:
    """The earlier runs' checkpoints a change of the model set aside: where, how big, why."""
    runs = summary.get("checkpoints_set_aside") or []
    if not runs:
        return []
    lines = [
        "",
        "## Checkpoints set aside",
        "",
        "Earlier runs' checkpoints, moved aside (not deleted) when a setting of the model, "
        "the dataset or --force started a new run. Remove one with `rm -r FOLDER`.",
        "",
        "| folder | size | why |",
        "|---|---|---|",
    ]
    for run in runs:
        lines.append(
            f"| `{run.get('path')}` | {human_bytes(run.get('bytes') or 0)} | "
            f"{run.get('reason') or 'not recorded'} |"
        )
    return lines


def write_report(layout: WorkdirLayout) -> Path:
    layout.report.mkdir(parents=True, exist_ok=True)
    summary = read_record(layout.root / "summary.json") or {}
    quality = read_record(layout.data_quality) or {}
    metrics = _read_metrics(layout.logs / "metrics.jsonl")
    lines = [
        "# Pipeline run report",
        "",
        f"Workdir: `{layout.root}`",
        "",
        f"Status: **{summary.get('status', 'unknown')}** — threshold "
        f"`{summary.get('threshold')}`, test AUC {summary.get('test_auc')}, "
        f"validation AUC {summary.get('validation_auc')}, next-day AUC "
        f"{summary.get('next_day_auc')}" + _previous_model_words(summary),
        "",
        "## Stages",
        "",
    ]
    lines += _stage_table(layout)
    if _plot_stage_times(_stage_seconds(layout), layout.report / "stage_times.png"):
        lines += ["", "![time per stage](stage_times.png)"]
    lines += [
        "",
        "## Data",
        "",
        f"Rows per split: `{summary.get('rows')}`",
        "",
        f"Table sizes: `{summary.get('table_sizes')}`",
    ]
    if quality:
        lines += ["", "Data quality totals: `" + json.dumps(_quality_totals(quality)) + "`"]
        if _plot_quality(quality, layout.report / "data_quality.png"):
            lines += ["", "![data quality](data_quality.png)"]
    lines += ["", "## Training", ""]
    if _plot_training(metrics, layout.report / "training.png"):
        lines += ["![loss and AUC](training.png)"]
    else:
        lines += ["No training metrics yet."]
    lines += _daily_section(layout)
    lines += _set_aside_section(summary)
    path = layout.report / "report.md"
    write_text_atomic(path, "\n".join(lines) + "\n", fsync=False)
    return path


if __name__ == "__main__":
    print(write_report(WorkdirLayout.at(sys.argv[1] if len(sys.argv) > 1 else "workdir")))
