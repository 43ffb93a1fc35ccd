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
import stat
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
    """``path`` created if needed and set to mode 0700; refused (``Refused``) when it already
    exists as another user's directory or as a symbolic link: whoever made it first could
    read or replace what the daemons keep there (their secret, logs, executors' files)."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise Refused(
            f"{path} is not a directory of its own (a symbolic link or a file): choose another --dir"
        )
    if info.st_uid != os.geteuid():
        raise Refused(
            f"{path} belongs to uid {info.st_uid}, not to this user "
            f"(uid {os.geteuid()}): another user made it first; choose another --dir"
        )
    path.chmod(0o700)
    return path


def default_daemon_dir() -> Path:
    """The daemon's private directory when --dir is not given: under the user's home
    ($XDG_STATE_HOME, else ~/.local/state), never a predictable path under the shared
    temporary directory, where another user could create it first."""
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "criteo-spark"


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
    rpc_encryption: bool = True  # spark.network.crypto.enabled (AES-GCM on every RPC channel)
    io_encryption: bool = False  # spark.io.encryption.enabled (shuffle and spill files)
    admin_users: str = ""  # spark.admin.acls: view and modify every application
    view_users: str = ""  # spark.ui.view.acls


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
            lines += ["spark.network.crypto.enabled true", "spark.network.crypto.saslFallback false"]
    return "\n".join(lines) + "\n"


def cluster_env_lines(security: ClusterSecurity, daemon_conf: Path) -> list[str]:
    """The non-secret settings submit.sh passes on to the job (cluster.env)."""
    on = {True: "on", False: "off"}
    return [
        f"AUTH={on[security.authenticate]}",
        f"SECRET_FILE={security.secret_file or ''}",
        f"RPC_ENCRYPTION={on[security.authenticate and security.rpc_encryption]}",
        f"IO_ENCRYPTION={on[security.io_encryption]}",
        f"ADMIN_USERS={security.admin_users}",
        f"VIEW_USERS={security.view_users}",
        f"DAEMON_CONF={daemon_conf}",
    ]


# Spark hands each executor its driver's configuration over RPC (RetrieveSparkAppConfig), the
# shared secret and the I/O encryption key included: without RPC encryption that crosses the
# network in clear, and whoever reads it can join the cluster.
NO_ENCRYPTION_OFF_LOOPBACK = (
    "--no-rpc-encryption on {host}, which is not a loopback address, would send the cluster's "
    "shared secret to every executor unencrypted (Spark passes executors the driver's "
    "settings, the secret among them, over RPC): drop --no-rpc-encryption, or on a network "
    "you trust entirely run without authentication (--insecure)"
)

INSECURE_WARNING = """\
WARNING: --insecure: the Spark cluster on {host} runs WITHOUT authentication.
WARNING: anyone who can reach {host} can submit a job to it, which runs arbitrary code as
WARNING: user '{user}' on every node. Use this only on a network where you trust every host.
"""


class Refused(Exception):
    """A combination of flags that cannot run (exit 2, one line)."""


def decide_security(args: argparse.Namespace) -> ClusterSecurity:
    """Who authenticates, with what, and what is encrypted: the rules of docs/cluster.md §2.2,
    the same for start-cluster.sh and the image's daemon modes. Prints the --insecure warning."""
    if args.authenticate and args.insecure:
        raise Refused("--authenticate and --insecure contradict each other")
    for flag, users in (("--admin-users", args.admin_users), ("--view-users", args.view_users)):
        if users and not _USERS.match(users):
            raise Refused(f"{flag} must be user names separated by commas, got {users!r}")
    loopback = is_loopback(args.host)
    authenticate = args.authenticate or not (loopback or args.insecure)
    if args.secret_file and not authenticate:
        raise Refused(
            "--secret-file is for an authenticated cluster (drop --insecure, or add "
            "--authenticate on a loopback address)"
        )
    if authenticate and args.no_rpc_encryption and not loopback:
        raise Refused(NO_ENCRYPTION_OFF_LOOPBACK.format(host=args.host))
    if args.insecure and not loopback:
        print(INSECURE_WARNING.format(host=args.host, user=getpass.getuser()), end="", file=sys.stderr)
    return ClusterSecurity(
        authenticate=authenticate,
        rpc_encryption=not args.no_rpc_encryption,
        io_encryption=args.io_encryption,
        admin_users=args.admin_users or getpass.getuser(),
        view_users=args.view_users or "",
    )


def write_daemon_conf(security: ClusterSecurity, auth_dir: Path, secret_file: str | None) -> Path:
    """The daemons' properties file (mode 0600, in ``auth_dir``, mode 0700); with
    authentication, the secret of ``secret_file`` (else of ``auth_dir``/secret, created)."""
    auth_dir = private_dir(auth_dir)
    secret = None
    if security.authenticate:
        try:
            security.secret_file, secret = ensure_secret(auth_dir, secret_file)
        except SecretFileError as error:
            raise Refused(str(error)) from None
    daemon_conf = auth_dir / "daemon.conf"
    _write_private(daemon_conf, daemon_properties(security, secret))
    return daemon_conf


def prepare(args: argparse.Namespace) -> int:
    security = decide_security(args)
    daemon_conf = write_daemon_conf(security, Path(args.dir), args.secret_file)
    print("\n".join(cluster_env_lines(security, daemon_conf)))
    return 0


