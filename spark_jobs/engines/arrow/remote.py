"""The Arrow engine's reads and writes of input and workdir files that may live behind a URL
(``s3://``, ``gs://``, ``abfs://``, ``hdfs://``) rather than on a POSIX path.

Why a module of its own: the engine's tasks read day files by byte range, hand partial counts
to the merge, stage dictionary parts and copy the index; on a local path they keep today's
``open``/``pread``/``rename`` (the fast path, unchanged), behind a URL every such step goes
through a pyarrow filesystem as whole-object writes (an object store has no rename and no
partial write) and ranged reads. The filesystem comes from ``dlrm_contracts.storage``
(credentials and endpoints from the environment; for S3: ``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_REGION``, ``AWS_ENDPOINT_URL``).

Accounting: with ``CRITEO_DLRM_IO_LOG`` set to a file, every request made here appends one
line (pid, kind, bytes), so a benchmark can count requests and bytes per phase across Spark's
Python workers. Unset (always outside benchmarks) it costs one dictionary lookup.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import tempfile
import threading
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Iterator, Sequence

IO_LOG_ENV = "CRITEO_DLRM_IO_LOG"
# A day file's reads: the first small, so a task starts parsing after a short wait; each next
# one twice the last up to the largest (``PreprocessConfig.arrow_remote_read_mb``). On S3 they
# are pieces of one streamed GET per chunk; on the other stores, one ranged request each.
REMOTE_FIRST_READ_BYTES = 8 << 20


def is_url(path) -> bool:
    """An object store's or HDFS's URL (or Location): what goes through a pyarrow filesystem."""
    from dlrm_contracts.storage import is_url as storage_url

    return storage_url(path)


def filesystem(url: str):
    """(pyarrow filesystem, path within it) of a URL, through ``dlrm_contracts.storage`` (the
    one place a URL becomes a filesystem; one client per store and environment, reused)."""
    from dlrm_contracts.storage import resolve

    location = resolve(str(url))
    return location.fs, location.path


def join(base, *parts: str) -> str:
    """``base/part/...``: a URL stays a URL (``Path`` would fold its ``//``)."""
    if is_url(base):
        return posixpath.join(str(base).rstrip("/"), *parts)
    return str(Path(base, *parts))


def log_request(kind: str, nbytes: int = 0) -> None:
    """One request, appended to the accounting log when one is set."""
    log = os.environ.get(IO_LOG_ENV)
    if log:
        with open(log, "a") as out:
            out.write(f"{os.getpid()} {kind} {nbytes}\n")


def size(path) -> int:
    if not is_url(path):
        return os.stat(path).st_size
    fs, inner = filesystem(str(path))
    log_request("head")
    return fs.get_file_info(inner).size


def read_range(handle, offset: int, n: int) -> bytes:
    """``n`` bytes at ``offset`` of an opened remote file (fewer at its end): one request."""
    data = handle.read_at(n, offset)
    log_request("get", len(data))
    return data


def open_remote(url: str):
    """A random-access handle on an object (its size is known without a request more)."""
    fs, inner = filesystem(url)
    log_request("head")
    return fs.open_input_file(inner)


def streams(url: str) -> bool:
    """Whether ``stream_range`` reads this URL: S3 with boto3 (pyarrow's S3 client has no
    streamed read, each of its reads is a request of its own); other stores are read by
    ranges."""
    from urllib.parse import urlsplit

    return urlsplit(str(url)).scheme.lower() == "s3" and _s3_client() is not None


def stream_range(url: str, start: int, end: int | None) -> "Stream":
    """A streamed GET of bytes [start, end) of an S3 object (``end`` None: to its end), read
    piece by piece with ``read(n)``: one request for a whole chunk, whose bytes arrive while
    the task parses (only what is read is held). A range starting at or past the object's
    end reads as empty."""
    return Stream(url, start, end)


# A stream broken mid-way (a reset connection, a read timeout) is asked again from where it
# stopped, this many times, before the task fails (and Spark retries it).
STREAM_RETRIES = 3


class Stream:
    """One streamed GET: ``read(n)`` gives ``n`` bytes (fewer only at its end); the request is
    logged with the bytes read when it is closed."""

    def __init__(self, url: str, start: int, end: int | None):
        self.url, self.start, self.end = url, start, end
        self.read_total, self.retries, self.logged = 0, 0, 0
        self.body = self._open(start)

    def _open(self, offset: int):
        from urllib.parse import urlsplit

        from botocore.exceptions import ClientError

        if self.end is not None and self.end <= offset:
            return None
        parts = urlsplit(str(self.url))
        last = "" if self.end is None else str(self.end - 1)
        try:
            response = _s3_client().get_object(
                Bucket=parts.netloc, Key=parts.path.lstrip("/"), Range=f"bytes={offset}-{last}"
            )
        except ClientError as error:
            code = error.response.get("Error", {}).get("Code")
            if code in ("NoSuchKey", "404"):
                raise FileNotFoundError(self.url) from None
            if code != "InvalidRange":  # InvalidRange: at or past the object's end
                raise
            log_request("get")
            return None
        return response["Body"]

    def read(self, n: int) -> bytes:
        pieces: list[bytes] = []
        wanted = n
        while wanted > 0 and self.body is not None:
            piece = self._read_body(wanted)
            if not piece:
                break
            pieces.append(piece)
            wanted -= len(piece)
            self.read_total += len(piece)
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)

    def _read_body(self, n: int) -> bytes:
        from botocore.exceptions import BotoCoreError
        from urllib3.exceptions import HTTPError

        try:
            return self.body.read(n)
        except (BotoCoreError, HTTPError, ConnectionError) as error:
            if self.retries >= STREAM_RETRIES:
                raise OSError(f"{self.url}: the stream broke {self.retries + 1} times ({error})") from None
            self.retries += 1
            self._close_body()
            self.body = self._open(self.start + self.read_total)
            return b"" if self.body is None else self._read_body(n)

    def close(self) -> None:
        if self.body is not None:
            self._close_body()

    def _close_body(self) -> None:
        self.body.close()
        self.body = None
        log_request("get", self.read_total - self.logged)
        self.logged = self.read_total


