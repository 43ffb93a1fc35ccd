"""A real Spark standalone cluster on localhost runs the preprocessing like local mode does, and
lets in only jobs that hold its secret.

docker/spark-cluster/start-cluster.sh starts a master and one worker on 127.0.0.1 (free
non-default ports) with ``--authenticate`` (off loopback that is the default; a routable address
may not exist on a test machine). Four jobs then run at once, to keep the wall time down (the
two refused ones spend most of theirs waiting out Spark's registration attempts): submit.sh
(``spark-submit --master spark://… spark_jobs/main.py``, the secret file passed on by the
script), the pipeline's preprocess stage against the cluster with ``--spark-secret-file``, a job
without the secret and a job with a wrong one, while a thread reads every process's command line
and a local-mode reference runs in this process. Both good runs must equal local mode row for row
and the master's log must show each registered with an executor on the worker (so neither
quietly fell back to local mode); the other two must be refused (and the master must never
register them); the secret may appear in no command line and in no file any of them wrote. The
cluster is always stopped, even on failure.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from spark_cluster import CLUSTER, cluster_env, free_ports, generate_raw, run_checked, standalone_cluster
from spark_fixtures import run

pytestmark = [pytest.mark.spark, pytest.mark.slow]

SPLITS = ("train", "test", "validation")
THRESHOLD = "2,C3:3"
SUBMIT_APP = "criteo-submitted"  # submit.sh's run, told apart from the pipeline's in the master's log
PIPELINE_APP = "criteo-dlrm-preprocess"  # the job's default name
GOOD = {"submit": SUBMIT_APP, "pipeline": PIPELINE_APP}


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
    return generate_raw(tmp_path_factory.mktemp("cluster") / "raw", days=3, rows_per_day=1000, seed=7)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """(master URL, cluster dir, ports): stopped at teardown whatever happens."""
    directory = tmp_path_factory.mktemp("auth_standalone")
    with standalone_cluster(directory, "--authenticate") as (url, out, ports):
        secret = (directory / "auth" / "secret").read_text().strip()
        assert secret not in out.stdout + out.stderr
        yield url, directory, ports


def _daemon_pids(directory: Path) -> list[int]:
    return [int(p.read_text().strip()) for p in (directory / "pids").glob("*.pid")]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _popen(argv: list[str], cwd: Path, name: str) -> subprocess.Popen:
    """Output to files (among those searched for the secret): four processes writing into
    pipes read one after the other could block each other."""
    with open(cwd / f"{name}.stdout", "w") as out, open(cwd / f"{name}.stderr", "w") as err:
        return subprocess.Popen(argv, stdout=out, stderr=err, env=cluster_env(), cwd=cwd)


def _argvs(url: str, directory: Path, raw: Path, base: Path) -> dict[str, list[str]]:
    """The four jobs. The two good ones take one core each of the worker's two, so that they
    run side by side instead of one waiting for the other's executor."""
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
                    "conf": {"spark.ui.enabled": "false", "spark.cores.max": "1"},
                }
            }
        )
    )
    job = [sys.executable, "-m", "spark_jobs", "--input", str(raw), "--frequency-threshold", THRESHOLD]
    job += ["--driver-memory", "1g", "--conf", "spark.ui.enabled=false"]
    return {
        "submit": [
            "bash",
            str(CLUSTER / "submit.sh"),
            "--dir",
            str(directory),
            "--driver-memory",
            "1g",
            "--executor-memory",
            "1g",
            "--total-executor-cores",
            "1",
            "--conf",
            "spark.ui.enabled=false",
            "--",
            "--input",
            str(raw),
            "--workdir",
            str(base / "submit"),
            "--frequency-threshold",
            THRESHOLD,
            "--conf",
            f"spark.app.name={SUBMIT_APP}",
        ],
        "pipeline": [
            sys.executable,
            "-m",
            "pipeline",
            "--config",
            str(config),
            "--input",
            str(raw),
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
        "no_secret": job + ["--workdir", str(base / "no_secret"), "--master", url],
        "wrong_secret": job
        + ["--workdir", str(base / "wrong_secret_out"), "--master", url, "--auth-secret-file", str(wrong)],
    }


@pytest.fixture(scope="module")
def runs(cluster, raw_input, tmp_path_factory, spark):
    """Everything at once; {name: (returncode, stdout, stderr)}, the local-mode reference's
    workdir and summary, and the watch."""
    url, directory, _ = cluster
    pids = _daemon_pids(directory)
    assert len(pids) == 2 and all(_alive(p) for p in pids), "master and worker must be running"
    base = tmp_path_factory.mktemp("cluster_runs")
    argvs = _argvs(url, directory, raw_input, base)
    watch = CommandLineWatch((directory / "auth" / "secret").read_text().strip())
    watch.start()
    procs = {name: _popen(argv, base, name) for name, argv in argvs.items()}
    results = {}
    try:
        # local mode, meanwhile, on this process's own session
        local = run(spark, raw_input, base / "local", THRESHOLD)
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
    return {"results": results, "base": base, "watch": watch, "local": local}


def _rows(workdir: Path, split: str) -> pa.Table:
    files = sorted((workdir / "parquet" / split).glob("part-*.parquet"))
    assert files, f"no parquet files in {workdir / 'parquet' / split}"
    return pa.concat_tables(pq.read_table(f) for f in files)


def _master_log(directory: Path) -> str:
    return "".join(p.read_text(errors="replace") for p in (directory / "logs").glob("*Master*.out"))


def _assert_ran_on_the_cluster(directory: Path, app: str) -> None:
    """The master registered the application once and gave it an executor on our worker."""
    master_log = _master_log(directory)
    assert len(re.findall(rf"Registering app {app}\b", master_log)) == 1, master_log[-3000:]
    app_id = re.search(rf"Registered app {app} with ID (app-\S+)", master_log)
    assert app_id, master_log[-3000:]
    assert f"Launching executor {app_id.group(1)}/" in master_log, master_log[-3000:]


def _assert_equals_local(workdir: Path, local: Path) -> None:
    for split in SPLITS:
        got, want = _rows(workdir, split), _rows(local, split)
        assert got.schema == want.schema, split
        assert got.num_rows == want.num_rows > 0 and got.equals(want), f"{split}: differs from local mode"
    for name in ("model_size.json", "data_quality.json"):
        assert json.loads((workdir / "parquet" / name).read_text()) == json.loads(
            (local / "parquet" / name).read_text()
        ), name


def test_submit_to_standalone_cluster_equals_local_mode(cluster, runs):
    _, directory, _ = cluster
    results, base = runs["results"], runs["base"]
    pids = _daemon_pids(directory)
    assert len(pids) == 2 and all(_alive(p) for p in pids), "master and worker must still be running"
    code, out, err = results["submit"]
    assert code == 0, f"submit.sh exited {code}\n{out[-3000:]}\n{err[-3000:]}"
    _assert_ran_on_the_cluster(directory, SUBMIT_APP)
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["rows"] == {"train": 2000, "test": 500, "validation": 500}
    assert summary["rows"] == runs["local"]["rows"]
    _assert_equals_local(base / "submit", base / "local")
    assert (base / "submit" / "parquet" / "_SUCCESS").exists()


def test_job_with_the_secret_runs_on_the_cluster_and_equals_local_mode(cluster, runs):
    _, directory, _ = cluster
    results, base = runs["results"], runs["base"]
    code, out, err = results["pipeline"]
    assert code == 0, f"pipeline failed\n{out[-2000:]}\n{err[-3000:]}"
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["stages"]["preprocess"]["action"] == "ran", summary
    assert "SecurityManager: authentication enabled" in _master_log(directory)
    _assert_ran_on_the_cluster(directory, PIPELINE_APP)
    _assert_equals_local(base / "pipeline", base / "local")


def test_jobs_without_the_secret_or_with_a_wrong_one_are_refused(cluster, runs):
    _, directory, _ = cluster
    results, base = runs["results"], runs["base"]
    for name, workdir in (("no_secret", "no_secret"), ("wrong_secret", "wrong_secret_out")):
        code, out, err = results[name]
        assert code == 5, f"{name} was not refused (exit {code})\n{err[-3000:]}"
        assert "did not accept the job" in err, err[-2000:]
        assert not (base / workdir / "parquet" / "_SUCCESS").exists()
    # The wrong secret fails in the authentication handshake (Spark's AES-based auth: with the
    # SASL fallback off, the server's challenge refuses it and closes the channel). Which the
    # driver logs is a race: the handshake's refusal, or, when the close wins on a loaded
    # machine, its registration giving up on the master; never a registered application (below).
    wrong_err = results["wrong_secret"][2]
    refused = "Authentication failed" in wrong_err and "network.crypto.Auth" in wrong_err
    assert refused or "All masters are unresponsive" in wrong_err, wrong_err[-3000:]
    # Only the good runs' applications were ever registered.
    assert len(re.findall(r"Registering app", _master_log(directory))) == len(GOOD)


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


def test_a_second_master_on_a_used_port_is_refused(cluster, tmp_path):
    url, _, _ = cluster
    port = url.rsplit(":", 1)[1]
    (webui,) = free_ports(1)
    clash = subprocess.run(
        [
            "bash",
            str(CLUSTER / "start-cluster.sh"),
            "--dir",
            str(tmp_path / "d"),
            "--port",
            port,
            "--webui-port",
            str(webui),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=cluster_env(),
    )
    assert clash.returncode != 0 and "port is in use" in clash.stderr, clash.stderr
    assert not list((tmp_path / "d" / "pids").glob("*.pid")), "nothing may start after the refusal"


def test_stop_cluster_stops_every_daemon(cluster):
    """Runs last in this module: stops by pid file, waits for exit; a second stop is harmless."""
    _, directory, _ = cluster
    pids = _daemon_pids(directory)
    assert len(pids) == 2 and all(_alive(p) for p in pids)
    run_checked(["bash", str(CLUSTER / "stop-cluster.sh"), "--dir", str(directory)], timeout=120)
    assert not any(_alive(p) for p in pids)
    assert not list((directory / "pids").glob("*.pid"))
    run_checked(["bash", str(CLUSTER / "stop-cluster.sh"), "--dir", str(directory)], timeout=60)
