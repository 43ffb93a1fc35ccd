"""Bad configs, bad input and damaged workdirs, tried as a new user (and a disk) would: each
case ends with one line, a documented exit code and the JSON summary, never a traceback and
never ``ok`` over an output that differs from what its stage wrote; nothing outside the
workdir is touched. The Spark and serving cases are in test_spark_quality.py and
test_serving.py; these need no Spark (the workdirs are made from parquet written here).
The refused settings and the damaged workdirs' convert, train and eval runs are the pipeline's
command line run in this process (tests/pipeline_helpers.py run_in_process: its exit code and
output, a traceback counted as one); a config file, a read-only or misshapen workdir and the
input's checks go through a process of their own.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dlrm_contracts.errors import ExitCode
from tests.pipeline_helpers import run_in_process, same_tree

REPO = Path(__file__).resolve().parent.parent


def run_pipeline(cwd: Path, *args: str, timeout: int = 600):
    """(process, JSON summary or None) of ``python -m pipeline ARGS`` run from ``cwd``."""
    proc = subprocess.run(
        [sys.executable, "-m", "pipeline", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    lines = proc.stdout.strip().splitlines()
    summary = json.loads(lines[-1]) if lines and lines[-1].startswith("{") else None
    return proc, summary


def assert_refused(proc, summary, code: ExitCode, *words: str) -> None:
    """One known failure: its code, its words on stderr, no traceback, the summary last."""
    assert proc.returncode == code, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert summary is not None and summary["status"].startswith("failed"), proc.stdout[-2000:]
    for word in words:
        assert word in proc.stderr, (word, proc.stderr[-3000:])


def files_under(root: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in root.rglob("*")
        if p.is_file()
    }


# ------------------------------------------------------------------ config files and workdirs
@pytest.mark.parametrize("content", [b'spark:\n  master: "\xff\xfe"\n', b"\xff\xfe\x00\x01"])
def test_a_config_file_that_is_not_utf8_is_one_line_and_exit_2(tmp_path, content):
    config = tmp_path / "latin1.yaml"
    config.write_bytes(content)
    before = files_under(tmp_path)
    proc, summary = run_pipeline(tmp_path, "--config", str(config), "--workdir", str(tmp_path / "w"))
    assert_refused(proc, summary, ExitCode.USAGE, "latin1.yaml", "UTF-8")
    assert summary == {"status": "failed: usage", "error": summary["error"], "stages": {}}
    assert files_under(tmp_path) == before  # no workdir, nothing else


@contextlib.contextmanager
def read_only(path: Path):
    """``path`` made read-only for this test's processes: immutable when they run as root
    (root ignores permission bits), mode 0555 otherwise."""
    if os.geteuid() == 0:
        subprocess.run(["chattr", "+i", str(path)], check=True)
        try:
            yield
        finally:
            subprocess.run(["chattr", "-i", str(path)], check=True)
    else:
        mode = path.stat().st_mode
        path.chmod(0o555)
        try:
            yield
        finally:
            path.chmod(mode)


@pytest.mark.parametrize("lock_exists", [False, True])
def test_a_read_only_workdir_is_one_line_and_exit_2_with_a_summary(tmp_path, lock_exists):
    workdir = tmp_path / "w"
    (workdir / "logs").mkdir(parents=True)
    if lock_exists:
        (workdir / ".pipeline.lock").write_text("")
    before = files_under(tmp_path)
    with read_only(workdir):
        proc, summary = run_pipeline(tmp_path, "--workdir", str(workdir), "--stages", "generate")
    assert_refused(proc, summary, ExitCode.USAGE, str(workdir), "cannot be")
    assert summary["status"] == "failed: usage"
    assert files_under(tmp_path) == before


def test_a_read_only_output_inside_the_workdir_is_one_line_and_exit_2(tmp_path):
    """The workdir is writable but the generated data's directory is not (a read-only mount,
    a different owner): the stage fails with one line naming it, not a traceback."""
    workdir = tmp_path / "w"
    raw = workdir / "raw"
    raw.mkdir(parents=True)
    (raw / "day_0").write_text("")
    config = tmp_path / "c.yaml"
    config.write_text("generator: {days: 2, rows_per_day: 100}\npreflight: {enabled: false}\n")
    with read_only(raw):
        proc, summary = run_pipeline(
            tmp_path, "--workdir", str(workdir), "--config", str(config), "--stages", "generate"
        )
    assert_refused(proc, summary, ExitCode.USAGE, "raw", "cannot be written")
    assert summary["stages"]["generate"]["action"] == "failed"


@pytest.mark.parametrize("where", ["raw", "parquet"])
def test_a_file_where_the_workdir_needs_a_directory_is_one_line_and_exit_2(tmp_path, where):
    """A damaged layout (a file named like one of the workdir's directories): one line naming
    it, exit 2, never a traceback, and the file left as it was."""
    workdir = tmp_path / "w"
    workdir.mkdir()
    (workdir / where).write_text("not a directory\n")
    config = tmp_path / "c.yaml"
    config.write_text("generator: {days: 2, rows_per_day: 100}\npreflight: {enabled: false}\n")
    proc, summary = run_pipeline(
        tmp_path, "--workdir", str(workdir), "--config", str(config), "--stages", "generate,preprocess"
    )
    assert_refused(proc, summary, ExitCode.USAGE, where, "a file stands where")
    assert (workdir / where).read_text() == "not a directory\n"


# ------------------------------------------------------------------ settings
@pytest.mark.parametrize("value", [0, -2, 5, 2**63])
def test_export_missing_integer_must_read_as_missing(tmp_path, value):
    """Any integer <= -3 is served as missing (log transform gives 0, as Spark writes);
    0 would silently serve log(3) for every missing field."""
    config = tmp_path / "c.yaml"
    config.write_text(f"export:\n  missing_integer: {value}\n")
    proc, summary = run_in_process(
        tmp_path, "--config", str(config), "--workdir", str(tmp_path / "w"), "--stages", "export"
    )
    assert_refused(proc, summary, ExitCode.USAGE, "missing_integer")
    assert not (tmp_path / "w").exists()


# ------------------------------------------------------------------ damaged day files
def _day_lines(rows: int, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    lines = []
    for _ in range(rows):
        ints = [str(v) for v in rng.integers(0, 50, 13)]
        cats = ["%08x" % v for v in rng.integers(0, 40, 26)]
        lines.append("\t".join([str(rng.integers(0, 2))] + ints + cats))
    return ("\n".join(lines) + "\n").encode()


def damaged_gzip_days(raw: Path) -> dict[str, Path]:
    """day_0.gz intact, day_1.gz cut at two thirds, day_2.gz with a gzip header and garbage
    after it (a file with no gzip header is refused earlier, by the input check)."""
    raw.mkdir(parents=True)
    for day in range(3):
        (raw / f"day_{day}.gz").write_bytes(gzip.compress(_day_lines(3000, day)))
    truncated = raw / "day_1.gz"
    truncated.write_bytes(truncated.read_bytes()[: truncated.stat().st_size * 2 // 3])
    corrupt = raw / "day_2.gz"
    data = bytearray(corrupt.read_bytes())
    data[20:4000] = b"\xff" * 3980
    corrupt.write_bytes(bytes(data))
    return {"truncated": truncated, "corrupt": corrupt}


def test_preflight_names_damaged_gzip_days_instead_of_a_traceback(tmp_path):
    damaged = damaged_gzip_days(tmp_path / "raw")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipeline",
            "preflight",
            "--input",
            str(tmp_path / "raw"),
            "--workdir",
            str(tmp_path / "w"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    for path in damaged.values():
        line = next(l for l in proc.stdout.splitlines() if str(path) in l)
        assert "not a readable gzip file" in line and "will refuse it" in line, line
    assert (
        "truncated" in proc.stdout
        and "corrupt" in proc.stdout
        and json.loads(proc.stdout.splitlines()[-1])["status"] == "ok"
    )


@pytest.mark.spark
@pytest.mark.slow
def test_a_damaged_gzip_day_fails_preprocess_with_exit_5_naming_it(tmp_path):
    """The preflight notes the damage and sizes the run from the rest; the Spark job then
    refuses the file (exit 5, one line naming it), before any output is marked done."""
    damaged = damaged_gzip_days(tmp_path / "raw")
    config = tmp_path / "c.yaml"
    config.write_text("spark: {driver_memory: 1g}\n")
    proc, summary = run_pipeline(
        tmp_path,
        "--input",
        str(tmp_path / "raw"),
        "--workdir",
        str(tmp_path / "w"),
        "--config",
        str(config),
        "--stages",
        "preprocess",
    )
    assert_refused(proc, summary, ExitCode.PREPROCESS, "will refuse it")
    headline = next(l for l in proc.stderr.splitlines() if "preprocess failed" in l)
    assert any(path.name in headline for path in damaged.values()), headline
    assert summary["stages"]["preprocess"]["action"] == "failed"
    assert not (tmp_path / "w" / "manifests" / "preprocess.done").exists()


# ------------------------------------------------------------------ damaged workdirs
# Small tables (every dtype boundary is tested in test_converters.py): the convert stage runs
# in a second or two, with no Spark and no TensorFlow.
SMALL_TABLES = [3, 40, 130, 7, 2, 90, 200, 5, 60, 33000] + [11] * 16
SMALL_ROWS = {"train": 3000, "test": 800, "validation": 700}
PREFLIGHT_OFF = "preflight: {enabled: false}\nconvert: {progress: false}\n"


@pytest.fixture(scope="module")
def converted_workdir(tmp_path_factory):
    """A workdir whose parquet (written here, threshold 2) went through the convert stage."""
    from tests.converter_helpers import write_workdir

    root = tmp_path_factory.mktemp("converted")
    write_workdir(root / "w", table_sizes=SMALL_TABLES, split_rows=SMALL_ROWS)
    (root / "raw").mkdir()
    config = root / "c.yaml"
    config.write_text(PREFLIGHT_OFF)
    proc, summary = run_in_process(
        root,
        "--input",
        str(root / "raw"),
        "--workdir",
        str(root / "w"),
        "--config",
        str(config),
        "--stages",
        "convert",
    )
    assert proc.returncode == 0 and summary["stages"]["convert"]["action"] == "ran", proc.stderr
    return root


def workdir_copy(converted_workdir: Path, tmp_path: Path, config_text: str = PREFLIGHT_OFF):
    """(copy of the converted workdir, its config, the raw dir): mtimes kept, so it is up to
    date as it is."""
    shutil.copytree(converted_workdir / "w", tmp_path / "w")
    (tmp_path / "raw").mkdir()
    config = tmp_path / "c.yaml"
    config.write_text(config_text)
    return tmp_path / "w", config


def convert(tmp_path: Path, workdir: Path, config: Path, *extra: str):
    return run_in_process(
        tmp_path,
        "--input",
        str(tmp_path / "raw"),
        "--workdir",
        str(workdir),
        "--config",
        str(config),
        "--stages",
        "convert",
        *extra,
    )


def flip_bit(path: Path, offset: int = 100, keep_mtime: bool = False) -> None:
    """One bit of ``path`` flipped in place: a disk's error (mtime kept) or a rewrite."""
    info = path.stat()
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))
    if keep_mtime:
        os.utime(path, ns=(info.st_atime_ns, info.st_mtime_ns))


