"""A real S3-compatible server for the tests: moto's server mode on a loopback port.

One server per test session (``moto_s3`` in conftest.py); each test takes its own bucket
(``server.bucket()``), so tests never see each other's objects. The server is the process
``.venv/bin/moto_server`` (installed with the dev dependencies), stopped when the session ends.
The client side is configured the way a user's is: AWS_* in the environment.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

ENVIRONMENT = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class MotoServer:
    endpoint: str
    process: subprocess.Popen
    log: Path
    buckets: list[str] = field(default_factory=list)

    def client(self):
        import boto3  # installed with moto[server] (dev dependencies)

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name=ENVIRONMENT["AWS_REGION"],
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )

    def bucket(self, prefix: str = "test") -> str:
        """A new empty bucket's name."""
        name = f"{prefix}-{uuid.uuid4().hex[:12]}".lower()
        self.client().create_bucket(Bucket=name)
        self.buckets.append(name)
        return name

    def environment(self) -> dict[str, str]:
        """What a process needs in its environment to reach this server."""
        return {**ENVIRONMENT, "AWS_ENDPOINT_URL": self.endpoint}


def start_moto(log: Path) -> MotoServer:
    """moto_server on a free loopback port, answering; raises if it does not come up."""
    executable = Path(sys.executable).parent / "moto_server"
    if not executable.exists():
        raise RuntimeError(
            f"{executable} is missing: scripts/install.sh installs moto[server] with the dev dependencies"
        )
    port = free_port()
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [str(executable), "-H", "127.0.0.1", "-p", str(port)], stdout=out, stderr=subprocess.STDOUT
        )
    wait_until_answering(process, port, "moto_server", log)
    return MotoServer(f"http://127.0.0.1:{port}", process, log)


def wait_until_answering(process: subprocess.Popen, port: int, name: str, log: Path) -> None:
    """Until ``process`` accepts connections on ``port``; raises (the process killed) if it
    exits first or does not answer in a generous time (the machine's speed varies)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{name} exited: {log.read_text()[-2000:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.2)
    process.kill()
    raise RuntimeError(f"{name} did not answer")


def stop_moto(server: MotoServer) -> None:
    server.process.terminate()
    try:
        server.process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        server.process.kill()
        server.process.wait()


def set_environment(server: MotoServer) -> dict[str, str | None]:
    """Point this process (and its children) at the server; returns what to restore."""
    previous = {name: os.environ.get(name) for name in server.environment()}
    os.environ.update(server.environment())
    return previous


def restore_environment(previous: dict[str, str | None]) -> None:
    for name, value in previous.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