_S3_CLIENTS: dict[tuple, object] = {}


def _s3_client() -> Any:
    """boto3's S3 client for this environment (one per process and environment: its set-up
    costs a credential lookup), None without boto3. Credentials, region and endpoint come from
    the environment as for pyarrow's client (``dlrm_contracts.storage``)."""
    try:
        import boto3
    except ImportError:
        return None
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    key = (endpoint, region, os.environ.get("AWS_ACCESS_KEY_ID"), os.environ.get("AWS_PROFILE"))
    client = _S3_CLIENTS.get(key)
    if client is None:
        client = _S3_CLIENTS[key] = boto3.client("s3", endpoint_url=endpoint or None, region_name=region)
    return client


def read_bytes(url: str) -> bytes:
    """An object read whole (FileNotFoundError when it is not there): on S3 one GET (pyarrow's
    client asks for the object's size first, a second request per object)."""
    if streams(url):
        data = _get_object(url)
    else:
        fs, inner = filesystem(url)
        with fs.open_input_stream(inner, compression=None) as handle:
            data = handle.read()
    log_request("get", len(data))
    return data


def _get_object(url: str) -> bytes:
    from urllib.parse import urlsplit

    from botocore.exceptions import ClientError

    parts = urlsplit(str(url))
    try:
        response = _s3_client().get_object(Bucket=parts.netloc, Key=parts.path.lstrip("/"))
    except ClientError as error:
        if error.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
            raise FileNotFoundError(url) from None
        raise
    with response["Body"] as body:
        return body.read()


def write_bytes(url: str, data) -> None:
    """One object written whole: a reader sees the previous object or this one, never half.
    Inside ``writes_behind`` the request is sent on its threads and this returns at once."""
    behind = _BEHIND.get()
    if behind is not None:
        behind.submit(url, data)
        return
    _write_now(url, data)


def _write_now(url: str, data) -> None:
    fs, inner = filesystem(url)
    with fs.open_output_stream(inner, compression=None) as out:
        out.write(data)
    log_request("put", len(memoryview(data).cast("B")))


class _WritesBehind:
    """Object writes on a few threads: a task's requests wait for the store while it goes on
    computing. At most ``pending`` writes are held (each holds its bytes), so the memory is
    bounded whatever the task writes; the first failure is raised when the block ends."""

    def __init__(self, threads: int, pending: int):
        from concurrent.futures import ThreadPoolExecutor

        self.pool = ThreadPoolExecutor(threads, thread_name_prefix="writes-behind")
        self.slots = threading.BoundedSemaphore(pending)
        self.futures: list = []

    def submit(self, url: str, data) -> None:
        self.slots.acquire()
        try:
            future = self.pool.submit(_write_now, url, data)
        except BaseException:
            self.slots.release()
            raise
        future.add_done_callback(lambda _: self.slots.release())
        self.futures.append(future)

    def finish(self) -> None:
        """Wait for every write; the first failure raised."""
        try:
            for future in self.futures:
                future.result()
        finally:
            self.pool.shutdown(wait=True, cancel_futures=True)


