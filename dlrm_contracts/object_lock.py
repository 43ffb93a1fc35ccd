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
runs taking over the same stale lock only one succeeds. The holder deletes it when it ends.

Stores whose client here makes no conditional write (GCS, Azure and HDFS through pyarrow)
cannot hold this lock: the requirement there is one scheduler per workdir (docs/cluster.md),
and the run says so in a warning instead of pretending to lock.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid

from dlrm_contracts.atomic import pid_alive
from dlrm_contracts.errors import ExitCode, PipelineError
from dlrm_contracts.lock import LOCK_TOKEN_ENV
from dlrm_contracts.storage import CONDITIONAL_WRITE_SCHEMES, Location, StorageError

log = logging.getLogger(__name__)

LOCK_NAME = ".pipeline.lock"
RENEW_EVERY = 60.0
STALE_AFTER = 600.0


def _s3_client():
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


def _precondition_failed(exc: Exception) -> bool:
    response = getattr(exc, "response", None) or {}
    code = str(response.get("Error", {}).get("Code", ""))
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return code in ("PreconditionFailed", "ConditionalRequestConflict") or status in (409, 412)


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
                shown = {k: v for k, v in holder.items() if k not in ("token", "renewed_epoch")}
                raise PipelineError(
                    f"workdir {self.workdir} is in use by another pipeline run "
                    f"({json.dumps(shown)}); wait for it to finish or use another workdir",
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

    def _read(self) -> tuple[dict | None, str | None]:
        try:
            response = self._client.get_object(Bucket=self._bucket, Key=self._key)
        except Exception as exc:
            if getattr(exc, "response", {}).get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                return None, None
            raise
        raw = response["Body"].read()
        try:
            holder = json.loads(raw)
        except ValueError:
            holder = {"unreadable": raw[:200].decode("utf-8", "replace")}
        return (holder if isinstance(holder, dict) else {}), response.get("ETag")

    def _stale(self, holder: dict) -> bool:
        if holder.get("host") == socket.gethostname() and isinstance(holder.get("pid"), int):
            if not pid_alive(holder["pid"]):
                return True
        renewed = holder.get("renewed_epoch")
        return isinstance(renewed, (int, float)) and time.time() - renewed > self.stale_after

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.renew_every):
            try:
                if not self._create(if_match=self._etag):
                    log.error(
                        "workdir %s: the lock was taken by another run; this run no longer holds it",
                        self.workdir,
                    )
                    return
            except Exception as exc:  # noqa: BLE001 — a store hiccup: the next renewal tries again
                log.warning("workdir %s: renewing the lock failed (%s)", self.workdir, exc)

    def __exit__(self, *exc) -> None:
        if self.guest or self.unlocked or self._token is None:
            return
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join()
        if self._previous_env is None:
            os.environ.pop(LOCK_TOKEN_ENV, None)
        else:
            os.environ[LOCK_TOKEN_ENV] = self._previous_env
        holder, _etag = self._read()
        if holder is not None and holder.get("token") == self._token:
            self._client.delete_object(Bucket=self._bucket, Key=self._key)
        self._token = None
