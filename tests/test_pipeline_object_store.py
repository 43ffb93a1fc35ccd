"""``run_pipeline.sh`` with its input and workdir in a bucket of a real S3-compatible server
(moto on loopback): the convert stage reads the published parquet and publishes the binary
dataset at the URL, byte for byte a local run's; train stages it in once; the records live at
the URL; a second run is refused while the first holds the lock; a failed run recovers.
With raw days in a bucket too, ``--stages preprocess,convert`` gives a local run's dataset,
skips a rerun, follows a threshold change, and takes over the lock a killed job left."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from dlrm_contracts.layout import MODEL_SIZE_JSON, PREPROCESS_JSON, SUCCESS, complete_checkpoints
from dlrm_contracts.lock import LOCK_TOKEN_ENV
from dlrm_contracts.object_commit import committed_files, publish_directory
from dlrm_contracts.schema import SPLITS
from dlrm_contracts.storage import resolve
from pipeline.remote_models import read_index
from tests.pipeline_helpers import run_in_process, same_tree

REPO = Path(__file__).resolve().parent.parent

CONFIG = """
convert:
  batch_rows: 700
  fsync: false
train:
  preset: small
  batch_size: 256
  warmup_steps: 2
  evaluate_previous: false
preflight:
  enabled: false
launch:
  np: 1
"""


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != LOCK_TOKEN_ENV}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    return env


def _pipeline(*args: str, code: str | None = None) -> tuple[subprocess.CompletedProcess, dict]:
    """``python -m pipeline ARGS`` (or ``code`` run first, then the same main); with its
    summary, the last stdout line."""
    main = f"{code}\nimport sys\nfrom pipeline.cli import main\nsys.exit(main(sys.argv[1:]))"
    prefix = [sys.executable, "-c", main] if code else [sys.executable, "-m", "pipeline"]
    proc = subprocess.run([*prefix, *args], capture_output=True, text=True, env=_env(), check=False)
    lines = proc.stdout.strip().splitlines()
    return proc, json.loads(lines[-1]) if lines and lines[-1].startswith("{") else {}


def _pipeline_here(cwd: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    """``_pipeline``'s run made by its main in this process (run_in_process), for the runs
    whose subject is what the pipeline decides and leaves at the URL, not its process: the
    stages' children (the trainer) are still processes of their own. The runs that are killed,
    that must lose their lock, or whose check is a warning of the lock's own logger (which the
    test process's logging takes) stay ``python -m pipeline`` processes."""
    proc, summary = run_in_process(cwd, *args)
    return proc, summary or {}


def _publish_parquet(parquet: Path, url: str) -> None:
    """A local run's published preprocess outputs at ``url``: each split and the
    dictionaries committed by their markers, the descriptions as single objects."""
    target = resolve(url)
    for split in SPLITS:
        publish_directory(parquet / split, target / split)
    for name in (PREPROCESS_JSON, MODEL_SIZE_JSON, SUCCESS):  # _SUCCESS last
        (target / name).write_bytes((parquet / name).read_bytes())


@pytest.fixture(scope="module")
def local_run(tmp_path_factory) -> tuple[Path, Path]:
    """(a local workdir converted by the pipeline, the config file)."""
    from tests.converter_helpers import write_workdir

    root = tmp_path_factory.mktemp("local")
    config = root / "pipeline.yaml"
    config.write_text(CONFIG)
    workdir = root / "workdir"
    write_workdir(workdir)
    (root / "raw").mkdir()
    proc, summary = _pipeline_here(
        root,
        "--workdir",
        str(workdir),
        "--config",
        str(config),
        "--input",
        str(root / "raw"),
        "--stages",
        "convert",
    )
    assert proc.returncode == 0 and summary["status"] == "ok", proc.stderr
    return workdir, config


def _bucket_workdir(moto_s3, local_run, base: Path) -> tuple[str, str, Path]:
    bucket = moto_s3.bucket()
    workdir = f"s3://{bucket}/criteo/workdir"
    _publish_parquet(local_run[0] / "parquet", f"{workdir}/parquet")
    (resolve(f"s3://{bucket}/criteo/raw") / "day_0").write_bytes(b"1\t2\n")
    return workdir, f"s3://{bucket}/criteo/raw", base / "node"