def test_an_untouched_copy_is_up_to_date(converted_workdir, tmp_path):
    workdir, config = workdir_copy(converted_workdir, tmp_path)
    proc, summary = convert(tmp_path, workdir, config)
    assert proc.returncode == 0 and summary["stages"]["convert"]["action"] == "skipped", proc.stderr


@pytest.mark.parametrize("record", ["convert.done", "convert.json"])
def test_a_damaged_manifest_reruns_its_stage_with_a_warning_naming_it(converted_workdir, tmp_path, record):
    workdir, config = workdir_copy(converted_workdir, tmp_path)
    (workdir / "manifests" / record).write_bytes(b"{\x00 not json")
    proc, summary = convert(tmp_path, workdir, config)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    warning = next(l for l in proc.stderr.splitlines() if record in l)
    assert "not valid JSON" in warning
    assert summary["status"] == "ok" and summary["stages"]["convert"]["action"] in ("ran", "derived")
    assert same_tree(converted_workdir / "w" / "binary", workdir / "binary", ignore=("dataset.json",)) == []
    again, summary = convert(tmp_path, workdir, config)
    assert summary["stages"]["convert"]["action"] == "skipped"


def _damage(workdir: Path, kind: str) -> str:
    """Damage the binary dataset; returns the file's name the run must report."""
    binary = workdir / "binary"
    if kind == "dataset.json not JSON":
        (binary / "dataset.json").write_text("{oops")
        return "dataset.json"
    if kind == "dataset.json edited":
        data = json.loads((binary / "dataset.json").read_text())
        data["splits"]["train"] += 1
        (binary / "dataset.json").write_text(json.dumps(data))
        return "dataset.json"
    if kind == "file deleted":
        (binary / "train" / "cat_3.bin").unlink()
        return "train/cat_3.bin"
    if kind == "bit flipped, file rewritten":
        flip_bit(binary / "train" / "numerical.bin")
        return "train/numerical.bin"
    if kind == "bit flipped, mtime kept":
        flip_bit(binary / "validation" / "cat_9.bin", keep_mtime=True)
        return "validation/cat_9.bin"
    raise AssertionError(kind)


