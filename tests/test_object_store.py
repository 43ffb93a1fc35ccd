"""The workdir on an object store (a real S3-compatible server, moto, on loopback): the commit
protocol without rename, the workdir lock by conditional writes, and stage-in of the binary
dataset to a training node's disk."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from dlrm_contracts.binary_format import DatasetError
from dlrm_contracts.errors import ExitCode, PipelineError
from dlrm_contracts.lock import LOCK_TOKEN_ENV, workdir_lock
from dlrm_contracts.object_commit import (
    COMMIT_MARKER,
    committed_files,
    publish_directory,
    remove_other_versions,
)
from dlrm_contracts.object_lock import ObjectStoreLock
from dlrm_contracts.storage import resolve

REPO = Path(__file__).resolve().parent.parent


def _tree(root: Path, files: dict[str, bytes]) -> Path:
    for name, content in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(content)
    return root


# ------------------------------------------------------------------ commit without rename
def test_readers_see_only_what_the_last_marker_names(moto_s3, tmp_path):
    final = resolve(f"s3://{moto_s3.bucket()}/w/parquet/train")
    assert committed_files(final) == {}
    _tree(tmp_path / "one", {"part-0.parquet": b"first", "sub/part-1.parquet": b"first too"})
    publish_directory(tmp_path / "one", final)
    files = committed_files(final)
    assert {n: loc.read_bytes() for n, loc in files.items()} == {
        "part-0.parquet": b"first",
        "sub/part-1.parquet": b"first too",
    }
    # a writer killed before its marker: its objects are there, but never read
    orphan = final / ".v-killed-writer"
    (orphan / "part-0.parquet").write_bytes(b"half")
    assert {n: loc.read_bytes() for n, loc in committed_files(final).items()}["part-0.parquet"] == b"first"
    _tree(tmp_path / "two", {"part-0.parquet": b"second"})
    publish_directory(tmp_path / "two", final)
    assert {n: loc.read_bytes() for n, loc in committed_files(final).items()} == {"part-0.parquet": b"second"}
    # the older version and the orphan are gone: one version and the marker remain
    names = sorted(p.name for p in final.iterdir())
    assert len(names) == 2 and names[1] == COMMIT_MARKER and names[0].startswith(".v-")
    assert remove_other_versions(final) == []


def test_a_committed_file_that_went_missing_is_reported_not_read_around(moto_s3, tmp_path):
    final = resolve(f"s3://{moto_s3.bucket()}/w/binary")
    _tree(tmp_path / "d", {"a.bin": b"1234", "b.bin": b"5678"})
    version = publish_directory(tmp_path / "d", final)
    (version / "b.bin").delete()
    with pytest.raises(DatasetError, match="b.bin is missing"):
        committed_files(final)


# ------------------------------------------------------------------ the lock
HOLDER = textwrap.dedent("""
    import sys
    from dlrm_contracts.lock import workdir_lock
    with workdir_lock(sys.argv[1], "pipeline"):
        print("held", flush=True)
        sys.stdin.read()
