"""A real Spark standalone cluster on localhost for the cluster tests: the environment its
scripts run in, free ports, checked subprocesses, a generated input, and the master plus one
worker that docker/spark-cluster/start-cluster.sh starts (always stopped afterwards); and where
real Spark processes listen (their sockets, read with psutil)."""

from __future__ import annotations

import contextlib
import ipaddress
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
CLUSTER = REPO / "docker" / "spark-cluster"


def free_ports(n: int) -> list[int]:
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


# The tests' master and worker live a minute or two: the JIT's optimising tier (C2) would
# spend more CPU compiling their code than it saves running it. Their behaviour is the same.
SHORT_LIVED_DAEMON_JAVA_OPTS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def cluster_env() -> dict[str, str]:
    env = dict(
        os.environ, PYTHON=sys.executable, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable
    )
    env.pop("SPARK_HOME", None)  # the scripts find the pip PySpark's own
    env.setdefault("SPARK_DAEMON_JAVA_OPTS", SHORT_LIVED_DAEMON_JAVA_OPTS)
    return env


def listening(root_pid: int) -> set[tuple[str, int]]:
    """(address, port) of every listening TCP socket of a process and its descendants."""
    try:
        root = psutil.Process(root_pid)
        processes = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return set()
    found = set()
    for process in processes:
        try:
            connections = process.net_connections(kind="tcp")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        found |= {(plain(c.laddr.ip), c.laddr.port) for c in connections if c.status == psutil.CONN_LISTEN}
    return found


def plain(address: str) -> str:
    """An IPv4-mapped IPv6 address (Java's IPv4 sockets on a dual stack) as IPv4."""
    return address.removeprefix("::ffff:") if address.count(".") == 3 else address


def loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%")[0])
    mapped = getattr(ip, "ipv4_mapped", None)  # ::ffff:127.0.0.1, a Java IPv4 socket on a v6 stack
    return (mapped or ip).is_loopback


def spark_env() -> dict[str, str]:
    """The environment of a Spark script or job started from the tests: the pip PySpark's
    home, this interpreter, the repo on the path, short-lived daemons."""
    import pyspark

    return {
        **os.environ,
        "SPARK_HOME": os.path.dirname(pyspark.__file__),
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        "PYTHONPATH": str(REPO),
        "PYSPARK_PYTHON": sys.executable,
        "SPARK_DAEMON_JAVA_OPTS": os.environ.get("SPARK_DAEMON_JAVA_OPTS", SHORT_LIVED_DAEMON_JAVA_OPTS),
    }


def run_checked(argv: list[str], timeout: int, cwd: Path | None = None) -> subprocess.CompletedProcess:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=cluster_env(), cwd=cwd)
    assert proc.returncode == 0, (
        f"{argv[:3]} exited {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    )
    return proc


def generate_raw(raw: Path, days: int, rows_per_day: int, seed: int) -> Path:
    """A small synthetic Criteo input (pipeline.generate's generator) at ``raw``."""
    from dlrm_contracts.config import GeneratorConfig
    from pipeline.synthetic import generate

    generate(raw, GeneratorConfig(days=days, rows_per_day=rows_per_day, seed=seed, workers=1))
    return raw


@contextlib.contextmanager
def standalone_cluster(
    directory: Path, *extra: str
) -> Iterator[tuple[str, subprocess.CompletedProcess, set[int]]]:
    """(master URL, start-cluster.sh's output, its ports): a master and one worker on
    127.0.0.1, stopped on the way out whatever happens. ``extra`` goes to start-cluster.sh
    (``--authenticate``)."""
    port, webui, worker_webui = free_ports(3)
    try:
        out = run_checked(
            [
                "bash",
                str(CLUSTER / "start-cluster.sh"),
                "--dir",
                str(directory),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--webui-port",
                str(webui),
                "--worker-webui-port",
                str(worker_webui),
                "--workers",
                "1",
                "--worker-cores",
                "2",
                "--worker-memory",
                "2g",
                "--timeout",
                "150",
                *extra,
            ],
            timeout=200,
        )
        url = out.stdout.strip().splitlines()[-1]
        assert url == f"spark://127.0.0.1:{port}"
        yield url, out, {port, webui, worker_webui}
    finally:
        subprocess.run(
            ["bash", str(CLUSTER / "stop-cluster.sh"), "--dir", str(directory)],
            capture_output=True,
            text=True,
            timeout=120,
            env=cluster_env(),
        )
