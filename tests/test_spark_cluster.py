"""A real Spark standalone cluster on localhost runs the preprocessing like local mode does.

docker/spark-cluster/start-cluster.sh starts a master and one worker (127.0.0.1, free
non-default ports); submit.sh runs ``spark-submit --master spark://… spark_jobs/main.py``; the
parquet splits, table sizes and data-quality report must equal those of a local-mode run row for
row, and the master's log must show the application and an executor on the worker (so the job
did not quietly fall back to local mode). The cluster is always stopped, even on failure.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from spark_cluster import CLUSTER, cluster_env, free_ports, generate_raw, run_checked, standalone_cluster

pytestmark = [pytest.mark.spark, pytest.mark.slow]

SPLITS = ("train", "test", "validation")
THRESHOLD = "2,C3:3"


@pytest.fixture(scope="module")
def raw_input(tmp_path_factory) -> Path:
    return generate_raw(tmp_path_factory.mktemp("cluster") / "raw", days=3, rows_per_day=2000, seed=7)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """(master URL, cluster dir): a master and one worker, stopped at teardown whatever happens."""
    directory = tmp_path_factory.mktemp("standalone")
    with standalone_cluster(directory) as (url, _, _):
        yield url, directory


def _split_rows(workdir: Path, split: str):
    files = sorted((workdir / "parquet" / split).glob("part-*.parquet"))
    assert files, f"no parquet files in {workdir / 'parquet' / split}"
    return [pq.read_table(f) for f in files]


def _concat(tables):
    import pyarrow as pa

    return pa.concat_tables(tables)


def _daemon_pids(directory: Path) -> list[int]:
    return [int(p.read_text().strip()) for p in (directory / "pids").glob("*.pid")]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_submit_to_standalone_cluster_equals_local_mode(cluster, raw_input, tmp_path):
    url, directory = cluster
    pids = _daemon_pids(directory)
    assert len(pids) == 2 and all(_alive(p) for p in pids), "master and worker must be running"

    on_cluster, local = tmp_path / "cluster_out", tmp_path / "local_out"
    # The local-mode reference runs alongside the cluster run: both are mostly Spark start-up
    # and scheduling latency, so overlapping them keeps the test short.
    reference = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "spark_jobs",
            "--input",
            str(raw_input),
            "--workdir",
            str(local),
            "--frequency-threshold",
            THRESHOLD,
            "--master",
            "local[2]",
            "--driver-memory",
            "2g",
            "--conf",
            "spark.ui.enabled=false",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cluster_env(),
        cwd=tmp_path,
    )
    try:
        submitted = run_checked(
            [
                "bash",
                str(CLUSTER / "submit.sh"),
                "--dir",
                str(directory),
                "--driver-memory",
                "1g",
                "--executor-memory",
                "1g",
                "--conf",
                "spark.ui.enabled=false",
                "--",
                "--input",
                str(raw_input),
                "--workdir",
                str(on_cluster),
                "--frequency-threshold",
                THRESHOLD,
            ],
            timeout=600,
            cwd=tmp_path,
        )
        out, err = reference.communicate(timeout=600)
    finally:
        if reference.poll() is None:
            reference.kill()
            reference.wait()
    assert reference.returncode == 0, f"local-mode run failed\n{out[-2000:]}\n{err[-3000:]}"

    # It really ran on the cluster: the master registered the application and gave it an
    # executor on our worker.
    master_log = "".join(p.read_text(errors="replace") for p in (directory / "logs").glob("*Master*.out"))
    assert re.search(r"Registering app criteo", master_log), master_log[-2000:]
    assert "Launching executor" in master_log, master_log[-2000:]
    summary = json.loads(submitted.stdout.strip().splitlines()[-1])
    assert summary["rows"] == {"train": 4000, "test": 1000, "validation": 1000}

    for split in SPLITS:
        got, want = _concat(_split_rows(on_cluster, split)), _concat(_split_rows(local, split))
        assert got.schema == want.schema, split
        assert got.num_rows == want.num_rows > 0, split
        assert got.equals(want), f"{split}: cluster output differs from local mode"
    for name in ("model_size.json", "data_quality.json"):
        assert json.loads((on_cluster / "parquet" / name).read_text()) == json.loads(
            (local / "parquet" / name).read_text()
        ), name
    assert (on_cluster / "parquet" / "_SUCCESS").exists()


def test_a_second_master_on_a_used_port_is_refused(cluster, tmp_path):
    url, _ = cluster
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
    _, directory = cluster
    pids = _daemon_pids(directory)
    assert len(pids) == 2 and all(_alive(p) for p in pids)
    run_checked(["bash", str(CLUSTER / "stop-cluster.sh"), "--dir", str(directory)], timeout=120)
    assert not any(_alive(p) for p in pids)
    assert not list((directory / "pids").glob("*.pid"))
    run_checked(["bash", str(CLUSTER / "stop-cluster.sh"), "--dir", str(directory)], timeout=60)
