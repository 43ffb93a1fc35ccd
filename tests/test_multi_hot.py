"""Multi-hot materialization (dlrm_contracts.multi_hot) and the format's multi-hot columns."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
import zipfile

import numpy as np
import pytest

import dlrm_contracts.multi_hot as multi_hot
from dlrm_contracts.binary_format import (
    DatasetError,
    DatasetInfo,
    describe,
    multi_hot_extra,
    multi_hot_sizes,
    read_info,
    row_width,
)
from dlrm_contracts.multi_hot import (
    MultiHotError,
    MultiHotSpec,
    check_sizes,
    iter_tables,
    lookup_table,
    materialize,
    materialize_all,
    spec_of_dataset,
)
from dlrm_contracts.verify import verify_dataset
from tests.config_helpers import MLPERF_MULTI_HOT

# Produced with the reference (mlcommons/training aa344c7, recommendation_v2/torchrec_dlrm/
# multi_hot.py) in a venv with torch 2.13.0 and numpy 2.4.6:
#   m = Multihot(SIZES, CAPS, 1, False, "uniform")
#   torch.nn.functional.embedding(torch.tensor(IDS) % CAPS[c], m.multi_hot_tables_l[c])
CAPS = [
    1000,
    7,
    3,
    50000,
    1,
    97,
    10,
    10,
    10,
    10,
    10,
    10,
    10,
    10,
    10,
    10,
    10,
    10,
    10,
    10,
    100000,
    10,
    10,
    10,
    10,
    2,
]
SIZES = [3, 2, 1, 4, 1, 5, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 6, 1, 1, 1, 1, 3]
IDS = [0, 5, 999, 123456]
REFERENCE_ROWS = {
    0: [[0, 684, 559], [5, 277, 754], [999, 51, 473], [456, 76, 293]],
    1: [[0, 5], [5, 4], [5, 4], [4, 2]],
    3: [
        [0, 31098, 7000, 2321],
        [5, 13728, 38158, 21053],
        [999, 25852, 30218, 40524],
        [23456, 28602, 37728, 9603],
    ],
    5: [[0, 18, 84, 28, 58], [5, 76, 96, 80, 92], [29, 58, 76, 42, 91], [72, 32, 2, 55, 3]],
    20: [
        [0, 22975, 92701, 9982, 53305, 95956],
        [5, 63351, 20313, 33127, 15154, 69617],
        [999, 55884, 96444, 56483, 53943, 83234],
        [23456, 45455, 4669, 68275, 93010, 7929],
    ],
    25: [[0, 1, 0], [1, 1, 1], [1, 1, 1], [0, 1, 0]],
}
SPEC = MultiHotSpec(tuple(CAPS), tuple(SIZES))


def test_rows_equal_the_reference_scripts_output():
    rows = materialize_all(SPEC, [np.array(IDS, dtype=np.int64)] * 26)
    for column, want in REFERENCE_ROWS.items():
        assert rows[column].dtype == np.int32
        assert rows[column].tolist() == want, column
    # one-hot columns: the id modulo the table, one per row
    assert rows[2].tolist() == [[0], [2], [0], [0]]
    assert rows[4].shape == (4, 1) and not rows[4].any()


def test_one_column_alone_equals_the_full_pass():
    """A column's table depends on the stream the columns before it used: one column asked
    for alone (the earlier ones skipped) equals the pass that builds them all."""
    every = dict(iter_tables(SPEC))
    assert sorted(every) == [0, 1, 3, 5, 20, 25]
    for column in (3, 20, 25):
        np.testing.assert_array_equal(lookup_table(SPEC, column), every[column])
        assert materialize(np.array(IDS), lookup_table(SPEC, column)).tolist() == REFERENCE_ROWS[column]


def test_chunked_draws_equal_one_draw(monkeypatch):
    """Tables are filled (and skipped) a chunk at a time: the stream is the same whatever
    the chunk (a prime, so a skipped column's chunks end mid-row)."""
    whole = dict(iter_tables(SPEC))
    monkeypatch.setattr(multi_hot, "CHUNK_DRAWS", 997)
    chunked = dict(iter_tables(SPEC))
    assert sorted(chunked) == sorted(whole)
    for column in whole:
        np.testing.assert_array_equal(chunked[column], whole[column])
    np.testing.assert_array_equal(lookup_table(SPEC, 20), whole[20])


def test_seed_and_distribution_change_the_draws_but_not_the_first_id():
    base = lookup_table(SPEC, 0)
    other_seed = lookup_table(MultiHotSpec(SPEC.table_sizes, SPEC.sizes, seed=1), 0)
    pareto = lookup_table(MultiHotSpec(SPEC.table_sizes, SPEC.sizes, distribution="pareto"), 0)
    for table in (other_seed, pareto):
        np.testing.assert_array_equal(table[:, 0], np.arange(CAPS[0]))
        assert not np.array_equal(table, base)
        assert table.min() >= 0 and table.max() < CAPS[0]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"table_sizes": (3, 0), "sizes": (1, 2)}, "table sizes must be >= 1"),
        ({"table_sizes": (3, 4), "sizes": (1, 0)}, "multi-hot sizes must be >= 1"),
        ({"table_sizes": (3,), "sizes": (1, 2)}, "1 table sizes but 2"),
        ({"table_sizes": (3,), "sizes": (2,), "distribution": "zipf"}, "not one of"),
        ({"table_sizes": (3,), "sizes": (2,), "seed": -1}, "outside"),
    ],
)
def test_bad_specs_are_clear_errors(kwargs, message):
    with pytest.raises(MultiHotError, match=message):
        MultiHotSpec(**kwargs)


