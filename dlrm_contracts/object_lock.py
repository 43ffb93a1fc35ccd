"""One writer per workdir on an object store: the lock as an object created only if absent.

On a local or shared POSIX filesystem the workdir lock is ``flock`` (dlrm_contracts.lock). An
object store has no locks, but S3 has conditional writes: ``PutObject`` with
``If-None-Match: *`` creates ``DIR/.pipeline.lock`` only when no object has that name, so of
two runs exactly one gets it; the second ends with exit 3 naming the holder, as locally. The
record is the local lock's (pid, host, by, started, token) and the holder's children run
under it through the same inherited token (``LOCK_TOKEN_ENV``).

Unlike flock, an object outlives a killed holder. A lock whose holder ran on this host and
whose pid is gone is stale; so is one not renewed for ``STALE_AFTER`` seconds (the holder
renews it every ``RENEW_EVERY`` seconds from a background thread, so a holder on another host
that died is noticed too). A stale lock is taken over with ``If-Match`` on its ETag: of two
runs taking over the same stale lock only one succeeds.

A renewal is a write with ``If-Match`` on the holder's last ETag. One that finds another run's
record there (this run was taken for dead: its renewals failed for ``STALE_AFTER`` seconds),
or no lock at all (who wrote the workdir since is unknown), stops this run: its main thread is interrupted as by Ctrl-C (a Spark job's tasks are cancelled,
the pipeline stops its stage's child), and leaving the lock's block turns that into one line
and exit 3 (``ExitCode.LOCKED``, as a refused start), so the run no longer writes over the
workdir the other run now owns. The holder deletes the lock when it ends: it reads the record
and, if the token is its own, deletes it with ``If-Match`` on the ETag read (S3 has taken
conditional deletes since 2025, as do moto and Ceph), so a record another run wrote in between
is never deleted. A server that refuses the condition (or ignores it) gets a plain delete after
that read: the window is one request long, and a run only takes over a lock not renewed for
``STALE_AFTER`` seconds, which this holder renewed until it ended.

Stores whose client here makes no conditional write (GCS, Azure and HDFS through pyarrow)
cannot hold this lock: the requirement there is one scheduler per workdir (docs/cluster.md),
and the run says so in a warning instead of pretending to lock.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import threading
import time
import uuid
from typing import TYPE_CHECKING

from dlrm_contracts.atomic import pid_alive
from dlrm_contracts.errors import ExitCode, PipelineError
from dlrm_contracts.lock import LOCK_TOKEN_ENV
from dlrm_contracts.storage import CONDITIONAL_WRITE_SCHEMES, Location, StorageError

if TYPE_CHECKING:  # boto3 is an optional dependency (the object-store extra)
    from botocore.client import BaseClient

log = logging.getLogger(__name__)

LOCK_NAME = ".pipeline.lock"
RENEW_EVERY = 60.0
STALE_AFTER = 600.0


def _s3_client() -> BaseClient:
    try:
        import boto3
    except ImportError:
        raise StorageError(
            "a workdir on S3 needs boto3 for its lock's conditional writes: "
            "pip install '.[object-store]' (scripts/install.sh installs it)"
        ) from None
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    return boto3.client("s3", endpoint_url=endpoint or None)


def _bucket_key(location: Location) -> tuple[str, str]:
    bucket, _, key = location.path.partition("/")
    return bucket, key


def _error_code(exc: Exception) -> tuple[str, object]:
    """(the store's error code, the HTTP status) of a botocore ClientError; ("", None) else."""
    response = getattr(exc, "response", None) or {}
    return str(response.get("Error", {}).get("Code", "")), response.get("ResponseMetadata", {}).get(
        "HTTPStatusCode"
    )


def _precondition_failed(exc: Exception) -> bool:
    code, status = _error_code(exc)
    return code in ("PreconditionFailed", "ConditionalRequestConflict") or status in (409, 412)


def _missing(exc: Exception) -> bool:
    code, status = _error_code(exc)
    return code in ("NoSuchKey", "404") or status == 404


def _condition_refused(exc: Exception) -> bool:
    """A store that does not take ``If-Match`` on a delete (some S3-compatible servers)."""
    code, status = _error_code(exc)
    return code in ("NotImplemented", "InvalidArgument") or status == 501


class ObjectStoreLock:
    """``with ObjectStoreLock(workdir_location, "pipeline"):`` (see the module docstring)."""

    def __init__(
        self,
        workdir: Location,
        who: str = "pipeline",
        stale_after: float = STALE_AFTER,
        renew_every: float = RENEW_EVERY,
    ):
        self.workdir = workdir
        self.location = workdir / LOCK_NAME
        self.who = who
        self.guest = False
        self.unlocked = False
        # set when another run took the lock over from this one (see the module docstring)
        self.lost: PipelineError | None = None
        self.stale_after = stale_after
        self.renew_every = renew_every
        self._token: str | None = None
        self._etag: str | None = None
        self._previous_env: str | None = None
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None

    def _scheme(self) -> str:
        return self.location.base.split("://", 1)[0].lower()

    def __enter__(self) -> "ObjectStoreLock":
        if self._scheme() not in CONDITIONAL_WRITE_SCHEMES:
            log.warning(
                "workdir %s: this store has no conditional write here, so the workdir is "
                "not locked; run one scheduler per workdir (docs/cluster.md)",
                self.workdir,
            )
            self.unlocked = True
            return self
        self._client = _s3_client()
        self._bucket, self._key = _bucket_key(self.location)
        self._token = uuid.uuid4().hex
        for _attempt in range(3):
            if self._create(if_match=None):
                break
            holder, etag = self._read()
            if holder is None:
                continue  # released in between: try again
            if holder.get("token") and os.environ.get(LOCK_TOKEN_ENV) == holder.get("token"):
                self.guest = True
                return self
            if not self._stale(holder) or not self._create(if_match=etag):
                raise PipelineError(
                    f"workdir {self.workdir} is in use by another pipeline run "
                    f"({_shown(holder)}); wait for it to finish or use another workdir",
                    ExitCode.LOCKED,
                )
            log.warning("workdir %s: took over a stale lock (%s)", self.workdir, holder)
            break
        else:
            raise PipelineError(
                f"workdir {self.workdir}: its lock keeps changing; another run is starting", ExitCode.LOCKED
            )
        self._previous_env = os.environ.get(LOCK_TOKEN_ENV)
        os.environ[LOCK_TOKEN_ENV] = self._token
        self._renewer = threading.Thread(target=self._renew_loop, daemon=True, name="workdir-lock-renewer")
        self._renewer.start()
        return self

    def _record(self) -> bytes:
        return json.dumps(
            {
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "by": self.who,
                "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "renewed_epoch": time.time(),
                "token": self._token,
            }
        ).encode()

    def _create(self, if_match: str | None) -> bool:
        """Write the lock: only where none is (or only over the stale one with ``if_match``)."""
        condition = {"IfMatch": if_match} if if_match else {"IfNoneMatch": "*"}
        try:
            response = self._client.put_object(
                Bucket=self._bucket, Key=self._key, Body=self._record(), **condition
            )
        except Exception as exc:  # botocore's ClientError; its module is optional here
            if _precondition_failed(exc):
                return False
            if getattr(exc, "response", {}).get("Error", {}).get("Code") == "NoSuchBucket":
                raise StorageError(
                    f"{self.location}: the bucket {self._bucket} does not exist "
                    "(create it, or check the URL and AWS_ENDPOINT_URL)"
                ) from None
            raise
        self._etag = response.get("ETag")
        return True

    def _read(self) -> tuple[dict[str, object] | None, str | None]:
        try:
            response = self._client.get_object(Bucket=self._bucket, Key=self._key)
        except Exception as exc:
            if _missing(exc):
                return None, None
            raise
        raw = response["Body"].read()
        try:
            holder = json.loads(raw)
        except ValueError:
            holder = {"unreadable": raw[:200].decode("utf-8", "replace")}
        return (holder if isinstance(holder, dict) else {}), response.get("ETag")

    def _stale(self, holder: dict[str, object]) -> bool:
        pid = holder.get("pid")
        if holder.get("host") == socket.gethostname() and isinstance(pid, int):
            if not pid_alive(pid):
                return True
        renewed = holder.get("renewed_epoch")
        return isinstance(renewed, (int, float)) and time.time() - renewed > self.stale_after

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.renew_every):
            try:
                holder = self._renew()
            except Exception as exc:  # noqa: BLE001 — a store hiccup: the next renewal tries again
                log.warning("workdir %s: renewing the lock failed (%s)", self.workdir, exc)
                continue
            if holder is not None:
                self._lose(holder)
                return

    def _renew(self) -> dict[str, object] | None:
        """Write a fresh record over this run's own: None when done, else what holds the
        lock now (another run's record, or {} for no lock at all)."""
        try:
            if self._create(if_match=self._etag):
                return None
        except Exception as exc:
            if _missing(exc):  # removed: by hand, or by a run that took it over and ended
                return {}
            raise
        holder, etag = self._read()
        if holder is not None and holder.get("token") == self._token:
            self._etag = etag  # an earlier renewal landed but its answer was lost
            return None
        return holder or {}

    def _lose(self, holder: dict[str, object]) -> None:
        """The lock is no longer this run's: stop the run (see the module docstring)."""
        what = (
            f"another run took over this run's lock ({_shown(holder)})"
            if holder
            else "this run's lock was removed"
        )
        self.lost = PipelineError(
            f"workdir {self.workdir}: {what}, so this run stopped; the workdir may be another run's now",
            ExitCode.LOCKED,
        )
        # said once, by what leaves the lock's block: a command line's error line, the pipeline's record
        main = threading.main_thread().ident
        if main is not None and not self._stop.is_set():  # a run already ending needs no stop
            signal.pthread_kill(main, signal.SIGINT)

    def _release(self) -> None:
        """Delete the lock if it still holds this run's record: read, then delete with
        ``If-Match`` on the ETag read, so a record written in between is never deleted."""
        holder, etag = self._read()
        if holder is None or holder.get("token") != self._token:
            return  # taken over by another run: not this run's to delete
        try:
            self._client.delete_object(Bucket=self._bucket, Key=self._key, IfMatch=etag)
        except Exception as exc:
            if _precondition_failed(exc) or _missing(exc):
                return  # rewritten or removed since the read: no longer this run's
            if not _condition_refused(exc):
                raise
            self._client.delete_object(Bucket=self._bucket, Key=self._key)  # see the module docstring

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        if self.guest or self.unlocked or self._token is None:
            return
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join()
        if self._previous_env is None:
            os.environ.pop(LOCK_TOKEN_ENV, None)
        else:
            os.environ[LOCK_TOKEN_ENV] = self._previous_env
        if self.lost is None:
            self._release()
        self._token = None
        if self.lost is not None and exc_type is not None:  # the interrupt _lose sent, or its effect
            raise self.lost from None


def _shown(holder: dict[str, object]) -> str:
    """A lock record for a message: without its token or its renewal time."""
    return json.dumps({k: v for k, v in holder.items() if k not in ("token", "renewed_epoch")})
