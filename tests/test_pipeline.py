"""The pipeline end to end, for real: generator, local Spark, converters, horovodrun with 2 ranks.

One module-scoped end-to-end run feeds several checks (the lock, its children under it, the
rerun that skips, the threshold raise without Spark: those two reruns are the command line run
in this process); the kill-and-restart test compares against an uninterrupted run made from
the same raw files (in this process, on the shared Spark session).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from datetime import datetime
from pathlib import Path

import pytest

from dlrm_contracts.errors import ExitCode
from dlrm_contracts.progress import Progress
from pipeline_helpers import pipeline_cmd, run, run_here, same_tree

pytestmark = [pytest.mark.spark, pytest.mark.horovod, pytest.mark.slow]

DAYS, ROWS_PER_DAY = 3, 3000
SMALL_CONFIG = f"""
generator:
  days: {DAYS}
  rows_per_day: {ROWS_PER_DAY}
  seed: 4242
spark:
  driver_memory: 2g
preprocess:
  frequency_threshold: "2"
convert:
  batch_rows: 512
train:
  preset: small
  batch_size: 512
  warmup_steps: 5
  learning_rate: 0.2
launch:
  np: 2
progress:
  interval_s: 5
"""


def manifest(workdir: Path, stage: str) -> dict:
    return json.loads((workdir / "manifests" / f"{stage}.json").read_text())


def parquet_rows(split_dir: Path) -> list[tuple]:
    import pyarrow.parquet as pq

    files = sorted(split_dir.glob("*.parquet"))
    table = pq.read_table(files) if files else None
    return (
        [] if table is None else list(zip(*[table.column(i).to_pylist() for i in range(table.num_columns)]))
    )


@pytest.fixture(scope="module")
def config_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("config") / "pipeline.yaml"
    path.write_text(SMALL_CONFIG)
    return path


@pytest.fixture(scope="module")
def e2e(tmp_path_factory, config_file):
    """A full default-stage run with --np 2, and a second run started while it holds the lock."""
    workdir = tmp_path_factory.mktemp("e2e")
    first = subprocess.Popen(
        pipeline_cmd(workdir, config_file, "--np", "2", "--max-steps", "30"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 600  # a bound, not a wait: the loop ends when the lock is taken
    lock = workdir / ".pipeline.lock"
    while time.time() < deadline and not (lock.exists() and lock.read_text().strip()):
        time.sleep(0.2)
    second, _ = run(workdir, config_file, "--stages", "generate")
    out, err = first.communicate(timeout=900)
    assert first.returncode == 0, err[-4000:]
    summary = json.loads(out.strip().splitlines()[-1])
    return workdir, summary, second


def test_end_to_end_with_two_ranks(e2e):
    workdir, summary, _ = e2e
    assert summary["status"] == "ok"
    assert set(summary["stages"]) == {"generate", "preprocess", "convert", "train", "eval"}
    assert all(
        summary["stages"][s]["action"] == "ran" for s in ("generate", "preprocess", "convert", "train")
    )
    assert summary["stages"]["train"]["engine"] == "horovod"
    # eval adopts the trainer's own final evaluation of the checkpoint it kept
    assert summary["stages"]["eval"]["action"] == "derived", summary["stages"]["eval"]
    evaluation = json.loads((workdir / "eval.json").read_text())
    assert evaluation["evaluated_by"] == "train" and evaluation["ranks"] == 2, evaluation
    assert summary["test_auc"] == evaluation["test_auc"]
    rows = summary["rows"]
    quality = json.loads((workdir / "parquet" / "data_quality.json").read_text())
    rows_in = quality["totals"]["rows_read"]
    assert rows_in == DAYS * ROWS_PER_DAY
    assert rows["train"] + rows["test"] + rows["validation"] == rows_in - quality["totals"]["rows_rejected"]
    assert abs(rows["test"] - rows["validation"]) <= 1
    assert len(summary["table_sizes"]) == 26 and min(summary["table_sizes"]) >= 2
    assert 0.0 <= summary["test_auc"] <= 1.0 and 0.0 <= summary["validation_auc"] <= 1.0
    # the newest day is held out: its test half's AUC is the model's next-day AUC
    assert summary["next_day_auc"] == summary["test_auc"] and summary["init"] == "scratch"
    assert summary["previous_model_test_auc"] is None and summary["export_version"] is None
    for path in (
        "parquet/model_size.json",
        "binary/model_size.json",
        "binary/_SUCCESS",
        "report/report.md",
        "report/stage_times.png",
        "summary.json",
    ):
        assert (workdir / path).exists(), path
    assert list((workdir / "logs").glob("pipeline-*.log"))


def test_the_pipeline_runs_its_wings_under_its_own_lock(e2e):
    """The preprocess stage is ``python -m spark_jobs`` and the train stage horovodrun's two
    ranks, children of the pipeline, which holds the workdir's lock: they run under it (the
    stages ran, exit 0), not refused with exit 3 as another writer would be
    (tests/test_workdir_lock.py)."""
    workdir, summary, _ = e2e
    assert summary["stages"]["preprocess"]["action"] == "ran", summary
    assert (workdir / "parquet" / "_SUCCESS").is_file()
    assert summary["stages"]["train"]["action"] == "ran" and summary["stages"]["train"]["engine"] == "horovod"


def _log_lines(workdir: Path) -> list[tuple[datetime, str]]:
    """(time, message) of the e2e run's log (the refused second run leaves a log too)."""
    for path in sorted((workdir / "logs").glob("pipeline-*.log")):
        text = path.read_text()
        if "train      ran" in text:
            return [
                (datetime.fromisoformat(stamp), message)
                for stamp, level, message in (
                    line.split(" ", 2) for line in text.splitlines() if line.count(" ") >= 2
                )
                if level == "INFO"
            ]
    raise AssertionError("no log of the e2e run")


