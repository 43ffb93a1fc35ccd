"""Bad input never vanishes: rejects with reasons, the rows-in identity, the reject-rate limit,
gzip + CRLF, empty and missing days, and incremental counting."""

from __future__ import annotations

import gzip
import json
from collections import Counter

import pytest

from pipeline.layout import WorkdirLayout
from spark_fixtures import (BAD_LINES, assert_rows_equal, random_days, read_split,  # noqa: F401
                            reference_missing_rates, reference_preprocess, run, salted_days,
                            sort_key, spark, write_days)
from spark_jobs.errors import PreprocessInputError

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def salted(tmp_path_factory, spark):
    days = salted_days(5, 3, 250)
    raw = write_days(tmp_path_factory.mktemp("salted") / "raw", days)
    work = tmp_path_factory.mktemp("salted_work")
    summary = run(spark, raw, work, "2", max_reject_rate=0.2)
    return days, raw, work, summary


def _rejects(work) -> list[dict]:
    rows = []
    for file in sorted((WorkdirLayout.at(work).rejects).glob("part-*.json")):
        rows += [json.loads(line) for line in file.read_text().splitlines() if line]
    return rows


def test_identity_holds_and_every_bad_kind_is_rejected_with_its_reason(salted):
    days, _, work, summary = salted
    ref = reference_preprocess(days, "2")
    report = json.loads(WorkdirLayout.at(work).data_quality.read_text())
    assert report["rows_in"] == ref.rows_in == sum(len(d) for d in days)
    assert report["rows_in"] == report["rows_out"] + report["rejected"]
    assert report["identity_holds"] and report["rows_out_checked"]
    assert report["totals"]["rejected_by_reason"] == {r: ref.rejected[r] for r in BAD_LINES}
    assert report["totals"]["rows_padded"] == ref.padded
    assert all(ref.rejected[r] >= len(BAD_LINES[r]) * len(days) for r in BAD_LINES)
    for day in report["days"]:
        assert day["rows_read"] == day["rows_written"] + day["rows_rejected"]
    assert sum(summary["rows"].values()) == report["rows_out"]
    # the rejects output carries file, line number, reason and the line itself
    rejects = _rejects(work)
    assert Counter(r["reason"] for r in rejects) == ref.rejected
    for r in rejects:
        day = int(r["file"].split("_")[1])
        assert days[day][r["line_number"] - 1] == r["line"]
    # and the valid rows are exactly the reference's
    for split in ("test", "validation"):
        assert_rows_equal(read_split(WorkdirLayout.at(work).parquet_split(split)), ref.splits[split], split)
    train = sorted(read_split(WorkdirLayout.at(work).parquet_split("train")), key=sort_key)
    assert_rows_equal(train, sorted(ref.splits["train"], key=sort_key), "train")


def test_gzip_and_crlf_give_the_same_outputs(salted, tmp_path, spark):
    days, _, work, _ = salted
    raw = write_days(tmp_path / "raw", days, gz=True, crlf=True)
    run(spark, raw, tmp_path / "work", "2", max_reject_rate=0.2)
    for split in ("train", "test", "validation"):
        assert read_split(WorkdirLayout.at(tmp_path / "work").parquet_split(split)) == \
            read_split(WorkdirLayout.at(work).parquet_split(split)), split
    assert Counter(r["reason"] for r in _rejects(tmp_path / "work")) == \
        Counter(r["reason"] for r in _rejects(work))


def test_reject_rate_over_the_limit_fails_clearly(salted, tmp_path, spark):
    _, raw, _, _ = salted
    with pytest.raises(PreprocessInputError, match=r"lines rejected .*> max_reject_rate 1\.00%"):
        run(spark, raw, tmp_path / "work", "2")  # default limit 1%
    layout = WorkdirLayout.at(tmp_path / "work")
    assert not (layout.parquet / "_SUCCESS").exists()
    report = json.loads(layout.data_quality.read_text())
    assert report["reject_rate"] > 0.01 and report["rejected"] > 0


