"""The command line, Spark settings (--conf, --conf-file, --gpu) and spark-submit.

No GPU Spark can run here: the --gpu tests check the generated configuration and the error for
a missing plugin jar, nothing more.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from dlrm_contracts.config import SparkConfig
from dlrm_contracts.layout import WorkdirLayout
from spark_fixtures import random_days, write_days
from spark_jobs.errors import PreprocessConfigError
from spark_jobs.gpu import RAPIDS_PLUGIN, rapids_conf
from spark_jobs.session import parse_conf_pairs, read_conf_file, spark_settings


def test_gpu_profile_sets_the_rapids_plugin_up(tmp_path):
    jar = tmp_path / "rapids-4-spark_2.13-25.08.0.jar"
    jar.write_bytes(b"PK")
    script = tmp_path / "getGpusResources.sh"
    script.write_text("#!/bin/sh\n")
    spark = SparkConfig(gpu=True, gpu_discovery_script=str(script), gpu_tasks_per_gpu=4)
    conf = rapids_conf(spark, environ={spark.gpu_jar_env: str(jar)})
    assert conf["spark.plugins"] == RAPIDS_PLUGIN
    assert conf["spark.jars"] == str(jar) == conf["spark.driver.extraClassPath"]
    assert conf["spark.executor.resource.gpu.amount"] == "1"
    assert conf["spark.task.resource.gpu.amount"] == "0.25"
    assert conf["spark.executor.resource.gpu.discoveryScript"] == str(script)
    assert conf["spark.rapids.memory.pinnedPool.size"] == "2g"
    assert conf["spark.rapids.sql.concurrentGpuTasks"] == "2"


def test_gpu_without_jar_is_a_clear_error(tmp_path, monkeypatch):
    spark = SparkConfig(gpu=True)
    with pytest.raises(PreprocessConfigError, match="SPARK_RAPIDS_PLUGIN_JAR"):
        rapids_conf(spark, environ={})
    with pytest.raises(PreprocessConfigError, match="does not name an existing jar"):
        rapids_conf(spark, environ={"SPARK_RAPIDS_PLUGIN_JAR": str(tmp_path / "nope.jar")})
    raw = write_days(tmp_path / "raw", random_days(1, 2, 5))
    env = {k: v for k, v in os.environ.items() if k != "SPARK_RAPIDS_PLUGIN_JAR"}
    proc = subprocess.run(
        [sys.executable, "-m", "spark_jobs", "--input", str(raw), "--workdir", str(tmp_path / "w"), "--gpu"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "SPARK_RAPIDS_PLUGIN_JAR" in lines[0], proc.stderr


def test_conf_precedence_file_then_flags(tmp_path):
    conf_file = tmp_path / "spark.conf"
    conf_file.write_text("# comment\nspark.sql.shuffle.partitions 17\nspark.executor.cores=3\n")
    assert read_conf_file(conf_file) == {"spark.sql.shuffle.partitions": "17", "spark.executor.cores": "3"}
    spark = SparkConfig(
        master="spark://head:7077",
        conf_file=str(conf_file),
        conf=parse_conf_pairs(["spark.executor.cores=5", "spark.foo= bar "]),
    )
    settings = spark_settings(spark)
    assert settings["spark.master"] == "spark://head:7077"
    assert settings["spark.sql.shuffle.partitions"] == "17"
    assert settings["spark.executor.cores"] == "5" and settings["spark.foo"] == "bar"
    assert spark_settings(SparkConfig(master="local[2]"))["spark.sql.shuffle.partitions"] == "8"
    # under spark-submit the master is spark-submit's: no sizing from our default local[2]
    assert "spark.sql.shuffle.partitions" not in spark_settings(
        SparkConfig(master="local[2]"), under_spark_submit=True
    )
    with pytest.raises(PreprocessConfigError, match="key=value"):
        parse_conf_pairs(["novalue"])
    with pytest.raises(PreprocessConfigError, match="does not exist"):
        read_conf_file(tmp_path / "missing.conf")


def test_cli_bad_input_is_one_line_and_input_exit_code(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "spark_jobs",
            "--input",
            str(tmp_path / "none"),
            "--workdir",
            str(tmp_path / "w"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 4
    assert proc.stderr.strip().count("\n") == 0 and "does not exist" in proc.stderr
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "spark_jobs",
            "--input",
            str(tmp_path),
            "--workdir",
            str(tmp_path / "w"),
            "--frequency-threshold",
            "15,C99:3",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "unknown column" in proc.stderr


@pytest.mark.spark
def test_spark_submit_runs_the_job(tmp_path, venv_bin, repo_root):
    raw = write_days(tmp_path / "raw", random_days(4, 2, 30))
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    proc = subprocess.run(
        [
            str(venv_bin / "spark-submit"),
            "--master",
            "local[1]",
            "--driver-memory",
            "1g",
            str(repo_root / "spark_jobs" / "main.py"),
            "--input",
            str(raw),
            "--workdir",
            str(tmp_path / "work"),
            "--frequency-threshold",
            "1",
            "--conf",
            "spark.sql.shuffle.partitions=2",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["rows"] == {"train": 30, "test": 15, "validation": 15}
    assert (WorkdirLayout.at(tmp_path / "work").parquet / "_SUCCESS").exists()


def test_bad_master_driver_memory_and_conf_file_are_usage_errors(tmp_path):
    from spark_jobs.session import check_spark_config

    for master in [
        "local",
        "local[2]",
        "local[*]",
        "local[4,3]",
        "spark://h:7077",
        "yarn",
        "k8s://https://h:443",
    ]:
        # well-formed; insecure: off loopback a cluster needs its secret file otherwise
        # (tests/test_cluster_auth.py)
        check_spark_config(SparkConfig(master=master, insecure=True))
    for master in ["locl[2]", "local[0]", "local[ 2]", "spark:/h:7077", ""]:
        with pytest.raises(PreprocessConfigError, match="--master"):
            check_spark_config(SparkConfig(master=master))
    for memory in ["12", "1x", "12gb", "0g"]:
        with pytest.raises(PreprocessConfigError, match="--driver-memory"):
            check_spark_config(SparkConfig(driver_memory=memory))
    with pytest.raises(PreprocessConfigError, match="is not a file"):
        read_conf_file(tmp_path)
    binary = tmp_path / "binary.conf"
    binary.write_bytes(b"spark.a 1\n\xff\xfe\n")
    with pytest.raises(PreprocessConfigError, match="not UTF-8"):
        read_conf_file(binary)


def test_bad_settings_exit_2_before_the_workdir_is_touched(tmp_path):
    """A bad --master/--conf-file is refused (one line, exit 2) before the input is scanned and
    before the previous run's parquet/_SUCCESS marker is removed; no Java trace."""
    raw = write_days(tmp_path / "raw", random_days(1, 2, 5))
    success = WorkdirLayout.at(tmp_path / "w").parquet / "_SUCCESS"
    success.parent.mkdir(parents=True)
    success.touch()
    for flags in (
        ["--master", "locl[2]"],
        ["--conf-file", str(tmp_path / "missing.conf")],
        ["--driver-memory", "12"],
    ):
        for input_dir in (raw, tmp_path / "no_input"):
            proc = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "spark_jobs",
                    "--input",
                    str(input_dir),
                    "--workdir",
                    str(tmp_path / "w"),
                    *flags,
                ],
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert proc.returncode == 2, (flags, proc.stderr[-2000:])
            assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr[-2000:]
            assert success.exists(), flags


