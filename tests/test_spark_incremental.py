"""Stable ids' incremental daily runs, on a real local Spark session: a daily run must cost one
day's transform, not the window's, and give what a full retransform gives.

Day files land one a run (window 3). Each run must transform only the day that is new and the
one that joined train (the job's own record says which), reuse the other days' parts, drop
the day that left the window; the converter must copy the days it converted before from the
previous binary dataset. The result must equal a full retransform row for row, in the same
order, except where the documented "as of" rule says otherwise: a reused day keeps the ids it
was transformed with, so a value kept only later is 0 in its rows (and only there). Also: a
run killed between days leaves the previous binary dataset whole and the next run completes.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from converters.convert import convert_parquet
from dlrm_contracts.binary_format import LABEL_FILE, NUMERICAL_FILE, cat_file, read_info
from dlrm_contracts.config import ConvertConfig, PreprocessConfig
from dlrm_contracts.layout import DAY_JSON, SEGMENTS_JSON, WorkdirLayout
from dlrm_contracts.schema import CAT_COLUMNS, SPLITS
from spark_fixtures import copy_of_run, land_day, random_days, spark_config
from spark_jobs import day_store

WINDOW = 3
ROWS = 300


def _preprocess(spark, raw: Path, work: Path, retransform: bool = False) -> dict:
    from spark_jobs.preprocess import run_preprocess

    assert spark is not None
    return run_preprocess(
        raw,
        work,
        spark_config(),
        PreprocessConfig(frequency_threshold="2", ids="stable", window_days=WINDOW, output_files=2),
        retransform=retransform,
    )


def _convert(work: Path, binary: Path | None = None) -> dict:
    layout = WorkdirLayout.at(work)
    return convert_parquet(
        layout.parquet, binary or layout.binary, ConvertConfig(progress=False, fsync=False, overwrite=True)
    )


def _arrays(binary: Path, split: str) -> dict[str, np.ndarray]:
    info = read_info(binary)
    rows = info.splits[split]
    out = {
        "label": np.fromfile(binary / split / LABEL_FILE, np.uint8),
        "numerical": np.fromfile(binary / split / NUMERICAL_FILE, np.float16),
    }
    for i, dtype in enumerate(info.cat_dtypes):
        out[CAT_COLUMNS[i]] = np.fromfile(binary / split / cat_file(i), np.dtype(dtype)).astype(np.int64)
    assert len(out["label"]) == rows
    return out


def _as_of_sizes(work: Path, binary: Path, split: str) -> np.ndarray:
    """Per row of ``split``: the table sizes of the day it came from was transformed at."""
    segments = read_info(binary).extra["segments"][split]
    sizes = []
    for segment in segments:
        record = json.loads((WorkdirLayout.at(work).parquet_day(segment["day"]) / DAY_JSON).read_text())
        sizes += [[record["table_sizes"][c] for c in CAT_COLUMNS]] * segment["rows"]
    return np.array(sizes, np.int64).reshape(-1, len(CAT_COLUMNS))


def _compare_with_retransform(spark, raw: Path, work: Path, tmp: Path) -> int:
    """The workdir's binary dataset against a full retransform of a copy of it (same
    dictionaries, every day transformed again, converted afresh): same rows in the same order;
    ids equal, except 0 where the day was transformed before the value got its id. Returns
    how many ids differ that way."""
    full = tmp / "full"
    shutil.rmtree(full, ignore_errors=True)
    shutil.copytree(work, full, symlinks=True)
    shutil.rmtree(full / "binary")
    summary = _preprocess(spark, raw, full, retransform=True)
    assert summary["transform"]["days_reused"] == []
    assert set(summary["transform"]["why"].values()) == {"--retransform"}
    _convert(full)
    ours, theirs = WorkdirLayout.at(work).binary, WorkdirLayout.at(full).binary
    differing = 0
    for split in SPLITS:
        a, b = _arrays(ours, split), _arrays(theirs, split)
        assert np.array_equal(a["label"], b["label"]), split
        assert np.array_equal(a["numerical"], b["numerical"]), split
        as_of = _as_of_sizes(work, ours, split)
        for j, c in enumerate(CAT_COLUMNS):
            moved = a[c] != b[c]
            # only values numbered after the day was transformed, and they read 0
            assert np.all(a[c][moved] == 0), (split, c)
            assert np.all(b[c][moved] >= as_of[moved, j]), (split, c)
            assert np.array_equal(a[c][~moved], b[c][~moved])
            differing += int(moved.sum())
    return differing


@pytest.mark.spark
def test_daily_runs_transform_and_convert_only_the_new_days(tmp_path, spark):
    """Five days landing one by one (window 3): each run transforms the new day and the one
    that joined train, reuses the rest, drops the one that left; the converter copies the
    days it converted before (and its output equals a conversion from scratch, byte for
    byte); the end result equals a full retransform but for the documented "as of" zeros."""
    days = random_days(2525, 5, ROWS)
    raw, work = tmp_path / "raw", tmp_path / "work"
    layout = WorkdirLayout.at(work)
    land_day(raw, 0, days[0])
    for k in range(1, 5):
        land_day(raw, k, days[k])
        first = max(0, k - WINDOW + 1)
        if k == 4:  # a reused day's stored value counts damaged: it is read to recount them
            counted = sorted((layout.counts / "values" / f"day={first}").glob("*.parquet"))[0]
            counted.write_bytes(counted.read_bytes()[:20])
        summary = _preprocess(spark, raw, work)
        work_done = summary["transform"]
        assert work_done["days_transformed"] == ([0, 1] if k == 1 else [k - 1, k])
        assert work_done["days_reused"] == list(range(first, k - 1))
        assert work_done["days_dropped"] == ([k - WINDOW] if k >= WINDOW else [])
        if k > 1:
            assert work_done["why"] == {str(k - 1): "its role changed to train", str(k): "new"}
        # only the new day is read: the others' statistics were kept with them (yesterday's
        # too, though it is transformed again as train: its file did not change)
        assert work_done["days_read"] == ([0, 1] if k == 1 else [first, k] if k == 4 else [k])
        assert summary["days_counted"] == ([0, 1] if k == 1 else [first, k] if k == 4 else [k])
        assert summary["data_quality"]["rows_read"] == ROWS * (k + 1 - first)
        assert day_store.stored_days(layout) == list(range(first, k + 1))
        # the splits are the window's days: train day by day, test/validation of the newest
        segments = json.loads((layout.parquet / SEGMENTS_JSON).read_text())["splits"]
        assert [s["day"] for s in segments["train"]] == list(range(first, k))
        assert [s["day"] for s in segments["test"]] == [k]
        rows_in = sum(d for d in summary["rows"].values())
        assert rows_in == summary["data_quality"]["rows_written"]
        converted = _convert(work)
        assert converted["days_reused"]["train"] == work_done["days_reused"]
        assert converted["days_reused"]["test"] == converted["days_reused"]["validation"] == []
        fresh = _convert(work, tmp_path / f"fresh-{k}")
        assert fresh["days_reused"]["train"] == []
        for split in SPLITS:  # copying a day equals converting it
            for name in [LABEL_FILE, NUMERICAL_FILE, *(cat_file(i) for i in range(26))]:
                assert (layout.binary / split / name).read_bytes() == (
                    tmp_path / f"fresh-{k}" / split / name
                ).read_bytes(), (k, split, name)
    assert _compare_with_retransform(spark, raw, work, tmp_path) > 0  # the as-of rule was hit


@pytest.fixture(scope="module")
def first_run(tmp_path_factory, spark):
    """A full window (days 0-2) landed, preprocessed and converted: where the tests of the
    next day's run start, each on its own copy (``copy_of_run``); day 3 is theirs to land."""
    days = random_days(2526, 4, ROWS)
    base = tmp_path_factory.mktemp("first_run")
    for k in range(WINDOW):
        land_day(base / "raw", k, days[k])
    _preprocess(spark, base / "raw", base / "work")
    _convert(base / "work")
    return SimpleNamespace(spark=spark, days=days, base=base)


