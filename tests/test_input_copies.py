"""The node-local copies of chunks read behind a URL (spark_jobs.engines.arrow.input_copies)
against a real S3-compatible server (moto on loopback): the count's read keeps a copy, the
transform's read takes it (no request to the store) and removes it, and every way a copy can
be missing or short (another run's, none kept, cut short, over the budget) reads the store
for what is missing: always the lines of a local read."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from spark_fixtures import random_days, write_days

import bench_object_store as harness


@pytest.fixture(scope="module")
def bucket(moto_s3):
    return {**moto_s3.environment(), "bucket": moto_s3.bucket("copies")}


@pytest.fixture
def days(bucket, tmp_path_factory):
    """Two days on local disk and in the bucket: a plain one of several chunks and a .gz one."""
    raw = write_days(tmp_path_factory.mktemp("raw"), random_days(43, 2, 400))
    (raw / "day_1.gz").write_bytes(gzip.compress((raw / "day_1").read_bytes()))
    (raw / "day_1").unlink()
    url = harness.upload_input(raw, bucket, f"in-{raw.name}", bucket["bucket"])
    return raw, url


@pytest.fixture
def scratch(tmp_path, monkeypatch):
    """The executor's local directory, as Spark gives it to its Python workers."""
    monkeypatch.setenv("SPARK_LOCAL_DIRS", str(tmp_path / "local"))
    (tmp_path / "local").mkdir()
    return tmp_path / "local"


@pytest.fixture
def requests(tmp_path, monkeypatch):
    from spark_jobs.engines.arrow import remote

    log = tmp_path / "requests.log"
    monkeypatch.setenv(remote.IO_LOG_ENV, str(log))

    def gets() -> list[int]:
        lines = log.read_text().splitlines() if log.exists() else []
        log.unlink(missing_ok=True)
        return [int(line.split()[2]) for line in lines if line.split()[1] == "get"]

    return gets


def _chunks(raw: Path, url: str):
    from spark_jobs.engines.arrow.chunks import plan_chunks

    local = plan_chunks(
        [harness.UrlDay(0, str(raw / "day_0")), harness.UrlDay(1, str(raw / "day_1.gz"))], 12_000
    )
    behind = plan_chunks(harness.url_days(url), 12_000)
    assert len(local) == len(behind) >= 4
    return local, behind


def _lines(chunk, copy=None) -> list[bytes]:
    from spark_jobs.engines.arrow.chunks import line_blocks

    blocks = line_blocks(chunk, 1024, 4096, remote_read_bytes=4096, copy=copy)
    return [block.line(i) for block in blocks for i in range(len(block))]


def _copy(spec, chunk, mode):
    from spark_jobs.engines.arrow.input_copies import ChunkCopy

    return ChunkCopy.of(spec, chunk, mode, 1024)


def test_the_transform_reads_the_count_s_copy_and_removes_it(days, scratch, requests):
    from spark_jobs.engines.arrow import input_copies
    from spark_jobs.engines.arrow.input_copies import KEEP, READ, TAKE, CopySpec

    raw, url = days
    local, behind = _chunks(raw, url)
    spec = CopySpec.new(64)
    requests()
    for a, b in zip(local, behind):
        assert _lines(b, _copy(spec, b, KEEP)) == _lines(a)
    assert len(requests()) == len(behind)  # the count: one streamed GET per chunk
    folder = input_copies.directory(spec)
    assert len(list(folder.iterdir())) == len(behind)
    # the last chunk of each day was read to the object's end: nothing left to ask for
    last = [behind[-2], behind[-1]]
    assert sorted(p.name for p in folder.iterdir() if p.name.endswith(".whole")) == [
        f"{c.day}-{c.index}-{c.start}-{c.end}.whole" for c in last
    ]

    for mode in (READ, TAKE):  # the rejects read the copies, the transform takes them
        for a, b in zip(local, behind):
            assert _lines(b, _copy(spec, b, mode)) == _lines(a)
        assert requests() == []
    assert list(folder.iterdir()) == []


