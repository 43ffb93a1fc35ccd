"""The Arrow engine with its input and workdir in a bucket of a real S3-compatible server (moto's
server mode on loopback): every file it writes equals, byte for byte, the file a run on local
paths writes (with the partial files exchange), with either exchange of the partial counts
behind the URL (Spark's shuffle, the default there; partial objects read by range)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dlrm_contracts.config import PreprocessConfig
from spark_fixtures import random_days, spark_session, write_days

import bench_object_store as harness

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def store(moto_s3):
    """The session's moto server (tests/conftest.py) reached by the Python workers too
    (``SparkContext.environment``: workers started from now on get it); a bucket of our own."""
    session = spark_session()
    environment = moto_s3.environment()
    session.sparkContext.environment.update(environment)
    yield {**environment, "bucket": moto_s3.bucket("arrow")}
    for key in environment:
        session.sparkContext.environment.pop(key, None)


def _local_files(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.name.startswith((".", "_"))
    }


def _bucket_files(url: str) -> dict[str, bytes]:
    from spark_jobs.engines.arrow import remote

    prefix = url.rstrip("/") + "/"
    return {u[len(prefix) :]: remote.read_bytes(u) for u in remote.list_files(url, recursive=True)}


def _outputs(files: dict[str, bytes]) -> dict[str, bytes]:
    """What the engine leaves: counts, dictionaries, index, splits (no scratch)."""
    return {
        k: v
        for k, v in files.items()
        if not any(part.startswith(("_", ".")) and part != ".splits-staging" for part in k.split("/"))
    }


def test_engine_on_a_bucket_writes_the_local_run_s_bytes(store, tmp_path, monkeypatch):
    from spark_jobs.engines.arrow import partial_files

    host_dirs: list[Path] = []
    on_this_host = partial_files.on_this_host
    monkeypatch.setattr(
        partial_files, "on_this_host", lambda root: host_dirs.append(on_this_host(root)) or host_dirs[-1]
    )
    session = spark_session()
    raw = write_days(tmp_path / "raw", random_days(38, 3, 400))
    (raw / "day_2").rename(raw / "day_2.plain")
    import gzip

    (raw / "day_2.gz").write_bytes(gzip.compress((raw / "day_2.plain").read_bytes()))
    (raw / "day_2.plain").unlink()
    # chunks of 16 KB (several per plain day) and small value groups (several per big column)
    cfg = dict(frequency_threshold="2", engine="arrow", arrow_group_values=300)
    work = tmp_path / "work"
    result = harness.run_engine(session, str(raw), str(work), PreprocessConfig(**cfg), chunk_bytes=16 << 10)
    assert result["rows_in"] == 1200
    local = _outputs(_local_files(work))
    assert any(k.startswith("parquet/.splits-staging/train/") for k in local)
    assert any(k.startswith("parquet/dictionary_index/") for k in local)

    input_url = harness.upload_input(raw, store, "input", store["bucket"])
    for exchange in ("shuffle", "files", "local"):
        work = f"s3://{store['bucket']}/work-{exchange}"
        harness.run_engine(
            session, input_url, work, PreprocessConfig(arrow_exchange=exchange, **cfg), chunk_bytes=16 << 10
        )
        remote_files = _outputs(_bucket_files(work))
        assert sorted(remote_files) == sorted(local), exchange
        different = [k for k in remote_files if remote_files[k] != local[k]]
        assert not different, (exchange, different)
        # the local exchange's partial files and staged dictionary parts went to this host's
        # disk (a directory each), and are gone
        assert len(host_dirs) == 2 * (exchange == "local"), exchange
        assert not any(d.exists() for d in host_dirs)


@pytest.mark.parametrize("streamed", [True, False], ids=["s3-stream", "ranges"])
def test_reads_behind_a_url_give_the_lines_of_a_local_read(store, tmp_path, monkeypatch, streamed):
    """Chunks of a plain day and a .gz day read behind a URL by reads of 4 KB (lines cross
    the chunks', the reads' and on S3 the streamed GETs' boundaries), as one streamed GET per
    chunk (S3) or by ranged requests (the other stores): the same lines as read from the disk."""
    from spark_jobs.engines.arrow import chunks, remote

    raw = write_days(tmp_path / "raw", random_days(39, 2, 300))
    import gzip

    (raw / "day_1.gz").write_bytes(gzip.compress((raw / "day_1").read_bytes()))
    (raw / "day_1").unlink()
    url = harness.upload_input(raw, store, "ranged", store["bucket"])
    if not streamed:
        monkeypatch.setattr(remote, "streams", lambda url: False)

    def lines(chunk):
        blocks = chunks.line_blocks(chunk, 1024, 4096, remote_read_bytes=4096)
        return [block.line(i) for block in blocks for i in range(len(block))]

    local = chunks.plan_chunks(
        [harness.UrlDay(0, str(raw / "day_0")), harness.UrlDay(1, str(raw / "day_1.gz"))], 10_000
    )
    behind = chunks.plan_chunks(harness.url_days(url), 10_000)
    assert len(local) == len(behind) > 2
    for a, b in zip(local, behind):
        assert lines(b) == lines(a)
    assert sum(len(lines(c)) for c in behind) == 600


def _requests(log: Path, kind: str) -> list[int]:
    return [int(line.split()[2]) for line in log.read_text().splitlines() if line.split()[1] == kind]


def test_a_chunk_on_s3_is_one_streamed_get(store, tmp_path, monkeypatch):
    """Each chunk of a plain day on S3 costs one GET (and no HEAD), reading its range plus one
    block, whatever the read size: the requests do not grow with the chunk."""
    from spark_jobs.engines.arrow import chunks, remote

    raw = write_days(tmp_path / "raw", random_days(41, 1, 600))
    url = harness.upload_input(raw, store, "streamed", store["bucket"])
    monkeypatch.setattr(remote, "REMOTE_FIRST_READ_BYTES", 1024)
    log = tmp_path / "requests.log"
    monkeypatch.setenv(remote.IO_LOG_ENV, str(log))
    local = chunks.plan_chunks([harness.UrlDay(0, str(raw / "day_0"))], 20_000)
    behind = chunks.plan_chunks(harness.url_days(url), 20_000)
    log.unlink()
    assert len(behind) >= 3

    for a, b in zip(local, behind):
        blocks = chunks.line_blocks(b, 512, 4096, remote_read_bytes=4096)
        assert [k.line(i) for k in blocks for i in range(len(k))] == [
            k.line(i) for k in chunks.line_blocks(a, 512, 4096) for i in range(len(k))
        ]
    assert len(_requests(log, "get")) == len(behind)
    assert not _requests(log, "head")
    size = (raw / "day_0").stat().st_size
    assert size <= sum(_requests(log, "get")) <= size + len(behind) * 512


def test_a_broken_stream_is_asked_again_from_where_it_stopped(store, tmp_path):
    """A connection reset mid-way through a chunk's GET: the stream asks for the rest with a
    new GET from the byte it stopped at, and the bytes read are the object's."""
    from urllib3.exceptions import ProtocolError

    from spark_jobs.engines.arrow import remote

    data = bytes(range(256)) * 64
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "day_0").write_bytes(data)
    url = harness.upload_input(tmp_path / "raw", store, "broken", store["bucket"]) + "/day_0"

    class Breaks:
        def __init__(self, body):
            self.body, self.reads = body, 0

        def read(self, n):
            self.reads += 1
            if self.reads == 3:
                raise ProtocolError("Connection broken: reset by peer")
            return self.body.read(n)

        def close(self):
            self.body.close()

    stream = remote.stream_range(url, 100, 10_000)
    stream.body = Breaks(stream.body)
    got = b"".join(iter(lambda: stream.read(1000), b""))
    stream.close()
    assert got == data[100:10_000] and stream.retries == 1