@pytest.mark.spark
def test_a_run_killed_between_days_keeps_yesterdays_dataset_and_the_next_run_completes(
    tmp_path, first_run, monkeypatch
):
    """Killed after the new day was transformed, before the splits were relinked: the
    previous binary dataset is untouched, the parquet is marked incomplete, and the next run
    transforms only what is left (the day done before the kill is reused) and completes."""
    spark, days = first_run.spark, first_run.days
    raw, work = copy_of_run(first_run.base, tmp_path)
    layout = WorkdirLayout.at(work)
    before = {p: p.read_bytes() for p in layout.binary.rglob("*") if p.is_file()}
    land_day(raw, 3, days[3])

    class Killed(BaseException):
        """What the process sees of a kill: nothing after this point runs."""

    original = day_store.commit_day
    done = []

    def commit_then_die(*args, **kwargs):
        rows = original(*args, **kwargs)
        done.append(args[1].day)
        if len(done) == 1:
            raise Killed()
        return rows

    monkeypatch.setattr(day_store, "commit_day", commit_then_die)
    with pytest.raises(Killed):
        _preprocess(spark, raw, work)
    monkeypatch.setattr(day_store, "commit_day", original)
    assert not (layout.parquet / "_SUCCESS").exists()
    with pytest.raises(Exception, match="_SUCCESS"):
        _convert(work)
    assert {p: p.read_bytes() for p in layout.binary.rglob("*") if p.is_file()} == before
    summary = _preprocess(spark, raw, work)
    assert summary["transform"]["days_transformed"] == [3]  # day 2 was done before the kill
    assert summary["transform"]["days_reused"] == [1, 2]  # the window is days 1-3
    assert summary["transform"]["days_dropped"] == [0]
    converted = _convert(work)
    assert converted["days_reused"]["train"] == [1]  # day 2 was test/validation
    _compare_with_retransform(spark, raw, work, tmp_path)