def test_missing_and_empty_days_are_clear_errors(tmp_path, spark):
    days = random_days(1, 3, 20)
    gap = write_days(tmp_path / "gap", days)
    (gap / "day_1").unlink()
    with pytest.raises(PreprocessInputError, match="missing day file.*day_1"):
        run(spark, gap, tmp_path / "w1")
    empty = write_days(tmp_path / "empty", days)
    (empty / "day_2").write_bytes(b"")
    with pytest.raises(PreprocessInputError, match="day_2 is empty"):
        run(spark, empty, tmp_path / "w2")
    with pytest.raises(PreprocessInputError, match="does not exist"):
        run(spark, tmp_path / "nowhere", tmp_path / "w3")
    twice = write_days(tmp_path / "twice", days)
    (twice / "day_0.gz").write_bytes(gzip.compress(b"0\n"))
    with pytest.raises(PreprocessInputError, match="day 0 is given twice"):
        run(spark, twice, tmp_path / "w4")
    empty_gz = write_days(tmp_path / "empty_gz", days)
    (empty_gz / "day_1").unlink()
    (empty_gz / "day_1.gz").write_bytes(gzip.compress(b""))
    with pytest.raises(PreprocessInputError, match="day_1.gz has no lines"):
        run(spark, empty_gz, tmp_path / "w5")


def test_adding_a_day_counts_only_that_day(tmp_path, spark):
    days = random_days(9, 3, 150)
    raw = write_days(tmp_path / "raw", days[:2])
    work = tmp_path / "work"
    first = run(spark, raw, work, "2")
    assert first["days_counted"] == [0, 1]
    values = WorkdirLayout.at(work).counts / "values"
    before = {p: p.stat().st_mtime_ns for p in values.rglob("*.parquet")}
    write_days(tmp_path / "more", days)
    (raw / "day_2").write_bytes((tmp_path / "more" / "day_2").read_bytes())
    second = run(spark, raw, work, "2")
    assert second["days_counted"] == [2] and second["days_reused"] == [0, 1]
    assert {p: p.stat().st_mtime_ns for p in before} == before  # old partitions untouched
    ref = reference_preprocess(days, "2")
    assert second["table_sizes"] == ref.sizes
    assert_rows_equal(read_split(WorkdirLayout.at(work).parquet_split("test")), ref.splits["test"], "test")
    days_json = json.loads((WorkdirLayout.at(work).counts / "days.json").read_text())
    assert [d["file"] for d in days_json["days"]] == ["day_0", "day_1", "day_2"]
    # reused days keep exact statistics (they come from the row classes, not the value counts)
    for d, day_lines in zip(days_json["days"], days):
        assert d["missing_rate"] == pytest.approx(reference_missing_rates(day_lines)), d["file"]
    # a changed day is recounted; unchanged ones are not
    (raw / "day_0").write_bytes((raw / "day_0").read_bytes() + (days[0][0] + "\n").encode())
    third = run(spark, raw, work, "2")
    assert third["days_counted"] == [0]
    assert third["data_quality"]["rows_read"] == sum(len(d) for d in days) + 1


def test_the_validity_filter_stays_above_the_parse_when_pos_is_not_output(tmp_path, spark):
    """A day with bad lines is parsed with checks and filtered on ``reason``. The train side does
    not output ``pos``; if the optimizer pruned it, the filter would be pushed below the parse
    and ``split`` (with every check) inlined once per field reference — slow, not wrong, so only
    the plan shows it."""
    from spark_jobs.parse import parse_for_transform, read_day

    day = tmp_path / "day_0"
    day.write_text("1\t5\t\tabc\n0\t7\n")
    rows = parse_for_transform(read_day(spark, str(day), 0), seed=1, checked=True)
    plan = rows.select("key1", "label", "C1")._jdf.queryExecution().optimizedPlan().toString()
    assert plan.count("split(") == 1, plan
    assert rows.select("key1", "label").count() == 1  # line 1 has a non-integer I3: filtered
