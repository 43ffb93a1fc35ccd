"""The shared secret of an authenticated Spark standalone cluster (docs/cluster.md §2.2).

Spark's standalone mode authenticates every RPC connection (driver, master, workers,
executors) with one shared secret, which each JVM must find as ``spark.authenticate.secret``
(Spark 4 reads ``spark.authenticate.secret.file`` on Kubernetes only). A command line is
readable by every user of a host (``ps``), and manifests and logs are shared, so the secret
only ever lives in files of mode 0600 in a directory of mode 0700: the one the user keeps
(or that ``prepare`` creates) and the daemons' properties file. The job reads it from the
former (spark_jobs/session.py) and hands it to its JVM over the py4j socket.

``python -m pipeline.cluster_auth prepare`` is what ``docker/spark-cluster/start-cluster.sh``
runs before it starts any daemon: it decides whether the cluster authenticates (yes by default
off loopback), creates or checks the secret, writes the daemons' properties file and prints the
non-secret ``cluster.env`` lines that submit.sh reads.
"""

from __future__ import annotations

import argparse
import getpass
import os
import re
import secrets
import sys
from dataclasses import dataclass
from pathlib import Path

from dlrm_contracts.atomic import atomic_file
from dlrm_contracts.secret_file import SecretFileError, read_secret_file
from dlrm_contracts.security import is_loopback

SECRET_BYTES = 32  # what `prepare` generates: 256 random bits, 64 hex characters
# Spark's user lists (spark.admin.acls): names separated by commas; no backslash or blank,
# which the properties-file reader would take for an escape or a separator.
_USERS = re.compile(r"^[A-Za-z0-9._@$-]+(,[A-Za-z0-9._@$-]+)*$")


