"""The Arrow engine with its input and workdir in a bucket of a real S3-compatible server (moto's
server mode on loopback): every file it writes equals, byte for byte, the file a run on local
paths writes (with the partial files exchange), with either exchange of the partial counts
behind the URL (Spark's shuffle, the default there; partial objects read by range)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dlrm_contracts.config import PreprocessConfig
from spark_fixtures import random_days, spark_session, write_days

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import bench_object_store as harness  # noqa: E402

pytestmark = pytest.mark.spark

BUCKET = "criteo-test"


@pytest.fixture(scope="module")
def moto(tmp_path_factory):
    """A moto server on a free loopback port for this module, stopped by its own pid."""
    port = harness.free_port()
    log = tmp_path_factory.mktemp("moto") / "moto.log"
    process = subprocess.Popen([str(Path(sys.executable).parent / "moto_server"), "-H",
                                "127.0.0.1", "-p", str(port)],
                               stdout=open(log, "w"), stderr=subprocess.STDOUT)
    try:
        for _ in range(300):
            try:
                socket.create_connection(("127.0.0.1", port), 1).close()
                break
            except OSError:
                time.sleep(0.2)
        yield {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
               "AWS_REGION": "us-east-1", "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}"}
    finally:
        process.terminate()
        process.wait(30)


@pytest.fixture(scope="module")
def store(moto):
    """The endpoint and credentials in the driver's environment and in the Python workers'
    (``SparkContext.environment``: workers started from now on get it)."""
    session = spark_session()
    saved = {k: os.environ.get(k) for k in moto}
    os.environ.update(moto)
    session.sparkContext.environment.update(moto)
    yield moto
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    for key in moto:
        session.sparkContext.environment.pop(key, None)


def _local_files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and not p.name.startswith((".", "_"))}


def _bucket_files(url: str) -> dict[str, bytes]:
    from spark_jobs.engines.arrow import remote

    prefix = url.rstrip("/") + "/"
    return {u[len(prefix):]: remote.read_bytes(u) for u in remote.list_files(url, recursive=True)}


def _outputs(files: dict[str, bytes]) -> dict[str, bytes]:
    """What the engine leaves: counts, dictionaries, index, splits (no scratch)."""
    return {k: v for k, v in files.items()
            if not any(part.startswith(("_", ".")) and part != ".splits-staging"
                       for part in k.split("/"))}


def test_engine_on_a_bucket_writes_the_local_run_s_bytes(store, tmp_path):
    session = spark_session()
    raw = write_days(tmp_path / "raw", random_days(38, 3, 400))
    (raw / "day_2").rename(raw / "day_2.plain")
    import gzip
    (raw / "day_2.gz").write_bytes(gzip.compress((raw / "day_2.plain").read_bytes()))
    (raw / "day_2.plain").unlink()
    # chunks of 16 KB (several per plain day) and small value groups (several per big column)
    cfg = dict(frequency_threshold="2", engine="arrow", arrow_group_values=300)
    work = tmp_path / "work"
    result = harness.run_engine(session, str(raw), str(work),
                                PreprocessConfig(**cfg), chunk_bytes=16 << 10)
    assert result["rows_in"] == 1200
    local = _outputs(_local_files(work))
    assert any(k.startswith("parquet/.splits-staging/train/") for k in local)
    assert any(k.startswith("parquet/dictionary_index/") for k in local)

    input_url = harness.upload_input(raw, store, "input")
    for exchange in ("shuffle", "files"):
        work = f"s3://{harness.BUCKET}/work-{exchange}"
        harness.run_engine(session, input_url, work,
                           PreprocessConfig(arrow_exchange=exchange, **cfg), chunk_bytes=16 << 10)
        remote_files = _outputs(_bucket_files(work))
        assert sorted(remote_files) == sorted(local), exchange
        different = [k for k in remote_files if remote_files[k] != local[k]]
        assert not different, (exchange, different)


def test_ranged_reads_give_the_lines_of_a_local_read(store, tmp_path, monkeypatch):
    """Chunks of a plain day and a .gz day read behind a URL by requests of 4 KB (lines cross
    both the chunks' and the requests' boundaries): the same lines as read from the disk."""
    from spark_jobs.engines.arrow import chunks, remote

    raw = write_days(tmp_path / "raw", random_days(39, 2, 300))
    import gzip
    (raw / "day_1.gz").write_bytes(gzip.compress((raw / "day_1").read_bytes()))
    (raw / "day_1").unlink()
    url = harness.upload_input(raw, store, "ranged")
    monkeypatch.setattr(remote, "REMOTE_READ_BYTES", 4096)

    def lines(chunk):
        return [block.line(i) for block in chunks.line_blocks(chunk, 1024, 4096)
                for i in range(len(block))]

    local = chunks.plan_chunks([harness.UrlDay(0, str(raw / "day_0")),
                                harness.UrlDay(1, str(raw / "day_1.gz"))], 10_000)
    behind = chunks.plan_chunks(harness.url_days(url), 10_000)
    assert len(local) == len(behind) > 2
    for a, b in zip(local, behind):
        assert lines(b) == lines(a)
    assert sum(len(lines(c)) for c in behind) == 600