_BEHIND: ContextVar[_WritesBehind | None] = ContextVar("writes_behind", default=None)


@contextlib.contextmanager
def writes_behind(threads: int = 4, pending: int = 8) -> Iterator[None]:
    """``write_bytes`` and ``upload`` in this block (this thread) send their request on
    ``threads`` threads and return at once; the block ends when every write has landed, and
    raises the first failure (a task then fails, and Spark retries it).

    Why: a store's request costs a round trip (tens of milliseconds on S3), and a merge or
    dictionary task writes several objects per group, one after another: in sequence, the
    round trips add up to seconds per task while its CPU waits. Each object is still written
    whole by one request, so what a reader sees is unchanged."""
    if _BEHIND.get() is not None:  # already inside one: its threads serve this block too
        yield
        return
    behind = _WritesBehind(threads, pending)
    _BEHIND.set(behind)
    try:
        yield
    finally:
        # not reset(token): a generator's block may end in another context than it began
        _BEHIND.set(None)
        behind.finish()


def upload(local: str | Path, url: str) -> None:
    """A local file copied to ``url`` whole."""
    write_bytes(url, Path(local).read_bytes())


def download(url: str, local: str | Path) -> None:
    """An object copied to a local file (written under another name, then renamed)."""
    target = Path(local)
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary = target.with_name(f".{target.name}.{os.getpid()}")
    temporary.write_bytes(read_bytes(url))
    os.replace(temporary, target)


def download_all(pairs: Sequence[tuple[str, str | Path]]) -> None:
    """``download`` of each (url, local path), the requests sent together on threads: their
    round trips overlap instead of adding up."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max(1, min(4, len(pairs)))) as pool:
        list(pool.map(lambda pair: download(*pair), pairs))


def exists(url: str) -> bool:
    from pyarrow import fs as pafs

    fs, inner = filesystem(url)
    log_request("head")
    return fs.get_file_info(inner).type != pafs.FileType.NotFound


def list_files(url: str, suffix: str = "", recursive: bool = False) -> list[str]:
    """The objects under the ``url`` prefix whose names end with ``suffix`` (names starting
    with a dot, temporaries, left out), as URLs, sorted."""
    return [name for name, _size in list_sized(url, suffix, recursive)]


def list_sized(url: str, suffix: str = "", recursive: bool = False) -> list[tuple[str, int]]:
    """As :func:`list_files`, each URL with its size: the listing carries the sizes, so
    nothing asks the store for them one object at a time."""
    from dataclasses import replace

    from pyarrow import fs as pafs

    from dlrm_contracts.storage import resolve

    root = resolve(str(url))
    log_request("list")
    infos = root.fs.get_file_info(
        pafs.FileSelector(root.path.rstrip("/"), allow_not_found=True, recursive=recursive)
    )
    return sorted(
        (replace(root, path=i.path).url, i.size)
        for i in infos
        if i.type == pafs.FileType.File and i.path.endswith(suffix) and not i.base_name.startswith(".")
    )


def delete_tree(url: str) -> None:
    """Every object under the ``url`` prefix removed (nothing there: nothing to do)."""
    from pyarrow import fs as pafs

    fs, inner = filesystem(url)
    log_request("delete")
    try:
        fs.delete_dir(inner.rstrip("/"))
    except OSError:
        # nothing there (a FileNotFoundError on S3 and Azure, "No such directory" on GCS), or
        # on GCS a prefix without pyarrow's directory marker, whose objects are deleted by then
        if fs.get_file_info(inner.rstrip("/")).type != pafs.FileType.NotFound:
            raise


def local_scratch(prefix: str) -> str:
    """A private local directory for files staged on their way to or from a URL: under the
    executor's Spark local directory when there is one (it goes with the application)."""
    root = os.environ.get("SPARK_LOCAL_DIRS", "").split(",")[0] or None
    return tempfile.mkdtemp(prefix=prefix, dir=root)
