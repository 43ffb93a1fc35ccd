"""Disk: the preflight's refusal, the lean-disk mode, and a disk that fills up at each stage.

Full disks are real: small tmpfs filesystems mounted for the test (root only; the tests that
need one are skipped elsewhere), filled with a ballast file to leave a chosen amount free.
The manifest write is also failed by injection, in-process, so that one runs everywhere.
Spark runs: one normal run at threshold 5 (the reference), one run that dies of a full
``spark.local.dir`` and its rerun in the lean mode, raised to 5 without Spark afterwards.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from dlrm_contracts.errors import ExitCode
from pipeline_helpers import run, run_here, run_in_process, same_tree

SMALL = """
spark:
  driver_memory: 2g
convert:
  batch_rows: 512
train:
  preset: small
  batch_size: 512
  warmup_steps: 5
  learning_rate: 0.2
launch:
  np: 1
"""
LEAN = SMALL + "preprocess:\n  keep_parquet: false\n"
DAYS, ROWS_PER_DAY = 3, 3000  # the generated input of the Spark runs


# ---------------------------------------------------------------- small filesystems
def _can_mount() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0 and shutil.which("mount") is not None


@contextlib.contextmanager
def tmpfs(path: Path, size: str):
    path.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True, text=True
    )
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def fill(path: Path, leave: int) -> Path:
    """A ballast file that leaves ``leave`` bytes free on ``path``'s filesystem."""
    ballast = path / f".ballast-{uuid.uuid4().hex}"
    free = shutil.disk_usage(path).free
    with open(ballast, "wb") as fh:
        os.posix_fallocate(fh.fileno(), 0, max(1, free - leave))
    return ballast


needs_mount = pytest.mark.skipif(not _can_mount(), reason="mounting a tmpfs needs root")


def assert_one_line_disk_full(proc, summary, stage: str, path_part: str) -> None:
    assert proc.returncode == ExitCode.DISK_FULL, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = [l for l in proc.stderr.splitlines() if "disk full:" in l]
    assert len(lines) == 1, proc.stderr[-3000:]
    assert f"stage {stage}" in lines[0] and path_part in lines[0] and "free on its filesystem" in lines[0]
    assert summary is not None and summary["status"] == "failed: disk_full"
    if stage == "setup":  # before the first stage (the effective config, the lock, the logs)
        assert summary["stages"] == {}
    else:
        assert summary["stages"][stage]["action"] == "failed"


# ---------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def configs(tmp_path_factory):
    root = tmp_path_factory.mktemp("configs")
    (root / "small.yaml").write_text(SMALL)
    (root / "lean.yaml").write_text(LEAN)
    return root


@pytest.fixture(scope="module")
def raw(tmp_path_factory):
    out = tmp_path_factory.mktemp("raw")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pipeline.generate",
            "--out",
            str(out),
            "--days",
            str(DAYS),
            "--rows-per-day",
            str(ROWS_PER_DAY),
            "--seed",
            "4242",
        ],
        check=True,
        capture_output=True,
    )
    return out


@pytest.fixture(scope="module")
def fresh5(tmp_path_factory, raw):
    """The reference: Spark from scratch at threshold 5, then a conversion, parquet kept (in
    this process, on the shared local session: no second JVM start)."""
    from converters.convert import convert_parquet
    from dlrm_contracts.config import ConvertConfig, PreprocessConfig, SparkConfig
    from dlrm_contracts.layout import WorkdirLayout
    from spark_jobs.preprocess import run_preprocess

    layout = WorkdirLayout.at(tmp_path_factory.mktemp("fresh5"))
    run_preprocess(
        raw,
        layout.root,
        SparkConfig(master="local[2]", driver_memory="2g"),
        PreprocessConfig(frequency_threshold="5"),
    )
    convert_parquet(layout.parquet, layout.binary, ConvertConfig(batch_rows=512, progress=False))
    return layout.root