def _write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` with mode 0600 from the first byte (no window in which the
    file exists with the umask's mode), replacing any older file atomically."""
    with atomic_file(path) as tmp:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="ascii") as sink:
            sink.write(text)


def private_dir(path: Path) -> Path:
    """``path`` created if needed and set to mode 0700."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.chmod(0o700)
    return path


def ensure_secret(auth_dir: Path, secret_file: str | None) -> tuple[Path, str]:
    """(file, secret): the user's file when named, else AUTH_DIR/secret, created on first use
    and kept across restarts (workers on other hosts hold copies of it)."""
    if secret_file:
        path = Path(secret_file).resolve()
        return path, read_secret_file(path)
    path = private_dir(auth_dir) / "secret"
    if not path.exists():
        _write_private(path, secrets.token_hex(SECRET_BYTES) + "\n")
    return path, read_secret_file(path)


@dataclass
class ClusterSecurity:
    """What the daemons and the jobs of one standalone cluster agree on (all but the secret)."""

    authenticate: bool
    secret_file: Path | None = None
    rpc_encryption: bool = True   # spark.network.crypto.enabled (AES-GCM on every RPC channel)
    io_encryption: bool = False   # spark.io.encryption.enabled (shuffle and spill files)
    admin_users: str = ""         # spark.admin.acls: view and modify every application
    view_users: str = ""          # spark.ui.view.acls


def daemon_properties(security: ClusterSecurity, secret: str | None) -> str:
    """The master's and workers' properties file (``--properties-file``)."""
    lines = [
        "# Written by python -m pipeline.cluster_auth prepare (start-cluster.sh). Mode 0600.",
        # Submission only through the authenticated RPC port, never the REST server.
        "spark.master.rest.enabled false",
        "spark.ui.killEnabled false",
        "spark.acls.enable true",
    ]
    if security.admin_users:
        lines.append(f"spark.admin.acls {security.admin_users}")
    if security.view_users:
        lines.append(f"spark.ui.view.acls {security.view_users}")
    if security.authenticate:
        assert secret is not None
        lines += ["spark.authenticate true", f"spark.authenticate.secret {secret}"]
        if security.rpc_encryption:
            # No fallback to unencrypted SASL: a job without encryption is refused too.
            lines += ["spark.network.crypto.enabled true",
                      "spark.network.crypto.saslFallback false"]
    return "\n".join(lines) + "\n"


def cluster_env_lines(security: ClusterSecurity, daemon_conf: Path) -> list[str]:
    """The non-secret settings submit.sh passes on to the job (cluster.env)."""
    on = {True: "on", False: "off"}
    return [f"AUTH={on[security.authenticate]}",
            f"SECRET_FILE={security.secret_file or ''}",
            f"RPC_ENCRYPTION={on[security.authenticate and security.rpc_encryption]}",
            f"IO_ENCRYPTION={on[security.io_encryption]}",
            f"ADMIN_USERS={security.admin_users}",
            f"VIEW_USERS={security.view_users}",
            f"DAEMON_CONF={daemon_conf}"]


# Spark hands each executor its driver's configuration over RPC (RetrieveSparkAppConfig), the
# shared secret and the I/O encryption key included: without RPC encryption that crosses the
# network in clear, and whoever reads it can join the cluster.
NO_ENCRYPTION_OFF_LOOPBACK = (
    "--no-rpc-encryption on {host}, which is not a loopback address, would send the cluster's "
    "shared secret to every executor unencrypted (Spark passes executors the driver's "
    "settings, the secret among them, over RPC): drop --no-rpc-encryption, or on a network "
    "you trust entirely run without authentication (--insecure)")

INSECURE_WARNING = """\
WARNING: --insecure: the Spark cluster on {host} runs WITHOUT authentication.
WARNING: anyone who can reach {host} can submit a job to it, which runs arbitrary code as
WARNING: user '{user}' on every node. Use this only on a network where you trust every host.
"""


def prepare(args: argparse.Namespace) -> int:
    if args.authenticate and args.insecure:
        return _usage("--authenticate and --insecure contradict each other")
    for flag, users in (("--admin-users", args.admin_users), ("--view-users", args.view_users)):
        if users and not _USERS.match(users):
            return _usage(f"{flag} must be user names separated by commas, got {users!r}")
    loopback = is_loopback(args.host)
    authenticate = args.authenticate or not (loopback or args.insecure)
    if args.secret_file and not authenticate:
        return _usage("--secret-file is for an authenticated cluster (drop --insecure, or add "
                      "--authenticate on a loopback address)")
    if authenticate and args.no_rpc_encryption and not loopback:
        return _usage(NO_ENCRYPTION_OFF_LOOPBACK.format(host=args.host))
    if args.insecure and not loopback:
        print(INSECURE_WARNING.format(host=args.host, user=getpass.getuser()), end="",
              file=sys.stderr)
    auth_dir = private_dir(Path(args.dir))
    security = ClusterSecurity(authenticate=authenticate,
                               rpc_encryption=not args.no_rpc_encryption,
                               io_encryption=args.io_encryption,
                               admin_users=args.admin_users or getpass.getuser(),
                               view_users=args.view_users or "")
    secret = None
    if authenticate:
        try:
            security.secret_file, secret = ensure_secret(auth_dir, args.secret_file)
        except SecretFileError as error:
            return _usage(str(error))
    daemon_conf = auth_dir / "daemon.conf"
    _write_private(daemon_conf, daemon_properties(security, secret))
    print("\n".join(cluster_env_lines(security, daemon_conf)))
    return 0


def _usage(message: str) -> int:
    print(f"start-cluster.sh: error: {message}", file=sys.stderr)
    return 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m pipeline.cluster_auth")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prepare", help="secret + daemon properties; prints cluster.env lines")
    p.add_argument("--dir", required=True, help="the cluster's private directory (mode 0700)")
    p.add_argument("--host", required=True, help="the address the daemons bind to")
    p.add_argument("--authenticate", action="store_true", help="authenticate on loopback too")
    p.add_argument("--insecure", action="store_true", help="no authentication off loopback")
    p.add_argument("--secret-file", help="use this secret (mode 0600) instead of creating one")
    p.add_argument("--no-rpc-encryption", action="store_true")
    p.add_argument("--io-encryption", action="store_true")
    p.add_argument("--admin-users", help="spark.admin.acls (default: the current user)")
    p.add_argument("--view-users", help="spark.ui.view.acls")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return prepare(args)


if __name__ == "__main__":
    sys.exit(main())