# (damage, threshold asked for): the dataset is at 2, so 2 reruns the stage over changed files
# and 5 is a raise derived from them. A bit flipped with size and mtime kept is found when a
# derivation checks the checksums; a run at the same threshold skips the stage by size and
# mtime, without reading the dataset (docs/pipeline.md).
DAMAGE = [
    (kind, threshold)
    for kind in (
        "dataset.json not JSON",
        "dataset.json edited",
        "file deleted",
        "bit flipped, file rewritten",
    )
    for threshold in ("2", "5")
]
DAMAGE.append(("bit flipped, mtime kept", "5"))


@pytest.fixture(scope="module")
def intact_at(converted_workdir, tmp_path_factory):
    """threshold -> the binary dataset the intact workdir gives at it (made once each)."""
    made: dict[str, Path] = {}

    def binary(threshold: str) -> Path:
        if threshold not in made:
            root = tmp_path_factory.mktemp(f"intact{threshold}")
            workdir, config = workdir_copy(converted_workdir, root)
            proc, _ = convert(root, workdir, config, "--frequency-threshold", threshold)
            assert proc.returncode == 0, proc.stderr
            made[threshold] = workdir / "binary"
        return made[threshold]

    return binary


@pytest.mark.parametrize("kind, threshold", DAMAGE)
def test_a_damaged_binary_dataset_is_rebuilt_from_the_parquet(
    converted_workdir, intact_at, tmp_path, kind, threshold
):
    """Never derived from the damaged files (a raise to 5 would hard-link them, a rerun at 2
    would keep them): rebuilt from the parquet, with a warning naming the file; the result is
    byte for byte what the intact dataset gives. Nothing outside the workdir is touched."""
    workdir, config = workdir_copy(converted_workdir, tmp_path)
    name = _damage(workdir, kind)
    outside = files_under(tmp_path)
    outside = {k: v for k, v in outside.items() if not k.startswith("w/")}
    proc, summary = convert(tmp_path, workdir, config, "--frequency-threshold", threshold)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert summary["status"] == "ok"
    assert summary["stages"]["convert"]["engine"].startswith("converters"), summary
    warning = next(l for l in proc.stderr.splitlines() if name in l)
    assert "rebuilding it from the parquet" in warning, warning
    assert same_tree(intact_at(threshold), workdir / "binary", ignore=("dataset.json",)) == []
    now = {k: v for k, v in files_under(tmp_path).items() if not k.startswith("w/")}
    assert now == outside


