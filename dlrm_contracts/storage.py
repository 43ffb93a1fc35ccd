"""Where a path or URL lives: a local path, or an object in S3, GCS, Azure or HDFS.

``--input`` and ``--workdir`` may be URLs (``s3://bucket/criteo/``, ``gs://...``,
``abfs://container@account.dfs.core.windows.net/...``, ``hdfs://namenode:8020/...``,
``file:///...``) as well as local paths. :func:`resolve` turns any of them into a
:class:`Location`: a pyarrow FileSystem and the path inside it, with the few operations the
stages need (read and write small files, list, exists, byte ranges, delete a tree). Code that
may meet a URL goes through it, never through ``open()``.

Credentials and endpoints come only from the environment or the cloud's usual chain (for S3:
``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_REGION``, and ``AWS_ENDPOINT_URL`` for
an S3-compatible server; instance roles; for GCS the application default credentials, and
``STORAGE_EMULATOR_HOST`` for an emulator; for Azure ``AZURE_STORAGE_CONNECTION_STRING`` or
``AZURE_STORAGE_ACCOUNT``/``AZURE_STORAGE_KEY``, else the default credential chain; the table
in docs/cluster.md §2.0.3), never from the config or a command line: a URL with
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
from datetime import timedelta
from pathlib import Path
from typing import cast
from urllib.parse import SplitResult, urlsplit

import pyarrow as pa
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


def is_url(text: str | os.PathLike[str] | Location) -> bool:
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


# (scheme, authority or "", the environment's values): one client each
_FILESYSTEMS: dict[tuple[str, str, tuple[str | None, ...]], pafs.FileSystem] = {}
_FILESYSTEMS_LOCK = threading.Lock()
# The environment that selects a store's account, credentials and endpoint, per scheme: a
# changed one gets a new client.
_ENVIRONMENT = {
    "s3": (
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_REGION",
        "AWS_DEFAULT_REGION",
        "AWS_ENDPOINT_URL",
        "AWS_ENDPOINT_URL_S3",
        "AWS_PROFILE",
    ),
    "gs": ("STORAGE_EMULATOR_HOST", "GOOGLE_APPLICATION_CREDENTIALS", "GOOGLE_CLOUD_PROJECT"),
    "abfs": (
        "AZURE_STORAGE_CONNECTION_STRING",
        "AZURE_STORAGE_ACCOUNT",
        "AZURE_STORAGE_KEY",
        "AZURE_STORAGE_SAS_TOKEN",
        "AZURE_CLIENT_ID",
        "AZURE_TENANT_ID",
        "AZURE_CLIENT_SECRET",
    ),
}
_ENVIRONMENT["gcs"] = _ENVIRONMENT["gs"]
_ENVIRONMENT["abfss"] = _ENVIRONMENT["abfs"]


def _filesystem(scheme: str, authority: str, url: str) -> tuple[pafs.FileSystem, str]:
    """(filesystem, path inside it) for an object-store URL; one client per store and
    environment, reused (a client's set-up costs a credential lookup)."""
    key = (
        scheme,
        authority if scheme in ("hdfs", "viewfs", "abfs", "abfss") else "",
        tuple(os.environ.get(name) for name in _ENVIRONMENT.get(scheme, ())),
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
        options: dict[str, object] = {"allow_delayed_open": True}
        if endpoint:
            parts = urlsplit(endpoint)
            options.update(endpoint_override=parts.netloc or endpoint, scheme=parts.scheme or "https")
        if region:
            options["region"] = region
        return pafs.S3FileSystem(**options)
    if scheme in ("gs", "gcs"):
        return _gcs_filesystem()
    if scheme in ("abfs", "abfss"):
        return pafs.AzureFileSystem(**azure_options(urlsplit(url).hostname or ""))
    fs, _path = pafs.FileSystem.from_uri(url)
    return fs


def _gcs_filesystem() -> pafs.FileSystem:
    """GCS through the application default credentials (GOOGLE_APPLICATION_CREDENTIALS, the
    metadata server of a Google Cloud VM; GOOGLE_CLOUD_PROJECT), or, with
    ``STORAGE_EMULATOR_HOST`` set (the variable Google's own client libraries and gcloud read),
    an emulator at that address without credentials."""
    emulator = os.environ.get("STORAGE_EMULATOR_HOST")
    if not emulator:
        return pafs.GcsFileSystem(retry_time_limit=GCS_RETRY_LIMIT)
    parts = urlsplit(emulator if "://" in emulator else f"http://{emulator}")
    if not parts.netloc:
        raise ValueError("STORAGE_EMULATOR_HOST is not host:port or http://host:port")
    return pafs.GcsFileSystem(
        anonymous=True, endpoint_override=parts.netloc, scheme=parts.scheme, retry_time_limit=GCS_RETRY_LIMIT
    )


# How long pyarrow's GCS client retries one request that fails for a transient reason (the
# store unreachable, 5xx): without a bound its client's own is 15 minutes, so a wrong endpoint
# or a network outage would look like a hang; past it the request fails (and Spark retries
# the task).
GCS_RETRY_LIMIT = timedelta(minutes=2)


def azure_options(host: str) -> dict[str, str]:
    """pyarrow.fs.AzureFileSystem's arguments for the account the URL's host names
    (``account.dfs.core.windows.net``), from the environment the Azure CLI and SDKs read:
    ``AZURE_STORAGE_CONNECTION_STRING`` (account, key or SAS, and endpoints: how an emulator
    such as Azurite, or another cloud's endpoint suffix, is reached), else
    ``AZURE_STORAGE_ACCOUNT`` with ``AZURE_STORAGE_KEY`` or ``AZURE_STORAGE_SAS_TOKEN``, else
    the default credential chain (``AZURE_CLIENT_ID``/``AZURE_TENANT_ID``/
    ``AZURE_CLIENT_SECRET``, workload or managed identity). A key or token named for another
    account than the URL's is refused (never shown)."""
    account = host.split(".", 1)[0]
    if not account:
        raise ValueError(
            "an abfs:// URL names its account: abfs://CONTAINER@ACCOUNT.dfs.core.windows.net/PATH"
        )
    connection = os.environ.get("AZURE_STORAGE_CONNECTION_STRING")
    if connection:
        return _connection_string_options(account, connection)
    named = os.environ.get("AZURE_STORAGE_ACCOUNT")
    key, sas = os.environ.get("AZURE_STORAGE_KEY"), os.environ.get("AZURE_STORAGE_SAS_TOKEN")
    options = {"account_name": account}
    if named and (key or sas):
        if named != account:
            raise ValueError(f"AZURE_STORAGE_ACCOUNT names the account '{named}', the URL '{account}'")
        if key:
            options["account_key"] = key
        elif sas:
            options["sas_token"] = sas.lstrip("?")
    return options


def _connection_string_options(account: str, connection: str) -> dict[str, str]:
    fields: dict[str, str] = {}
    for item in connection.split(";"):
        name, sep, value = item.strip().partition("=")
        if sep:
            fields[name.strip().lower()] = value.strip()
    named = fields.get("accountname")
    if named and named != account:
        raise ValueError(
            f"AZURE_STORAGE_CONNECTION_STRING is for the account '{named}', the URL names '{account}'"
        )
    options = {"account_name": account}
    if fields.get("accountkey"):
        options["account_key"] = fields["accountkey"]
    elif fields.get("sharedaccesssignature"):
        options["sas_token"] = fields["sharedaccesssignature"].lstrip("?")
    protocol = fields.get("defaultendpointsprotocol", "https")
    suffix = fields.get("endpointsuffix")
    for service in ("blob", "dfs"):
        endpoint = fields.get(f"{service}endpoint")
        if endpoint is None and service == "dfs" and fields.get("blobendpoint"):
            endpoint = _dfs_of_blob(account, fields["blobendpoint"])
        if endpoint:
            scheme, authority = _endpoint_authority(account, endpoint, service)
        elif suffix:
            scheme, authority = protocol, f".{service}.{suffix}"
        else:
            continue
        options[f"{service}_storage_scheme"] = scheme
        options[f"{service}_storage_authority"] = authority
    return options


def _dfs_of_blob(account: str, blob_endpoint: str) -> str:
    """The Data Lake endpoint beside a blob endpoint: ``account.dfs.<suffix>`` for a cloud's
    ``account.blob.<suffix>``; an emulator's own address otherwise (Azurite serves the blob
    API only, and pyarrow falls back to it where the account has no hierarchical namespace)."""
    parts = urlsplit(blob_endpoint)
    prefix = f"{account}.blob."
    if (parts.hostname or "").startswith(prefix):
        return blob_endpoint.replace(prefix, f"{account}.dfs.", 1)
    return blob_endpoint


def _endpoint_authority(account: str, endpoint: str, service: str) -> tuple[str, str]:
    """(scheme, authority) as pyarrow takes them: ``.blob.core.windows.net`` (the account's
    name goes in front) for ``https://ACCOUNT.blob.core.windows.net``, ``host:port`` (the
    account's name goes in the path) for an emulator's ``http://host:port/ACCOUNT``."""
    parts = urlsplit(endpoint)
    host = parts.netloc
    if parts.path.strip("/") == account:
        return parts.scheme or "https", host
    if host.startswith(f"{account}.") and not parts.path.strip("/"):
        return parts.scheme or "https", host[len(account) :]
    raise ValueError(
        f"AZURE_STORAGE_CONNECTION_STRING's {service} endpoint is neither "
        f"https://{account}.{service}.<suffix> nor http://host:port/{account}"
    )


def _inner_path(scheme: str, url: str) -> str:
    parts = urlsplit(url)
    if scheme == "s3" or scheme in ("gs", "gcs"):
        return (parts.netloc + parts.path).rstrip("/") or parts.netloc
    if scheme in ("abfs", "abfss"):
        # abfs://CONTAINER@ACCOUNT.dfs.core.windows.net/PATH (or ACCOUNT.../CONTAINER/PATH):
        # the account is the filesystem, the container the first part of the path
        inner = f"{parts.username}{parts.path}" if parts.username else parts.path.lstrip("/")
        return inner.rstrip("/")
    # hdfs://namenode:8020/PATH (and viewfs://): the filesystem is the authority's, cached
    # by _filesystem; the path is the URL's own, read here without building another client
    return parts.path.rstrip("/") or "/"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


_LOCAL = pafs.LocalFileSystem()


def resolve(target: str | os.PathLike[str] | Location) -> Location:
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


def _root_of(scheme: str, parts: SplitResult, path: str) -> str:
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
        return cast(bool, self._info().type != pafs.FileType.NotFound)

    def is_file(self) -> bool:
        return cast(bool, self._info().type == pafs.FileType.File)

    def is_dir(self) -> bool:
        return cast(bool, self._info().type == pafs.FileType.Directory)

    def size(self) -> int:
        info = self._info()
        if info.type != pafs.FileType.File:
            raise FileNotFoundError(f"{self} is not a file")
        return cast(int, info.size)

    def mtime_ns(self) -> int | None:
        return cast("int | None", self._info().mtime_ns)

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
        if not recursive and self.fs.type_name == "gcs":
            return self._gcs_children()
        selector = pafs.FileSelector(self.path, allow_not_found=True, recursive=recursive)
        return sorted(self.fs.get_file_info(selector), key=lambda info: info.path)

    def _gcs_children(self) -> list[pafs.FileInfo]:
        """The entries directly inside a GCS prefix. pyarrow's GCS listing of one level returns
        the objects and the directory markers its own ``create_dir`` writes, but not the
        prefixes under which objects were simply written (its client reads a listing's items,
        never its prefixes), so a version ``.v-*/`` or a checkpoint ``step-N/`` would be
        missed. So: every object below, folded into the first level (one listing request per
        1,000 objects below)."""
        selector = pafs.FileSelector(self.path, allow_not_found=True, recursive=True)
        prefix = self.path.rstrip("/") + "/"
        children: dict[str, pafs.FileInfo] = {}
        for info in self.fs.get_file_info(selector):
            name, below, _rest = info.path[len(prefix) :].partition("/")
            if below or info.type == pafs.FileType.Directory:
                children[name] = pafs.FileInfo(prefix + name, pafs.FileType.Directory)
            else:
                children.setdefault(name, info)
        return [children[name] for name in sorted(children)]

    # ------------------------------------------------------------------ reads
    def read_bytes(self) -> bytes:
        with self.fs.open_input_file(self.path) as fh:
            return cast(bytes, fh.read())

    def read_text(self) -> str:
        return self.read_bytes().decode("utf-8")

    def read_range(self, offset: int, length: int) -> bytes:
        """``length`` bytes from ``offset`` (fewer at the end): one ranged request on a store."""
        with self.fs.open_input_file(self.path) as fh:
            return cast(bytes, fh.read_at(length, offset))

    def open_input(self) -> pa.NativeFile:
        """A random-access reader (``read_at(length, offset)``, ``seek``/``read``) for byte
        ranges; the caller closes it."""
        return self.fs.open_input_file(self.path)

    def open_stream(self) -> pa.NativeFile:
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

    def open_output(self) -> pa.NativeFile:
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
        try:
            self.fs.delete_dir(self.path)
        except FileNotFoundError:
            # GCS: pyarrow deletes the objects under the prefix, then the prefix's directory
            # marker, which a prefix made by writing objects (not by mkdir) does not have
            if self._info().type != pafs.FileType.NotFound:
                raise

    # ------------------------------------------------------------------ copies
    def copy_to(self, target: "Location") -> None:
        """This file copied to ``target`` (any filesystem), streamed."""
        if target.is_local:
            Path(target.path).parent.mkdir(parents=True, exist_ok=True)
        pafs.copy_files(self.path, target.path, source_filesystem=self.fs, destination_filesystem=target.fs)


def location_of(target: str | os.PathLike[str] | Location) -> Location | Path:
    """What the stages keep: a Path for a local path (code for local paths stays as it is),
    a Location for a URL."""
    if isinstance(target, Location):
        return target.local_path() if target.is_local else target
    if is_url(target):
        return resolve(target)
    check_url(os.fspath(target))
    text = os.fspath(target)
    return Path(urlsplit(text).path) if text.startswith("file://") else Path(text)