def test_every_stage_says_where_it_is_and_the_summary_keeps_its_rate(e2e):
    workdir, summary, _ = e2e
    ran = {name: stage for name, stage in summary["stages"].items() if stage["action"] == "ran"}
    assert set(ran) == {"generate", "preprocess", "convert", "train"}  # eval: derived from train
    for name, stage in ran.items():
        assert stage["rows"] > 0 and stage["rows_per_s"] > 0 and stage["cpu_seconds"] > 0, name
    history = json.loads((workdir / "manifests" / "history.jsonl").read_text().splitlines()[0])
    assert history["stages"]["preprocess"]["cpu_seconds"] == summary["stages"]["preprocess"]["cpu_seconds"]
    lines = _log_lines(workdir)
    for name in ("preprocess", "convert", "train"):  # eval's own: tests/test_launch.py
        records = [
            Progress.from_line(line)
            for line in (workdir / "logs" / f"{name}.progress.jsonl").read_text().splitlines()
        ]
        assert records and records[-1].fraction == pytest.approx(1.0), name
        # from "running" to "ran": a progress line at least every interval_s (5 s here)
        start = next(i for i, (_, m) in enumerate(lines) if m.startswith(f"{name:<10} running"))
        end = next(i for i, (_, m) in enumerate(lines) if m.startswith(f"{name:<10} ran"))
        times = [
            t
            for t, m in lines[start : end + 1]
            if m.startswith(f"{name:<10} r") or (m.startswith(name) and " · elapsed" in m)
        ]
        assert len(times) >= 2, (name, lines[start : end + 1])
        gaps = [(b - a).total_seconds() for a, b in zip(times, times[1:])]
        # the slack is for a loaded machine's thread wake-ups (5.4 s seen at load 16); a
        # line missed still fails, since two intervals would have passed
        assert max(gaps) <= 7.5, (name, gaps)


def test_second_concurrent_run_refuses_with_its_own_exit_code(e2e):
    _, _, second = e2e
    assert second.returncode == ExitCode.LOCKED, second.stderr[-2000:]
    assert "in use by another pipeline run" in second.stderr