def test_lean_mode_cannot_rebuild_a_damaged_dataset_and_says_what_to_run(converted_workdir, tmp_path):
    workdir, config = workdir_copy(
        converted_workdir, tmp_path, PREFLIGHT_OFF + "preprocess: {keep_parquet: false}\n"
    )
    proc, summary = convert(tmp_path, workdir, config, "--force")
    assert proc.returncode == 0 and not (workdir / "parquet" / "train").exists(), proc.stderr
    before = (workdir / "binary" / "train" / "numerical.bin").read_bytes()
    flip_bit(workdir / "binary" / "train" / "numerical.bin")
    damaged = (workdir / "binary" / "train" / "numerical.bin").read_bytes()
    proc, summary = convert(tmp_path, workdir, config, "--frequency-threshold", "5")
    assert_refused(
        proc, summary, ExitCode.CONVERT, "train/numerical.bin", "--stages preprocess,convert --force"
    )
    assert (workdir / "binary" / "train" / "numerical.bin").read_bytes() == damaged != before


def test_the_command_line_s_lean_mode_leaves_a_workdir_the_pipeline_recognises(converted_workdir, tmp_path):
    """``python -m converters convert --workdir`` with keep_parquet: false removes the splits
    and records the parquet as the convert stage would: the pipeline's next raise is derived
    from the binary dataset instead of asking for the splits it no longer has."""
    from converters.cli import main

    workdir, config = workdir_copy(
        converted_workdir, tmp_path, PREFLIGHT_OFF + "preprocess: {keep_parquet: false}\n"
    )
    cli = ["convert", "--workdir", str(workdir), "--config", str(config), "--no-progress"]
    assert main([*cli, "--frequency-threshold", "2"]) == 0
    assert not (workdir / "parquet" / "train").exists()
    proc, summary = convert(tmp_path, workdir, config, "--frequency-threshold", "5")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert summary["stages"]["convert"]["action"] == "derived", summary