def test_check_sizes():
    assert check_sizes(None) == (1,) * 26
    assert check_sizes(SIZES) == tuple(SIZES)
    for bad in ([1] * 25, [1] * 25 + [0], [1] * 25 + [True], [1] * 25 + [2.0]):
        with pytest.raises(MultiHotError, match="26 integers"):
            check_sizes(bad)


def _info(extra) -> DatasetInfo:
    return describe("/nowhere", {"train": 10, "test": 0, "validation": 0}, [1000] * 26, None, "fp", extra)


def test_dataset_description_of_multi_hot_columns():
    one_hot = _info(multi_hot_extra([1] * 26))
    assert "multi_hot_sizes" not in one_hot.to_json()  # one-hot datasets are unchanged
    assert multi_hot_sizes(one_hot) == (1,) * 26 == one_hot.multi_hot_sizes
    info = _info(multi_hot_extra(SIZES))
    assert json.loads(json.dumps(info.to_json()))["multi_hot_sizes"] == SIZES
    assert multi_hot_sizes(info.to_json()) == tuple(SIZES)
    assert row_width("cat_20.bin", info) == (np.dtype("<i2"), 6)
    assert row_width("cat_2.bin", info) == (np.dtype("<i2"), 1)
    assert info.nbytes("train") == 10 * (1 + 2 * 13 + 2 * sum(SIZES))
    with pytest.raises(DatasetError, match="26 integers"):
        multi_hot_sizes({"multi_hot_sizes": [2] * 3})


# ------------------------------------------------------------------ converters, real runs


@pytest.fixture(scope="module")
def multi_hot_workdir(tmp_path_factory):
    """The converter tests' parquet (test_converters.write_workdir), converted one-hot and
    with MLPerf's multi-hot sizes plus the reference's layout."""
    from tests.converter_helpers import CONFIG, write_workdir
    from converters.convert import convert_parquet

    root = tmp_path_factory.mktemp("multi_hot")
    write_workdir(root)
    one_hot = convert_parquet(root / "parquet", root / "one_hot", CONFIG)
    config = dataclasses.replace(
        CONFIG, multi_hot_sizes=MLPERF_MULTI_HOT, formats=["binary", "mlperf_multihot"]
    )
    summary = convert_parquet(root / "parquet", root / "binary", config)
    return root, one_hot, summary


