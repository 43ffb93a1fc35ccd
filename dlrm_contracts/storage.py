"""Where a path or URL lives: a local path, or an object in S3, GCS, Azure or HDFS.

``--input`` and ``--workdir`` may be URLs (``s3://bucket/criteo/``, ``gs://...``,
``abfs://container@account.dfs.core.windows.net/...``, ``hdfs://namenode:8020/...``,
``file:///...``) as well as local paths. :func:`resolve` turns any of them into a
:class:`Location`: a pyarrow FileSystem and the path inside it, with the few operations the
stages need (read and write small files, list, exists, byte ranges, delete a tree). Code that
may meet a URL goes through it, never through ``open()``.

Credentials and endpoints come only from the environment or the cloud's usual chain (for S3:
``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_REGION``, and ``AWS_ENDPOINT_URL`` for
an S3-compatible server; instance roles; for GCS the application default credentials; for
Azure ``AZURE_*`` / managed identity), never from the config or a command line: a URL with
user information holding a password or a query string (pyarrow would read ``access_key=``,
``secret_key=``, ``endpoint_override=`` from it) is refused with one line naming the URL's
kind of problem, never the secret, because URLs are recorded in manifests, logs and argv.

Writes of one object are all-or-nothing on every store: a local file goes through a
temporary and a rename (dlrm_contracts.atomic), an object is published by its upload's
completion (a killed upload leaves nothing). What is made of several objects is committed by
a marker written last (dlrm_contracts.object_commit).
"""

from __future__ import annotations

import os
import posixpath
import threading
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import pyarrow.fs as pafs

from dlrm_contracts.errors import UsageError
from dlrm_contracts.security import secret_in_value

# Schemes served by one of pyarrow's own filesystems (fsspec is not needed for any of them).
OBJECT_SCHEMES = ("s3", "gs", "gcs", "abfs", "abfss", "hdfs", "viewfs")
# Stores whose writes can be conditional through this project's client (the workdir lock).
CONDITIONAL_WRITE_SCHEMES = ("s3",)


class StorageError(UsageError):
    """A URL this project refuses (a secret in it, an unknown scheme), or a store that cannot
    be reached with the environment's settings: the user fixes the URL or the environment."""


def is_url(text: str | os.PathLike) -> bool:
    """Whether ``text`` names an object store or HDFS (``file://`` and plain paths do not)."""
    if isinstance(text, Location):
        return not text.is_local
    if isinstance(text, Path):
        return False
    scheme = urlsplit(str(text)).scheme.lower()
    return scheme in OBJECT_SCHEMES


def check_url(text: str) -> None:
    """Refuse a URL that carries a secret or a setting of the store (see the module docstring);
    a plain path passes. The message names what is wrong, never the value."""
    text = str(text)
    parts = urlsplit(text)
    scheme = parts.scheme.lower()
    if "://" not in text:
        return
    if scheme not in OBJECT_SCHEMES and scheme != "file":
        raise StorageError(
            f"{_shown(text)}: unknown scheme '{scheme}://' (local paths, file://, "
            f"{', '.join(s + '://' for s in OBJECT_SCHEMES)})"
        )
    if secret_in_value(text) or parts.password is not None:
        raise StorageError(
            f"{_shown(text)} holds a password in the URL: credentials come from "
            "the environment or the cloud's credential chain (AWS_ACCESS_KEY_ID, "
            "AWS_SECRET_ACCESS_KEY, instance roles), never from a URL, which is "
            "recorded in manifests and logs (docs/cluster.md)"
        )
    if scheme in ("s3", "gs", "gcs") and parts.username is not None:
        raise StorageError(
            f"{_shown(text)} names a user in the URL: credentials come from the environment (docs/cluster.md)"
        )
    if parts.query or parts.fragment:
        raise StorageError(
            f"{_shown(text)} has a query string: a store's settings (endpoint, "
            "region, keys) come from the environment (AWS_ENDPOINT_URL, "
            "AWS_REGION, ...), never from the URL (docs/cluster.md)"
        )


def _shown(text: str) -> str:
    """A URL for a message: scheme, host and path only (no user information, no query)."""
    parts = urlsplit(text)
    if not parts.scheme:
        return text
    host = parts.hostname or ""
    if parts.port:
        host += f":{parts.port}"
    return f"{parts.scheme}://{host}{parts.path}"


_FILESYSTEMS: dict[tuple, pafs.FileSystem] = {}
_FILESYSTEMS_LOCK = threading.Lock()
# The environment that selects an S3 client's account and endpoint: a changed one gets a new client.
_S3_ENVIRONMENT = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_PROFILE",
)