""")


def _holder(url: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != LOCK_TOKEN_ENV}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, url], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
    )
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_two_runs_on_one_workdir_url_one_is_refused_and_a_killed_holder_recovers(moto_s3):
    url = f"s3://{moto_s3.bucket()}/workdir"
    holder = _holder(url)
    try:
        with pytest.raises(PipelineError) as err:
            with workdir_lock(url, "pipeline"):
                pass
        assert err.value.code == ExitCode.LOCKED and "in use by another pipeline run" in str(err.value)
        assert '"by": "pipeline"' in str(err.value) and "token" not in str(err.value)
    finally:
        holder.send_signal(signal.SIGKILL)  # killed: its lock object stays behind
        holder.wait()
    assert (resolve(url) / ".pipeline.lock").exists()
    with workdir_lock(url, "pipeline") as lock:  # its pid is gone on this host: stale
        assert isinstance(lock, ObjectStoreLock) and not lock.guest
        record = json.loads((resolve(url) / ".pipeline.lock").read_text())
        assert record["pid"] == os.getpid()
    assert not (resolve(url) / ".pipeline.lock").exists()  # released


def test_the_holders_children_run_under_its_lock_and_a_lock_not_renewed_goes_stale(moto_s3):
    url = f"s3://{moto_s3.bucket()}/workdir"
    with workdir_lock(url, "pipeline"):
        with workdir_lock(url, "spark_jobs") as child:  # same token in the environment
            assert child.guest
        saved = os.environ.pop(LOCK_TOKEN_ENV)
        try:
            with pytest.raises(PipelineError):
                with workdir_lock(url, "converters"):
                    pass
            # a holder on another host that stopped renewing: taken over after stale_after
            lock = resolve(url) / ".pipeline.lock"
            record = json.loads(lock.read_text())
            lock.write_text(json.dumps({**record, "host": "elsewhere", "renewed_epoch": 0}))
            with ObjectStoreLock(resolve(url), "converters") as taker:
                assert not taker.guest
        finally:
            os.environ[LOCK_TOKEN_ENV] = saved


# A run holding its lock on S3 with a renewal every 0.2 s, doing its work (a long sleep) as a
# command line does, under run_cli.
RENEWING_HOLDER = textwrap.dedent("""
    import sys, time
    from dlrm_contracts.errors import run_cli
    from dlrm_contracts.object_lock import ObjectStoreLock
    from dlrm_contracts.storage import resolve

    def body():
        with ObjectStoreLock(resolve(sys.argv[1]), "spark_jobs", renew_every=0.2):
            print("held", flush=True)
            time.sleep(240)
        return 0

    sys.exit(run_cli("spark_jobs", body))