def test_convert_writes_the_reference_rows_of_the_one_hot_ids(multi_hot_workdir):
    root, one_hot, summary = multi_hot_workdir
    plain, multi = read_info(root / "one_hot"), verify_dataset(root / "binary", full=True)
    assert "multi_hot_sizes" not in plain.extra
    assert multi.multi_hot_sizes == tuple(MLPERF_MULTI_HOT)
    assert (multi.extra["multi_hot_seed"], multi.extra["multi_hot_distribution"]) == (0, "uniform")
    spec = spec_of_dataset(multi)
    assert spec == MultiHotSpec(plain.table_sizes, tuple(MLPERF_MULTI_HOT))
    for split in ("train", "validation"):
        ids = [np.fromfile(plain.file(split, f"cat_{c}.bin"), plain.cat_dtypes[c]) for c in range(26)]
        want = materialize_all(spec, ids)
        for c in range(26):
            got = np.fromfile(multi.file(split, f"cat_{c}.bin"), multi.cat_dtypes[c])
            assert got.dtype == np.dtype(plain.cat_dtypes[c])  # same narrow dtype as one-hot
            np.testing.assert_array_equal(got.reshape(-1, MLPERF_MULTI_HOT[c]), want[c])
    # the files a one-hot column writes are the one-hot dataset's, byte for byte
    for name in ("label.bin", "numerical.bin", "cat_2.bin"):
        assert (root / "binary/test" / name).read_bytes() == (root / "one_hot/test" / name).read_bytes()


def test_verify_reads_multi_hot_widths(multi_hot_workdir, tmp_path):
    root, _, _ = multi_hot_workdir
    copy = tmp_path / "copy"
    shutil.copytree(root / "binary", copy)
    path = copy / "train" / "cat_20.bin"
    ids = np.fromfile(path, read_info(copy).cat_dtypes[20])
    ids[100 * 7 + 3] = -1  # row 7's fourth id
    ids.tofile(path)
    with pytest.raises(DatasetError, match=r"cat_20.bin: id -1 at row 7 "):
        verify_dataset(copy, full=True)
    with open(path, "ab") as fh:
        fh.write(b"\0" * 2)
    with pytest.raises(DatasetError, match=r"rows of 100 × int32"):
        verify_dataset(copy, full=False)


def _reference_npz_read(path, name):
    """The reference reader's own way into an npz entry (MultiHotCriteoIterDataPipe.
    _load_from_npz): the entry must be stored, its .npy header 20 bytes past the local header
    it recomputes (np.savez's zip64 extra field), then a memory map."""
    zf = zipfile.ZipFile(path)
    info = zf.NameToInfo[name]
    assert info.compress_type == 0
    zf.fp.seek(info.header_offset + len(info.FileHeader()) + 20)
    version = np.lib.format.read_magic(zf.fp)
    read_header = (
        np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    )
    shape, fortran, dtype = read_header(zf.fp)
    assert dtype == "int32" and not fortran
    return np.memmap(path, dtype=dtype, shape=shape, mode="r", offset=zf.fp.tell())


def test_mlperf_layout_is_what_the_reference_reads(multi_hot_workdir):
    root, _, summary = multi_hot_workdir
    info = read_info(root / "binary")
    out = root / "mlperf_multihot"
    assert summary["mlperf_multihot"]["output"] == str(out) and (out / "_SUCCESS").is_file()
    rows = summary["mlperf_multihot"]["rows_per_day"]
    assert len(rows) == 24 and max(rows[:23]) - min(rows[:23]) <= 1
    assert sum(rows[:23]) == info.splits["train"]
    assert rows[23] == info.splits["test"] + info.splits["validation"]
    flags = json.loads((out / "mlperf_multihot.json").read_text())["dlrm_main_flags"]
    assert flags["--multi_hot_sizes"] == ",".join(map(str, MLPERF_MULTI_HOT))
    for c in (0, 2, 20):
        ours = np.concatenate(
            [
                np.fromfile(info.file(s, f"cat_{c}.bin"), info.cat_dtypes[c])
                for s in ("train", "test", "validation")
            ]
        )
        ours = ours.reshape(-1, MLPERF_MULTI_HOT[c])
        days = [_reference_npz_read(out / f"day_{d}_sparse_multi_hot.npz", f"{c}.npy") for d in range(24)]
        np.testing.assert_array_equal(np.concatenate(days), ours)
        assert np.load(out / "day_5_sparse_multi_hot.npz")[str(c)].shape == (rows[5], MLPERF_MULTI_HOT[c])
    labels = np.concatenate([np.load(out / f"day_{d}_labels.npy") for d in range(24)])
    dense = np.load(out / "day_23_dense.npy")
    assert labels.dtype == np.int32 and labels.shape == (sum(rows), 1)
    assert dense.dtype == np.float32 and dense.shape == (rows[23], 13)
    test_rows = info.splits["test"]
    np.testing.assert_array_equal(
        dense[:test_rows],
        np.fromfile(info.file("test", "numerical.bin"), "<f2").reshape(-1, 13).astype(np.float32),
    )
    # entry for entry the bytes np.savez writes for the same arrays (what the reference uses)
    day = np.load(out / "day_3_sparse_multi_hot.npz")
    arrays = {k: day[k] for k in day.files}
    np.savez(root / "savez.npz", **arrays)
    with (
        zipfile.ZipFile(root / "savez.npz") as theirs,
        zipfile.ZipFile(out / "day_3_sparse_multi_hot.npz") as mine,
    ):
        assert mine.namelist() == theirs.namelist() == [f"{c}.npy" for c in range(26)]
        for name in mine.namelist():
            assert mine.read(name) == theirs.read(name)