def test_without_a_whole_copy_the_store_gives_what_is_missing(days, scratch, requests):
    from spark_jobs.engines.arrow import input_copies
    from spark_jobs.engines.arrow.input_copies import KEEP, TAKE, CopySpec

    raw, url = days
    local, behind = _chunks(raw, url)
    spec = CopySpec.new(64)
    for b in behind:
        _lines(b, _copy(spec, b, KEEP))
    folder = input_copies.directory(spec)
    copies = sorted(folder.iterdir())
    first, gz = copies[0], copies[-1]
    first.write_bytes(first.read_bytes()[:3000])  # a prefix: the rest comes from the store
    gz.rename(gz.with_name(gz.name.replace(".whole", "")))  # a .gz copy not known to be whole
    copies[1].unlink()  # a copy this node never made
    requests()

    another = CopySpec.new(64)  # another run's copies are never read
    assert _lines(behind[2], _copy(another, behind[2], TAKE)) == _lines(local[2])
    assert len(requests()) == 1

    for a, b in zip(local, behind):
        assert _lines(b, _copy(spec, b, TAKE)) == _lines(a)
    gets = requests()
    # the cut copy's rest (from byte 3000 on), the missing chunk, the .gz copy's end (nothing)
    assert len(gets) == 3 and 0 in gets
    assert list(folder.iterdir()) == []


def test_copies_stay_within_the_budget_and_a_new_run_clears_the_old(days, scratch, requests):
    from spark_jobs.engines.arrow import input_copies
    from spark_jobs.engines.arrow.input_copies import KEEP, TAKE, CopySpec

    raw, url = days
    local, behind = _chunks(raw, url)
    old = CopySpec.new(64)
    _lines(behind[0], _copy(old, behind[0], KEEP))
    assert input_copies.directory(old).exists()

    # room for about two plain chunks' copies (each reserves its range plus a block)
    spec = CopySpec(run="budget", budget=2 * (behind[0].end - behind[0].start + 1 + 1024) + 100)
    for b in behind:
        _lines(b, _copy(spec, b, KEEP))
    assert not input_copies.directory(old).exists()
    kept = list(input_copies.directory(spec).iterdir())
    assert len(kept) == 2
    assert sum(p.stat().st_size for p in kept) <= spec.budget
    requests()
    for a, b in zip(local, behind):
        assert _lines(b, _copy(spec, b, TAKE)) == _lines(a)
    assert len(requests()) == len(behind) - 2

    assert CopySpec.new(0) is None  # arrow_input_copy_mb: 0 turns the copies off


def test_one_worker_of_a_node_fetches_the_index_the_others_wait(bucket, tmp_path, monkeypatch):
    """Workers starting the transform together on one node: the index behind the URL is
    fetched once, and every worker gets the whole copy."""
    import threading
    import time

    from spark_jobs.engines.arrow import dictionary_index, remote

    url = f"s3://{bucket['bucket']}/index-{tmp_path.name}"
    files = {"index.json": b"{}", "C1/00000.slots": bytes(4096), "C1/00001.slots": bytes(range(256)) * 16}
    for name, data in files.items():
        remote.write_bytes(remote.join(url, name), data)
    fetched = []
    fetch = dictionary_index.fetch_index

    def slow_fetch(source, target):
        fetched.append(target)
        time.sleep(0.5)  # the others arrive while it copies
        fetch(source, target)

    monkeypatch.setattr(dictionary_index, "fetch_index", slow_fetch)
    copies = []
    workers = [
        threading.Thread(target=lambda: copies.append(dictionary_index.local_copy(url, str(tmp_path), "run")))
        for _ in range(3)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert len(fetched) == 1 and len(set(copies)) == 1 and len(copies) == 3
    assert {
        str(p.relative_to(copies[0])): p.read_bytes() for p in Path(copies[0]).rglob("*") if p.is_file()
    } == files