@pytest.fixture(scope="module")
def lean(tmp_path_factory, raw):
    """A lean-mode run whose Spark job dies of a full spark.local.dir, then the same command
    once space is freed. Returns the workdir, the config and the first run's result."""
    if not _can_mount():
        pytest.skip("mounting a tmpfs needs root")
    root = tmp_path_factory.mktemp("lean")
    workdir = root / "w"
    with tmpfs(root / "local", "4m") as local:
        config = root / "lean.yaml"
        config.write_text(LEAN.replace("spark:\n", f"spark:\n  local_dir: {local}\n"))
        ballast = fill(local, 16 * 1024)
        first = run(workdir, config, "--input", str(raw), "--stages", "preprocess,convert", "--force")
        ballast.unlink()  # space freed (and the filesystem grown): the same command, without
        subprocess.run(["mount", "-o", "remount,size=256m", str(local)], check=True)  # --force
        second, _ = run(workdir, config, "--input", str(raw), "--stages", "preprocess,convert")
        assert second.returncode == 0, second.stderr[-3000:]
    return workdir, config, first, local


# ---------------------------------------------------------------- preflight
@needs_mount
def test_preflight_refuses_a_workdir_too_small_before_any_stage(tmp_path, configs):
    with tmpfs(tmp_path / "fs", "2m") as fs:
        workdir = fs / "w"
        # The embedded default: generate alone writes ~46 MiB of text.
        proc, summary = run(workdir, configs / "small.yaml")
        assert proc.returncode == ExitCode.INPUT_DATA, proc.stderr[-3000:]
        refusal = [l for l in proc.stderr.splitlines() if "preflight: " in l]
        assert len(refusal) == 1 and "needs" in refusal[0] and "free" in refusal[0]
        assert str(workdir) in refusal[0]
        assert summary["status"] == "failed: preflight" and summary["stages"] == {}
        assert not (workdir / "raw").exists()
        alone = subprocess.run(
            [
                sys.executable,
                "-m",
                "pipeline",
                "preflight",
                "--workdir",
                str(workdir),
                "--config",
                str(configs / "small.yaml"),
            ],
            capture_output=True,
            text=True,
        )
        assert alone.returncode == ExitCode.INPUT_DATA
        assert "disk: workdir" in alone.stdout and "time: total" in alone.stdout
        # --force overrides: the run starts, and the full disk then stops it with its own code.
        proc, summary = run(workdir, configs / "small.yaml", "--stages", "generate", "--force")
        assert_one_line_disk_full(proc, summary, "generate", str(workdir))


def test_rows_are_estimated_from_a_sample_of_each_file(tmp_path):
    import gzip
    import random

    from pipeline.preflight import bytes_per_line

    rng = random.Random(7)
    lines = [
        "\t".join(
            [str(rng.randint(0, 1))]
            + [str(rng.randint(0, 10 ** rng.randint(1, 6))) for _ in range(13)]
            + ["%08x" % rng.getrandbits(32) if rng.random() > 0.2 else "" for _ in range(26)]
        )
        for _ in range(40_000)
    ]
    text = ("\n".join(lines) + "\n").encode()
    (tmp_path / "day_0").write_bytes(text)
    (tmp_path / "day_1.gz").write_bytes(gzip.compress(text, 1))
    for name in ("day_0", "day_1.gz"):
        path = tmp_path / name
        sampled = path.stat().st_size / bytes_per_line(path, 256 * 1024)
        assert abs(sampled - 40_000) / 40_000 < 0.05, (name, sampled)
        assert round(path.stat().st_size / bytes_per_line(path, 2**30)) == 40_000  # whole file