""")


def test_a_holder_whose_lock_another_run_took_over_stops_in_one_line_with_exit_3(moto_s3):
    """Its renewal finds another run's record: the run stops (not at the end of its sleep),
    says so in one line, exits as a refused start does, and leaves the other run's lock."""
    url = f"s3://{moto_s3.bucket()}/workdir"
    env = {k: v for k, v in os.environ.items() if k != LOCK_TOKEN_ENV}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    proc = subprocess.Popen(
        [sys.executable, "-c", RENEWING_HOLDER, url],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert proc.stdout.readline().strip() == "held"
    lock = resolve(url) / ".pipeline.lock"
    other = {**json.loads(lock.read_text()), "pid": 1, "host": "elsewhere", "token": "other-run"}
    lock.write_text(json.dumps(other))  # what a run taking this one for dead writes
    started = time.monotonic()
    _out, err = proc.communicate(timeout=600)
    assert proc.returncode == ExitCode.LOCKED, err
    assert time.monotonic() - started < 200  # stopped by the renewal, not by the end of its work
    lines = [line for line in err.splitlines() if "another run took over" in line]
    assert len(lines) == 1 and lines[0].startswith(f"spark_jobs: error: workdir {url}: another run took over")
    assert "Traceback" not in err and "other-run" not in err
    assert json.loads(lock.read_text())["token"] == "other-run"  # not deleted on the way out


def test_a_holder_whose_lock_was_removed_stops_too(moto_s3):
    """No lock at the renewal (removed by hand, or by a run that took it over and ended): the
    run cannot know who wrote the workdir since, so it stops as locked (here in this process:
    the interrupt reaches this thread's wait)."""
    url = f"s3://{moto_s3.bucket()}/workdir"
    with pytest.raises(PipelineError, match="this run's lock was removed, so this run stopped") as err:
        with ObjectStoreLock(resolve(url), "pipeline", renew_every=0.2):
            (resolve(url) / ".pipeline.lock").delete()
            time.sleep(240)
    assert err.value.code == ExitCode.LOCKED
    assert not (resolve(url) / ".pipeline.lock").exists()  # not taken again


def test_release_deletes_only_this_runs_record(moto_s3):
    url = f"s3://{moto_s3.bucket()}/workdir"
    lock = resolve(url) / ".pipeline.lock"
    with ObjectStoreLock(resolve(url), "pipeline") as held:
        held._etag = '"an-answer-lost"'  # a renewal landed but its ETag never came back
    assert not lock.exists()
    with ObjectStoreLock(resolve(url), "pipeline"):
        record = json.loads(lock.read_text())
        lock.write_text(json.dumps({**record, "token": "other-run"}))  # taken over meanwhile
    assert json.loads(lock.read_text())["token"] == "other-run"

    lock.delete()
    with ObjectStoreLock(resolve(url), "pipeline") as racing:  # taken over between the
        read = racing._read  # release's read of its record and its delete

        def read_then_taken_over():
            seen = read()
            lock.write_text(json.dumps({**seen[0], "token": "third-run"}))
            return seen

        racing._read = read_then_taken_over
    assert json.loads(lock.read_text())["token"] == "third-run"


def test_a_store_without_conditional_writes_warns_that_it_is_not_locked(caplog, tmp_path):
    from dlrm_contracts.storage import Location

    local = resolve(tmp_path)
    fake = Location(local.fs, local.path, "hdfs://namenode:8020")
    with caplog.at_level("WARNING"):
        with ObjectStoreLock(fake, "pipeline") as lock:
            assert lock.unlocked
    assert "one scheduler per workdir" in caplog.text


# ------------------------------------------------------------------ stage-in
@pytest.fixture(scope="module")
def binary_dataset(tmp_path_factory) -> Path:
    from converters.convert import convert_parquet
    from dlrm_contracts.config import ConvertConfig
    from tests.converter_helpers import write_workdir

    root = tmp_path_factory.mktemp("dataset")
    write_workdir(root)
    convert_parquet(root / "parquet", root / "binary", ConvertConfig())
    return root / "binary"


def test_stage_in_copies_once_checks_checksums_and_recopies_a_damaged_copy(moto_s3, binary_dataset, tmp_path):
    from converters.stage_in import stage_in

    url = f"s3://{moto_s3.bucket()}/workdir/binary"
    publish_directory(binary_dataset, resolve(url))
    target = tmp_path / "node-local" / "binary"
    first = stage_in(url, target)
    assert first["copied"] and first["bytes"] > 0
    local = sorted(p.relative_to(binary_dataset) for p in binary_dataset.rglob("*") if p.is_file())
    assert sorted(p.relative_to(target) for p in target.rglob("*") if p.is_file()) == local
    for name in local:
        assert (target / name).read_bytes() == (binary_dataset / name).read_bytes()
    assert stage_in(url, target) == {"copied": False, "files": first["files"], "bytes": 0}
    damaged = target / "train" / "label.bin"
    damaged.write_bytes(bytes(len(damaged.read_bytes())))
    assert stage_in(url, target)["copied"]
    assert damaged.read_bytes() == (binary_dataset / "train" / "label.bin").read_bytes()


def test_stage_in_refuses_a_damaged_source_and_publishes_nothing(moto_s3, binary_dataset, tmp_path):
    from converters.stage_in import stage_in

    url = f"s3://{moto_s3.bucket()}/workdir/binary"
    version = publish_directory(binary_dataset, resolve(url))
    label = version / "train" / "label.bin"
    label.write_bytes(bytes(label.size()))  # same size, other bytes
    target = tmp_path / "node" / "binary"
    with pytest.raises(DatasetError, match="checksum"):
        stage_in(url, target)
    assert not target.exists()
    with pytest.raises(DatasetError, match="no complete binary dataset"):
        stage_in(f"s3://{moto_s3.bucket()}/empty", tmp_path / "other")


def test_stage_in_from_the_command_line(moto_s3, binary_dataset, tmp_path):
    url = f"s3://{moto_s3.bucket()}/workdir/binary"
    publish_directory(binary_dataset, resolve(url))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    env.pop(LOCK_TOKEN_ENV, None)
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "converters",
            "stage-in",
            "--source",
            url,
            "--target",
            str(tmp_path / "n" / "binary"),
            "--json",
        ],
        capture_output=True,
        text=True,
        env=env,
    )
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout.splitlines()[-1])["copied"] is True