def _stored_day(tmp_path: Path, rows: int, rejected: int = 0):
    """A day file and its transformed train part, committed as day 1 of a workdir."""
    from spark_jobs.inputs import DayFile
    from spark_jobs.engines.arrow.split_writer import split_table
    from spark_jobs.stats import DayStats

    import pyarrow.parquet as pq

    raw = tmp_path / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    (raw / "day_1").write_text("x\n" * (rows + rejected))
    day = DayFile(1, raw / "day_1")
    layout = WorkdirLayout.at(tmp_path / "work")
    staging = day_store.staging_dir(layout, 1)
    (staging / "train").mkdir(parents=True)
    table = split_table(
        np.zeros(rows, np.int32), [np.zeros(rows, np.float32)] * 13, [np.ones(rows, np.int32)] * 26
    )
    pq.write_table(table, staging / "train" / "part-00000.parquet")
    stats = DayStats(1, rows_read=rows + rejected, rows_valid=rows, partitions={0: rows + rejected})
    stats.rejected["bad_label"] = rejected
    cfg = PreprocessConfig(ids="stable")
    transformed = day_store.TransformedWith(cfg, "lineage-a", {c: 5 for c in CAT_COLUMNS}, "arrow/256")
    day_store.commit_day(layout, day, day_store.TRAIN, stats, transformed)
    return layout, day, cfg, stats