def test_rerun_with_nothing_changed_skips_every_stage(e2e, config_file):
    workdir, _, _ = e2e
    proc, summary = run_here(workdir, config_file, "--np", "2", "--max-steps", "30")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert {s["action"] for s in summary["stages"].values()} == {"skipped"}


@pytest.fixture(scope="module")
def scratch_at_5(tmp_path_factory, e2e, spark):
    """Preprocess + convert from scratch at threshold 5 on the e2e run's raw files: the
    reference the CLI's runs are compared with, made in this process on the shared Spark
    session (tests/conftest.py), without a JVM of its own."""
    from converters.convert import convert_parquet
    from dlrm_contracts.config import ConvertConfig, PreprocessConfig, SparkConfig
    from dlrm_contracts.layout import WorkdirLayout
    from spark_jobs.preprocess import run_preprocess

    layout = WorkdirLayout.at(tmp_path_factory.mktemp("scratch5"))
    run_preprocess(
        e2e[0] / "raw",
        layout.root,
        SparkConfig(master="local[2]", driver_memory="2g"),
        PreprocessConfig(frequency_threshold="5"),
    )
    convert_parquet(layout.parquet, layout.binary, ConvertConfig(batch_rows=512, progress=False))
    return layout.root


def test_raising_the_threshold_runs_no_spark_and_equals_a_scratch_run(e2e, config_file, scratch_at_5):
    workdir, _, _ = e2e
    proc, summary = run_here(
        workdir, config_file, "--frequency-threshold", "5", "--stages", "preprocess,convert"
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert manifest(workdir, "preprocess")["engine"] != "spark"
    assert manifest(workdir, "preprocess")["action"] == "skipped"
    assert manifest(workdir, "convert")["engine"] == "rethreshold"
    assert summary["stages"]["preprocess"]["action"] == "skipped"
    differ = same_tree(workdir / "binary", scratch_at_5 / "binary", ignore=("dataset.json",))
    assert differ == []
    ours = json.loads((workdir / "binary" / "dataset.json").read_text())
    theirs = json.loads((scratch_at_5 / "binary" / "dataset.json").read_text())
    for key in ("splits", "table_sizes", "cat_dtypes", "threshold_spec"):
        assert ours[key] == theirs[key], key


def _kill_when(proc: subprocess.Popen, ready, timeout: float = 300) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        if ready():
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=60)
            return
        time.sleep(0.02)
    raise AssertionError("the pipeline ended before the kill point was reached")


def test_killed_runs_restart_to_the_same_outputs(tmp_path, e2e, config_file, scratch_at_5):
    raw = e2e[0] / "raw"
    workdir = tmp_path / "killed"
    cmd = pipeline_cmd(
        workdir,
        config_file,
        "--input",
        str(raw),
        "--frequency-threshold",
        "5",
        "--stages",
        "preprocess,convert",
    )

    def start():
        return subprocess.Popen(
            cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )

    # 1. Killed while Spark is working: it has begun writing under the workdir, no marker yet.
    def spark_writing() -> bool:
        return any(
            any(p.is_file() for p in (workdir / d).rglob("*"))
            for d in ("counts", "parquet")
            if (workdir / d).exists()
        )

    _kill_when(start(), spark_writing)
    assert not (workdir / "manifests" / "preprocess.done").exists()
    # 2. Restarted and killed while converting: a temporary binary directory exists.
    _kill_when(start(), lambda: any(p.name.startswith(".binary.tmp-") for p in workdir.iterdir()))
    assert not (workdir / "manifests" / "convert.done").exists()
    # 3. Restarted to the end (its main in this process: the Spark job is still a process).
    proc, summary = run_here(
        workdir,
        config_file,
        "--input",
        str(raw),
        "--frequency-threshold",
        "5",
        "--stages",
        "preprocess,convert",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    for split in ("train", "test", "validation"):
        assert parquet_rows(workdir / "parquet" / split) == parquet_rows(scratch_at_5 / "parquet" / split)
    assert same_tree(workdir / "binary", scratch_at_5 / "binary", ignore=("dataset.json",)) == []
    assert not [p for p in workdir.iterdir() if p.name.startswith(".binary.tmp-")]
