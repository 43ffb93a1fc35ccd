"""The storage layer and one Arrow-engine preprocessing run on Google Cloud Storage (``gs://``)
and Azure Blob Storage (``abfs://``), against local emulators (tests/cloud_emulators.py:
fake-gcs-server and Azurite) reached the way a user's clients are, through the environment
(``STORAGE_EMULATOR_HOST``, ``AZURE_STORAGE_CONNECTION_STRING``): lists, ranged and streamed
reads, deletes, the commit by marker, the lock's rule on stores without conditional writes
here, and a ``run_preprocess`` whose published outputs equal a local run's byte for byte."""

from __future__ import annotations

import gzip
import os

import pyarrow.fs as pafs
import pytest

from dlrm_contracts.storage import GCS_RETRY_LIMIT, StorageError, azure_options, resolve
from spark_fixtures import BAD_LINES, random_days, spark_session, write_days

import cloud_emulators

# the tests on an emulator take the shared Spark session (its Python workers get the
# emulator's environment); the settings' tests at the end are of the quick tier
on_a_store = pytest.mark.spark


@pytest.fixture(scope="module", params=["gcs", "azure"])
def store(request, tmp_path_factory):
    """One emulator at a time, in this process's environment and in that of Spark's Python
    workers started from now on; yields the URL of a new bucket or container."""
    try:
        emulator = cloud_emulators.start(request.param, tmp_path_factory.mktemp(request.param))
    except cloud_emulators.EmulatorMissing as missing:
        pytest.skip(f"no {request.param} emulator: {missing}")
    environment = emulator.environment()
    previous = {name: os.environ.get(name) for name in environment}
    os.environ.update(environment)
    session = spark_session()
    session.sparkContext.environment.update(environment)
    try:
        yield emulator.new_root("clouds")
    finally:
        for name, value in previous.items():
            session.sparkContext.environment.pop(name, None)
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        cloud_emulators.stop(emulator)


@on_a_store
def test_the_storage_layer_lists_reads_by_range_and_stream_copies_and_deletes(store, tmp_path):
    from spark_jobs.engines.arrow import remote

    root = resolve(f"{store}/work/")
    assert str(root / "a" / "x.json") == f"{store}/work/a/x.json"
    assert not root.exists() and root.iterdir() == []
    data = bytes(range(256)) * 300
    (root / "a" / "x.json").write_text("hello")
    (root / "a" / "deep" / "y.bin").write_bytes(data)
    (root / "top.json").write_text("{}")
    assert (root / "a" / "x.json").read_text() == "hello" and (root / "a" / "x.json").is_file()
    assert (root / "a").is_dir() and (root / "a" / "deep" / "y.bin").size() == len(data)
    # one level: the prefixes that only exist because objects were written under them too
    assert [(p.name, p.is_dir()) for p in root.iterdir()] == [("a", True), ("top.json", False)]
    assert [p.relative_to(root) for p in root.files()] == ["a/deep/y.bin", "a/x.json", "top.json"]
    assert remote.list_sized(f"{store}/work/a", recursive=True) == [
        (f"{store}/work/a/deep/y.bin", len(data)),
        (f"{store}/work/a/x.json", 5),
    ]
    # ranged reads (the engine's chunks of a plain day) and streamed reads (a .gz member)
    big = root / "a" / "deep" / "y.bin"
    assert big.read_range(70_000, 100) == data[70_000:70_100]
    assert big.read_range(len(data) - 6, 100) == data[-6:]
    handle = remote.open_remote(str(big))
    assert remote.read_range(handle, 1000, 3000) == data[1000:4000]
    handle.close()
    with big.open_stream() as stream:
        assert stream.read(10) + stream.read() == data
    assert remote.read_bytes(str(big)) == data
    big.copy_to(resolve(tmp_path / "copy" / "y.bin"))
    assert (tmp_path / "copy" / "y.bin").read_bytes() == data
    # deletes: a file (and one that is not there), a prefix made by writing objects under it
    (root / "top.json").delete()
    (root / "top.json").delete()
    assert not (root / "top.json").exists()
    (root / "a").delete_tree()
    assert not (root / "a").exists() and root.files() == []
    (root / "a").delete_tree()  # nothing there: nothing to do


@on_a_store
def test_a_directory_is_published_by_its_marker_and_older_versions_go(store, tmp_path):
    from dlrm_contracts.object_commit import COMMIT_MARKER, committed_files, publish_directory

    final = resolve(f"{store}/w/parquet/train")
    assert committed_files(final) == {}
    first = tmp_path / "one"
    (first / "sub").mkdir(parents=True)
    (first / "part-0.parquet").write_bytes(b"first")
    (first / "sub" / "part-1.parquet").write_bytes(b"first too")
    publish_directory(first, final)
    assert {n: p.read_bytes() for n, p in committed_files(final).items()} == {
        "part-0.parquet": b"first",
        "sub/part-1.parquet": b"first too",
    }
    # a writer killed before its marker: its objects are never read, and the next
    # publication deletes them with the version it replaces
    (final / ".v-killed-writer" / "part-0.parquet").write_bytes(b"half")
    assert committed_files(final)["part-0.parquet"].read_bytes() == b"first"
    second = tmp_path / "two"
    second.mkdir()
    (second / "part-0.parquet").write_bytes(b"second")
    version = publish_directory(second, final)
    assert {n: p.read_bytes() for n, p in committed_files(final).items()} == {"part-0.parquet": b"second"}
    assert sorted(p.name for p in final.iterdir()) == [version.name, COMMIT_MARKER]


