"""converters: convert (every value), dtype narrowing, atomicity, verify, rethreshold, planner.

Inputs are written here with pyarrow in the layout spark_jobs produces (several files and row
groups per split, files created out of name order), so the expected values are known without
running Spark; the Spark-to-Spark equivalence lives in test_threshold_rerun_equivalence.py.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from converters.convert import convert_parquet
import converters.convert as convert_module
from converters.planner import plan
from converters.rethreshold import rethreshold
from dlrm_contracts.atomic import remove_stale_temporaries
from dlrm_contracts.binary_format import DatasetError, cat_dtype
from dlrm_contracts.config import ConvertConfig
from dlrm_contracts.errors import ExitCode
from dlrm_contracts.schema import CAT_COLUMNS, INT_COLUMNS, SPLITS
from dlrm_contracts.table_sizes import LowerThresholdError, read_histogram
from dlrm_contracts.verify import verify_dataset
from tests.converter_helpers import (
    BASE_THRESHOLD,
    CONFIG,
    SPLIT_ROWS,
    TABLE_SIZES,
    write_histogram,
    write_workdir,
)


def independent_kept(counts_dir: Path, column: str, threshold: int) -> int:
    table = pq.read_table(counts_dir / "histogram.parquet").to_pydict()
    return sum(
        n
        for c, k, n in zip(table["column"], table["count"], table["num_values"])
        if c == column and k >= max(1, threshold)
    )


def read_binary(split_dir: Path, dtypes) -> dict[str, np.ndarray]:
    data = {
        "label": np.fromfile(split_dir / "label.bin", dtype="<u1"),
        "numerical": np.fromfile(split_dir / "numerical.bin", dtype="<f2").reshape(-1, 13),
    }
    for i, dtype in enumerate(dtypes):
        data[f"cat_{i}"] = np.fromfile(split_dir / f"cat_{i}.bin", dtype=np.dtype(dtype))
    return data


@pytest.fixture()
def converted(tmp_path):
    expected = write_workdir(tmp_path)
    summary = convert_parquet(tmp_path / "parquet", tmp_path / "binary", CONFIG)
    return tmp_path, expected, summary


# ------------------------------------------------------------------------------ convert
def test_convert_matches_parquet_every_value_in_all_splits(converted):
    root, expected, summary = converted
    binary = root / "binary"
    assert summary["rows"] == SPLIT_ROWS
    meta = json.loads((binary / "dataset.json").read_text())
    assert meta["splits"] == SPLIT_ROWS
    assert meta["table_sizes"] == TABLE_SIZES
    assert meta["threshold_spec"] == "2"
    assert meta["source_fingerprint"].startswith("xxh3_128:")
    assert json.loads((binary / "model_size.json").read_text()) == dict(zip(CAT_COLUMNS, TABLE_SIZES))
    assert (binary / "_SUCCESS").exists()
    for split in SPLITS:
        table = expected[split]
        got = read_binary(binary / split, meta["cat_dtypes"])
        np.testing.assert_array_equal(got["label"], table.column("label").to_numpy())
        want_num = np.stack([table.column(c).to_numpy() for c in INT_COLUMNS], axis=1)
        np.testing.assert_array_equal(got["numerical"], want_num.astype(np.float16))
        np.testing.assert_allclose(got["numerical"], want_num, rtol=1e-3)
        for i, column in enumerate(CAT_COLUMNS):
            np.testing.assert_array_equal(
                got[f"cat_{i}"], table.column(column).to_numpy(), err_msg=f"{split} {column}"
            )
    assert verify_dataset(binary).splits == SPLIT_ROWS


def test_one_worker_gives_the_same_bytes(converted, tmp_path):
    root, _expected, _summary = converted
    single = ConvertConfig(workers=1, batch_rows=4096, progress=False, fsync=False)
    convert_parquet(root / "parquet", tmp_path / "single", single)
    for split in SPLITS:
        for path in (root / "binary" / split).iterdir():
            assert path.read_bytes() == (tmp_path / "single" / split / path.name).read_bytes()


def test_fingerprint_follows_the_data(converted, tmp_path):
    root, _expected, summary = converted
    part = sorted((root / "parquet" / "test").glob("*.parquet"))[0]
    table = pq.read_table(part)
    labels = 1 - table.column("label").to_numpy()
    pq.write_table(table.set_column(0, "label", pa.array(labels.astype(np.int32))), part)
    again = convert_parquet(root / "parquet", tmp_path / "again", CONFIG)
    assert again["source_fingerprint"] != summary["source_fingerprint"]


@pytest.mark.parametrize(
    "size,dtype",
    [
        (1, "int8"),
        (127, "int8"),
        (128, "int8"),
        (129, "int16"),
        (32767, "int16"),
        (32768, "int16"),
        (32769, "int32"),
        (2**31, "int32"),
    ],
)
def test_narrowest_dtype_at_the_boundaries(size, dtype):
    assert cat_dtype(size).name == dtype


def test_boundary_tables_hold_their_largest_id(converted):
    root, _expected, _summary = converted
    meta = json.loads((root / "binary" / "dataset.json").read_text())
    for i, size in enumerate(TABLE_SIZES):
        assert meta["cat_dtypes"][i] == cat_dtype(size).name
        ids = np.fromfile(root / "binary" / "train" / f"cat_{i}.bin", dtype=meta["cat_dtypes"][i])
        assert ids.max() == size - 1 and ids.min() >= 0


def test_out_of_range_id_in_parquet_is_an_error_not_a_wrap(tmp_path):
    sizes = list(TABLE_SIZES)
    write_workdir(tmp_path, table_sizes=sizes)
    sizes[3] = 127  # the data holds id 127 for C4; a table of 127 cannot
    (tmp_path / "parquet" / "model_size.json").write_text(json.dumps(dict(zip(CAT_COLUMNS, sizes))))
    with pytest.raises(DatasetError, match="C4 has id 127 outside its table of size 127"):
        convert_parquet(tmp_path / "parquet", tmp_path / "binary", CONFIG)
    assert not (tmp_path / "binary").exists()


@pytest.mark.parametrize(
    "column,values,message",
    [
        ("label", [0, 2, 1], "label outside {0, 1}"),
        ("I3", [0.5, float("nan"), 1.0], "column I3 holds nan, a numerical value NaN/inf"),
        (
            "I4",
            [0.5, 70000.0, 1.0],
            "column I4 holds 70000.0, a numerical value NaN/inf or beyond float16 range",
        ),
        ("C2", [0, None, 1], "column C2 has 1 null"),
        ("C5", [0, -1, 1], "C5 has id -1 outside its table"),
    ],
)
def test_bad_parquet_values_are_clear_errors(tmp_path, column, values, message):
    write_workdir(tmp_path)
    part = sorted((tmp_path / "parquet" / "validation").glob("*.parquet"))[-1]
    table = pq.read_table(part)
    index = table.schema.get_field_index(column)
    patched = table.column(column).to_pylist()
    patched[5 : 5 + len(values)] = values
    table = table.set_column(
        index,
        table.schema.field(index).with_nullable(True),
        pa.array(patched, table.schema.field(index).type),
    )
    pq.write_table(table, part)
    with pytest.raises(DatasetError, match=re.escape(message)) as info:
        convert_parquet(tmp_path / "parquet", tmp_path / "binary", CONFIG)
    assert part.name in str(info.value)
    assert not (tmp_path / "binary").exists()


def test_incomplete_parquet_is_refused(tmp_path):
    write_workdir(tmp_path)
    (tmp_path / "parquet" / "_SUCCESS").unlink()
    with pytest.raises(DatasetError, match="incomplete"):
        convert_parquet(tmp_path / "parquet", tmp_path / "binary", CONFIG)


@pytest.mark.parametrize("damage", ["truncated", "empty", "garbage", "corrupt_page"])
def test_unreadable_parquet_file_is_a_clear_error_naming_it(tmp_path, damage):
    write_workdir(tmp_path)
    part = sorted((tmp_path / "parquet" / "test").glob("*.parquet"))[1]
    data = part.read_bytes()
    if damage == "truncated":
        part.write_bytes(data[: len(data) // 2])
    elif damage == "empty":
        part.write_bytes(b"")
    elif damage == "garbage":  # a PAR1 trailer whose footer length is nonsense
        part.write_bytes(b"x" * 100 + (10**6).to_bytes(4, "little") + b"PAR1")
    else:  # the footer is intact, a data page is not
        table = pq.read_table(part)
        pq.write_table(table, part, compression="snappy")
        data = bytearray(part.read_bytes())
        data[100:1100] = b"\xab" * 1000
        part.write_bytes(bytes(data))
    with pytest.raises(DatasetError, match="is not (a readable )?(a )?parquet file") as info:
        convert_parquet(tmp_path / "parquet", tmp_path / "binary", CONFIG)
    assert part.name in str(info.value)
    assert not (tmp_path / "binary").exists()


def test_unreadable_parquet_cli_exit_code_without_traceback(tmp_path):
    write_workdir(tmp_path)
    part = sorted((tmp_path / "parquet" / "train").glob("*.parquet"))[0]
    part.write_bytes(part.read_bytes()[:-3])
    result = subprocess.run(
        [sys.executable, "-m", "converters", "convert", "--workdir", str(tmp_path), "--no-fsync"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == ExitCode.CONVERT
    assert "Traceback" not in result.stderr and part.name in result.stderr


@pytest.mark.parametrize("output", ["parquet", ".", "parquet/train", "binary/../parquet"])
def test_convert_refuses_an_output_overlapping_the_parquet(tmp_path, output):
    write_workdir(tmp_path)
    before = sorted(p.relative_to(tmp_path) for p in (tmp_path / "parquet").rglob("*"))
    with pytest.raises(DatasetError, match="overlaps the parquet"):
        convert_parquet(tmp_path / "parquet", tmp_path / output, CONFIG)
    assert sorted(p.relative_to(tmp_path) for p in (tmp_path / "parquet").rglob("*")) == before


def test_preprocess_json_that_is_not_an_object_is_a_clear_error(tmp_path):
    write_workdir(tmp_path)
    (tmp_path / "parquet" / "preprocess.json").write_text("[2]")
    with pytest.raises(DatasetError, match="preprocess.json: expected a JSON object"):
        convert_parquet(tmp_path / "parquet", tmp_path / "binary", CONFIG)


@pytest.mark.parametrize("command", ["convert", "rethreshold"])
def test_cli_refuses_zero_batch_rows_as_usage(tmp_path, command):
    args = (
        ["convert", "--parquet", str(tmp_path / "p"), "--output", str(tmp_path / "b")]
        if command == "convert"
        else [
            "rethreshold",
            "--source",
            str(tmp_path / "b"),
            "--counts",
            str(tmp_path / "c"),
            "--frequency-threshold",
            "5",
            "--output",
            str(tmp_path / "o"),
        ]
    )
    result = subprocess.run(
        [sys.executable, "-m", "converters", *args, "--batch-rows", "0"], capture_output=True, text=True
    )
    assert result.returncode == 2 and "batch rows must be at least 1" in result.stderr


# ------------------------------------------------------------------------------ atomicity
def _fail_after(monkeypatch, calls: int) -> None:
    real = convert_module.write_batch_columns
    seen = []

    def flaky(*args, **kwargs):
        seen.append(1)
        if len(seen) > calls:
            raise RuntimeError("disk on fire (injected)")
        return real(*args, **kwargs)

    monkeypatch.setattr(convert_module, "write_batch_columns", flaky)


def _siblings(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir())


def test_interrupted_conversion_leaves_nothing_that_looks_finished(tmp_path, monkeypatch):
    write_workdir(tmp_path)
    before = _siblings(tmp_path)
    _fail_after(monkeypatch, 9)
    with pytest.raises(RuntimeError, match="injected"):
        convert_parquet(tmp_path / "parquet", tmp_path / "binary", CONFIG)
    assert not (tmp_path / "binary").exists()
    assert _siblings(tmp_path) == before  # no half-written temporary left behind either


def test_interruption_keeps_the_previous_complete_dataset(converted, monkeypatch):
    root, _expected, _summary = converted
    old = {p: p.read_bytes() for p in (root / "binary").rglob("*") if p.is_file()}
    _fail_after(monkeypatch, 20)  # the test split, after train is written
    with pytest.raises(RuntimeError, match="injected"):
        convert_parquet(root / "parquet", root / "binary", CONFIG)
    assert {p: p.read_bytes() for p in (root / "binary").rglob("*") if p.is_file()} == old
    verify_dataset(root / "binary")


def test_a_killed_runs_temporary_is_removed_and_never_read_as_finished(tmp_path):
    write_workdir(tmp_path)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f".binary.tmp-{dead.pid}-deadbeef"
    (stale / "train").mkdir(parents=True)
    live = tmp_path / f".binary.tmp-{os.getpid()}-cafecafe"
    live.mkdir()
    with pytest.raises(DatasetError, match="no _SUCCESS"):
        verify_dataset(stale)
    assert remove_stale_temporaries(tmp_path / "binary") == [stale]
    assert live.exists()  # a running conversion's directory is left alone


KILL_SCRIPT = """
import os, signal, sys
import converters.convert as c
from dlrm_contracts.config import ConvertConfig
real, calls = c.write_batch_columns, []
def dying(*args):
    calls.append(1)
    if len(calls) > 12:
        os.kill(os.getpid(), signal.SIGKILL)  # a hard kill: no cleanup code runs
    return real(*args)