def test_ranged_reads_grow_to_the_largest_request(store, tmp_path, monkeypatch):
    """On a store read by ranges, a chunk's requests double from the first size to the largest
    (then stay there), one ahead of the parse, and still give the lines of a local read."""
    from spark_jobs.engines.arrow import chunks, remote

    raw = write_days(tmp_path / "raw", random_days(40, 1, 300))
    url = harness.upload_input(raw, store, "growing", store["bucket"])
    monkeypatch.setattr(remote, "streams", lambda url: False)
    monkeypatch.setattr(remote, "REMOTE_FIRST_READ_BYTES", 1024)
    log = tmp_path / "requests.log"
    monkeypatch.setenv(remote.IO_LOG_ENV, str(log))
    [local] = chunks.plan_chunks([harness.UrlDay(0, str(raw / "day_0"))], 1 << 30)
    [behind] = chunks.plan_chunks(harness.url_days(url), 1 << 30)
    log.unlink()

    def lines(chunk):
        blocks = chunks.line_blocks(chunk, 512, 4096, remote_read_bytes=4096)
        return [block.line(i) for block in blocks for i in range(len(block))]

    assert lines(behind) == lines(local)
    sizes = _requests(log, "get")
    size = (raw / "day_0").stat().st_size
    assert sum(sizes) == size
    assert sizes[:3] == [1024, 2048, 4096]
    assert all(s == 4096 for s in sizes[3:-1]) and 0 < sizes[-1] <= 4096