@pytest.mark.parametrize("stage", ["train", "eval"])
def test_train_and_eval_refuse_a_dataset_changed_since_convert_wrote_it(converted_workdir, tmp_path, stage):
    """Before any rank starts (no TensorFlow, no stage log): exit 7 naming the file and the
    stage that checks and rebuilds it."""
    workdir, config = workdir_copy(converted_workdir, tmp_path)
    flip_bit(workdir / "binary" / "test" / "label.bin", offset=3)
    proc, summary = run_in_process(
        tmp_path,
        "--input",
        str(tmp_path / "raw"),
        "--workdir",
        str(workdir),
        "--config",
        str(config),
        "--stages",
        stage,
    )
    assert_refused(proc, summary, ExitCode.DATASET_INVALID, "test/label.bin", "convert")
    assert not (workdir / "logs" / f"{stage}.log").exists()


# ------------------------------------------------------------------ settings out of range
@pytest.mark.parametrize(
    "text, words",
    [
        ("spark: {shuffle_partitions: -4}", "spark.shuffle_partitions must be >= 0"),
        ("spark: {log_level: LOUD}", "spark.log_level"),
        ("spark: {conf: {spark.sql.shuffle.partitions: [1, 2]}}", "spark.conf"),
        ("preprocess: {compression: bogus}", "preprocess.compression"),
        ("preprocess: {train_rows_per_file: 0}", "preprocess.train_rows_per_file"),
        ("preprocess: {arrow_chunk_mb: 0}", "preprocess.arrow_chunk_mb"),
        ("train: {preset: huge}", "train.preset"),
        ("train: {epochs: 0}", "train.epochs"),
        ("train: {learning_rate: .nan}", "train.learning_rate"),
        ("train: {top_mlp: [8, 2]}", "train.top_mlp"),
        ("train: {bottom_mlp: [0, 4]}", "train.bottom_mlp"),
        ("train: {force_column_split: [C99]}", "train.force_column_split"),
        ("train: {frequency_threshold: 'C99:1'}", "threshold spec"),
        ("train: {keep_checkpoints: 0}", "train.keep_checkpoints"),
        ("preflight: {sample_bytes: -1}", "preflight.sample_bytes"),
        ("preflight: {disk_headroom: 2}", "preflight.disk_headroom"),
    ],
)
def test_settings_out_of_range_are_refused_at_load(tmp_path, text, words):
    """Each section's ranges are checked when it is made (YAML, flags, code), so a bad value is
    one line and exit 2 before any stage, not a failure deep inside one (a negative
    preflight.sample_bytes read whole day files into memory; a bad codec failed in Spark)."""
    from pipeline.cli import main

    config = tmp_path / "c.yaml"
    config.write_text(text + "\n")
    proc, summary = run_in_process(tmp_path, "--config", str(config), "--workdir", str(tmp_path / "w"))
    assert_refused(proc, summary, ExitCode.USAGE, words)
    assert not (tmp_path / "w").exists()
    assert main(["show-config", "--config", str(config)]) == ExitCode.USAGE