def test_rethreshold_materializes_again_at_the_new_table_sizes(multi_hot_workdir):
    """Every draw depends on the table sizes, so a raise re-draws the multi-hot columns from
    their one-hot ids: the result is the reference's rows of the clamped ids at the new sizes,
    and also the reference layout written beside it."""
    from tests.converter_helpers import CONFIG
    from converters.rethreshold import rethreshold

    root, _, _ = multi_hot_workdir
    config = dataclasses.replace(CONFIG, formats=["binary", "mlperf_multihot"])
    summary = rethreshold(root / "binary", root / "counts", "30", root / "raised", config)
    plain, raised = read_info(root / "one_hot"), verify_dataset(root / "raised", full=True)
    assert raised.multi_hot_sizes == tuple(MLPERF_MULTI_HOT)
    assert summary["mlperf_multihot"]["output"] == str(root / "raised_mlperf_multihot")
    changed = [c for c in range(26) if raised.table_sizes[c] != plain.table_sizes[c]]
    assert changed and changed[0] < 20  # the columns after it are drawn again too
    spec = spec_of_dataset(raised)
    assert spec.table_sizes == raised.table_sizes
    ids = [
        np.fromfile(plain.file("test", f"cat_{c}.bin"), plain.cat_dtypes[c]).astype(np.int64)
        for c in range(26)
    ]
    ids = [np.where(col >= size, 0, col) for col, size in zip(ids, raised.table_sizes)]
    want = materialize_all(spec, ids)
    for c in range(26):
        got = np.fromfile(raised.file("test", f"cat_{c}.bin"), raised.cat_dtypes[c])
        np.testing.assert_array_equal(got.reshape(-1, MLPERF_MULTI_HOT[c]), want[c])


def test_stable_ids_reuse_a_day_only_under_the_same_materialization(multi_hot_workdir, tmp_path):
    """A day's multi-hot rows depend on every table's size and the materialization: the
    conversion copies them from the previous dataset only when all of that is unchanged."""
    from converters.segments import SEGMENTS_KEY, previous_segments

    root, _, _ = multi_hot_workdir
    copy = tmp_path / "binary"
    shutil.copytree(root / "binary", copy)
    info = read_info(copy)
    description = json.loads((copy / "dataset.json").read_text())
    description[SEGMENTS_KEY] = {
        split: [{"day": 0, "rows": rows, "token": f"t-{split}"}] for split, rows in info.splits.items()
    }
    (copy / "dataset.json").write_text(json.dumps(description))
    same = spec_of_dataset(info)
    sizes = list(info.table_sizes)
    assert set(previous_segments(copy, sizes, same)) == {(s, f"t-{s}") for s in info.splits}
    grown = sizes[:20] + [sizes[20] + 1] + sizes[21:]
    assert previous_segments(copy, grown, dataclasses.replace(same, table_sizes=tuple(grown))) == {}
    assert previous_segments(copy, sizes, dataclasses.replace(same, seed=1)) == {}
    assert previous_segments(copy, sizes, None) == {}  # now one-hot