@pytest.mark.spark
def test_preflight_uses_the_counts_for_rows_and_embedding_memory(tmp_path, lean, raw):
    workdir = lean[0]
    tight = tmp_path / "tight.yaml"
    tight.write_text(SMALL + "preflight:\n  rank_memory_gib: 6.00001\n")  # ~10 KiB for tables
    proc, _ = run_in_process(
        tmp_path, "preflight", "--workdir", str(workdir), "--input", str(raw), "--config", str(tight)
    )
    assert proc.returncode == ExitCode.INPUT_DATA, proc.stdout + proc.stderr
    assert f"{DAYS * ROWS_PER_DAY:,} rows (counted by the last preprocess run)" in proc.stdout
    # The default optimizer's state (Adagrad's accumulators) is counted with the tables.
    assert "embedding tables + optimizer state per rank" in proc.stdout
    assert "fullest rank" in proc.stderr
    facts = json.loads(proc.stdout.strip().splitlines()[-1])
    quality = json.loads((workdir / "parquet" / "data_quality.json").read_text())
    assert facts["rows"] == quality["totals"]["rows_read"] == DAYS * ROWS_PER_DAY
    from dlrm_contracts.binary_format import model_size_list

    model_size = workdir / "parquet" / "model_size.json"  # the parquet's threshold: 2, as asked
    sizes = model_size_list(json.loads(model_size.read_text()), model_size)
    from dlrm_contracts.config import OPTIMIZER_STATE_FACTOR, TrainConfig

    copies = OPTIMIZER_STATE_FACTOR[TrainConfig().optimizer]
    assert copies == 2  # value + accumulator
    # dim 16 + the wide term's column (train.wide, on by default)
    assert TrainConfig().wide
    assert sum(facts["embedding_bytes_per_rank"]) == sum(sizes) * (16 + 1) * 4 * copies


@pytest.mark.parametrize("ids", ["frequency", "stable"])
def test_stable_ids_tables_are_at_least_the_last_runs(tmp_path, ids):
    """Stable ids keep the ids of values that left the window: the preflight's tables are
    never below the last run's sizes; frequency ids follow the histogram alone."""
    from dlrm_contracts.config import PipelineConfig, PreprocessConfig
    from dlrm_contracts.layout import WorkdirLayout
    from dlrm_contracts.schema import CAT_COLUMNS
    from pipeline.preflight import _table_sizes
    from dlrm_contracts.table_sizes import write_histogram

    layout = WorkdirLayout.at(tmp_path)
    layout.counts.mkdir(parents=True)
    write_histogram({c: [(1, 50), (3, 10)] for c in CAT_COLUMNS}, layout.counts)
    layout.parquet_model_size.parent.mkdir(parents=True)
    last = {c: 100 if c == "C3" else 5 for c in CAT_COLUMNS}
    layout.parquet_model_size.write_text(json.dumps(last))
    config = PipelineConfig(
        workdir=str(tmp_path), preprocess=PreprocessConfig(frequency_threshold="2", ids=ids)
    )
    sizes = dict(zip(CAT_COLUMNS, _table_sizes(config, layout)))
    assert sizes["C1"] == 11  # 10 values counted 3 times + id 0
    assert sizes["C3"] == (100 if ids == "stable" else 11)


@pytest.mark.spark
def test_tables_unknown_up_front_are_checked_again_before_train(tmp_path, fresh5):
    """No counts at the start (binary dataset only): the tables per rank are checked once the
    train stage is next, before any trainer process starts."""
    workdir = tmp_path / "w"
    _copy_into(fresh5, workdir, ("binary",))
    tight = tmp_path / "tight.yaml"
    tight.write_text(SMALL + "preflight:\n  rank_memory_gib: 6.00001\n")
    proc, summary = run_here(workdir, tight, "--stages", "train", "--input", str(tmp_path))
    assert proc.returncode == ExitCode.INPUT_DATA, proc.stderr[-3000:]
    assert "not known until the counts exist" in proc.stderr
    assert "preflight (before train) memory: embedding tables" in proc.stderr
    assert summary["status"] == "failed: preflight"
    assert not (workdir / "logs" / "train.log").exists()  # no trainer was started


