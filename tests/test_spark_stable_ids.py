"""preprocess.ids: stable and preprocess.window_days, on a real local Spark session.

A scheduled job's input grows by one day file a run; with a rolling window of three days the
oldest day leaves as a new one lands. Stable ids are checked against a plain-Python reference
of the documented rule (old ids kept, newcomers numbered after them by count descending, value
ascending; a value that becomes rare keeps its id and still maps to it), run after run,
including a value that first appears late and one that leaves the window; the first run equals
the frequency ids. Also: the value ranges split into many groups, a run killed while swapping
the dictionaries in, the SQL engine's stable ids, a threshold change refused, and the window.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pyarrow.parquet as pq
import pytest

from dlrm_contracts.layout import WorkdirLayout
from dlrm_contracts.schema import CAT_COLUMNS
from dlrm_contracts.thresholds import parse_threshold_spec
from spark_fixtures import (
    assert_rows_equal,
    copy_of_run,
    random_days,
    read_split,
    reference_numerical,
    reference_parse,
    reference_preprocess,
    land_day,
    run,
    sort_key,
)
from spark_jobs import stable_ids
from spark_jobs.engines.arrow import stable_ids as stable_groups
from spark_jobs.errors import PreprocessConfigError, PreprocessInputError
from spark_jobs.inputs import discover_days

LATE = "0badcafe"  # C1: first seen on day 3, often
FADE = "0000fade"  # C2: frequent on days 0-1, then gone, once more on day 4 (rare by then)
WINDOW = 3


def _days() -> list[list[str]]:
    days = random_days(2511, 6, 200)
    out = []
    for d, lines in enumerate(days):
        changed = []
        for i, line in enumerate(lines):
            fields = line.split("\t")
            if d >= 3 and i % 5 == 0:
                fields[14] = LATE
            if (d <= 1 and i % 5 == 1) or (d == 4 and i == 0):
                fields[15] = FADE
            changed.append("\t".join(fields))
        out.append(changed)
    return out


def _window_counts(days: list[list[str]]) -> dict[str, Counter]:
    counts = {c: Counter() for c in CAT_COLUMNS}
    for lines in days:
        for line in lines:
            reason, _, _, _, cats = reference_parse(line)
            if reason is None:
                for c, v in zip(CAT_COLUMNS, cats):
                    if v is not None:
                        counts[c][v] += 1
    return counts


def _extend(ids: dict[str, dict[str, int]], counts: dict[str, Counter], threshold: str):
    """The documented rule: old ids kept; kept values without one numbered next, by count
    descending then value ascending."""
    spec = parse_threshold_spec(threshold)
    out = {}
    for c in CAT_COLUMNS:
        known = dict(ids.get(c, {}))
        fresh = sorted(
            (v for v, n in counts[c].items() if n >= max(1, spec.effective(c)) and v not in known),
            key=lambda v: (-counts[c][v], v),
        )
        for v in fresh:
            known[v] = len(known) + 1
        out[c] = known
    return out


def _as_of(ids, sizes: dict[str, int] | None):
    """The ids a day transformed when the tables had ``sizes`` holds: the values numbered
    since map to 0 there (None: today's ids)."""
    if sizes is None:
        return ids
    return {c: {v: i for v, i in ids[c].items() if i < sizes[c]} for c in CAT_COLUMNS}


def _expected_splits(days: list[list[str]], ids, as_of=None) -> dict[str, list[tuple]]:
    """``as_of``: per train day, the table sizes it was transformed at (None: today's)."""

    def row(parsed, ids):
        label, ints, cats = parsed
        return (
            label,
            *[reference_numerical(x) for x in ints],
            *[ids[c].get(v, 0) if v is not None else 0 for c, v in zip(CAT_COLUMNS, cats)],
        )

    parsed = [[p[2:] for p in map(reference_parse, lines) if p[0] is None] for lines in days[:-1]]
    as_of = as_of or [None] * len(parsed)
    last = days[-1]
    half = (len(last) + 1) // 2
    evaluation = [
        [p[2:] for p in map(reference_parse, part) if p[0] is None] for part in (last[:half], last[half:])
    ]
    return {
        "train": [row(p, _as_of(ids, sizes)) for day, sizes in zip(parsed, as_of) for p in day],
        "test": [row(p, ids) for p in evaluation[0]],
        "validation": [row(p, ids) for p in evaluation[1]],
    }


def _dictionaries(work: Path) -> dict[str, dict[str, tuple[int, int]]]:
    """value → (id, count) per column, as written."""
    out = {}
    for c in CAT_COLUMNS:
        folder = WorkdirLayout.at(work).dictionaries / f"column={c}"
        if not folder.is_dir():
            out[c] = {}
            continue
        table = pq.read_table(folder, columns=["value", "id", "count"])
        out[c] = {
            v: (i, n) for v, i, n in zip(*(table.column(k).to_pylist() for k in ("value", "id", "count")))
        }
    return out


def _check_run(work: Path, summary: dict, window: list[list[str]], ids, counts, as_of=None) -> None:
    """``as_of``: per train day of the window, the table sizes of the run that transformed it
    (a reused day keeps the ids it was transformed with); None: this run's."""
    written = _dictionaries(work)
    for c in CAT_COLUMNS:
        assert {v: i for v, (i, _) in written[c].items()} == ids[c], c
        # every entry's count is its count in this run's window (0: not seen in it)
        assert {v: n for v, (_, n) in written[c].items()} == {v: counts[c][v] for v in ids[c]}, c
    sizes = {c: len(ids[c]) + 1 for c in CAT_COLUMNS}
    assert summary["table_sizes"] == sizes and summary["ids"] == "stable"
    layout = WorkdirLayout.at(work)
    assert json.loads(layout.parquet_model_size.read_text()) == sizes
    expected = _expected_splits(window, ids, as_of)
    for split in ("test", "validation"):
        assert_rows_equal(read_split(layout.parquet_split(split)), expected[split], split)
    assert_rows_equal(
        sorted(read_split(layout.parquet_split("train")), key=sort_key),
        sorted(expected["train"], key=sort_key),
        "train (as a multiset)",
    )


@pytest.mark.spark
def test_ids_never_move_over_a_rolling_window(tmp_path, spark):
    """Four daily runs (input day_0..day_k, window 3), each against the reference; ids once
    given are kept, LATE is appended after the ids that existed before it, FADE keeps its id
    (and its row maps to it) after it left the window, and the first run is the frequency
    mode's. With 40 values per group the big columns are cut into many value ranges, planned
    anew each run over the counts and the previous dictionary (the other tests run with one
    range per column)."""
    days = _days()
    raw, work = tmp_path / "raw", tmp_path / "work"
    settings = dict(ids="stable", window_days=WINDOW, arrow_group_values=40)
    land_day(raw, 0, days[0])
    ids: dict = {}
    history = []
    sizes_after: dict[int, dict[str, int]] = {}  # run k → its table sizes
    for k in range(1, 5):
        land_day(raw, k, days[k])
        first = max(0, k - WINDOW + 1)
        window = days[first : k + 1]
        counts = _window_counts(window)
        before = ids
        ids = _extend(ids, counts, "2")
        sizes_after[k] = {c: len(ids[c]) + 1 for c in CAT_COLUMNS}
        summary = run(spark, raw, work, "2", **settings)
        assert [d["day"] for d in summary["days"]] == list(range(first, k + 1))
        # only the new day and the one that joined train are transformed; day j became train
        # in run j + 1 and keeps that run's ids
        assert summary["transform"]["days_transformed"] == ([0, 1] if k == 1 else [k - 1, k])
        assert summary["transform"]["days_reused"] == list(range(first, k - 1))
        assert summary["transform"]["days_dropped"] == ([k - WINDOW] if k > WINDOW - 1 else [])
        as_of = [sizes_after[max(1, j + 1)] for j in range(first, k)]
        _check_run(work, summary, window, ids, counts, as_of)
        for c in CAT_COLUMNS:  # nothing moved
            assert all(ids[c][v] == i for v, i in before.get(c, {}).items())
        history.append({c: len(ids[c]) + 1 for c in CAT_COLUMNS})
        if k == 1:
            assert ids == reference_preprocess(window, "2").ids  # the frequency ids
    assert ids["C1"][LATE] >= history[1]["C1"]  # appended on day 3, after run 2's ids
    fade = ids["C2"][FADE]
    assert fade > 0 and _window_counts(days[2:5])["C2"][FADE] == 1  # rare now, id kept
    test_rows = read_split(WorkdirLayout.at(work).parquet_split("test"))
    assert test_rows[0][15] == fade  # and the value still maps to it
    parts = [
        len(list((WorkdirLayout.at(work).dictionaries / f"column={c}").glob("part-*.parquet")))
        for c in CAT_COLUMNS
    ]
    assert max(parts) > 1  # the ranges did split the columns
    # the frequency ids (tested exact elsewhere) would have moved: LATE is frequent, it ranks
    # near the top there, and FADE is rare, so it maps to 0
    frequency = reference_preprocess(days[2:5], "2").ids
    assert frequency["C1"][LATE] < ids["C1"][LATE] and FADE not in frequency["C2"]


@pytest.fixture(scope="module")
def first_run(tmp_path_factory, spark):
    """Days 0-2 landed and one run with stable ids (the Arrow engine): where the tests that
    go on from a first run start, each on its own copy (``copy_of_run``)."""
    days = _days()
    base = tmp_path_factory.mktemp("first_run")
    for k in range(3):
        land_day(base / "raw", k, days[k])
    run(spark, base / "raw", base / "work", "2", ids="stable")
    return SimpleNamespace(spark=spark, days=days, base=base)


@pytest.mark.spark
def test_a_run_killed_while_swapping_leaves_the_previous_ids(tmp_path, first_run, monkeypatch):
    """Killed between retiring the old dictionaries and renaming the new ones in: the next run
    puts the old ones back (they are what it extends) and completes with the same ids."""
    spark, days = first_run.spark, first_run.days
    raw, work = copy_of_run(first_run.base, tmp_path)
    first = _dictionaries(work)
    land_day(raw, 3, days[3])
    dict_dir = WorkdirLayout.at(work).dictionaries

    class Killed(BaseException):
        """What the process sees of a kill: nothing after this point runs."""

    def killed(staging, target, spec, sizes):
        target.rename(stable_ids.retired_dir(target))
        raise Killed()

    original = stable_ids.commit
    monkeypatch.setattr(stable_ids, "commit", killed)
    with pytest.raises(Killed):
        run(spark, raw, work, "2", ids="stable")
    assert not dict_dir.exists() and stable_ids.retired_dir(dict_dir).is_dir()
    monkeypatch.setattr(stable_ids, "commit", original)
    summary = run(spark, raw, work, "2", ids="stable")
    counts = _window_counts(days[:4])
    ids = _extend({c: {v: i for v, (i, _) in first[c].items()} for c in CAT_COLUMNS}, counts, "2")
    first_sizes = {c: len(first[c]) + 1 for c in CAT_COLUMNS}
    assert summary["transform"]["days_transformed"] == [2, 3]  # days 0-1 kept from run 1
    _check_run(work, summary, days[:4], ids, counts, [first_sizes, first_sizes, None])
    assert not stable_ids.retired_dir(dict_dir).exists()
    assert not stable_ids.staging_dir(dict_dir).exists()


@pytest.mark.spark
def test_the_sql_engine_gives_the_same_stable_ids_and_a_threshold_change_is_refused(tmp_path, first_run):
    """Two runs (days 0-2, then 0-3) with each engine in its own workdir: the same
    dictionaries and splits, and the reference's. Then another threshold: refused (exit 2),
    nothing touched."""
    spark, days = first_run.spark, first_run.days
    raw, work = copy_of_run(first_run.base, tmp_path)
    run(spark, raw, tmp_path / "sql", "2", ids="stable", engine="sql")
    assert _dictionaries(tmp_path / "sql") == _dictionaries(work)
    land_day(raw, 3, days[3])
    arrow = run(spark, raw, work, "2", ids="stable")
    sql = run(spark, raw, tmp_path / "sql", "2", ids="stable", engine="sql")
    assert sql["table_sizes"] == arrow["table_sizes"] and sql["engine"] == "sql"
    assert _dictionaries(tmp_path / "sql") == _dictionaries(work)
    for split in ("train", "test", "validation"):
        assert read_split(WorkdirLayout.at(tmp_path / "sql").parquet_split(split)) == read_split(
            WorkdirLayout.at(work).parquet_split(split)
        ), split
    counts = _window_counts(days[:4])
    first_ids = _extend({}, _window_counts(days[:3]), "2")
    ids = _extend(first_ids, counts, "2")
    first_sizes = {c: len(first_ids[c]) + 1 for c in CAT_COLUMNS}
    # the same days transformed; the SQL engine reads day 2 again for its line counts (its
    # partitions follow Spark's file splitting), the Arrow engine kept them with the day
    assert {k: v for k, v in sql["transform"].items() if k != "days_read"} == {
        k: v for k, v in arrow["transform"].items() if k != "days_read"
    }
    assert sql["transform"]["days_reused"] == [0, 1] and sql["transform"]["days_transformed"] == [2, 3]
    assert (arrow["transform"]["days_read"], sql["transform"]["days_read"]) == ([3], [2, 3])
    _check_run(tmp_path / "sql", sql, days[:4], ids, counts, [first_sizes, first_sizes, None])
    dict_dir = WorkdirLayout.at(work).dictionaries
    files = {p: p.stat().st_mtime_ns for p in dict_dir.rglob("*")}
    with pytest.raises(PreprocessConfigError, match=r"built at threshold 2, but this run asks for 3"):
        run(spark, raw, work, "3", ids="stable")
    assert {p: p.stat().st_mtime_ns for p in dict_dir.rglob("*")} == files
    record = json.loads((dict_dir / stable_ids.IDS_RECORD).read_text())
    assert record["threshold_spec"] == "2" and record["table_sizes"]["C1"] > 1


# ---------------------------------------------------------------- the window


@pytest.mark.spark
def test_window_uses_the_newest_days_and_moves_with_a_new_day(tmp_path, spark):
    """Five day files, a window of three: the data is days 2-4 (day 4 test/validation), equal to
    the reference over those days; the old files stay. A sixth day moves the window: only it
    is counted, day 2's counts are dropped, day 2's file stays."""
    days = _days()
    raw, work = tmp_path / "raw", tmp_path / "work"
    for k in range(5):
        land_day(raw, k, days[k])
    summary = run(spark, raw, work, "2", window_days=3)
    assert [d["day"] for d in summary["days"]] == [2, 3, 4] and summary["window_days"] == 3
    ref = reference_preprocess(days[2:5], "2")
    layout = WorkdirLayout.at(work)
    for split in ("test", "validation"):
        assert_rows_equal(read_split(layout.parquet_split(split)), ref.splits[split], split)
    assert_rows_equal(
        sorted(read_split(layout.parquet_split("train")), key=sort_key),
        sorted(ref.splits["train"], key=sort_key),
        "train (as a multiset)",
    )
    assert summary["table_sizes"] == ref.sizes
    assert sorted(p.name for p in (layout.counts / "values").iterdir()) == ["day=2", "day=3", "day=4"]
    land_day(raw, 5, days[5])
    summary = run(spark, raw, work, "2", window_days=3)
    assert summary["days_counted"] == [5] and summary["days_reused"] == [3, 4]
    assert sorted(p.name for p in (layout.counts / "values").iterdir()) == ["day=3", "day=4", "day=5"]
    assert summary["table_sizes"] == reference_preprocess(days[3:6], "2").sizes
    assert sorted(p.name for p in raw.iterdir()) == [f"day_{k}" for k in range(6)]


def test_window_ignores_older_files_and_needs_a_whole_window(tmp_path):
    raw = tmp_path / "raw"
    for k in range(6):
        land_day(raw, k, ["0" + "\t" * 39])
    assert [d.day for d in discover_days(raw, 3)] == [3, 4, 5]
    assert [d.day for d in discover_days(raw, 10)] == list(range(6))  # fewer days than N
    assert [d.day for d in discover_days(raw)] == list(range(6))
    for k in (0, 1):  # archived by the user: fine with a window
        os.remove(raw / f"day_{k}")
    (raw / "day_2").write_bytes(b"")  # outside the window: never even looked at
    assert [d.day for d in discover_days(raw, 3)] == [3, 4, 5]
    with pytest.raises(PreprocessInputError, match="missing day file"):
        discover_days(raw)
    os.remove(raw / "day_4")
    with pytest.raises(PreprocessInputError, match=r"window of 3 days .* is day_3 to day_5"):
        discover_days(raw, 3)


# ---------------------------------------------------------------- units (no Spark)


def test_recover_settles_a_swap_a_kill_interrupted(tmp_path):
    dict_dir = tmp_path / "parquet" / "dictionaries"
    retired, staging = stable_ids.retired_dir(dict_dir), stable_ids.staging_dir(dict_dir)
    # killed after retiring the old dictionaries: they are put back, the staged ones dropped
    (retired / "column=C1").mkdir(parents=True)
    (retired / stable_ids.IDS_RECORD).write_text("{}")
    (staging / "column=C1").mkdir(parents=True)
    stable_ids.recover(dict_dir)
    assert (dict_dir / stable_ids.IDS_RECORD).is_file()
    assert not retired.exists() and not staging.exists()
    # killed after the new ones were renamed in: the retired copy goes
    (retired / "column=C1").mkdir(parents=True)
    stable_ids.recover(dict_dir)
    assert dict_dir.is_dir() and not retired.exists()


def test_old_entries_read_only_their_value_range(tmp_path):
    """A group reads the previous dictionary's entries of its own range (lower bound included,
    upper excluded), from parts of any range."""
    import numpy as np
    import pyarrow as pa

    folder = tmp_path / "column=C7"
    folder.mkdir()
    values = [f"{v:08x}" for v in (5, 9, 10, 200, 4_000_000_000)]
    for k, chunk in enumerate((values[:2], values[2:])):
        pq.write_table(
            pa.table(
                {
                    "value": chunk,
                    "id": pa.array(range(k * 2 + 1, k * 2 + 1 + len(chunk)), pa.int32()),
                    "count": pa.array([1] * len(chunk), pa.int64()),
                }
            ),
            folder / f"part-{k:05d}.parquet",
        )
    got, ids = stable_groups.old_entries(str(tmp_path), "C7", 9, 200)
    assert got.tolist() == [9, 10] and ids.tolist() == [2, 3]
    got, ids = stable_groups.old_entries(str(tmp_path), "C7", 200, None)
    assert got.tolist() == [200, 4_000_000_000] and ids.tolist() == [4, 5]
    assert stable_groups.old_entries(str(tmp_path), "C8", 0, None)[0].dtype == np.uint32
    previous = stable_ids.Previous(str(tmp_path), "2", {c: 1 for c in CAT_COLUMNS})
    samples = stable_groups.dictionary_samples(previous)
    assert [(j, n, s.tolist()) for j, n, s in samples] == [(6, 2, [5]), (6, 3, [10])]


def test_flags_and_settings_of_ids_and_window(tmp_path):
    """--ids and --window-days map onto preprocess.ids and preprocess.window_days; a window of
    fewer than two days (no train day) and an unknown id mode are refused as usage errors."""
    from dlrm_contracts.config import ConfigError, PreprocessConfig
    from spark_jobs.cli import build_parser, configs_from_args

    args = build_parser().parse_args(
        ["--input", "raw", "--workdir", "w", "--ids", "stable", "--window-days", "3"]
    )
    _, pre = configs_from_args(args)
    assert (pre.ids, pre.window_days) == ("stable", 3)
    assert (PreprocessConfig().ids, PreprocessConfig().window_days) == ("frequency", None)
    with pytest.raises(ConfigError, match="window_days must be >= 2"):
        configs_from_args(build_parser().parse_args(["--input", "r", "--workdir", "w", "--window-days", "1"]))
    with pytest.raises(ConfigError, match="preprocess.ids 'sometimes' is not one of"):
        PreprocessConfig(ids="sometimes")
