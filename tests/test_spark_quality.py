"""Bad input never vanishes: rejects with reasons, the rows-in identity, the reject-rate limit,
gzip + CRLF, empty and missing days, and incremental counting."""

from __future__ import annotations

import gzip
import json
import shutil
from collections import Counter

import pytest

from dlrm_contracts.config import PreprocessConfig
from dlrm_contracts.layout import WorkdirLayout
from spark_fixtures import (
    BAD_LINES,
    assert_rows_equal,
    random_days,
    read_split,
    reference_missing_rates,
    reference_preprocess,
    run,
    salted_days,
    sort_key,
    write_days,
)
from spark_jobs.errors import PreprocessInputError

pytestmark = pytest.mark.spark


SALTED_LIMIT = 0.2  # above the salted days' reject rate


@pytest.fixture(scope="module")
def salted(tmp_path_factory, spark):
    """Three salted days run once: read by the tests below, and copied by those that change
    the input or the workdir and run again."""
    days = salted_days(5, 3, 250)
    raw = write_days(tmp_path_factory.mktemp("salted") / "raw", days)
    work = tmp_path_factory.mktemp("salted_work")
    summary = run(spark, raw, work, "2", max_reject_rate=SALTED_LIMIT)
    return days, raw, work, summary


def _copy_of(salted, tmp_path):
    """(days, raw, work, summary): a copy of the salted run's input and workdir to change and
    run again. Copies keep their files' modification times, so the days' fingerprints (name,
    size, mtime, sampled hash) still match the counts' record and nothing is counted again
    unless a test changes it."""
    days, raw, work, summary = salted
    shutil.copytree(raw, tmp_path / "raw")
    shutil.copytree(work, tmp_path / "work")
    return [list(lines) for lines in days], tmp_path / "raw", tmp_path / "work", summary


def _rejects(work) -> list[dict]:
    rows = []
    for file in sorted((WorkdirLayout.at(work).rejects).glob("part-*.json")):
        # split on '\n' only: a rejected line may hold NEL or U+2028, which JSON leaves as is
        rows += [json.loads(line) for line in file.read_text(encoding="utf-8").split("\n") if line]
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
        assert read_split(WorkdirLayout.at(tmp_path / "work").parquet_split(split)) == read_split(
            WorkdirLayout.at(work).parquet_split(split)
        ), split
    assert Counter(r["reason"] for r in _rejects(tmp_path / "work")) == Counter(
        r["reason"] for r in _rejects(work)
    )


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


def test_adding_a_day_counts_only_that_day(salted, tmp_path, spark):
    days, raw, work, first = _copy_of(salted, tmp_path)
    assert first["days_counted"] == [0, 1, 2]
    values = WorkdirLayout.at(work).counts / "values"
    before = {p: p.stat().st_mtime_ns for p in values.rglob("*.parquet")}
    days.append(salted_days(9, 1, 150)[0])
    write_days(tmp_path / "more", days)
    (raw / "day_3").write_bytes((tmp_path / "more" / "day_3").read_bytes())
    second = run(spark, raw, work, "2", max_reject_rate=SALTED_LIMIT)
    assert second["days_counted"] == [3] and second["days_reused"] == [0, 1, 2]
    assert {p: p.stat().st_mtime_ns for p in before} == before  # old partitions untouched
    ref = reference_preprocess(days, "2")
    assert second["table_sizes"] == ref.sizes
    assert_rows_equal(read_split(WorkdirLayout.at(work).parquet_split("test")), ref.splits["test"], "test")
    days_json = json.loads((WorkdirLayout.at(work).counts / "days.json").read_text())
    assert [d["file"] for d in days_json["days"]] == ["day_0", "day_1", "day_2", "day_3"]
    # reused days keep exact statistics (integers from the row classes, categoricals from the
    # stored value counts)
    for d, day_lines in zip(days_json["days"], days):
        assert d["missing_rate"] == pytest.approx(reference_missing_rates(day_lines)), d["file"]
    # a changed day is recounted; unchanged ones are not
    (raw / "day_0").write_bytes((raw / "day_0").read_bytes() + (days[0][0] + "\n").encode())
    third = run(spark, raw, work, "2", max_reject_rate=SALTED_LIMIT)
    assert third["days_counted"] == [0]
    assert third["data_quality"]["rows_read"] == sum(len(d) for d in days) + 1