@pytest.fixture
def bucket_workdir(moto_s3, local_run, tmp_path) -> tuple[str, str, Path]:
    """(workdir URL holding the local run's published parquet, input URL, local side)."""
    return _bucket_workdir(moto_s3, local_run, tmp_path)


@pytest.fixture(scope="module")
def trained_at_url(moto_s3, local_run, tmp_path_factory):
    """(workdir URL, input URL, local side, (process, summary)) of one ``--stages convert,train
    --max-steps 3`` run at a workdir URL holding the local run's parquet: the tests that
    follow it on other nodes share it."""
    workdir, raw, local = _bucket_workdir(moto_s3, local_run, tmp_path_factory.mktemp("trained"))
    done = _pipeline_here(
        local.parent,
        *_args(workdir, raw, local, local_run[1], "--stages", "convert,train", "--max-steps", "3"),
    )
    return workdir, raw, local, done


def _args(workdir: str, raw: str, local: Path, config: Path, *more: str) -> list[str]:
    # the local side set in a YAML file, as a user would
    yaml = local.parent / f"{local.name}.yaml"
    yaml.write_text(config.read_text().replace("train:\n", f"train:\n  stage_dir: {local}\n"))
    return ["--workdir", workdir, "--input", raw, "--config", str(yaml), *more]


def _published(url: str) -> dict[str, bytes]:
    return {name: loc.read_bytes() for name, loc in committed_files(resolve(url)).items()}


def _assert_local_runs_dataset(workdir: str, local_binary: Path) -> None:
    """The dataset published at the URL is the local run's, byte for byte, but for where
    dataset.json says its parquet came from (each workdir names its own)."""
    published = _published(f"{workdir}/binary")
    expected = {
        p.relative_to(local_binary).as_posix(): p.read_bytes() for p in local_binary.rglob("*") if p.is_file()
    }
    assert published.keys() == expected.keys()
    assert [n for n in expected if n != "dataset.json" and published[n] != expected[n]] == []
    here, there = (json.loads(d["dataset.json"]) for d in (published, expected))
    assert here["source"] == {"kind": "parquet", "path": f"{workdir}/parquet"}
    assert {**here, "source": None} == {**there, "source": None}