# ------------------------------------------------------------------ the input at a URL
def test_day_files_at_a_url_are_found_fingerprinted_and_sized_as_local_ones(moto_s3, tmp_path):
    import gzip
    from spark_jobs.errors import PreprocessInputError
    from spark_jobs.inputs import bytes_per_line, discover_days

    bucket = moto_s3.bucket()
    lines = "".join(f"{i % 2}" + "\t1" * 13 + "\tab" * 26 + "\n" for i in range(5000)).encode()
    files = {"day_0": lines, "day_1.gz": gzip.compress(lines, mtime=0), "notes.txt": b"x"}
    local = _tree(tmp_path / "raw", files)
    for name, content in files.items():
        (resolve(f"s3://{bucket}/raw") / name).write_bytes(content)
    here = discover_days(local)
    there = discover_days(f"s3://{bucket}/raw/")
    assert [(d.day, d.name, d.gzipped) for d in there] == [(d.day, d.name, d.gzipped) for d in here]
    assert str(there[1].path) == f"s3://{bucket}/raw/day_1.gz"
    for a, b in zip(here, there):
        name, size, _mtime, digest = a.fingerprint().split(":")
        assert b.fingerprint().split(":")[:2] == [name, size]
        assert b.fingerprint().split(":")[3] == digest  # same bytes, same sample hash
        assert bytes_per_line(b.path, 4096) == bytes_per_line(a.path, 4096)
    (resolve(f"s3://{bucket}/raw") / "day_3").write_bytes(lines)
    with pytest.raises(PreprocessInputError, match="missing day file"):
        discover_days(f"s3://{bucket}/raw")
    (resolve(f"s3://{bucket}/raw") / "day_2.gz").write_bytes(lines)
    with pytest.raises(PreprocessInputError, match="not gzip-compressed"):
        discover_days(f"s3://{bucket}/raw")


def test_a_dataset_converted_to_a_url_and_staged_in_equals_the_local_one_byte_for_byte(
    moto_s3, binary_dataset, tmp_path
):
    url = f"s3://{moto_s3.bucket()}/workdir/binary"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    env.pop(LOCK_TOKEN_ENV, None)
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "converters",
            "convert",
            "--parquet",
            str(binary_dataset.parent / "parquet"),
            "--output",
            url,
            "--json",
        ],
        capture_output=True,
        text=True,
        env=env,
    )
    assert run.returncode == 0, run.stderr
    assert not (resolve(url).parent / ".pipeline.lock").exists()  # taken and released
    from converters.stage_in import stage_in

    target = tmp_path / "node" / "binary"
    stage_in(url, target)
    local = sorted(p.relative_to(binary_dataset) for p in binary_dataset.rglob("*") if p.is_file())
    assert sorted(p.relative_to(target) for p in target.rglob("*") if p.is_file()) == local
    for name in local:
        assert (target / name).read_bytes() == (binary_dataset / name).read_bytes(), name


# ------------------------------------------------------------------ checkpoints and exports at the URL
def _checkpoint(root: Path, step: int, run: str, payload: bytes = b"") -> Path:
    """A checkpoint as the trainer leaves one: its arrays, then meta.json naming its run."""
    path = root / f"step-{step:09d}"
    _tree(path, {"rank-0.npz": b"tables %d %s" % (step, payload), "replicated.npz": b"mlp %d" % step})
    (path / "meta.json").write_text(json.dumps({"step": step, "run": {"id": run}}))
    if not (root / "run.json").is_file() or json.loads((root / "run.json").read_text()) != {"id": run}:
        (root / "run.json").write_text(json.dumps({"id": run}))  # as the trainer: when it changes
    return path