def _filesystem(scheme: str, authority: str, url: str) -> tuple[pafs.FileSystem, str]:
    """(filesystem, path inside it) for an object-store URL; one client per store and
    environment, reused (a client's set-up costs a credential lookup)."""
    key = (
        scheme,
        authority if scheme in ("hdfs", "viewfs", "abfs", "abfss") else "",
        tuple(os.environ.get(name) for name in _S3_ENVIRONMENT),
    )
    with _FILESYSTEMS_LOCK:
        fs = _FILESYSTEMS.get(key)
    try:
        if fs is None:
            fs = _new_filesystem(scheme, url)
            with _FILESYSTEMS_LOCK:
                _FILESYSTEMS[key] = fs
        path = _inner_path(scheme, url)
    except (OSError, ValueError, ImportError) as exc:
        raise StorageError(
            f"{_shown(url)}: the store cannot be opened with this environment's settings ({_first_line(exc)})"
        ) from None
    return fs, path


def _new_filesystem(scheme: str, url: str) -> pafs.FileSystem:
    if scheme == "s3":
        # pyarrow's S3 client reads AWS_* (keys, AWS_REGION, AWS_ENDPOINT_URL) itself; an
        # http:// endpoint (a server on loopback) needs the scheme told to it.
        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
        # allow_delayed_open: an object written whole goes up as one PutObject at close, not
        # as a multipart upload of three requests
        options = {"allow_delayed_open": True}
        if endpoint:
            parts = urlsplit(endpoint)
            options.update(endpoint_override=parts.netloc or endpoint, scheme=parts.scheme or "https")
        if region:
            options["region"] = region
        return pafs.S3FileSystem(**options)
    fs, _path = pafs.FileSystem.from_uri(url)
    return fs


def _inner_path(scheme: str, url: str) -> str:
    parts = urlsplit(url)
    if scheme == "s3" or scheme in ("gs", "gcs"):
        return (parts.netloc + parts.path).rstrip("/") or parts.netloc
    _fs, path = pafs.FileSystem.from_uri(url)
    return path.rstrip("/") or path


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


_LOCAL = pafs.LocalFileSystem()


def resolve(target: "str | os.PathLike | Location") -> "Location":
    """The Location of a local path, a ``file://`` URL or an object-store URL (checked by
    :func:`check_url`)."""
    if isinstance(target, Location):
        return target
    text = os.fspath(target)
    check_url(text)
    parts = urlsplit(text)
    scheme = parts.scheme.lower() if "://" in text else ""
    if scheme in ("", "file"):
        local = parts.path if scheme == "file" else text
        return Location(_LOCAL, str(Path(local).absolute()), str(Path(local).absolute()))
    fs, path = _filesystem(scheme, parts.netloc, text)
    base = f"{parts.scheme}://{parts.netloc}"
    return Location(fs, path, base.rstrip("/"), inner_root=_root_of(scheme, parts, path))


def _root_of(scheme: str, parts, path: str) -> str:
    """The part of the inner path that the URL's authority stands for (S3 and GCS: the
    bucket), so a child's URL is the base URL plus the rest of its path."""
    if scheme in ("s3", "gs", "gcs"):
        return parts.netloc
    if scheme in ("abfs", "abfss") and parts.username and path.startswith(parts.username):
        return parts.username  # abfs://container@account...: the container
    return ""


