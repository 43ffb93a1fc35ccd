"""Where real Spark processes listen: web UIs on loopback only, RPC where it must be reached.

Spark binds every web UI to SPARK_LOCAL_IP, else to every interface (WebUI.initServer, Spark
4.0.1), and its ACLs restrict nobody without an authentication filter: a UI on a routable
address shows anyone the application list, every executor's logs, SQL plans with paths and
thread dumps. The preprocess image's master and worker modes (docker/spark/entrypoint.sh, run
here without Docker) on this machine's routable address with a driver that authenticates, their
processes' listening sockets read with psutil while they run: RPC on that address, every UI on
loopback. A local preprocess job's sockets (everything on loopback) are read the same way by
tests/test_spark_cli.py, on the job its other tests read (one JVM for both).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from spark_cluster import listening, loopback, spark_env

pytestmark = [pytest.mark.spark, pytest.mark.slow]

REPO = Path(__file__).resolve().parent.parent
ENTRYPOINT = REPO / "docker" / "spark" / "entrypoint.sh"
SECRET = "0123456789abcdef" * 4


def routable_address() -> str | None:
    for addresses in psutil.net_if_addrs().values():
        for address in addresses:
            if address.family == socket.AF_INET and not loopback(address.address):
                return address.address
    return None


def free_port(host: str) -> int:
    with socket.socket() as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


DRIVER = textwrap.dedent("""
    import json, os, sys, psutil
    from dlrm_contracts.config import SparkConfig
    from spark_jobs.session import get_session

    spark = get_session(SparkConfig(master=sys.argv[1], auth_secret_file=sys.argv[2],
                                    driver_memory="1g", executor_memory="1g"))
    total = spark.range(100_000).selectExpr("sum(id) AS s").collect()[0]["s"]
    me = psutil.Process()
    sockets = sorted({(c.laddr.ip.removeprefix("::ffff:"), c.laddr.port)
                      for p in [me, *me.children(recursive=True)]
                      for c in p.net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN})
    ui = spark.sparkContext.uiWebUrl
    spark.stop()
    print(json.dumps({"sum": total, "sockets": sockets, "ui": ui}))
""")


def test_image_daemons_off_loopback_authenticate_and_keep_uis_on_loopback(tmp_path):
    host = routable_address()
    if host is None:
        pytest.skip("this machine has no routable IPv4 address to bind a cluster to")
    secret = tmp_path / "secret"
    secret.write_text(SECRET + "\n")
    secret.chmod(0o600)
    port, webui, worker_webui = free_port(host), free_port("127.0.0.1"), free_port("127.0.0.1")
    root = ["--allow-root"] if os.geteuid() == 0 else []  # the image's own user is uid 10001
    common = ["--host", host, "--secret-file", str(secret), *root]
    refused = subprocess.run(
        ["bash", str(ENTRYPOINT), "master", "--host", host, *root, "--dir", str(tmp_path / "r")],
        capture_output=True,
        text=True,
        env=spark_env(),
        timeout=60,
    )
    assert refused.returncode == 2 and "--secret-file" in refused.stderr
    daemons = {}
    try:
        for role, args in (
            ("master", ["--port", str(port), "--webui-port", str(webui)]),
            (
                "worker",
                [
                    f"spark://{host}:{port}",
                    "--webui-port",
                    str(worker_webui),
                    "--cores",
                    "2",
                    "--memory",
                    "2g",
                ],
            ),
        ):
            log = open(tmp_path / f"{role}.log", "w")
            daemons[role] = subprocess.Popen(
                ["bash", str(ENTRYPOINT), role, *args, *common, "--dir", str(tmp_path / role)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=spark_env(),
            )
            wait_for(
                tmp_path / f"{role}.log",
                "Successfully registered with master" if role == "worker" else "I have been elected leader",
                daemons[role],
            )
        driver = subprocess.run(
            [sys.executable, "-c", DRIVER, f"spark://{host}:{port}", str(secret)],
            capture_output=True,
            text=True,
            env=spark_env(),
            timeout=300,
            cwd=tmp_path,
        )
        assert driver.returncode == 0, driver.stderr[-3000:]
        result = json.loads(driver.stdout.strip().splitlines()[-1])
        assert result["sum"] == sum(range(100_000))
        daemon_sockets = {role: listening(p.pid) for role, p in daemons.items()}
        for role, process in daemons.items():
            command = " ".join(psutil.Process(process.pid).cmdline())
            assert SECRET not in command and "--properties-file" in command, role
    finally:
        for process in daemons.values():
            process.terminate()
        for process in daemons.values():
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
    master_log = (tmp_path / "master.log").read_text()
    assert "authentication enabled" in master_log and "Registering app" in master_log
    assert (host, port) in daemon_sockets["master"]
    assert ("127.0.0.1", webui) in daemon_sockets["master"]
    assert ("127.0.0.1", worker_webui) in daemon_sockets["worker"]
    every = daemon_sockets["master"] | daemon_sockets["worker"] | {tuple(s) for s in result["sockets"]}
    wildcard = {s for s in every if s[0] in ("0.0.0.0", "::")}
    assert not wildcard, wildcard
    uis = {("127.0.0.1", webui), ("127.0.0.1", worker_webui)}
    driver_ui = int(result["ui"].rsplit(":", 1)[1])
    assert ("127.0.0.1", driver_ui) in {tuple(s) for s in result["sockets"]}
    routable = {s for s in every if not loopback(s[0])}
    assert routable and all(s[0] == host for s in routable), routable  # RPC: master, worker, driver
    assert not routable & uis


def wait_for(log: Path, words: str, process: subprocess.Popen, timeout: float = 180) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if words in log.read_text(errors="replace"):
            return
        if process.poll() is not None:
            raise AssertionError(
                f"{log.name}: exited {process.returncode}\n{log.read_text(errors='replace')[-3000:]}"
            )
        time.sleep(0.5)
    raise AssertionError(
        f"{log.name}: no '{words}' within {timeout} s\n{log.read_text(errors='replace')[-3000:]}"
    )