def _versions(location) -> list[str]:
    return [p.name for p in location.iterdir() if p.name.startswith(".v-")]


def test_checkpoints_are_published_once_each_retired_at_the_url_and_restored_on_another_node(
    moto_s3, tmp_path
):
    from dlrm_contracts.fingerprint import tree_fingerprint
    from pipeline.remote_models import CHECKPOINTS, INDEX, publish_tree, read_index, restore_checkpoints

    final = resolve(f"s3://{moto_s3.bucket()}/w/checkpoints")
    node = tmp_path / "node" / "checkpoints"
    for step in (2, 4):
        _checkpoint(node, step, "run-a")
    assert restore_checkpoints(final, node) is None  # nothing published yet
    cost = publish_tree(CHECKPOINTS, node, final)
    assert (cost["units"], cost["uploaded"], cost["removed"]) == (3, 3, 0)  # two steps and run.json
    index = (final / INDEX).read_bytes()
    # unchanged: nothing uploaded, not even the index
    assert publish_tree(CHECKPOINTS, node, final)["uploaded"] == 0
    assert (final / INDEX).read_bytes() == index
    # the trainer saved step 6 and retention removed step 2: so does the URL
    _checkpoint(node, 6, "run-a")
    shutil.rmtree(node / "step-000000002")
    cost = publish_tree(CHECKPOINTS, node, final)
    assert (cost["units"], cost["uploaded"], cost["removed"]) == (3, 1, 1)
    names = [p.name for p in final.iterdir() if not p.name.startswith(".v-")]
    assert sorted(names) == [INDEX, "step-000000004", "step-000000006"] and len(_versions(final)) == 1
    assert all(len(_versions(final / s)) == 1 for s in ("step-000000004", "step-000000006"))
    assert read_index(final)["newest"] == 6

    # another node (or a wiped disk) with an earlier run of its own: that run is set aside,
    # the published one restored byte for byte with its files' times (the same fingerprint)
    other = tmp_path / "other" / "checkpoints"
    _checkpoint(other, 8, "run-old")
    done = restore_checkpoints(final, other)
    assert done is not None and "latest step 6" in done
    assert sorted(p.name for p in other.iterdir()) == [
        "run.json",
        "step-000000004",
        "step-000000006",
        "superseded",
    ]
    assert tree_fingerprint(other, ignore=("superseded",)) == tree_fingerprint(node)
    assert [p.name for p in (other / "superseded").iterdir()][0]  # the old run kept, not deleted
    assert list((other / "superseded").glob("*/step-000000008/meta.json"))
    # as new as the URL: nothing copied; the publishing node itself: nothing either
    assert restore_checkpoints(final, other) is None and restore_checkpoints(final, node) is None
    # the same run further on the URL than here: the newer steps come over
    shutil.rmtree(other / "step-000000006")
    assert "1 of 3" in restore_checkpoints(final, other)
    assert tree_fingerprint(other, ignore=("superseded",)) == tree_fingerprint(node)


