"""A damaged dictionary index: one clear line naming the file and the fix, never a signal death,
a hang, or a run that ends well with other ids (spark_jobs/engines/arrow/index_checks.py).

The fuzz runs in a process of its own (tests/index_damage.py) so that a crash or a hang fails
the test instead of killing the test runner; a few damages go through a real preprocess run.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dlrm_contracts.errors import ExitCode
from index_damage import COLUMNS, FIX, build
from pipeline.processes import KNOWN_ERROR
from pipeline_helpers import run
from spark_fixtures import random_days, write_days
from spark_jobs.engines.arrow import dictionary_index as di
from spark_jobs.engines.arrow import index_checks
from spark_jobs.engines.arrow.kernels import build_region, lookup_column, relabel_region

HELPER = str(Path(__file__).with_name("index_damage.py"))
# far above what any of these takes: only a process that loops for good reaches it
HANG = 900


def test_random_damages_end_in_a_refusal_or_the_same_ids(tmp_path):
    """300 seeded damages to index.json and the range files: each is refused with one line or
    gives the ids of the intact index. Forged ones (their checksums recomputed) may give other
    ids but still never crash or loop, even a range with no empty slot."""
    proc = subprocess.run(
        [sys.executable, HELPER, "fuzz", "35", "300", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=HANG,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["failures"] == []
    results = report["results"]
    assert sum(sum(r.values()) for r in results.values()) == 300
    outcomes = {k: set(r) for k, r in results.items()}
    assert all(o <= {"refused", "same"} for k, o in outcomes.items() if not k.startswith("forged"))
    refused = sum(r.get("refused", 0) for r in results.values())
    assert refused > 200
    for kind in (
        "region:flip-key",
        "region:flip-id",
        "region:truncate",
        "region:missing",
        "region:full",
        "json-bytes:truncate",
        "json-fields:bounds:shift",
        "json-fields:starts:shift",
    ):
        assert outcomes.get(kind) == {"refused"}, kind  # a change of bytes is caught
    assert outcomes["region:same-bytes"] == {"same"}
    # a forged range with no empty slot was looked up, and the lookups ended
    assert outcomes["forged region:full"] == {"other ids"}


def _forged(index_dir: Path, edit) -> None:
    """index.json edited, then its own checksum recomputed: only the structural checks stand."""
    meta = json.loads((index_dir / di.INDEX_JSON).read_text())
    edit(meta["columns"])
    meta["checksum"] = index_checks.meta_checksum(meta["columns"])
    (index_dir / di.INDEX_JSON).write_text(json.dumps(meta))


def _set(column: str, key: str, i: int, value):
    def edit(columns):
        columns[column][key][i] = value

    return edit


@pytest.mark.parametrize(
    "edit, says",
    [
        (_set("C1", "starts", 1, 0), "starts are not the sums of the sizes before them"),
        (_set("C1", "starts", 2, 10**9), "starts are not the sums"),
        (_set("C1", "sizes", 0, 100), "not whole pages"),
        (_set("C1", "sizes", 0, -512), "'sizes' is not a list of integers"),
        (_set("C1", "bounds", 2, 5), "bounds not ascending from 0"),
        (_set("C1", "bounds", 0, 1), "bounds not ascending from 0"),
        (_set("C1", "bounds", 1, 2**40), "'bounds' is not a list of integers"),
        (_set("C2", "checksums", 0, None), "no checksum for each range"),
        (lambda c: c["C1"]["bounds"].pop(), "bounds, starts and sizes of different lengths"),
        (lambda c: c.pop("C3"), "no entry for column C3"),
        # a range grown by a page and the starts after it moved: consistent, but not its file
        (
            lambda c: c["C1"].update(
                sizes=[c["C1"]["sizes"][0] + 512, *c["C1"]["sizes"][1:]],
                starts=[0, c["C1"]["starts"][1] + 512, c["C1"]["starts"][2] + 512],
            ),
            "bytes where index.json says",
        ),
    ],
)
def test_a_forged_layout_is_refused_before_the_first_mapping(tmp_path, monkeypatch, edit, says):
    build(tmp_path)
    _forged(tmp_path, edit)
    mapped = []
    monkeypatch.setattr(di, "_map_column", lambda *a: mapped.append(a))
    with pytest.raises(index_checks.DictionaryIndexError, match=says) as error:
        di.DictionaryIndex(str(tmp_path), COLUMNS)
    assert str(tmp_path) in str(error.value) and FIX in str(error.value)
    assert mapped == []


def test_an_index_that_was_never_sealed_is_refused(tmp_path):
    build(tmp_path)
    meta = json.loads((tmp_path / di.INDEX_JSON).read_text())
    del meta["checksum"]
    (tmp_path / di.INDEX_JSON).write_text(json.dumps(meta))
    with pytest.raises(index_checks.DictionaryIndexError, match="not sealed"):
        di.DictionaryIndex(str(tmp_path), COLUMNS)


def test_a_probe_ends_in_a_region_without_an_empty_slot():
    """Every slot taken by another value: the lookup ends after one lap of the region (in a
    process of its own: without the bound it would loop for good)."""
    code = """if True:
        import numpy as np
        from spark_jobs.engines.arrow.kernels import lookup_column
        slots = (np.arange(1, 1025, dtype=np.uint64) | (np.uint64(7) << np.uint64(32)))
        out = np.full(3, -9, np.int32)
        lookup_column(np.array([5000, 6000, 3], np.int64), np.zeros(1, np.uint32),
                      np.zeros(1, np.int64), np.full(1, 1024, np.int64), slots, out)
        print(out.tolist())
    """
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=HANG)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "[0, 0, 7]"


def test_a_full_region_is_reported_by_the_build_not_looped_on():
    region = np.zeros(4, np.uint64)
    assert build_region(np.arange(1, 7, dtype=np.uint32), np.arange(1, 7, dtype=np.int32), region) == 2
    assert np.count_nonzero(region) == 4
    out = np.zeros(1, np.int32)
    lookup_column(
        np.array([99], np.int64),
        np.zeros(1, np.uint32),
        np.zeros(1, np.int64),
        np.full(1, 4, np.int64),
        region,
        out,
    )
    assert out[0] == 0


def test_a_staged_slot_pointing_past_its_rows_is_an_error_not_a_read():
    region = np.array([0, 5 | 1 << 32, 6 | 3 << 32, 7 | 2**31 << 32], np.uint64)
    with pytest.raises(ValueError, match="points past its group's rows"):
        relabel_region(region, np.array([0, 11, 12, 13], np.int32))
    assert (region[:3] >> np.uint64(32)).tolist() == [0, 11, 13]


# ---------------------------------------------------------------- a real preprocess run


@pytest.mark.spark
@pytest.mark.slow
def test_a_damaged_index_stops_the_run_in_one_line_and_a_forced_rerun_rebuilds_it(tmp_path):
    """The index damaged after the dictionary tasks sealed it and before the transform read it
    (a flipped key: same size, other bytes; the fuzz covers the other damages): exit 5 and one
    error line naming the file and the fix, no _SUCCESS; then ``--stages preprocess --force`` rebuilds the outputs the input must give."""
    from spark_fixtures import check_against_reference

    days = random_days(35, 3, 300)
    raw = write_days(tmp_path / "raw", days)
    workdir, config = tmp_path / "w", tmp_path / "pipeline.yaml"
    config.write_text('spark:\n  driver_memory: 1g\npreprocess:\n  frequency_threshold: "2"\n')
    proc = subprocess.run(
        [
            sys.executable,
            HELPER,
            "spark",
            "flip-key",
            "--",
            "--input",
            str(raw),
            "--workdir",
            str(workdir),
            "--config",
            str(config),
        ],
        capture_output=True,
        text=True,
        timeout=HANG,
    )
    assert proc.returncode == ExitCode.PREPROCESS, proc.stderr[-3000:]
    # the job's one line, as the pipeline picks it out of the stage's log (Spark's own log
    # lines, the executor's report of the failed task among them, go to the log only)
    lines = proc.stderr.strip().splitlines()
    known = [m.group(1) for m in map(KNOWN_ERROR.match, lines) if m]
    assert known == [lines[-1]], proc.stderr[-3000:]
    assert lines[-1].startswith(
        "spark_jobs: error: Spark job failed: DictionaryIndexError: damaged dictionary index: "
    ), lines[-1]
    index = workdir / "parquet" / "dictionary_index"
    assert str(index) in lines[-1] and ".slots" in lines[-1] and FIX in lines[-1], lines[-1]
    assert not (workdir / "parquet" / "_SUCCESS").exists()
    proc, summary = run(workdir, config, "--input", str(raw), "--stages", "preprocess", "--force")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert summary["stages"]["preprocess"]["action"] == "ran"
    preprocess = json.loads((workdir / "parquet" / "preprocess.json").read_text())
    check_against_reference(days, workdir, preprocess, "2")