@dataclass(frozen=True)
class Location:
    """A file or directory on some filesystem: ``fs`` and ``path`` inside it, and how to show
    it (``str()``: the URL or local path). Joins like a Path: ``location / "parquet"``."""

    fs: pafs.FileSystem
    path: str
    base: str  # the URL's scheme://authority ("" part for local paths)
    inner_root: str = ""  # the inner path's prefix the authority stands for

    @property
    def is_local(self) -> bool:
        return isinstance(self.fs, pafs.LocalFileSystem)

    @property
    def url(self) -> str:
        if self.is_local:
            return self.path
        rest = self.path[len(self.inner_root) :] if self.path.startswith(self.inner_root) else self.path
        return f"{self.base}/{rest.lstrip('/')}" if rest.strip("/") else self.base + "/"

    def __str__(self) -> str:
        return self.url

    def __truediv__(self, name: str) -> "Location":
        name = str(name)
        if name.startswith("/") or ".." in name.split("/"):
            raise ValueError(f"{name!r} is not a name inside {self}")
        return Location(self.fs, posixpath.join(self.path, name), self.base, self.inner_root)

    @property
    def name(self) -> str:
        return posixpath.basename(self.path.rstrip("/"))

    @property
    def parent(self) -> "Location":
        return Location(self.fs, posixpath.dirname(self.path.rstrip("/")), self.base, self.inner_root)

    def local_path(self) -> Path:
        """The local Path (only for a local Location)."""
        if not self.is_local:
            raise ValueError(f"{self} is not a local path")
        return Path(self.path)

    def relative_to(self, other: "Location") -> str:
        return posixpath.relpath(self.path, other.path)

    # ------------------------------------------------------------------ what is there
    def _info(self) -> pafs.FileInfo:
        return self.fs.get_file_info(self.path)

    def exists(self) -> bool:
        return self._info().type != pafs.FileType.NotFound

    def is_file(self) -> bool:
        return self._info().type == pafs.FileType.File

    def is_dir(self) -> bool:
        return self._info().type == pafs.FileType.Directory

    def size(self) -> int:
        info = self._info()
        if info.type != pafs.FileType.File:
            raise FileNotFoundError(f"{self} is not a file")
        return info.size

    def mtime_ns(self) -> int | None:
        return self._info().mtime_ns

    def iterdir(self) -> list["Location"]:
        """The entries directly inside this directory, sorted by name ([] when it is missing)."""
        return [
            Location(self.fs, info.path, self.base, self.inner_root)
            for info in self._listing(recursive=False)
        ]

    def files(self) -> list["Location"]:
        """Every file below this directory at any depth, sorted by path."""
        return [
            Location(self.fs, info.path, self.base, self.inner_root)
            for info in self._listing(recursive=True)
            if info.type == pafs.FileType.File
        ]

    def _listing(self, recursive: bool) -> list[pafs.FileInfo]:
        selector = pafs.FileSelector(self.path, allow_not_found=True, recursive=recursive)
        return sorted(self.fs.get_file_info(selector), key=lambda info: info.path)

    # ------------------------------------------------------------------ reads
    def read_bytes(self) -> bytes:
        with self.fs.open_input_file(self.path) as fh:
            return fh.read()

    def read_text(self) -> str:
        return self.read_bytes().decode("utf-8")

    def read_range(self, offset: int, length: int) -> bytes:
        """``length`` bytes from ``offset`` (fewer at the end): one ranged request on a store."""
        with self.fs.open_input_file(self.path) as fh:
            return fh.read_at(length, offset)

    def open_input(self):
        """A random-access reader (``read_at(length, offset)``, ``seek``/``read``) for byte
        ranges; the caller closes it."""
        return self.fs.open_input_file(self.path)

    def open_stream(self):
        """A sequential reader (whole ``.gz`` members, a file read once front to back), of the
        bytes as stored: pyarrow would otherwise (de)compress by the name's suffix."""
        return self.fs.open_input_stream(self.path, compression=None)

    # ------------------------------------------------------------------ writes
    def write_bytes(self, data: bytes, fsync: bool = True) -> None:
        """The whole file at once, all or nothing (see the module docstring)."""
        if self.is_local:
            from dlrm_contracts.atomic import atomic_file  # atomic imports layout, which imports us

            with atomic_file(self.path, fsync) as temporary:
                temporary.write_bytes(data)
            return
        with self.fs.open_output_stream(self.path, compression=None) as fh:
            fh.write(data)

    def write_text(self, text: str, fsync: bool = True) -> None:
        self.write_bytes(text.encode("utf-8"), fsync)

    def open_output(self):
        """A writer for a large object (local: written in place; a caller wanting it atomic
        writes a temporary name). On a store the object appears only when it is closed."""
        if self.is_local:
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        return self.fs.open_output_stream(self.path, compression=None)

    def mkdir(self) -> None:
        """A directory (local, HDFS); a no-op on stores without directories."""
        self.fs.create_dir(self.path, recursive=True)

    def delete(self) -> None:
        """This file, if it is there."""
        try:
            self.fs.delete_file(self.path)
        except FileNotFoundError:
            pass

    def delete_tree(self) -> None:
        """This directory (prefix) and everything under it, if it is there."""
        if self._info().type == pafs.FileType.NotFound:
            return
        if self._info().type == pafs.FileType.File:
            self.delete()
            return
        self.fs.delete_dir(self.path)

    # ------------------------------------------------------------------ copies
    def copy_to(self, target: "Location") -> None:
        """This file copied to ``target`` (any filesystem), streamed."""
        if target.is_local:
            Path(target.path).parent.mkdir(parents=True, exist_ok=True)
        pafs.copy_files(self.path, target.path, source_filesystem=self.fs, destination_filesystem=target.fs)


def location_of(target: "str | os.PathLike | Location") -> "Location | Path":
    """What the stages keep: a Path for a local path (code for local paths stays as it is),
    a Location for a URL."""
    if isinstance(target, Location):
        return target.local_path() if target.is_local else target
    if is_url(target):
        return resolve(target)
    check_url(os.fspath(target))
    text = os.fspath(target)
    return Path(urlsplit(text).path) if text.startswith("file://") else Path(text)