@on_a_store
def test_the_workdir_lock_on_a_store_without_conditional_writes_warns(store, caplog):
    """pyarrow's GCS and Azure clients make no conditional write: the rule there is one
    scheduler per workdir, said in a warning, and nothing is written as a lock."""
    from dlrm_contracts.lock import workdir_lock

    url = f"{store}/locked"
    with caplog.at_level("WARNING"):
        with workdir_lock(url, "pipeline") as lock:
            assert lock.unlocked
    assert "one scheduler per workdir" in caplog.text
    assert not resolve(url).files()


# ------------------------------------------------------------------ one preprocessing run
@pytest.fixture(scope="module")
def raw(tmp_path_factory):
    """Three small days on disk, one with rejected lines and one gzip-compressed."""
    days = random_days(382, 3, 300)
    days[1] += BAD_LINES["bad_label"][:2]
    local = write_days(tmp_path_factory.mktemp("raw"), days)
    (local / "day_2.gz").write_bytes(gzip.compress((local / "day_2").read_bytes(), mtime=0))
    (local / "day_2").unlink()
    return local


@pytest.fixture(scope="module")
def local_run(raw, tmp_path_factory):
    """The same run on local paths: (published files, summary)."""
    from spark_store_helpers import (
        published_bytes as _published,
        run_arrow as _run,
        stable_summary as _summary,
    )

    workdir = tmp_path_factory.mktemp("local")
    _run(raw, workdir, "2")
    return _published(workdir), _summary(workdir)


@on_a_store
def test_preprocess_at_the_store_publishes_the_local_run_s_bytes(store, raw, local_run):
    from spark_store_helpers import (
        published_bytes as _published,
        run_arrow as _run,
        stable_summary as _summary,
    )

    input_url = f"{store}/raw"
    for path in sorted(raw.iterdir()):
        (resolve(input_url) / path.name).write_bytes(path.read_bytes())
    url = f"{store}/work-run"
    result = _run(input_url, url, "2")
    assert result["days_counted"] == [0, 1, 2]
    published = _published(url)
    assert published["rejects"], "the input has rejected lines"
    assert sorted(published) == sorted(local_run[0])
    assert [name for name in published if published[name] != local_run[0][name]] == []
    assert _summary(url) == local_run[1]


# ------------------------------------------------------------------ the environment's settings
def test_azure_settings_come_from_the_connection_string_or_the_cli_variables(monkeypatch):
    for name in ("AZURE_STORAGE_CONNECTION_STRING", "AZURE_STORAGE_ACCOUNT", "AZURE_STORAGE_KEY"):
        monkeypatch.delenv(name, raising=False)
    host = "acct.dfs.core.windows.net"
    assert azure_options(host) == {"account_name": "acct"}  # the default credential chain
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT", "acct")
    monkeypatch.setenv("AZURE_STORAGE_KEY", "s3cr3t")
    assert azure_options(host) == {"account_name": "acct", "account_key": "s3cr3t"}
    monkeypatch.setenv(
        "AZURE_STORAGE_CONNECTION_STRING",
        "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=s3cr3t;EndpointSuffix=core.chinacloudapi.cn",
    )
    assert azure_options(host) == {
        "account_name": "acct",
        "account_key": "s3cr3t",
        "blob_storage_scheme": "https",
        "blob_storage_authority": ".blob.core.chinacloudapi.cn",
        "dfs_storage_scheme": "https",
        "dfs_storage_authority": ".dfs.core.chinacloudapi.cn",
    }
    monkeypatch.setenv(
        "AZURE_STORAGE_CONNECTION_STRING",
        "AccountName=acct;SharedAccessSignature=?sv=1&sig=s3cr3t;BlobEndpoint=https://acct.blob.core.windows.net",
    )
    assert azure_options(host) == {
        "account_name": "acct",
        "sas_token": "sv=1&sig=s3cr3t",
        "blob_storage_scheme": "https",
        "blob_storage_authority": ".blob.core.windows.net",
        "dfs_storage_scheme": "https",
        "dfs_storage_authority": ".dfs.core.windows.net",
    }
    # a key for another account: refused in one line, without the key
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", "AccountName=other;AccountKey=s3cr3t")
    with pytest.raises(StorageError) as error:
        resolve("abfs://container@acct.dfs.core.windows.net/work")
    assert "'other'" in str(error.value) and "s3cr3t" not in str(error.value) and "\n" not in str(error.value)


def test_gcs_reaches_an_emulator_named_by_storage_emulator_host(monkeypatch):
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "127.0.0.1:4443")
    location = resolve("gs://bucket/work")
    assert location.fs.type_name == "gcs" and location.path == "bucket/work"
    emulator = pafs.GcsFileSystem(
        anonymous=True, endpoint_override="127.0.0.1:4443", scheme="http", retry_time_limit=GCS_RETRY_LIMIT
    )
    assert location.fs.equals(emulator)


def test_an_unreachable_gcs_endpoint_is_an_error_not_a_hang(monkeypatch):
    """The GCS client's retries are bounded (storage.GCS_RETRY_LIMIT, here shortened): a store
    that does not answer fails the request instead of being retried for many minutes."""
    from datetime import timedelta

    from dlrm_contracts import storage

    monkeypatch.setattr(storage, "GCS_RETRY_LIMIT", timedelta(seconds=1))
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"127.0.0.1:{cloud_emulators.free_port()}")
    with pytest.raises(OSError, match="Retry policy exhausted"):
        resolve("gs://bucket/work/x.json").read_bytes()