def test_the_input_directory_itself_is_refused_as_workdir(tmp_path):
    """The run's own files (summary.json, the lock) would sit among the day files."""
    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "day_0").write_text("0\t1\n")
    before = files_under(tmp_path)
    proc, summary = run_pipeline(
        tmp_path, "--input", str(raw), "--workdir", str(raw), "--stages", "preprocess"
    )
    assert_refused(proc, summary, ExitCode.USAGE, "is the --input directory")
    assert files_under(tmp_path) == before


def test_a_workdir_inside_the_input_is_not_input(tmp_path):
    """Only the files directly in the input directory are the preprocess stage's input: a
    workdir kept inside it (outputs changing on every run) leaves the input unchanged, so the
    stage is not redone each time; a changed day file is noticed."""
    from dlrm_contracts.fingerprint import tree_fingerprint
    from pipeline.fingerprint import input_fingerprint

    raw = tmp_path / "raw"
    (raw / "work" / "parquet").mkdir(parents=True)
    for day in range(2):
        (raw / f"day_{day}").write_text(f"{day}\t1\n")
    (raw / "generator_meta.json").write_text("{}")
    before = input_fingerprint(raw)
    (raw / "work" / "summary.json").write_text("{}")
    (raw / "work" / "parquet" / "part-0.parquet").write_text("x")
    assert input_fingerprint(raw) == before
    (raw / "day_1").write_text("1\t1\n0\t1\n")
    assert input_fingerprint(raw) != before
    flat = tmp_path / "flat"
    shutil.copytree(raw, flat, ignore=shutil.ignore_patterns("work"))
    assert input_fingerprint(flat) == input_fingerprint(raw)
    assert input_fingerprint(flat) != tree_fingerprint(flat, ignore=("generator_meta.json",))