def test_the_validity_filter_stays_above_the_parse_when_pos_is_not_output(tmp_path, spark):
    """A day with bad lines is parsed with checks and filtered on ``reason``. The train side does
    not output ``pos``; if the optimizer pruned it, the filter would be pushed below the parse
    and ``split`` (with every check) inlined once per field reference — slow, not wrong, so only
    the plan shows it."""
    from spark_jobs.engines.sql.parse import parse_for_transform, read_day

    day = tmp_path / "day_0"
    day.write_text("1\t5\t\tabc\n0\t7\n")
    rows = parse_for_transform(read_day(spark, str(day), 0), PreprocessConfig().max_line_bytes, checked=True)
    plan = rows.select("label", "C1")._jdf.queryExecution().optimizedPlan().toString()
    assert plan.count("split(") == 1, plan
    assert rows.select("label").count() == 1  # line 1 has a non-integer I3: filtered


# Line terminators other than '\n' inside a line are data. Hadoop's default reader also ends a
# line at a lone '\r' (which split one line into two and shifted every later line number and
# the test/validation split), and Java's '$' also matches before a final '\r', NEL, U+2028 or
# U+2029 (which let "1\u0085" through as a label-0 row, let a last categorical "abcdef\u0085"
# into the dictionaries, and crashed the job with CAST_INVALID_INPUT on "1\t5\u0085").
_VALID = "1\t" + "\t".join(["5"] * 13) + "\t" + "\t".join(["0a0b0c0d"] * 26)
TERMINATOR_LINES = {
    "bad_label": ["1\u0085", "0\u2029", "1\u2028"],
    "non_integer": [
        "1\t5\r6",
        "1\t2\t3\rabc",
        "1\t5\u0085",
        "0\t1\t2\u2028",
        "0\t1\r\t2",
        _VALID.replace("\t5\t0a0b0c0d", "\t5\u0085\t0a0b0c0d"),
    ],
    "non_hex_categorical": [
        _VALID[:-8] + "abcdef\u0085",
        _VALID[:-1] + "\u0085",
        _VALID[:-2] + "c\u2028",
        "0" + "\t" * 14 + "ab\rcd",
    ],
}


def test_cr_nel_and_unicode_line_separators_inside_a_line_are_data(tmp_path, spark):
    rng_days = random_days(21, 2, 60)
    bad = [line for lines in TERMINATOR_LINES.values() for line in lines]
    days = [
        rng_days[0][:30] + bad + rng_days[0][30:],
        rng_days[1][:20] + bad[:6] + rng_days[1][20:],
    ]  # last day: before the split point
    raw = write_days(tmp_path / "raw", days)
    work = tmp_path / "work"
    summary = run(spark, raw, work, "1", max_reject_rate=1.0)
    ref = reference_preprocess(days, "1")
    report = json.loads(WorkdirLayout.at(work).data_quality.read_text())
    assert report["rows_in"] == sum(len(d) for d in days)
    assert report["totals"]["rejected_by_reason"] == {r: ref.rejected[r] for r in BAD_LINES}
    expected = Counter({r: len(v) for r, v in TERMINATOR_LINES.items()})
    expected.update(r for r, lines in TERMINATOR_LINES.items() for line in lines if line in bad[:6])
    assert ref.rejected == expected  # the reference agrees that every one of them is rejected
    for r in _rejects(work):
        day = int(r["file"].split("_")[1])
        assert days[day][r["line_number"] - 1] == r["line"], r
    assert summary["table_sizes"] == ref.sizes
    for split in ("test", "validation"):
        assert_rows_equal(read_split(WorkdirLayout.at(work).parquet_split(split)), ref.splits[split], split)
    train = sorted(read_split(WorkdirLayout.at(work).parquet_split("train")), key=sort_key)
    assert_rows_equal(train, sorted(ref.splits["train"], key=sort_key), "train")