c.write_batch_columns = dying
c.convert_parquet(sys.argv[1], sys.argv[2],
                  ConvertConfig(workers=2, batch_rows=700, progress=False, fsync=False))
"""


def test_a_hard_killed_conversion_leaves_no_final_dir_and_is_cleaned_next_time(tmp_path):
    write_workdir(tmp_path)
    killed = subprocess.run(
        [sys.executable, "-c", KILL_SCRIPT, str(tmp_path / "parquet"), str(tmp_path / "binary")],
        capture_output=True,
        text=True,
    )
    assert killed.returncode == -9, killed.stderr
    assert not (tmp_path / "binary").exists()
    leftovers = [p for p in tmp_path.iterdir() if p.name.startswith(".binary.tmp-")]
    assert len(leftovers) == 1 and (leftovers[0] / "train" / "label.bin").exists()
    with pytest.raises(DatasetError, match="no _SUCCESS"):
        verify_dataset(leftovers[0])
    convert_parquet(tmp_path / "parquet", tmp_path / "binary", CONFIG)
    assert not leftovers[0].exists()
    verify_dataset(tmp_path / "binary")


def test_interrupted_rethreshold_leaves_no_output_and_the_source_intact(converted, tmp_path, monkeypatch):
    import converters.rethreshold as rethreshold_module

    root, _expected, _summary = converted

    def broken(*args):
        raise OSError("no space left on device (injected)")

    monkeypatch.setattr(rethreshold_module, "clamp_ids_file", broken)
    with pytest.raises(OSError, match="injected"):
        rethreshold(root / "binary", root / "counts", "20", tmp_path / "t20", CONFIG)
    assert not (tmp_path / "t20").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".t20")]
    verify_dataset(root / "binary")


def test_existing_dataset_is_kept_when_overwrite_is_off(converted):
    root, _expected, _summary = converted
    keep = ConvertConfig(**{**CONFIG.__dict__, "overwrite": False})
    with pytest.raises(DatasetError, match="already holds a complete dataset"):
        convert_parquet(root / "parquet", root / "binary", keep)


# ------------------------------------------------------------------------------ verify
def test_verify_catches_a_truncated_file(converted):
    root, _expected, _summary = converted
    path = root / "binary" / "validation" / "cat_8.bin"
    path.write_bytes(path.read_bytes()[:-2])
    with pytest.raises(DatasetError, match=r"validation/cat_8.bin has \d+ bytes"):
        verify_dataset(root / "binary", full=False)


def test_verify_catches_an_out_of_range_id(converted):
    root, _expected, _summary = converted
    meta = json.loads((root / "binary" / "dataset.json").read_text())
    index = 4  # C5, a table of 129 stored as int16
    ids = np.memmap(root / "binary" / "test" / f"cat_{index}.bin", dtype=meta["cat_dtypes"][index], mode="r+")
    ids[1234] = TABLE_SIZES[index]
    ids.flush()
    del ids
    verify_dataset(root / "binary", full=False)  # sizes still fine: only the scan sees it
    with pytest.raises(DatasetError, match=r"test/cat_4.bin: id 129 at row 1234 outside \[0, 129\)"):
        verify_dataset(root / "binary")


def test_verify_catches_a_negative_id_a_bad_label_and_a_non_finite_value(converted):
    root, _expected, _summary = converted
    split = root / "binary" / "train"
    ids = np.memmap(split / "cat_1.bin", dtype=np.int8, mode="r+")
    ids[10] = -1
    ids.flush()
    labels = np.memmap(split / "label.bin", dtype=np.uint8, mode="r+")
    labels[20] = 2
    labels.flush()
    numerical = np.memmap(split / "numerical.bin", dtype=np.float16, mode="r+")
    numerical[13 * 30 + 5] = np.inf
    numerical.flush()
    del ids, labels, numerical
    with pytest.raises(DatasetError) as info:
        verify_dataset(root / "binary")
    message = str(info.value)
    assert "train/cat_1.bin: id -1 at row 10" in message
    assert "train/label.bin: label 2 at row 20" in message
    assert "train/numerical.bin: non-finite value inf at row 30" in message


def test_verify_catches_a_mismatched_description(converted):
    root, _expected, _summary = converted
    meta_path = root / "binary" / "dataset.json"
    meta = json.loads(meta_path.read_text())
    meta["table_sizes"][2] = 200  # int8 no longer holds it, and model_size.json says 127
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(DatasetError) as info:
        verify_dataset(root / "binary", full=False)
    assert "cat_dtypes[2] (C3) is 'int8' but a table of 200 needs 'int16'" in str(info.value)
    assert "model_size.json disagrees with dataset.json table_sizes (C3: 127 vs 200)" in str(info.value)


def test_verify_catches_row_counts_that_disagree_with_files(converted):
    root, _expected, _summary = converted
    meta_path = root / "binary" / "dataset.json"
    meta = json.loads(meta_path.read_text())
    meta["splits"]["test"] += 1
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(DatasetError, match="test/label.bin has 1700 bytes; 1701 rows"):
        verify_dataset(root / "binary", full=False)


def test_verify_refuses_a_dataset_without_success(converted):
    root, _expected, _summary = converted
    (root / "binary" / "_SUCCESS").unlink()
    with pytest.raises(DatasetError, match="incomplete"):
        verify_dataset(root / "binary", full=False)


def test_verify_cli_exit_codes(converted):
    root, _expected, _summary = converted
    command = [sys.executable, "-m", "converters", "verify", str(root / "binary")]
    good = subprocess.run(command, capture_output=True, text=True)
    assert good.returncode == 0, good.stderr
    assert "OK (full check" in good.stdout
    (root / "binary" / "train" / "numerical.bin").write_bytes(b"\0" * 26)
    bad = subprocess.run(command + ["--quick"], capture_output=True, text=True)
    assert bad.returncode == ExitCode.DATASET_INVALID
    assert "train/numerical.bin has 26 bytes; 5000 rows of 13 × float16 need 130000" in bad.stderr


# ------------------------------------------------------------------------------ rethreshold
def _clamped(ids: np.ndarray, kept: int) -> np.ndarray:
    return np.where(ids > kept, 0, ids)


def test_rethreshold_equals_clamping_computed_independently(converted, tmp_path):
    root, expected, _summary = converted
    spec = "20,C3:2,C9:1000,C21:45"
    summary = rethreshold(root / "binary", root / "counts", spec, tmp_path / "t20", CONFIG)
    out = tmp_path / "t20"
    meta = json.loads((out / "dataset.json").read_text())
    assert meta["threshold_spec"] == "20,C3:2,C9:1000,C21:45"
    assert meta["source"]["threshold_spec"] == "2"
    overrides = {"C3": 2, "C9": 1000, "C21": 45}
    kept = [independent_kept(root / "counts", c, overrides.get(c, 20)) for c in CAT_COLUMNS]
    assert meta["table_sizes"] == [k + 1 for k in kept]
    assert summary["table_sizes"] == dict(zip(CAT_COLUMNS, meta["table_sizes"]))
    assert meta["cat_dtypes"][7] == "int16"  # 32769 → about 2/3 kept → int16 now
    assert meta["table_sizes"][8] == 1 and meta["cat_dtypes"][8] == "int8"
    for split in SPLITS:
        got = read_binary(out / split, meta["cat_dtypes"])
        table = expected[split]
        np.testing.assert_array_equal(got["label"], table.column("label").to_numpy())
        for i, column in enumerate(CAT_COLUMNS):
            want = _clamped(table.column(column).to_numpy(), kept[i])
            np.testing.assert_array_equal(got[f"cat_{i}"], want, err_msg=f"{split} {column}")
            assert got[f"cat_{i}"].dtype == cat_dtype(kept[i] + 1)
        assert (out / split / "numerical.bin").read_bytes() == (
            root / "binary" / split / "numerical.bin"
        ).read_bytes()
    verify_dataset(out)


def test_rethreshold_copy_mode_gives_the_same_bytes(converted, tmp_path):
    root, _expected, _summary = converted
    linked = rethreshold(root / "binary", root / "counts", "30", tmp_path / "a", CONFIG)
    copied_config = ConvertConfig(**{**CONFIG.__dict__, "link_unchanged": False})
    rethreshold(root / "binary", root / "counts", "30", tmp_path / "b", copied_config)
    for split in SPLITS:
        for path in (tmp_path / "a" / split).iterdir():
            assert path.read_bytes() == (tmp_path / "b" / split / path.name).read_bytes()
        assert (tmp_path / "b" / split / "label.bin").stat().st_nlink == 1
    assert linked["columns_rewritten"]


def test_rethreshold_at_the_same_threshold_is_the_identity(converted, tmp_path):
    root, _expected, _summary = converted
    summary = rethreshold(root / "binary", root / "counts", "2", tmp_path / "same", CONFIG)
    assert summary["columns_rewritten"] == []
    for split in SPLITS:
        for path in (root / "binary" / split).iterdir():
            assert path.read_bytes() == (tmp_path / "same" / split / path.name).read_bytes()


@pytest.mark.parametrize("spec", ["1", "5,C7:1", "0"])
def test_rethreshold_refuses_a_lower_threshold(converted, tmp_path, spec):
    root, _expected, _summary = converted
    with pytest.raises(LowerThresholdError, match="needs a Spark rerun"):
        rethreshold(root / "binary", root / "counts", spec, tmp_path / "lower", CONFIG)
    assert not (tmp_path / "lower").exists()


def test_rethreshold_cli_refusal_exit_code(converted, tmp_path):
    root, _expected, _summary = converted
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "converters",
            "rethreshold",
            "--source",
            str(root / "binary"),
            "--counts",
            str(root / "counts"),
            "--frequency-threshold",
            "1",
            "--output",
            str(tmp_path / "x"),
        ],
        capture_output=True,
        text=True,
    )
    assert result.returncode == ExitCode.CONVERT
    assert "Spark rerun" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("output", ["binary", "t20/../binary", ".", "counts"])
def test_rethreshold_refuses_an_output_overlapping_its_inputs(converted, output):
    root, _expected, _summary = converted
    before = (root / "binary" / "dataset.json").read_text()
    with pytest.raises(DatasetError, match="overlaps the (source dataset|counts)"):
        rethreshold(root / "binary", root / "counts", "20", root / output, CONFIG)
    assert (root / "binary" / "dataset.json").read_text() == before
    assert (root / "counts" / "histogram.parquet").exists()
    verify_dataset(root / "binary")


def test_rethreshold_refuses_counts_of_another_dataset(converted, tmp_path):
    root, _expected, _summary = converted
    other = tmp_path / "other"
    write_histogram(other, [s + 1 for s in TABLE_SIZES], np.random.default_rng(1))
    with pytest.raises(DatasetError, match="do not belong to this dataset"):
        rethreshold(root / "binary", other, "10", tmp_path / "x", CONFIG)


# ------------------------------------------------------------------------------ planner
def test_planner_sizes_match_the_histogram(tmp_path):
    rng = np.random.default_rng(3)
    write_histogram(tmp_path / "counts", TABLE_SIZES, rng)
    rows = plan(tmp_path / "counts", ["1", "2", "5", "15,C3:3"], embedding_dim=16, dtype_bytes=2)
    for row in rows:
        spec = row["threshold_spec"]
        default, _, override = spec.partition(",")
        for column in CAT_COLUMNS:
            t = int(override.split(":")[1]) if override.startswith(column + ":") else int(default)
            assert row["table_sizes"][column] == independent_kept(tmp_path / "counts", column, t) + 1
        assert row["embedding_bytes"] == sum(row["table_sizes"].values()) * 16 * 2
    # Threshold 0 and 1 both keep every value seen; 2 drops the values seen once.
    assert rows[0]["table_sizes"]["C1"] == independent_kept(tmp_path / "counts", "C1", 0) + 1
    assert rows[0]["total_rows"] > rows[1]["total_rows"] >= rows[2]["total_rows"]
    histogram = read_histogram(tmp_path / "counts")
    assert histogram.table_sizes("2") == dict(zip(CAT_COLUMNS, TABLE_SIZES))


def test_planner_cli_json(tmp_path):
    write_histogram(tmp_path / "counts", TABLE_SIZES, np.random.default_rng(4))
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "converters",
            "plan",
            "--counts",
            str(tmp_path / "counts"),
            "--thresholds",
            "2,10",
            "--embedding-dim",
            "8",
            "--json",
        ],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout.strip().splitlines()[-1])
    assert [r["threshold_spec"] for r in rows] == ["2", "10"]
    assert rows[0]["table_sizes"] == dict(zip(CAT_COLUMNS, TABLE_SIZES))
    text = subprocess.run(
        [
            sys.executable,
            "-m",
            "converters",
            "plan",
            "--counts",
            str(tmp_path / "counts"),
            "--thresholds",
            "2",
        ],
        capture_output=True,
        text=True,
    ).stdout
    assert "C26" in text and "memory (dim 128, 4 B)" in text


def test_a_corrupt_histogram_is_a_clear_error(tmp_path):
    (tmp_path / "counts").mkdir()
    (tmp_path / "counts" / "histogram.parquet").write_bytes(b"PAR1 cut short")
    with pytest.raises(DatasetError, match="histogram.parquet is not a readable parquet file"):
        read_histogram(tmp_path / "counts")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "converters",
            "plan",
            "--counts",
            str(tmp_path / "counts"),
            "--thresholds",
            "2",
        ],
        capture_output=True,
        text=True,
    )
    assert result.returncode == ExitCode.DATASET_INVALID and "Traceback" not in result.stderr


@pytest.mark.parametrize("flag", ["--embedding-dim", "--dtype-bytes"])
def test_planner_refuses_a_non_positive_width(tmp_path, flag):
    write_histogram(tmp_path / "counts", TABLE_SIZES, np.random.default_rng(4))
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "converters",
            "plan",
            "--counts",
            str(tmp_path / "counts"),
            "--thresholds",
            "2",
            flag,
            "0",
        ],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2 and "must be at least 1" in result.stderr


def test_rethreshold_refuses_a_dataset_with_stable_ids(tmp_path):
    """Stable ids (preprocess.ids: stable) are not ordered by count: no threshold of them is a
    prefix, so the dataset records them and any other threshold is refused, by rethreshold and
    by the trainer's reader; the same one (a rebuild after damage) still derives."""
    write_workdir(tmp_path)
    (tmp_path / "parquet" / "preprocess.json").write_text(
        json.dumps({"threshold_spec": str(BASE_THRESHOLD), "ids": "stable"})
    )
    convert_parquet(tmp_path / "parquet", tmp_path / "binary", CONFIG)
    assert verify_dataset(tmp_path / "binary").extra["ids"] == "stable"
    with pytest.raises(DatasetError, match="stable ids"):
        rethreshold(tmp_path / "binary", tmp_path / "counts", "30", tmp_path / "t30", CONFIG)
    assert not (tmp_path / "t30").exists()
    rethreshold(tmp_path / "binary", tmp_path / "counts", str(BASE_THRESHOLD), tmp_path / "same", CONFIG)
    assert verify_dataset(tmp_path / "same").extra["ids"] == "stable"
    from trainer.data import open_dataset  # numpy only: the trainer's reader refuses it too

    with pytest.raises(DatasetError, match="stable ids"):
        open_dataset(tmp_path / "binary", threshold="30")
    assert open_dataset(tmp_path / "binary", threshold=str(BASE_THRESHOLD)).table_sizes == tuple(TABLE_SIZES)