# ---------------------------------------------------------------- lean disk + Spark full
@pytest.mark.spark
def test_a_full_spark_local_dir_fails_preprocess_in_one_line(lean):
    workdir, _config, (proc, summary), local = lean
    assert_one_line_disk_full(proc, summary, "preprocess", str(local))
    assert "convert" not in summary["stages"]
    history = [json.loads(l) for l in (workdir / "manifests" / "history.jsonl").read_text().splitlines()]
    assert history[0]["status"] == "failed: disk_full"  # and nothing was marked done then:
    assert history[1]["stages"]["preprocess"]["action"] == "ran"


@pytest.mark.spark
def test_lean_mode_removes_the_parquet_and_a_raise_still_equals_a_fresh_run(lean, raw, fresh5):
    workdir, config, _first, _local = lean
    parquet = workdir / "parquet"
    assert not any((parquet / s).exists() for s in ("train", "test", "validation"))
    removed = json.loads((parquet / "_REMOVED.json").read_text())
    assert removed["removed"] == ["train", "test", "validation"] and removed["bytes"] > 0
    for stage in ("preprocess", "convert"):
        manifest = json.loads((workdir / "manifests" / f"{stage}.json").read_text())
        assert manifest["summary"]["parquet_removed"]["time"] == removed["time"], stage
    assert (workdir / "counts" / "histogram.parquet").exists()

    # (these three: the command line in this process; none runs Spark, nor should it)
    proc, summary = run_here(workdir, config, "--input", str(raw), "--stages", "preprocess,convert")
    assert proc.returncode == 0 and {s["action"] for s in summary["stages"].values()} == {"skipped"}

    proc, summary = run_here(
        workdir, config, "--input", str(raw), "--stages", "preprocess,convert", "--frequency-threshold", "5"
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert summary["stages"]["preprocess"]["action"] == "skipped"
    assert summary["stages"]["convert"]["engine"] == "rethreshold"
    assert same_tree(workdir / "binary", fresh5 / "binary", ignore=("dataset.json",)) == []
    ours = json.loads((workdir / "binary" / "dataset.json").read_text())
    theirs = json.loads((fresh5 / "binary" / "dataset.json").read_text())
    for key in ("splits", "table_sizes", "cat_dtypes", "threshold_spec"):
        assert ours[key] == theirs[key], key

    # Back to threshold 2 with the convert stage alone: that needs the parquet, and says so.
    before = (workdir / "binary" / "dataset.json").read_text()
    proc, summary = run_here(
        workdir, config, "--input", str(raw), "--stages", "convert", "--frequency-threshold", "2"
    )
    assert proc.returncode == ExitCode.CONVERT, proc.stderr[-3000:]
    assert "needs the parquet splits, which were removed" in proc.stderr
    assert "--stages preprocess,convert --force" in proc.stderr
    assert (workdir / "binary" / "dataset.json").read_text() == before


# ---------------------------------------------------------------- full disk: convert, train
def _copy_into(src: Path, dst: Path, names: tuple[str, ...]) -> None:
    for name in names:
        shutil.copytree(src / name, dst / name)


@needs_mount
@pytest.mark.spark
def test_full_disk_in_convert_then_rerun_is_byte_identical(tmp_path, configs, fresh5):
    with tmpfs(tmp_path / "fs", "8m") as fs:
        workdir = fs / "w"
        _copy_into(fresh5, workdir, ("parquet", "counts"))
        ballast = fill(fs, 64 * 1024)
        proc, summary = run(
            workdir,
            configs / "small.yaml",
            "--stages",
            "convert",
            "--force",
            "--frequency-threshold",
            "5",
            "--input",
            str(fs),
        )
        assert_one_line_disk_full(proc, summary, "convert", str(workdir))
        assert not (workdir / "manifests" / "convert.done").exists()
        assert not (workdir / "binary" / "_SUCCESS").exists()
        ballast.unlink()
        proc, summary = run(
            workdir,
            configs / "small.yaml",
            "--stages",
            "convert",
            "--frequency-threshold",
            "5",
            "--input",
            str(fs),
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert same_tree(workdir / "binary", fresh5 / "binary", ignore=("dataset.json",)) == []


@needs_mount
@pytest.mark.spark
def test_full_disk_when_checkpointing_then_rerun_completes(tmp_path, configs, fresh5):
    with tmpfs(tmp_path / "fs", "8m") as fs:
        workdir = fs / "w"
        _copy_into(fresh5, workdir, ("binary", "counts"))
        ballast = fill(fs, 256 * 1024)  # the run starts; its checkpoint does not fit
        proc, summary = run(
            workdir,
            configs / "small.yaml",
            "--stages",
            "train",
            "--force",
            "--max-steps",
            "3",
            "--input",
            str(fs),
        )
        assert_one_line_disk_full(proc, summary, "train", str(workdir / "checkpoints"))
        assert not (workdir / "manifests" / "train.done").exists()
        assert not list((workdir / "checkpoints").glob(".step-*"))  # the partial one is gone
        ballast.unlink()
        proc, summary = run(
            workdir, configs / "small.yaml", "--stages", "train", "--max-steps", "3", "--input", str(fs)
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert (workdir / "manifests" / "train.done").exists()


# ---------------------------------------------------------------- full disk: logs, manifests
TINY = "generator:\n  days: 2\n  rows_per_day: 3000\n  workers: 1\n"


@needs_mount
def test_full_disk_from_the_start_logs_to_stderr_and_still_prints_the_summary(tmp_path):
    config = tmp_path / "tiny.yaml"
    config.write_text(TINY)
    with tmpfs(tmp_path / "fs", "4m") as fs:
        workdir = fs / "w"
        ballast = fill(fs, 0)
        proc, summary = run(workdir, config, "--stages", "generate", "--force")
        assert_one_line_disk_full(proc, summary, "setup", str(workdir / "manifests"))
        assert "logging to stderr only" in proc.stderr
        assert not (workdir / "manifests" / "generate.done").exists()
        ballast.unlink()
        proc, summary = run(workdir, config, "--stages", "generate")
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert (workdir / "manifests" / "generate.done").exists()
        assert list((workdir / "logs").glob("pipeline-*.log"))


def test_a_manifest_that_cannot_be_written_marks_nothing_done(tmp_path, monkeypatch, capsys):
    """Injected: the stage's work succeeds, its manifest write hits ENOSPC."""
    from pipeline import runner
    from pipeline.cli import main
    from pipeline.manifest import ManifestStore

    def no_space(self, record):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self.manifest_path(record.stage)))

    config = tmp_path / "tiny.yaml"
    config.write_text(TINY)
    monkeypatch.setattr(runner, "install_signal_handlers", lambda: None)
    monkeypatch.setattr(ManifestStore, "complete", no_space)
    code = main(["--workdir", str(tmp_path / "w"), "--config", str(config), "--stages", "generate"])
    captured = capsys.readouterr()
    assert code == ExitCode.DISK_FULL
    line = [l for l in captured.err.splitlines() if "disk full:" in l]
    assert len(line) == 1 and "stage generate" in line[0] and "generate.json" in line[0]
    summary = json.loads(captured.out.strip().splitlines()[-1])
    assert summary["status"] == "failed: disk_full"
    assert not (tmp_path / "w" / "manifests" / "generate.done").exists()
    monkeypatch.undo()
    monkeypatch.setattr(runner, "install_signal_handlers", lambda: None)
    assert main(["--workdir", str(tmp_path / "w"), "--config", str(config), "--stages", "generate"]) == 0
    assert (tmp_path / "w" / "manifests" / "generate.done").exists()