def test_the_sizes_of_the_index_and_of_the_stored_counts_come_with_their_listings(
    moto_s3, tmp_path, monkeypatch
):
    """No request per file for a size: the index's bytes and the stored counts' batches are
    sized from the listings (the engine's request log counts them)."""
    from dlrm_contracts.layout import COUNT_VALUES_DIR
    from spark_jobs.engines.arrow import dictionaries as dicts
    from spark_jobs.engines.arrow import dictionary_index, remote

    root = f"s3://{moto_s3.bucket('sizes')}/w"
    objects = {
        "index/C1/000.slots": 100,
        "index/C1/001.slots": 50,
        "index/C2/000.slots": 7,
        "index/index.json": 3,
        f"counts/{COUNT_VALUES_DIR}/day=0/part-0.parquet": 30,
        f"counts/{COUNT_VALUES_DIR}/day=0/part-1.parquet": 20,
        f"counts/{COUNT_VALUES_DIR}/day=0/_SUCCESS": 0,
        f"counts/{COUNT_VALUES_DIR}/day=1/part-0.parquet": 10,
    }
    for name, size in objects.items():
        remote.write_bytes(f"{root}/{name}", b"x" * size)
    log = tmp_path / "io.log"
    monkeypatch.setenv(remote.IO_LOG_ENV, str(log))
    assert dictionary_index.index_bytes(f"{root}/index") == 157
    files = dicts.stored_files(f"{root}/counts", [0, 1])
    values = f"{root}/counts/{COUNT_VALUES_DIR}"
    assert files == [
        (0, f"{values}/day=0/part-0.parquet", 30),
        (0, f"{values}/day=0/part-1.parquet", 20),
        (1, f"{values}/day=1/part-0.parquet", 10),
    ]
    batches = dicts.stored_batches(files, 2)
    assert sorted(sum(batches, [])) == files and [sum(f[2] for f in b) for b in batches] == [30, 30]
    # one listing for the index and one per day; no HEAD
    assert [line.split()[1] for line in log.read_text().splitlines()] == ["list", "list", "list"]


def test_writes_behind_land_every_object_by_the_end_of_their_block(store, tmp_path, monkeypatch):
    """Inside ``writes_behind`` the merge and dictionary tasks' writes return at once; when the
    block ends every object is in the store whole, one PUT each, and a nested block waits
    with the outer one."""
    from spark_jobs.engines.arrow import remote

    log = tmp_path / "requests.log"
    monkeypatch.setenv(remote.IO_LOG_ENV, str(log))
    base = f"s3://{store['bucket']}/behind"
    local = tmp_path / "part.bin"
    local.write_bytes(b"uploaded" * 1000)
    objects = {f"{base}/o-{k:02d}": bytes([k]) * (1000 + 997 * k) for k in range(20)}
    with remote.writes_behind(threads=3, pending=4):
        for url, data in objects.items():
            remote.write_bytes(url, data)
        with remote.writes_behind():
            remote.upload(local, f"{base}/uploaded")
    objects[f"{base}/uploaded"] = local.read_bytes()
    assert {url: remote.read_bytes(url) for url in remote.list_files(base)} == objects
    assert len(_requests(log, "put")) == len(objects)
    remote.write_bytes(f"{base}/after", b"x")  # outside a block: written before the call returns
    assert remote.read_bytes(f"{base}/after") == b"x"


def test_a_failed_write_behind_fails_its_block(store):
    """A write that fails on its thread is raised when the block ends (the task then fails and
    Spark retries it): never lost silently."""
    from spark_jobs.engines.arrow import remote

    with pytest.raises(OSError):
        with remote.writes_behind():
            remote.write_bytes(f"s3://no-such-bucket-{store['bucket']}/o", b"data")
    remote.write_bytes(f"s3://{store['bucket']}/still-written", b"y")  # the next block's writes work
    assert remote.read_bytes(f"s3://{store['bucket']}/still-written") == b"y"