# ------------------------------------------------------------------ the image's daemon modes
DAEMON_CLASSES = {
    "master": "org.apache.spark.deploy.master.Master",
    "worker": "org.apache.spark.deploy.worker.Worker",
}
# Every daemon web UI binds here (Spark binds UIs to SPARK_LOCAL_IP, else every interface):
# reach them with an SSH tunnel (docs/cluster.md §2.2).
UI_ADDRESS = "127.0.0.1"


def daemon_command(args: argparse.Namespace, spark_home: str) -> tuple[list[str], dict[str, str]]:
    """(argv, environment) of a standalone master or worker in the foreground, prepared as
    start-cluster.sh prepares its daemons: authenticated off loopback with a mounted secret
    file, REST server and kill buttons off, ACLs on, web UIs on loopback only."""
    if os.geteuid() == 0 and not args.allow_root:
        raise Refused(
            "a Spark daemon runs the code of every job it accepts as its own user: not "
            "as root (the image's user is 'spark', uid 10001: drop --user 0 / "
            "runAsUser: 0), or say --allow-root"
        )
    security = decide_security(args)
    if security.authenticate and not args.secret_file:
        raise Refused(
            f"a daemon on {args.host} authenticates: mount the cluster's secret file "
            "(mode 0600, owned by the daemon's user) and name it with --secret-file "
            "FILE, the same file on every node (or --insecure on a network you trust "
            "entirely)"
        )
    auth_dir = Path(args.dir) if args.dir else default_daemon_dir()
    daemon_conf = write_daemon_conf(security, auth_dir, args.secret_file)
    argv = [
        str(Path(spark_home) / "bin" / "spark-class"),
        DAEMON_CLASSES[args.role],
        "--host",
        args.host,
        "--webui-port",
        str(args.webui_port),
        "--properties-file",
        str(daemon_conf),
    ]
    if args.role == "master":
        argv += ["--port", str(args.port)]
    else:
        # executors' files and logs: this user's only
        work = private_dir(Path(args.work_dir) if args.work_dir else auth_dir / "work")
        argv += [
            "--cores",
            str(args.cores),
            "--memory",
            args.memory,
            "--work-dir",
            str(work),
            args.master_url,
        ]
    return argv, {"SPARK_LOCAL_IP": UI_ADDRESS, "SPARK_MASTER_HOST": args.host}


def daemon(args: argparse.Namespace) -> int:
    """Replace this process with the daemon (the container's main process)."""
    spark_home = os.environ.get("SPARK_HOME") or "/opt/spark"
    argv, environment = daemon_command(args, spark_home)
    sys.stdout.flush()
    os.execve(argv[0], argv, {**os.environ, **environment})
    return 1  # not reached


# ------------------------------------------------------------------ command line
def _security_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", required=True, help="the address the daemons bind to")
    p.add_argument("--authenticate", action="store_true", help="authenticate on loopback too")
    p.add_argument("--insecure", action="store_true", help="no authentication off loopback")
    p.add_argument(
        "--no-rpc-encryption", action="store_true", help="authenticate without encrypting RPC (loopback only)"
    )
    p.add_argument("--io-encryption", action="store_true")
    p.add_argument("--admin-users", help="spark.admin.acls (default: the current user)")
    p.add_argument("--view-users", help="spark.ui.view.acls")


def _master_url(text: str) -> str:
    if not re.match(r"^spark://[^\s/]+:[0-9]+$", text):
        raise argparse.ArgumentTypeError(f"must be a master URL spark://HOST:PORT, got {text!r}")
    return text


def _size(text: str) -> str:
    if not re.match(r"^[1-9][0-9]*[kKmMgGtT]$", text):
        raise argparse.ArgumentTypeError(f"must be a size like 4g or 512m, got {text!r}")
    return text


def _port(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port 1-65535, got {text!r}")
    return int(text)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m pipeline.cluster_auth")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prepare", help="secret + daemon properties; prints cluster.env lines")
    p.add_argument("--dir", required=True, help="the cluster's private directory (mode 0700)")
    p.add_argument("--secret-file", help="use this secret (mode 0600) instead of creating one")
    _security_flags(p)
    for role in ("master", "worker"):
        d = sub.add_parser(
            role,
            prog=f"entrypoint.sh {role}",
            help=f"a standalone {role} in the foreground (the image's {role} mode)",
        )
        if role == "worker":
            d.add_argument("master_url", type=_master_url, metavar="spark://MASTER:PORT")
            d.add_argument("--cores", type=int, default=os.cpu_count() or 1)
            d.add_argument("--memory", type=_size, default="4g")
            d.add_argument("--work-dir", help="executors' scratch (default: DIR/work)")
        else:
            d.add_argument("--port", type=_port, default=7077)
        d.add_argument("--webui-port", type=_port, default=8080 if role == "master" else 8081)
        d.add_argument("--secret-file", help="the cluster's secret, mounted (mode 0600)")
        d.add_argument(
            "--dir",
            help="private directory for the properties file (mode 0700; "
            "default: $XDG_STATE_HOME/criteo-spark, else "
            "~/.local/state/criteo-spark)",
        )
        d.add_argument("--allow-root", action="store_true", help="run as root anyway (not recommended)")
        _security_flags(d)
        d.set_defaults(role=role)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    prog = "start-cluster.sh" if args.command == "prepare" else f"entrypoint.sh {args.command}"
    try:
        return prepare(args) if args.command == "prepare" else daemon(args)
    except Refused as refusal:
        print(f"{prog}: error: {refusal}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