def test_convert_and_train_at_a_workdir_url_publish_the_local_runs_dataset(trained_at_url, local_run):
    workdir, raw, local, (proc, summary) = trained_at_url
    local_workdir, config = local_run
    assert proc.returncode == 0 and summary["status"] == "ok", proc.stderr[-3000:]
    assert summary["workdir"] == workdir and summary["local_side"] == str(local)
    assert summary["stages"]["convert"]["action"] == "ran"
    assert summary["stages"]["train"]["action"] == "ran"
    _assert_local_runs_dataset(workdir, local_workdir / "binary")
    # the train stage read the dataset the convert stage left on this node
    assert same_tree(local / "binary", local_workdir / "binary") == ["dataset.json"]
    assert list((local / "checkpoints").glob("step-*"))  # checkpoints stay on the node
    # the records live at the URL; the lock was released
    root = resolve(workdir)
    for name in (
        "manifests/convert.json",
        "manifests/convert.done",
        "manifests/train.done",
        "summary.json",
        "report/report.md",
    ):
        assert (root / name).is_file(), name
    assert json.loads((root / "summary.json").read_text())["status"] == "ok"
    assert not (root / ".pipeline.lock").exists()
    assert not (local / "parquet" / "train").exists()  # the local copy of the splits is gone

    # a rerun here: the intact local copy is checked, not copied again
    proc, summary = _pipeline_here(
        local.parent, *_args(workdir, raw, local, config, "--stages", "convert,eval")
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert summary["stages"]["convert"]["action"] == "skipped"
    assert "the local copy is intact, nothing copied" in proc.stderr

    # another node, its local side empty: up to date from the URL's records alone
    proc, summary = _pipeline_here(
        local.parent, *_args(workdir, raw, local.parent / "other-node", config, "--stages", "convert")
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert summary["stages"]["convert"]["action"] == "skipped"


def _arrays(checkpoint: Path) -> dict[str, np.ndarray]:
    out = {}
    for file in sorted(checkpoint.glob("*.npz")):
        with np.load(file) as saved:
            out.update({f"{file.name}:{key}": saved[key] for key in saved.files})
    return out


def test_a_train_stage_on_another_node_resumes_from_the_published_checkpoints(trained_at_url, local_run):
    """The checkpoints are published at the URL as the node keeps them; a train stage on a
    node without them (another node, a wiped disk) restores them and resumes from the
    published step, and ends where an uninterrupted run ends."""
    workdir, raw, first, (proc, _summary) = trained_at_url
    assert proc.returncode == 0, proc.stderr[-3000:]
    published = read_index(resolve(workdir) / "checkpoints")
    kept = {p.name for _step, p in complete_checkpoints(first / "checkpoints")}
    assert published["newest"] == 3 and set(published["units"]) == kept | {"."}

    node = first.parent / "resumed-node"  # nothing of the first node's disk
    # the same request there: the restored checkpoints are the ones the train stage recorded
    proc, summary = _pipeline_here(
        node.parent, *_args(workdir, raw, node, local_run[1], "--stages", "train", "--max-steps", "3")
    )
    assert proc.returncode == 0 and summary["stages"]["train"]["action"] == "skipped", proc.stderr[-3000:]
    assert f"checkpoints from {workdir}/checkpoints" in proc.stderr and "latest step 3" in proc.stderr
    assert {p.name for _s, p in complete_checkpoints(node / "checkpoints")} == kept
    # more steps: resumed from the published step
    args = _args(workdir, raw, node, local_run[1], "--stages", "train", "--max-steps", "6")
    proc, summary = _pipeline_here(node.parent, *args)
    assert proc.returncode == 0 and summary["stages"]["train"]["action"] == "ran", proc.stderr[-3000:]
    trained = json.loads((node / "manifests" / "train.json").read_text())["summary"]
    # resumed at the published step 3 ("step" is the model's: the best validation AUC's)
    assert (trained["init"]["mode"], trained["steps_run"], trained["last_step"]) == ("resume", 3, 6)
    published = read_index(resolve(workdir) / "checkpoints")
    assert published["newest"] == 6
    assert set(published["units"]) == {p.name for _s, p in complete_checkpoints(node / "checkpoints")} | {"."}

    # the same six steps uninterrupted (--force: from scratch, the resumed run set aside)
    proc, summary = _pipeline_here(node.parent, *args, "--force")
    assert proc.returncode == 0, proc.stderr[-3000:]
    whole = json.loads((node / "manifests" / "train.json").read_text())["summary"]
    assert (whole["init"]["mode"], whole["steps_run"], whole["last_step"]) == ("scratch", 6, 6)
    # the same last loss and weights (which checkpoint is the best differs: the stopped run
    # also evaluated its model at step 3, the uninterrupted one only where it evaluates)
    assert trained["train_loss"] == pytest.approx(whole["train_loss"], rel=1e-6)
    (resumed,) = (node / "checkpoints" / "superseded").glob("*/step-000000006")
    expected = _arrays(node / "checkpoints" / "step-000000006")
    got = _arrays(resumed)
    assert got.keys() == expected.keys()
    for name, value in expected.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-6, atol=1e-8, err_msg=name)


def test_a_second_run_on_the_workdir_url_is_refused_while_the_first_holds_its_lock(bucket_workdir, local_run):
    workdir, raw, local = bucket_workdir
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent("""
        import sys
        from dlrm_contracts.lock import workdir_lock
        with workdir_lock(sys.argv[1], "pipeline"):
            print("held", flush=True)
            sys.stdin.read()
        """),
            workdir,
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        proc, summary = _pipeline_here(
            local.parent, *_args(workdir, raw, local, local_run[1], "--stages", "convert")
        )
    finally:
        holder.communicate("")
    assert proc.returncode == 3, proc.stderr
    assert summary["status"] == "failed: locked" and "in use by another" in summary["error"]
    assert not (resolve(workdir) / "binary").exists()


# The pipeline renewing its lock every 0.2 s; its convert stage finds the lock taken over by
# another run (what a run that took this one for dead writes) and goes on working.
LOCK_TAKEN_OVER_IN_CONVERT = """
import json, time
import dlrm_contracts.object_lock as object_lock
import pipeline.stages as stages
from dlrm_contracts.storage import resolve
object_lock.ObjectStoreLock.__init__.__defaults__ = ("pipeline", object_lock.STALE_AFTER, 0.2)
def _convert(ctx):
    lock = resolve(ctx.workdir) / ".pipeline.lock"
    record = json.loads(lock.read_text())
    lock.write_text(json.dumps({**record, "host": "elsewhere", "token": "other-run"}))
    time.sleep(300)
stages._convert = _convert
"""


def test_a_run_whose_lock_another_run_took_over_stops_as_locked_and_writes_no_more_there(
    bucket_workdir, local_run
):
    workdir, raw, local = bucket_workdir
    args = _args(workdir, raw, local, local_run[1], "--stages", "convert")
    proc, summary = _pipeline(*args, code=LOCK_TAKEN_OVER_IN_CONVERT)
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert summary["status"] == "failed: locked"
    assert summary["stages"]["convert"]["action"] == "failed"
    said = [line for line in proc.stderr.splitlines() if "another run took over" in line]
    assert len(said) == 1 and said[0].startswith("[pipeline] workdir"), proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    root = resolve(workdir)
    assert json.loads((root / ".pipeline.lock").read_text())["token"] == "other-run"
    assert not (root / "summary.json").exists() and not (root / "manifests").exists()


# The convert stage killed (SIGKILL: no handler, no clean-up, the lock object left behind)
# after the dataset's files were uploaded and before its commit marker.
KILLED_BEFORE_MARKER = """
import os, signal
import dlrm_contracts.object_commit as commit
def _killed(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)
commit.write_marker = _killed
"""


def test_a_run_killed_before_the_datasets_marker_is_recovered_by_the_next(bucket_workdir, local_run):
    workdir, raw, local = bucket_workdir
    args = _args(workdir, raw, local, local_run[1], "--stages", "convert")
    proc, _summary = _pipeline(*args, code=KILLED_BEFORE_MARKER)
    assert proc.returncode == -9, proc.stderr
    root = resolve(workdir)
    assert (root / ".pipeline.lock").exists()  # left behind by the kill
    assert not (root / "binary" / "_COMMIT.json").exists()  # nothing a reader trusts
    assert any(p.name.startswith(".v-") for p in (root / "binary").iterdir())
    assert not (root / "manifests" / "convert.done").exists()
    proc, summary = _pipeline(*args)  # its holder's pid is gone on this host: stale
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "took over a stale lock" in proc.stderr
    assert summary["stages"]["convert"]["action"] in ("ran", "derived")
    _assert_local_runs_dataset(workdir, local_run[0] / "binary")
    assert len([p for p in (root / "binary").iterdir() if p.name.startswith(".v-")]) == 1
    assert not (root / ".pipeline.lock").exists()


@pytest.mark.parametrize("argv", [["export", "list"], ["plan"]])
def test_commands_that_read_a_workdir_by_path_refuse_a_url(argv, tmp_path, monkeypatch, capsys):
    from pipeline.cli import main

    monkeypatch.chdir(tmp_path)
    assert main([*argv, "--workdir", "s3://bucket/criteo/workdir"]) == 2
    assert "local side" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []  # no local "s3:" directory


@pytest.mark.parametrize("ids", ["stable", "contiguous"])
def test_what_the_spark_job_cannot_do_at_a_workdir_url_is_refused_before_anything(ids, tmp_path, capsys):
    from pipeline.cli import main

    config = tmp_path / "ids.yaml"
    config.write_text(f"preprocess:\n  ids: {ids}\n")
    argv = [
        "--workdir",
        "s3://bucket/criteo/workdir",
        "--input",
        "s3://bucket/criteo/raw",
        "--config",
        str(config),
        "--stages",
        "preprocess,convert",
    ]
    assert main(argv) == 2  # no store is reached: the bucket does not exist
    err = capsys.readouterr().err
    assert f"preprocess.ids: {ids} needs a workdir on a filesystem path" in err
    assert "a workdir URL supports ids: frequency and modulo" in err


# ------------------------------------------------------------------ preprocess and convert at a URL
PREPROCESS_CONFIG = """
spark:
  master: local[2]
  driver_memory: 2g
convert:
  batch_rows: 512
  fsync: false
train:
  preset: small
preflight:
  enabled: false
"""

# python -m spark_jobs killed (SIGKILL: no handler, no clean-up, its lock object left behind)
# in its transform: as soon as a split file is up (the other tasks may still be writing), and
# in any case before a split's commit marker (which waits for the kill).
KILLED_IN_THE_TRANSFORM = """
import os, signal, sys, threading, time
import dlrm_contracts.object_commit as commit
from dlrm_contracts.schema import SPLITS
from dlrm_contracts.storage import resolve

parquet = resolve(sys.argv[sys.argv.index("--workdir") + 1]) / "parquet"
publish = commit.write_marker

def _kill_at_the_first_split_file():
    while not any((parquet / split).files() for split in SPLITS):
        time.sleep(0.05)
    os.kill(os.getpid(), signal.SIGKILL)

def _marker(final, version, files):
    if final.name in SPLITS:
        time.sleep(3600)
    publish(final, version, files)

commit.write_marker = _marker
threading.Thread(target=_kill_at_the_first_split_file, daemon=True).start()
from spark_jobs.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _split_files(parquet) -> dict[str, bytes]:
    """Every split's published files by name (at a URL: those its commit marker names)."""
    from dlrm_contracts import workdir_io

    return {
        f"{split}/{p.name}": p.read_bytes()
        for split in SPLITS
        for p in workdir_io.published_files(parquet / split)
    }


def _assert_same_dataset(published: dict[str, bytes], reference: Path) -> None:
    """The binary dataset at a URL is the reference's byte for byte; of dataset.json (which
    names where its parquet came from) the parts that describe the data."""
    expected = {
        p.relative_to(reference).as_posix(): p.read_bytes() for p in reference.rglob("*") if p.is_file()
    }
    assert published.keys() == expected.keys()
    assert [n for n in expected if n != "dataset.json" and published[n] != expected[n]] == []
    here, there = (json.loads(d["dataset.json"]) for d in (published, expected))
    for key in ("splits", "table_sizes", "cat_dtypes", "threshold_spec"):
        assert here[key] == there[key], key


@pytest.fixture(scope="module")
def days_at_url(moto_s3, tmp_path_factory) -> tuple[Path, str]:
    """Three small days on disk and the same files in a bucket."""
    from spark_fixtures import random_days, write_days

    local = write_days(tmp_path_factory.mktemp("raw"), random_days(3838, 3, 400))
    url = f"s3://{moto_s3.bucket('raw')}/criteo/raw"
    for path in sorted(local.glob("day_*")):
        (resolve(url) / path.name).write_bytes(path.read_bytes())
    return local, url


@pytest.fixture(scope="module")
def local_references(spark, days_at_url, tmp_path_factory) -> dict[str, Path]:
    """Per threshold, a local workdir made from the same days by the Spark job and the
    converter (in this process, on the shared session: no JVM of its own)."""
    from converters.convert import convert_parquet
    from dlrm_contracts.config import ConvertConfig, PreprocessConfig, SparkConfig
    from dlrm_contracts.layout import WorkdirLayout
    from spark_jobs.preprocess import run_preprocess

    out = {}
    for threshold in ("2", "3"):
        layout = WorkdirLayout.at(tmp_path_factory.mktemp(f"local-{threshold}"))
        spark_settings = SparkConfig(master="local[2]", driver_memory="2g")
        run_preprocess(
            days_at_url[0], layout.root, spark_settings, PreprocessConfig(frequency_threshold=threshold)
        )
        convert_parquet(
            layout.parquet, layout.binary, ConvertConfig(batch_rows=512, progress=False, fsync=False)
        )
        out[threshold] = layout.root
    return out


@pytest.fixture(scope="module")
def killed_then_recovered(moto_s3, days_at_url, tmp_path_factory):
    """``python -m spark_jobs`` at a workdir URL killed in its transform, then the pipeline's
    ``--stages preprocess,convert`` on the same workdir URL: (workdir URL, the local side,
    the config, (the killed process, the lock record it left, the split files it left, the
    splits published then), the pipeline's run)."""
    root = tmp_path_factory.mktemp("url-run")
    config = root / "pipeline.yaml"
    config.write_text(PREPROCESS_CONFIG)
    workdir = f"s3://{moto_s3.bucket('work')}/criteo/workdir"
    argv = [
        "--input",
        days_at_url[1],
        "--workdir",
        workdir,
        "--frequency-threshold",
        "2",
        "--config",
        str(config),
    ]
    killed = subprocess.run(
        [sys.executable, "-c", KILLED_IN_THE_TRANSFORM, *argv], capture_output=True, text=True, env=_env()
    )
    lock = resolve(workdir) / ".pipeline.lock"
    left = json.loads(lock.read_text()) if lock.exists() else None
    parquet = resolve(workdir) / "parquet"
    split_files = sum(len((parquet / split).files()) for split in SPLITS)
    published = [split for split in SPLITS if (parquet / split / "_COMMIT.json").exists()]
    local = root / "node"
    done = _pipeline(*_args(workdir, days_at_url[1], local, config, "--stages", "preprocess,convert"))
    return workdir, local, config, (killed, left, split_files, published), done


def test_a_job_killed_in_its_transform_at_a_url_leaves_its_lock_and_the_next_run_takes_it_over(
    killed_then_recovered, local_references
):
    """The kill leaves the lock with a dead owner and no published split; the next run
    (the pipeline) takes the lock over, finishes, and publishes a clean run's splits."""
    import socket

    from dlrm_contracts.atomic import pid_alive
    from dlrm_contracts.layout import WorkdirLayout

    workdir, _local, _config, (killed, left, split_files, published), (proc, summary) = killed_then_recovered
    assert killed.returncode == -9, killed.stderr[-3000:]
    assert left is not None and left["by"] == "spark_jobs" and left["host"] == socket.gethostname()
    assert not pid_alive(left["pid"])
    assert split_files > 0 and published == []  # killed with its splits half done
    assert proc.returncode == 0 and summary["status"] == "ok", proc.stderr[-3000:]
    assert "took over a stale lock" in proc.stderr
    assert summary["stages"]["preprocess"]["action"] == "ran"
    parquet = WorkdirLayout.at(workdir).parquet
    assert _split_files(parquet) == _split_files(local_references["2"] / "parquet")
    assert not (resolve(workdir) / ".pipeline.lock").exists()


def test_preprocess_and_convert_at_a_url_give_a_local_run_s_dataset_skip_a_rerun_and_follow_a_threshold(
    killed_then_recovered, days_at_url, local_references
):
    """Input and workdir in buckets, through the pipeline as a user runs it: the binary
    dataset is a local run's byte for byte; the same request again is skipped; another
    threshold runs again and gives a local run's dataset at that threshold."""
    workdir, local, config, _killed, (proc, summary) = killed_then_recovered
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert summary["stages"]["convert"]["action"] == "ran"
    _assert_same_dataset(_published(f"{workdir}/binary"), local_references["2"] / "binary")

    proc, summary = _pipeline_here(
        local.parent, *_args(workdir, days_at_url[1], local, config, "--stages", "preprocess,convert")
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert {s["action"] for s in summary["stages"].values()} == {"skipped"}

    proc, summary = _pipeline_here(
        local.parent,
        *_args(
            workdir,
            days_at_url[1],
            local,
            config,
            "--stages",
            "preprocess,convert",
            "--frequency-threshold",
            "3",
        ),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert summary["stages"]["preprocess"]["action"] == "skipped"  # the parquet at 2 serves 3
    assert summary["stages"]["convert"]["action"] in ("ran", "derived")
    _assert_same_dataset(_published(f"{workdir}/binary"), local_references["3"] / "binary")