def test_a_recounted_day_that_has_no_values_left_drops_its_old_counts(salted, tmp_path, spark):
    days, raw, work, _ = _copy_of(salted, tmp_path)
    days[1] = ["x\ty"] * 40  # every line rejected now: no value of day 1 may stay counted
    (raw / "day_1").write_text("".join(line + "\n" for line in days[1]))
    summary = run(spark, raw, work, "1", max_reject_rate=1.0)  # 1: every counted value kept
    assert summary["days_counted"] == [1]
    assert summary["table_sizes"] == reference_preprocess(days, "1").sizes
    assert not (WorkdirLayout.at(work).counts / "values" / "day=1").exists()


def test_counts_of_another_days_json_version_are_recounted(salted, tmp_path, spark):
    _, raw, work, _ = _copy_of(salted, tmp_path)
    days_json = WorkdirLayout.at(work).counts / "days.json"
    data = json.loads(days_json.read_text())
    days_json.write_text(json.dumps({**data, "format_version": data["format_version"] - 1}))
    assert run(spark, raw, work, "1", max_reject_rate=SALTED_LIMIT)["days_counted"] == [0, 1, 2]
    assert run(spark, raw, work, "1", max_reject_rate=SALTED_LIMIT)["days_counted"] == []


def test_broken_gzip_days_are_clear_errors(tmp_path, spark):
    from spark_jobs.errors import PreprocessJobError

    days = random_days(27, 2, 200)
    raw = write_days(tmp_path / "raw", days)
    data = (raw / "day_1").read_bytes()
    (raw / "day_1").unlink()
    (raw / "day_1.gz").write_bytes(data)  # plain text named .gz
    with pytest.raises(PreprocessInputError, match=r"day_1.gz is not gzip-compressed"):
        run(spark, raw, tmp_path / "w1")
    (raw / "day_1.gz").write_bytes(gzip.compress(data)[:-200])  # truncated
    with pytest.raises(PreprocessJobError, match=r"day_1\.gz.*EOFException: Unexpected end"):
        run(spark, raw, tmp_path / "w2")


def test_damaged_stored_counts_are_counted_again_from_the_day_file(salted, tmp_path, spark):
    """A truncated stored counts file (a disk, a copy cut short) makes its day counted again,
    not a failed job: the day file is at hand, and the outputs equal the reference's."""
    days, raw, work, _ = _copy_of(salted, tmp_path)
    damaged = sorted((WorkdirLayout.at(work).counts / "values" / "day=1").glob("*.parquet"))[0]
    damaged.write_bytes(damaged.read_bytes()[:100])
    again = run(spark, raw, work, "2", max_reject_rate=SALTED_LIMIT)
    assert again["days_counted"] == [1] and again["days_reused"] == [0, 2]
    ref = reference_preprocess(days, "2")
    assert again["table_sizes"] == ref.sizes
    assert_rows_equal(read_split(WorkdirLayout.at(work).parquet_split("test")), ref.splits["test"], "test")
    # days.json, the record of what was counted, damaged: every day is counted again
    (WorkdirLayout.at(work).counts / "days.json").write_text('{"format_version": 3, "days": [{"da')
    again = run(spark, raw, work, "2", max_reject_rate=SALTED_LIMIT)
    assert again["days_counted"] == [0, 1, 2] and again["table_sizes"] == ref.sizes


def test_a_python_tasks_error_reaches_the_user_as_its_own_line():
    from spark_jobs.spark_failure import python_worker_error as _python_worker_error

    trace = [
        "An exception was thrown from the Python worker. Please see the stack trace below.",
        "Traceback (most recent call last):",
        'File "x.py", line 1, in run',
        "pyarrow.lib.ArrowInvalid: Parquet magic bytes not found in footer.",
    ]
    assert _python_worker_error(trace) == "ArrowInvalid: Parquet magic bytes not found in footer."
    trace[-1] = "ValueError: the stored value counts /w/c.parquet are damaged"
    assert _python_worker_error(trace) == "ValueError: the stored value counts /w/c.parquet are damaged"