def test_a_publication_killed_before_its_index_leaves_the_previous_one_readable(
    moto_s3, tmp_path, monkeypatch
):
    from dlrm_contracts.storage import Location
    from pipeline.remote_models import CHECKPOINTS, INDEX, publish_tree, read_index, restore_checkpoints

    final = resolve(f"s3://{moto_s3.bucket()}/w/checkpoints")
    node = tmp_path / "node" / "checkpoints"
    for step in (2, 4):
        _checkpoint(node, step, "run-a")
    publish_tree(CHECKPOINTS, node, final)
    before = read_index(final)
    _checkpoint(node, 6, "run-a")
    shutil.rmtree(node / "step-000000002")
    (node / "step-000000004" / "meta.json").write_text(
        json.dumps({"step": 4, "run": {"id": "run-a"}, "x": 1})
    )
    write_text = Location.write_text

    def killed(self, text, fsync=True):
        if self.name == INDEX:
            raise KeyboardInterrupt  # the process stops before its index
        return write_text(self, text, fsync)

    monkeypatch.setattr(Location, "write_text", killed)
    with pytest.raises(KeyboardInterrupt):
        publish_tree(CHECKPOINTS, node, final)
    monkeypatch.setattr(Location, "write_text", write_text)
    assert read_index(final) == before  # the previous publication, whole and readable
    restored = tmp_path / "other" / "checkpoints"
    restore_checkpoints(final, restored)
    assert sorted(p.name for p in restored.iterdir()) == ["run.json", "step-000000002", "step-000000004"]
    assert json.loads((restored / "step-000000004" / "meta.json").read_text()) == {
        "step": 4,
        "run": {"id": "run-a"},
    }
    assert (final / "step-000000006").exists() and len(_versions(final / "step-000000004")) == 2
    # the next publication names the new state and removes what the killed one left
    publish_tree(CHECKPOINTS, node, final)
    assert sorted(read_index(final)["units"]) == [".", "step-000000004", "step-000000006"]
    assert not (final / "step-000000002").exists()
    assert all(len(_versions(final / s)) == 1 for s in ("step-000000004", "step-000000006"))


def test_export_versions_are_published_and_restored_where_the_node_has_older_ones(moto_s3, tmp_path):
    from pipeline.remote_models import EXPORTS, publish_tree, restore_exports

    final = resolve(f"s3://{moto_s3.bucket()}/w/export")
    node = _tree(
        tmp_path / "node" / "export",
        {
            "1/saved_model.pb": b"one",
            "2/saved_model.pb": b"two",
            "2/variables/variables.index": b"vars",
            "serving.json": b"{}",
            ".2.tmp-1-x/saved_model.pb": b"half",  # an export being written: not a version
        },
    )
    assert publish_tree(EXPORTS, node, final)["units"] == 3
    assert not (final / ".2.tmp-1-x").exists()
    other = _tree(tmp_path / "other" / "export", {"1/saved_model.pb": b"one"})
    assert "newest version 2" in restore_exports(final, other)
    assert (other / "2" / "variables" / "variables.index").read_bytes() == b"vars"
    assert (other / "serving.json").read_bytes() == b"{}"
    assert restore_exports(final, other) is None
    newer = _tree(tmp_path / "newer" / "export", {"3/saved_model.pb": b"three"})
    assert restore_exports(final, newer) is None  # a node further on keeps its own


def test_while_the_train_stage_runs_each_checkpoint_is_published_as_it_is_kept(moto_s3, tmp_path):
    from pipeline.remote_models import CHECKPOINTS, Publisher, read_index

    final = resolve(f"s3://{moto_s3.bucket()}/w/checkpoints")
    node = tmp_path / "node" / "checkpoints"
    node.mkdir(parents=True)

    def published_when(wanted: set[str]) -> bool:
        deadline = time.monotonic() + 120  # generous: only the wait for the publisher's round
        while time.monotonic() < deadline:
            record = read_index(final)
            if record is not None and set(record["units"]) == wanted:
                return True
            time.sleep(0.1)
        return False

    with Publisher(CHECKPOINTS, node, final, poll=0.1) as publisher:
        _checkpoint(node, 2, "run-a")  # the trainer keeps a checkpoint...
        assert published_when({".", "step-000000002"})
        _checkpoint(node, 4, "run-a")  # ...and the next one, retention removing the first
        shutil.rmtree(node / "step-000000002")
        assert published_when({".", "step-000000004"})
    assert publisher.published >= 2
    assert read_index(final)["newest"] == 4 and not (final / "step-000000002").exists()
