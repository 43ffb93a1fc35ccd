"""dlrm_contracts.storage: local paths and URLs to one kind of Location, against a real
S3-compatible server (moto), and the URLs that are refused (a secret or a setting in them)."""

from __future__ import annotations

import pytest

from dlrm_contracts.errors import ExitCode
from dlrm_contracts.storage import Location, StorageError, is_url, location_of, resolve


@pytest.mark.parametrize(
    "url",
    [
        "s3://AKIAEXAMPLE:hunter2@bucket/criteo",
        "s3://AKIAEXAMPLE@bucket/criteo",
        "s3://bucket/criteo?access_key=AKIA&secret_key=hunter2",
        "s3://bucket/criteo?endpoint_override=evil.example:9000",
        "gs://user:pw@bucket/x",
        "hdfs://user:pw@namenode:8020/x",
        "ftp://host/x",
    ],
)
def test_urls_with_secrets_or_settings_are_refused_without_the_secret(url):
    with pytest.raises(StorageError) as err:
        resolve(url)
    assert err.value.code == ExitCode.USAGE
    assert "hunter2" not in str(err.value) and "AKIA" not in str(err.value)
    assert "\n" not in str(err.value)


def test_local_paths_stay_paths(tmp_path):
    assert location_of(tmp_path) == tmp_path
    assert location_of(f"file://{tmp_path}") == tmp_path
    assert not is_url(str(tmp_path)) and not is_url(f"file://{tmp_path}")
    assert is_url("s3://bucket/x") and is_url("hdfs://nn:8020/x") and is_url("gs://b/x")
    local = resolve(tmp_path / "a")
    (local / "b.json").write_text('{"x": 1}')
    assert (tmp_path / "a" / "b.json").read_text() == '{"x": 1}'
    assert [p.name for p in local.iterdir()] == ["b.json"]
    # written through a temporary and a rename: nothing else is left beside it
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["b.json"]


def test_s3_location_reads_writes_lists_ranges_and_deletes(moto_s3, tmp_path):
    bucket = moto_s3.bucket()
    root = resolve(f"s3://{bucket}/work/")
    assert isinstance(root, Location) and not root.is_local
    assert str(root / "parquet" / "x.json") == f"s3://{bucket}/work/parquet/x.json"
    assert str((root / "parquet").parent) == f"s3://{bucket}/work"
    assert not root.exists() and root.iterdir() == []
    (root / "parquet" / "x.json").write_text("hello world")
    (root / "parquet" / "d" / "y.bin").write_bytes(bytes(range(256)))
    (root / "manifests" / "m.json").write_text("{}")
    assert (root / "parquet" / "x.json").read_text() == "hello world"
    assert (root / "parquet" / "x.json").is_file() and (root / "parquet").is_dir()
    assert (root / "parquet" / "d" / "y.bin").read_range(250, 100) == bytes(range(250, 256))
    assert (root / "parquet" / "d" / "y.bin").size() == 256
    assert [p.name for p in root.iterdir()] == ["manifests", "parquet"]
    assert [p.relative_to(root) for p in root.files()] == [
        "manifests/m.json",
        "parquet/d/y.bin",
        "parquet/x.json",
    ]
    (root / "parquet" / "d" / "y.bin").copy_to(resolve(tmp_path / "copy" / "y.bin"))
    assert (tmp_path / "copy" / "y.bin").read_bytes() == bytes(range(256))
    (root / "parquet").delete_tree()
    assert not (root / "parquet" / "x.json").exists()
    assert [p.relative_to(root) for p in root.files()] == ["manifests/m.json"]
    with pytest.raises(ValueError):
        root / "../other"


def test_an_unreachable_store_is_one_clear_error(moto_s3, monkeypatch, capsys):
    """At a command line: exit 2 and one line naming the store's answer, not a traceback."""
    from dlrm_contracts.errors import ExitCode, run_cli

    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1")
    location = resolve("s3://no-such-server-bucket/x")
    with pytest.raises(OSError):
        location.read_bytes()
    assert run_cli("tool", location.read_bytes) == ExitCode.USAGE
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("tool: error: the object store did not answer") and "NETWORK_CONNECTION" in line


def test_the_workdir_layout_names_the_same_files_at_a_url(tmp_path):
    from dlrm_contracts.layout import WorkdirLayout

    local = WorkdirLayout.at(tmp_path / "w")
    assert local.parquet_split("train") == (tmp_path / "w" / "parquet" / "train").resolve()
    assert WorkdirLayout.at(f"file://{tmp_path}/w") == local
    remote = WorkdirLayout.at("s3://bucket/criteo/w/")
    for name in ("parquet", "counts", "binary", "dictionaries", "manifests", "lock_file"):
        inside = str(getattr(local, name).relative_to(local.root))
        assert str(getattr(remote, name)) == f"s3://bucket/criteo/w/{inside}", name
    assert str(remote.parquet_day(3)) == "s3://bucket/criteo/w/parquet/days/day=3"


@pytest.mark.parametrize("scheme", ["hdfs", "viewfs"])
def test_an_hdfs_url_is_its_namenode_s_one_client_and_the_url_s_path(scheme, monkeypatch, tmp_path):
    """Without a live HDFS: the client is built once per namenode (every later resolve and
    child reuses it) and the path inside it is the URL's own path."""
    from dlrm_contracts import storage

    built = []

    def new_filesystem(kind, url):
        built.append((kind, url))
        return object()  # a stand-in client: nothing here reaches it

    monkeypatch.setattr(storage, "_new_filesystem", new_filesystem)
    monkeypatch.setattr(storage, "_FILESYSTEMS", {})
    root = resolve(f"{scheme}://host:8020/a/b")
    assert (root.path, str(root)) == ("/a/b", f"{scheme}://host:8020/a/b")
    assert str(root / "c" / "d.json") == f"{scheme}://host:8020/a/b/c/d.json"
    assert resolve(f"{scheme}://host:8020/a/b/").path == "/a/b"
    assert resolve(f"{scheme}://host:8020/").path == "/"
    assert resolve(f"{scheme}://host:8020/x").fs is root.fs
    assert [kind for kind, _url in built] == [scheme]
    resolve(f"{scheme}://other:9000/a")  # another namenode: a client of its own
    assert len(built) == 2
