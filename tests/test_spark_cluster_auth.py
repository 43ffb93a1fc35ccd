"""A real authenticated Spark standalone cluster lets in only jobs that hold its secret.

start-cluster.sh starts a master and a worker on 127.0.0.1 with ``--authenticate`` (off
loopback that is the default; a routable address may not exist on a test machine). Four
things then run at once, to keep the wall time down: the pipeline's preprocess stage against
the cluster with ``--spark-secret-file``, a local-mode reference run, a job without the secret
and a job with a wrong one, while a thread reads every process's command line. The good run
must equal local mode row for row; the other two must be refused (and the master must never
register them); the secret may appear in no command line and in no file any of them wrote.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from spark_cluster import cluster_env, generate_raw, standalone_cluster

pytestmark = [pytest.mark.spark, pytest.mark.slow]

SPLITS = ("train", "test", "validation")
THRESHOLD = "2,C3:3"


class CommandLineWatch(threading.Thread):
    """Reads /proc/*/cmdline until stopped: which processes showed ``needle``, and which Spark
    JVMs it saw at all (so a watch that saw nothing cannot pass for a clean one)."""

    def __init__(self, needle: str):
        super().__init__(daemon=True)
        self.needle, self.leaks, self.seen = needle, set(), set()
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.2):
            for entry in Path("/proc").iterdir():
                if not entry.name.isdigit():
                    continue
                try:
                    line = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                except OSError:
                    continue
                if self.needle in line:
                    self.leaks.add(line[:300])
                for role in (
                    "SparkSubmit",
                    "CoarseGrainedExecutorBackend",
                    "deploy.master.Master",
                    "deploy.worker.Worker",
                ):
                    if role in line:
                        self.seen.add(role)


def _listening_addresses(ports: set[int]) -> dict[int, set[str]]:
    """{port: local addresses listening on it}, from /proc/net/tcp{,6} (state 0A = LISTEN)."""
    found: dict[int, set[str]] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for row in Path(table).read_text().splitlines()[1:]:
            fields = row.split()
            address, port = fields[1].rsplit(":", 1)
            if fields[3] == "0A" and int(port, 16) in ports:
                found.setdefault(int(port, 16), set()).add(address)
    return found


LOOPBACK_HEX = {"0100007F", "0000000000000000FFFF00000100007F"}  # 127.0.0.1, ::ffff:127.0.0.1


@pytest.fixture(scope="module")
def raw_input(tmp_path_factory) -> Path:
    return generate_raw(tmp_path_factory.mktemp("auth_cluster") / "raw", days=2, rows_per_day=1500, seed=11)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """(master URL, cluster dir, ports): stopped at teardown whatever happens."""
    directory = tmp_path_factory.mktemp("auth_standalone")
    with standalone_cluster(directory, "--authenticate") as (url, out, ports):
        secret = (directory / "auth" / "secret").read_text().strip()
        assert secret not in out.stdout + out.stderr
        yield url, directory, ports


def _popen(argv: list[str], cwd: Path, name: str) -> subprocess.Popen:
    """Output to files (among those searched for the secret): four processes writing into
    pipes read one after the other could block each other."""
    with open(cwd / f"{name}.stdout", "w") as out, open(cwd / f"{name}.stderr", "w") as err:
        return subprocess.Popen(argv, stdout=out, stderr=err, env=cluster_env(), cwd=cwd)


@pytest.fixture(scope="module")
def runs(cluster, raw_input, tmp_path_factory):
    """Everything at once; {name: (returncode, stdout, stderr, workdir)} and the watch."""
    url, directory, _ = cluster
    base = tmp_path_factory.mktemp("auth_runs")
    secret_file = directory / "auth" / "secret"
    wrong = base / "wrong_secret"
    wrong.write_text("f" * 64 + "\n")
    wrong.chmod(0o600)
    config = base / "pipeline.yaml"
    config.write_text(
        json.dumps(
            {
                "spark": {
                    "driver_memory": "1g",
                    "executor_memory": "1g",
                    "bind_address": "127.0.0.1",
                    "conf": {"spark.ui.enabled": "false"},
                }
            }
        )
    )
    job = [
        sys.executable,
        "-m",
        "spark_jobs",
        "--input",
        str(raw_input),
        "--frequency-threshold",
        THRESHOLD,
        "--driver-memory",
        "1g",
        "--conf",
        "spark.ui.enabled=false",
    ]
    argvs = {
        "pipeline": [
            sys.executable,
            "-m",
            "pipeline",
            "--config",
            str(config),
            "--input",
            str(raw_input),
            "--workdir",
            str(base / "pipeline"),
            "--stages",
            "preprocess",
            "--frequency-threshold",
            THRESHOLD,
            "--spark-master",
            url,
            "--spark-secret-file",
            str(secret_file),
        ],
        "local": job + ["--workdir", str(base / "local"), "--master", "local[2]"],
        "no_secret": job + ["--workdir", str(base / "no_secret"), "--master", url],
        "wrong_secret": job
        + ["--workdir", str(base / "wrong_secret_out"), "--master", url, "--auth-secret-file", str(wrong)],
    }
    watch = CommandLineWatch(secret_file.read_text().strip())
    watch.start()
    procs = {name: _popen(argv, base, name) for name, argv in argvs.items()}
    results = {}
    try:
        for name, proc in procs.items():
            proc.wait(timeout=600)
            results[name] = (
                proc.returncode,
                (base / f"{name}.stdout").read_text(),
                (base / f"{name}.stderr").read_text(),
            )
    finally:
        watch.done.set()
        watch.join()
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return {"results": results, "base": base, "watch": watch}


def _rows(workdir: Path, split: str) -> pa.Table:
    files = sorted((workdir / "parquet" / split).glob("part-*.parquet"))
    assert files, f"no parquet files in {workdir / 'parquet' / split}"
    return pa.concat_tables(pq.read_table(f) for f in files)


def _master_log(directory: Path) -> str:
    return "".join(p.read_text(errors="replace") for p in (directory / "logs").glob("*Master*.out"))


def test_job_with_the_secret_runs_on_the_cluster_and_equals_local_mode(cluster, runs):
    url, directory, _ = cluster
    results, base = runs["results"], runs["base"]
    for name in ("pipeline", "local"):
        code, out, err = results[name]
        assert code == 0, f"{name} failed\n{out[-2000:]}\n{err[-3000:]}"
    summary = json.loads(results["pipeline"][1].strip().splitlines()[-1])
    assert summary["stages"]["preprocess"]["action"] == "ran", summary
    master_log = _master_log(directory)
    assert "SecurityManager: authentication enabled" in master_log
    assert len(re.findall(r"Registering app criteo", master_log)) == 1, master_log[-3000:]
    assert "Launching executor" in master_log
    for split in SPLITS:
        got, want = _rows(base / "pipeline", split), _rows(base / "local", split)
        assert got.num_rows == want.num_rows > 0 and got.equals(want), split
    for name in ("model_size.json", "data_quality.json"):
        assert json.loads((base / "pipeline" / "parquet" / name).read_text()) == json.loads(
            (base / "local" / "parquet" / name).read_text()
        ), name


def test_jobs_without_the_secret_or_with_a_wrong_one_are_refused(cluster, runs):
    _, directory, _ = cluster
    results, base = runs["results"], runs["base"]
    for name, workdir in (("no_secret", "no_secret"), ("wrong_secret", "wrong_secret_out")):
        code, out, err = results[name]
        assert code == 5, f"{name} was not refused (exit {code})\n{err[-3000:]}"
        assert "did not accept the job" in err, err[-2000:]
        assert not (base / workdir / "parquet" / "_SUCCESS").exists()
    # The wrong secret failed in the authentication handshake itself (Spark's AES-based auth:
    # with the SASL fallback off, the server's challenge refuses it).
    wrong_err = results["wrong_secret"][2]
    assert "Authentication failed" in wrong_err and "network.crypto.Auth" in wrong_err, wrong_err[-3000:]
    # Only the good run's application was ever registered.
    assert len(re.findall(r"Registering app", _master_log(directory))) == 1


def test_the_secret_is_in_no_command_line_and_no_file_a_run_wrote(cluster, runs):
    _, directory, _ = cluster
    watch = runs["watch"]
    assert {
        "SparkSubmit",
        "CoarseGrainedExecutorBackend",
        "deploy.master.Master",
        "deploy.worker.Worker",
    } <= watch.seen, watch.seen
    assert not watch.leaks, f"the secret was on a command line: {watch.leaks}"
    secret = watch.needle.encode()
    for name, (_, out, err) in runs["results"].items():
        assert watch.needle not in out + err, name
    private = directory / "auth"
    written = [
        p
        for root in (runs["base"], directory)
        for p in root.rglob("*")
        if p.is_file() and private not in p.parents
    ]
    pipeline_files = {
        p.relative_to(runs["base"] / "pipeline").as_posix()
        for p in written
        if (runs["base"] / "pipeline") in p.parents
    }
    # The artefacts the issue names are among the files searched.
    assert {
        "manifests/effective_config.yaml",
        "manifests/preprocess.json",
        "summary.json",
        "logs/preprocess.log",
        "report/report.md",
    } <= pipeline_files, sorted(pipeline_files)
    assert any("/work/app-" in str(p) for p in written), "the executor's logs must be searched"
    leaking = [str(p) for p in written if secret in p.read_bytes()]
    assert not leaking, f"the secret was written to {leaking}"
    effective = runs["base"] / "pipeline" / "manifests" / "effective_config.yaml"
    assert str(directory / "auth" / "secret") in effective.read_text()  # the path, not the secret


def test_daemons_and_web_uis_listen_on_the_cluster_address_only(cluster, runs):
    _, directory, ports = cluster
    listening = _listening_addresses(ports)
    assert set(listening) == ports, listening
    for port, addresses in listening.items():
        assert addresses <= LOOPBACK_HEX, f"port {port} listens on {addresses}"
    master_log = _master_log(directory)
    assert "REST" not in master_log.replace("RESTART", "")  # no REST submission server
    assert "ui acls enabled" in master_log