def test_preflight_sizes_multi_hot_rows_and_the_reference_layout():
    from dlrm_contracts.config import PipelineConfig
    from pipeline.preflight_needs import _binary_bytes_per_row

    sizes = [1000] * 26  # int16 ids
    config = PipelineConfig()
    assert _binary_bytes_per_row(sizes, config) == 27 + 26 * 2
    config.convert = dataclasses.replace(config.convert, multi_hot_sizes=MLPERF_MULTI_HOT)
    assert _binary_bytes_per_row(sizes, config) == 27 + 2 * sum(MLPERF_MULTI_HOT)
    config.convert = dataclasses.replace(config.convert, formats=["binary", "mlperf_multihot"])
    assert _binary_bytes_per_row(sizes, config) == 27 + 2 * 214 + 4 * 214 + 4 * 13 + 4


def test_pipeline_convert_stage_with_multi_hot_and_the_reference_layout(tmp_path):
    """The pipeline's convert stage (no Spark: the converters' parquet fixture): the layout is
    written from the final dataset, a threshold raise derives and re-draws, a rerun skips, and
    another materialization converts again instead of deriving."""
    from pipeline_helpers import run
    from tests.converter_helpers import write_workdir

    workdir, raw = tmp_path / "w", tmp_path / "raw"
    raw.mkdir()
    write_workdir(workdir)
    config = tmp_path / "mh.yaml"

    def convert(threshold, seed=0):
        config.write_text(
            f"convert:\n  multi_hot_sizes: {MLPERF_MULTI_HOT}\n  multi_hot_seed: {seed}\n"
            "  formats: [binary, mlperf_multihot]\n  fsync: false\n"
        )
        proc, summary = run(
            workdir,
            config,
            "--input",
            str(raw),
            "--stages",
            "convert",
            "--frequency-threshold",
            str(threshold),
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        stage = summary["stages"]["convert"]
        return stage["action"], stage.get("engine")

    def layout_is_the_dataset():
        info = read_info(workdir / "binary")
        meta = json.loads((workdir / "mlperf_multihot/mlperf_multihot.json").read_text())
        assert meta["source_fingerprint"] == info.source_fingerprint
        assert meta["threshold_spec"] == info.threshold_spec
        ours = np.fromfile(info.file("test", "cat_21.bin"), info.cat_dtypes[21]).reshape(-1, 27)
        day = np.load(workdir / "mlperf_multihot/day_23_sparse_multi_hot.npz")["21"]
        np.testing.assert_array_equal(day[: len(ours)], ours)
        return info

    assert convert(2) == ("ran", "converters")
    assert layout_is_the_dataset().multi_hot_sizes == tuple(MLPERF_MULTI_HOT)
    assert convert(2)[0] == "skipped"
    assert convert(30) == ("derived", "rethreshold")  # from the binary dataset
    raised = layout_is_the_dataset()
    assert raised.threshold_spec == "30" and spec_of_dataset(raised).seed == 0
    # another materialization: converted again from the parquet (then raised), never derived
    # from the dataset drawn with seed 0
    assert convert(30, seed=1) == ("derived", "converters+rethreshold")
    assert spec_of_dataset(layout_is_the_dataset()).seed == 1


def test_cli_writes_the_layout_of_an_existing_dataset(multi_hot_workdir, tmp_path):
    root, _, _ = multi_hot_workdir
    out = tmp_path / "layout"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "converters",
            "mlperf-multihot",
            str(root / "binary"),
            "--output",
            str(out),
            "--no-fsync",
            "--no-progress",
            "--json",
        ],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1])["output"] == str(out)
    for name in ("day_0_sparse_multi_hot.npz", "day_23_sparse_multi_hot.npz"):
        with zipfile.ZipFile(out / name) as ours, zipfile.ZipFile(root / "mlperf_multihot" / name) as theirs:
            assert all(ours.read(n) == theirs.read(n) for n in theirs.namelist())
    for name in ("day_23_dense.npy", "day_7_labels.npy"):
        assert (out / name).read_bytes() == (root / "mlperf_multihot" / name).read_bytes()
    missing = subprocess.run(
        [sys.executable, "-m", "converters", "mlperf-multihot", str(tmp_path / "none")],
        capture_output=True,
        text=True,
    )
    assert missing.returncode == 6 and "Traceback" not in missing.stderr
    assert "is not a directory" in missing.stderr