@pytest.fixture(scope="module")
def local_job(tmp_path_factory):
    """One real ``python -m spark_jobs`` in local mode, as the pipeline starts it, for the
    tests that read what it did: its progress records and Spark event log, and every socket
    its processes listened on while it ran (read with psutil)."""
    from spark_cluster import listening, spark_env

    from dlrm_contracts.progress import PROGRESS_FILE_ENV

    tmp_path = tmp_path_factory.mktemp("local_job")
    raw = write_days(tmp_path / "raw", random_days(5, 3, 200))
    events = tmp_path / "spark-events"
    config = tmp_path / "config.yaml"
    config.write_text(f"spark:\n  event_log_dir: {events}\n  driver_memory: 1g\n")
    channel = tmp_path / "preprocess.progress.jsonl"
    with open(tmp_path / "job.err", "w") as stderr:
        job = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "spark_jobs",
                "--input",
                str(raw),
                "--workdir",
                str(tmp_path / "work"),
                "--config",
                str(config),
                "--master",
                "local[2]",
                "--frequency-threshold",
                "1",
            ],
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            env={**spark_env(), PROGRESS_FILE_ENV: str(channel)},
            cwd=tmp_path,
        )
        seen: set[tuple[str, int]] = set()
        while job.poll() is None:
            seen |= listening(job.pid)
            time.sleep(0.2)
    return SimpleNamespace(
        returncode=job.returncode,
        stderr=(tmp_path / "job.err").read_text(),
        channel=channel,
        events=events,
        listened=seen,
    )


@pytest.mark.spark
def test_the_job_reports_its_phases_to_the_pipeline_and_writes_an_event_log(local_job):
    from dlrm_contracts.progress import Progress

    proc, channel, events = local_job, local_job.channel, local_job.events
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [Progress.from_line(line) for line in channel.read_text().splitlines()]
    assert all(r is not None and r.stage == "preprocess" for r in records)
    phases = list(dict.fromkeys(r.phase for r in records))
    assert phases == ["session", "count", "dictionaries", "transform"]
    details = {r.phase: r.detail for r in records}
    assert details["count"].startswith("days 0-2, ") and details["dictionaries"] == "from days 0-2"
    assert details["transform"] == "train days 0-1, test/validation day 2"
    fractions = [r.fraction for r in records if r.fraction is not None]
    assert fractions == sorted(fractions) and fractions[-1] == 1.0
    count = [r for r in records if r.phase == "count"]
    assert count[-1].unit == "tasks" and count[-1].done >= 3 and count[-1].estimated
    assert all(r.rows is None or 0 <= r.rows < 600 for r in count)  # rows read, while reading
    # the Spark event log, for the History Server (Spark 4: a rolling log, zstd-compressed)
    import pyarrow as pa

    [app] = list(events.iterdir())
    assert not list(app.glob("appstatus_*.inprogress"))  # the application was closed
    text = b""
    for part in sorted(app.glob("events_*")):
        with pa.CompressedInputStream(str(part), "zstd") as stream:
            text += stream.read()
    assert b'"Event":"SparkListenerApplicationStart"' in text
    assert b'"Event":"SparkListenerApplicationEnd"' in text


@pytest.mark.spark
@pytest.mark.slow
def test_a_local_preprocess_listens_on_loopback_only(local_job):
    """The pipeline's own driver in local mode: its UI listened on *:4040 before."""
    from spark_cluster import loopback

    seen = local_job.listened
    assert local_job.returncode == 0, local_job.stderr[-3000:]
    assert len({port for _, port in seen}) >= 3, seen  # at least driver RPC, block manager, UI
    assert all(loopback(address) for address, _ in seen), sorted(seen)