def test_a_day_file_rewritten_with_its_size_and_mtime_kept_is_a_changed_input(tmp_path):
    """Name, size and mtime alone would call a day file put back with ``touch -r`` (or
    ``cp -p``) unchanged: the sampled blocks' hash tells, in the first, a middle and the last
    block of a file larger than the blocks together."""
    from dlrm_contracts.content_sample import BLOCK_BYTES, BLOCKS, block_offsets
    from pipeline.fingerprint import input_fingerprint
    from spark_jobs.inputs import DayFile

    raw = tmp_path / "raw"
    raw.mkdir()
    day = raw / "day_0"
    size = BLOCK_BYTES * BLOCKS * 3
    day.write_bytes(b"a" * size)
    st = day.stat()
    before, day_before = input_fingerprint(raw), DayFile(0, day).fingerprint()
    middle = block_offsets(size)[BLOCKS // 2] + 1
    for offset in (0, middle, size - 1):
        with open(day, "r+b") as fh:
            fh.seek(offset)
            fh.write(b"b")
        os.utime(day, ns=(st.st_atime_ns, st.st_mtime_ns))
        assert day.stat().st_size == st.st_size and day.stat().st_mtime_ns == st.st_mtime_ns
        assert input_fingerprint(raw) != before, offset
        assert DayFile(0, day).fingerprint() != day_before, offset
        day.write_bytes(b"a" * size)
        os.utime(day, ns=(st.st_atime_ns, st.st_mtime_ns))
        assert input_fingerprint(raw) == before


@pytest.mark.parametrize(
    "damaged", ["parquet/train", "counts", "parquet/model_size.json", "parquet/preprocess.json"]
)
def test_damaged_parquet_or_counts_name_the_file_and_the_stage_to_rerun(converted_workdir, tmp_path, damaged):
    workdir, config = workdir_copy(converted_workdir, tmp_path)
    victim = workdir / damaged
    if victim.is_dir():
        victim = sorted(victim.glob("*.parquet"))[0]
    victim.write_bytes(victim.read_bytes()[:5])
    proc, summary = convert(tmp_path, workdir, config, "--frequency-threshold", "5", "--force")
    assert_refused(proc, summary, ExitCode.CONVERT, str(victim), "--stages preprocess,convert --force")


def test_a_day_file_linked_outside_the_input_directory_is_refused_unless_its_root_is_allowed(tmp_path):
    """A symbolic link in a landing directory would make the job read (and copy rejected lines
    of) any file the pipeline's user can read: refused with the link named, before Spark
    starts and before the workdir is touched, unless preprocess.input_link_roots allows it."""
    from spark_jobs.errors import PreprocessInputError
    from spark_jobs.inputs import discover_days

    landing, elsewhere = tmp_path / "landing", tmp_path / "elsewhere"
    landing.mkdir()
    elsewhere.mkdir()
    line = b"1\t" + b"\t".join([b"1"] * 13) + b"\t" + b"\t".join([b"68fd1e64"] * 26) + b"\n"
    (landing / "day_0").write_bytes(line * 3)
    (elsewhere / "secrets.txt").write_bytes(line * 3)
    (landing / "day_1").symlink_to(elsewhere / "secrets.txt")
    with pytest.raises(PreprocessInputError, match=r"day_1 is a symbolic link to .*secrets.txt"):
        discover_days(landing)
    assert [d.name for d in discover_days(landing, link_roots=[str(elsewhere)])] == ["day_0", "day_1"]
    inside = landing / "archive"
    inside.mkdir()
    (landing / "day_1").unlink()
    (inside / "day_1").write_bytes(line * 3)
    (landing / "day_1").symlink_to(inside / "day_1")  # inside the input directory: followed
    assert len(discover_days(landing)) == 2
    (landing / "day_1").unlink()
    (landing / "day_1").symlink_to(elsewhere / "secrets.txt")
    for argv in (
        [sys.executable, "-m", "spark_jobs", "--input", str(landing), "--workdir", str(tmp_path / "w")],
        [
            sys.executable,
            "-m",
            "pipeline",
            "--input",
            str(landing),
            "--workdir",
            str(tmp_path / "w"),
            "--stages",
            "preprocess",
        ],
    ):
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=tmp_path)
        assert proc.returncode == ExitCode.INPUT_DATA, proc.stderr[-2000:]
        assert "symbolic link" in proc.stderr and "input_link_roots" in proc.stderr
        assert "Traceback" not in proc.stderr
        assert not (tmp_path / "w" / "parquet").exists() and not (tmp_path / "w" / "rejects").exists()
    from dlrm_contracts.config import ConfigError, PreprocessConfig

    with pytest.raises(ConfigError, match="input_link_roots"):
        PreprocessConfig(input_link_roots=["relative/dir"])