def test_a_kept_day_is_reused_only_while_its_file_role_settings_ids_and_parts_hold(tmp_path):
    """Each reason to transform a day again, from its record; its kept statistics round-trip
    (those of a day with rejected lines are not used: it is read again)."""
    import os

    from dataclasses import replace

    layout, day, cfg, stats = _stored_day(tmp_path, 50)
    why = day_store.why_not_reused
    assert why(layout, day, day_store.TRAIN, cfg, "lineage-a") is None
    reuse = day_store.DayWork([], [1], [])
    assert day_store.stored_stats(layout, reuse, [day], None) == {1: stats}
    # transformed again (its role changed), its file unchanged: its statistics still hold
    # when they were read the way this run reads (the Arrow engine's chunks)
    again = day_store.DayWork([(day, day_store.EVAL, "its role changed to eval")], [], [])
    assert day_store.stored_stats(layout, again, [day], "arrow/256") == {1: stats}
    assert day_store.stored_stats(layout, again, [day], "arrow/64") == {}
    assert day_store.stored_stats(layout, again, [day], None) == {}
    assert why(layout, day, day_store.EVAL, cfg, "lineage-a") == "its role changed to eval"
    assert why(layout, day, day_store.TRAIN, cfg, "lineage-b") == "the ids were started over"
    assert why(layout, day, day_store.TRAIN, cfg, None) == "the ids were started over"
    assert (
        why(layout, day, day_store.TRAIN, replace(cfg, shuffle_seed=7), "lineage-a")
        == "the output settings changed"
    )
    assert why(layout, replace(day, day=2), day_store.TRAIN, cfg, "lineage-a") == "new"
    work = day_store.plan([day, replace(day, day=2)], layout, cfg, "lineage-a", retransform=True)
    assert [(d.day, w) for d, _, w in work.transform] == [(1, "--retransform"), (2, "--retransform")]
    part = layout.parquet_day(1) / "train" / "part-00000.parquet"
    data = part.read_bytes()
    part.write_bytes(data[: len(data) // 2])  # a truncated part
    assert why(layout, day, day_store.TRAIN, cfg, "lineage-a").startswith("its parts or record")
    part.write_bytes(data)
    st = day.path.stat()
    os.utime(day.path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # the file was replaced
    assert why(layout, day, day_store.TRAIN, cfg, "lineage-a") == "its file changed"
    changed = day_store.DayWork([(day, day_store.TRAIN, "its file changed")], [], [])
    assert day_store.stored_stats(layout, changed, [day], "arrow/256") == {}
    layout, day, cfg, stats = _stored_day(tmp_path / "dirty", 40, rejected=3)
    assert why(layout, day, day_store.TRAIN, cfg, "lineage-a") is None
    assert day_store.stored_stats(layout, day_store.DayWork([], [1], []), [day], None) == {}


def test_retransform_is_a_flag_of_the_job():
    from spark_jobs.cli import build_parser

    assert build_parser().parse_args(["--input", "r", "--workdir", "w", "--retransform"]).retransform
    assert not build_parser().parse_args(["--input", "r", "--workdir", "w"]).retransform


@pytest.mark.spark
def test_the_pipeline_lean_mode_drops_the_days_and_force_retransforms_them(tmp_path, spark):
    """Three runs of one workdir as days land: the first (the job and the converter on the
    shared session, the pipeline's settings) keeps its days; the second, through the
    pipeline's CLI with keep_parquet: false and --force, transforms every day again (--force
    passes --retransform to the job: the kept days would have been reused) and then drops the
    kept days with the splits (they hold the bytes), so the third (the job and the converter
    on the shared session) transforms its whole window."""
    from spark_jobs import stable_ids
    from spark_jobs.inputs import discover_days
    from spark_jobs.preprocess import run_preprocess

    from pipeline_helpers import run

    days = random_days(2527, 5, ROWS)
    raw, workdir = tmp_path / "raw", tmp_path / "work"
    for k in range(3):
        land_day(raw, k, days[k])
    lean = tmp_path / "lean.yaml"
    lean.write_text(
        "spark:\n  driver_memory: 2g\nconvert:\n  batch_rows: 512\n"
        "preprocess:\n  ids: stable\n  keep_parquet: false\n"
    )
    stages = ("--input", str(raw), "--stages", "preprocess,convert")
    parquet = workdir / "parquet"

    def transformed() -> dict:
        return json.loads((parquet / "preprocess.json").read_text())["transform"]

    # lean.yaml's settings of the job (keep_parquet is the pipeline's)
    run_preprocess(raw, workdir, spark_config(), PreprocessConfig(ids="stable"))
    _convert(workdir)
    assert transformed()["days_reused"] == []
    assert (parquet / "days").is_dir() and (parquet / SEGMENTS_JSON).is_file()

    land_day(raw, 3, days[3])
    layout = WorkdirLayout.at(workdir)
    lineage = stable_ids.lineage(layout.dictionaries)
    unforced = day_store.plan(discover_days(raw), layout, PreprocessConfig(ids="stable"), lineage, False)
    assert unforced.reused == [0, 1]  # what the job would reuse without --force
    proc, summary = run(workdir, lean, *stages, "--force")
    assert proc.returncode == 0, proc.stderr[-3000:]
    work_done = transformed()
    assert work_done["days_transformed"] == [0, 1, 2, 3] and work_done["days_reused"] == []
    assert set(work_done["why"].values()) == {"--retransform"}
    removed = json.loads((parquet / "_REMOVED.json").read_text())
    assert removed["removed"] == ["train", "test", "validation", "days", SEGMENTS_JSON]
    assert not (parquet / "days").exists() and not (parquet / SEGMENTS_JSON).exists()

    # the third run's subject is the job's plan over the parts the pipeline removed: the job
    # and the converter on the shared session again
    land_day(raw, 4, days[4])
    run_preprocess(raw, workdir, spark_config(), PreprocessConfig(ids="stable"))
    converted = _convert(workdir)
    work_done = transformed()
    assert work_done["days_transformed"] == [0, 1, 2, 3, 4] and work_done["days_reused"] == []
    assert set(work_done["why"].values()) == {"new"}  # not forced: their parts were gone
    rows = converted["rows"]
    assert rows["train"] + rows["test"] + rows["validation"] == 5 * ROWS


@pytest.mark.spark
def test_a_daily_runs_progress_counts_only_the_work_it_does(tmp_path, first_run, monkeypatch):
    """A day lands in a full window: the count plans on the one day it reads, the transform on
    the two it writes (yesterday joins train, the new day is test/validation), each phase's
    share of the bar shrinks with its part of the window's bytes; convert counts the rows it
    converts, not those it copies from yesterday's dataset."""
    from dlrm_contracts.config import ProgressConfig
    from dlrm_contracts.progress import PROGRESS_FILE_ENV, Progress
    from spark_jobs.inputs import discover_days
    from spark_jobs.preprocess import input_tasks, run_preprocess
    from spark_jobs.progress import PreprocessProgress
    from spark_jobs.splits import train_files

    days = first_run.days
    raw, work = copy_of_run(first_run.base, tmp_path)
    land_day(raw, 3, days[3] + days[3][: ROWS // 2])  # a bigger day: shares follow bytes
    channel = tmp_path / "progress.jsonl"
    monkeypatch.setenv(PROGRESS_FILE_ENV, str(channel))
    cfg = PreprocessConfig(
        frequency_threshold="2", ids="stable", window_days=WINDOW, output_files=2
    )  # _preprocess's settings
    settings = ProgressConfig()
    window = discover_days(raw, WINDOW)  # days 1-3
    tasks = lambda chosen: input_tasks("arrow", chosen, cfg)  # noqa: E731
    with PreprocessProgress(raw, work, cfg, settings, tasks, 1 << 16) as progress:
        summary = run_preprocess(raw, work, spark_config(), cfg, progress=progress)
    assert summary["transform"]["days_transformed"] == [2, 3]
    assert summary["transform"]["days_read"] == [3]
    records = [Progress.from_line(line) for line in channel.read_text().splitlines()]
    fractions = [r.fraction for r in records if r.fraction is not None]
    assert fractions == sorted(fractions) and fractions[-1] == 1.0

    count = [r for r in records if r.phase == "count" and r.detail.startswith("day 3, ")]
    assert count, [(r.phase, r.detail) for r in records]
    assert count[0].total == tasks(window[2:]) < tasks(window)  # planned on day 3 alone
    transform = [r for r in records if r.phase == "transform"]
    assert {r.detail for r in transform} == {"train day 2, test/validation day 3"}
    day2 = json.loads((WorkdirLayout.at(work).parquet_day(2) / DAY_JSON).read_text())
    planned = tasks(window[1:]) + train_files(cfg, sum(day2["rows"].values()))
    assert transform[0].total == planned < tasks(window) + cfg.output_files, transform[0]
    # the bar at the transform's start: the count's and dictionaries' shares, the count's
    # reading part and the transform shrunk to the bytes they read of the window's
    size = {d.day: d.path.stat().st_size for d in window}
    part = {"count": size[3] / sum(size.values()), "transform": (size[2] + size[3]) / sum(size.values())}
    shares, read = settings.preprocess_phase_shares, settings.preprocess_read_shares["count"]
    count_share = shares["count"] * (read * part["count"] + 1 - read)
    transform_share = shares["transform"] * part["transform"]
    expected = (count_share + shares["dictionaries"]) / (
        count_share + shares["dictionaries"] + transform_share
    )
    assert transform[0].fraction == pytest.approx(expected, abs=0.01)
    unscaled = (shares["count"] + shares["dictionaries"]) / sum(shares.values())
    assert abs(expected - unscaled) > 0.02  # the test tells the two apart

    channel.write_text("")
    converted = convert_parquet(
        WorkdirLayout.at(work).parquet,
        WorkdirLayout.at(work).binary,
        ConvertConfig(progress=True, fsync=False, overwrite=True),
    )
    assert converted["days_reused"]["train"] == [1]
    copied = json.loads((WorkdirLayout.at(work).parquet_day(1) / DAY_JSON).read_text())
    records = [Progress.from_line(line) for line in channel.read_text().splitlines()]
    records = [r for r in records if r.stage == "convert" and r.total is not None]
    assert records and {r.total for r in records} == {
        sum(converted["rows"].values()) - sum(copied["rows"].values())
    }
    assert records[-1].done == records[-1].total and records[-1].fraction == 1.0


@pytest.mark.spark
def test_a_day_rewritten_with_its_size_and_mtime_kept_is_counted_and_transformed_again(tmp_path, first_run):
    """A day file whose values changed but whose size and mtime were put back (``touch -r``,
    ``cp -p``) is not the day counted before: its counts and parts are made again, and the
    tables equal those of a run from scratch on the same files."""
    import os

    from dlrm_contracts.table_sizes import read_histogram

    spark = first_run.spark
    raw, work = copy_of_run(first_run.base, tmp_path)
    day = raw / "day_0"
    st = day.stat()
    swapped = day.read_bytes().translate(bytes.maketrans(b"ab", b"ba"))  # other hex values
    assert swapped != day.read_bytes() and len(swapped) == st.st_size
    day.write_bytes(swapped)
    os.utime(day, ns=(st.st_atime_ns, st.st_mtime_ns))
    summary = _preprocess(spark, raw, work)
    assert summary["days_counted"] == [0]
    assert summary["transform"]["why"].get("0") == "its file changed"
    assert summary["transform"]["days_reused"] == [1, 2]
    fresh = tmp_path / "fresh"
    _preprocess(spark, raw, fresh)
    assert read_histogram(WorkdirLayout.at(work).counts).table_sizes("2") == read_histogram(
        WorkdirLayout.at(fresh).counts
    ).table_sizes("2")
