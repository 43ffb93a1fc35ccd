"""Cluster security without starting Spark: who authenticates, the secret file's rules, the
job's settings, and that the secret travels by file path only (docs/cluster.md §2.2).

The real cluster (authenticated master + worker, refused jobs) is tests/test_spark_cluster.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from dlrm_contracts.config import SparkConfig
from dlrm_contracts.errors import ExitCode, UsageError
from dlrm_contracts.secret_file import SecretFileError
from dlrm_contracts.security import SecretSettingError, secret_setting
from dlrm_contracts.secret_file import read_secret_file
from pipeline.cluster_auth import is_loopback, main as cluster_auth_main
from spark_jobs.errors import PreprocessConfigError
from spark_jobs.session import check_spark_config, spark_settings
from pipeline_helpers import fake_spark_submit

REPO = Path(__file__).resolve().parent.parent
SUBMIT = REPO / "docker" / "spark-cluster" / "submit.sh"
SECRET = "0123456789abcdef" * 4


def _secret_file(path: Path, text: str = SECRET + "\n", mode: int = 0o600) -> Path:
    path.write_text(text)
    path.chmod(mode)
    return path


def _setting_runs(tmp_path: Path, name: str, value: str) -> list[list[str]]:
    """The three ways a Spark setting reaches a run: the YAML's spark.conf, a --conf-file line
    (through the YAML's spark.conf_file), and spark_jobs' --conf."""
    yaml_config = tmp_path / "inline.yaml"
    yaml_config.write_text(f'spark:\n  conf:\n    {name}: "{value}"\n')
    conf_file = _secret_file(tmp_path / "spark.conf", f"{name} {value}\n")
    file_config = tmp_path / "file.yaml"
    file_config.write_text(f"spark:\n  conf_file: {conf_file}\n")
    runs = [
        [
            sys.executable,
            "-m",
            "pipeline",
            "--config",
            str(config),
            "--workdir",
            str(tmp_path / "w"),
            "--stages",
            "preprocess",
            "--input",
            str(tmp_path),
        ]
        for config in (yaml_config, file_config)
    ]
    runs.append(
        [
            sys.executable,
            "-m",
            "spark_jobs",
            "--input",
            str(tmp_path),
            "--workdir",
            str(tmp_path / "w"),
            "--conf",
            f"{name}={value}",
        ]
    )
    return runs


def _prepare(tmp_path: Path, capsys, *args: str) -> tuple[int, dict[str, str], str]:
    code = cluster_auth_main(["prepare", "--dir", str(tmp_path / "auth"), *args])
    out, err = capsys.readouterr()
    env = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    return code, env, err


def test_loopback_addresses_are_recognised():
    assert is_loopback("127.0.0.1") and is_loopback("127.3.4.5") and is_loopback("::1")
    assert is_loopback("localhost")
    assert not is_loopback("10.1.2.3") and not is_loopback("192.0.2.7") and not is_loopback("0.0.0.0")
    assert not is_loopback("no-such-host.invalid")  # unresolvable: authenticate


def test_off_loopback_the_cluster_authenticates_by_default(tmp_path, capsys):
    code, env, err = _prepare(tmp_path, capsys, "--host", "10.1.2.3")
    assert code == 0, err
    assert env["AUTH"] == "on" and env["RPC_ENCRYPTION"] == "on" and env["IO_ENCRYPTION"] == "off"
    secret_file = Path(env["SECRET_FILE"])
    assert secret_file == tmp_path / "auth" / "secret"
    assert (secret_file.stat().st_mode & 0o777) == 0o600
    assert ((tmp_path / "auth").stat().st_mode & 0o777) == 0o700
    secret = read_secret_file(secret_file)
    conf = Path(env["DAEMON_CONF"])
    assert (conf.stat().st_mode & 0o777) == 0o600
    lines = set(conf.read_text().splitlines())
    assert {
        "spark.authenticate true",
        f"spark.authenticate.secret {secret}",
        "spark.network.crypto.enabled true",
        "spark.network.crypto.saslFallback false",
        "spark.master.rest.enabled false",
        "spark.ui.killEnabled false",
        "spark.acls.enable true",
    } <= lines
    assert secret not in err and secret not in "".join(f"{k}={v}" for k, v in env.items())
    # A restart keeps the secret: workers on other hosts hold copies of it.
    code, again, _ = _prepare(tmp_path, capsys, "--host", "10.1.2.3")
    assert code == 0 and read_secret_file(again["SECRET_FILE"]) == secret


def test_loopback_is_open_unless_asked_and_insecure_is_loud(tmp_path, capsys):
    code, env, err = _prepare(tmp_path / "a", capsys, "--host", "127.0.0.1")
    assert code == 0 and env["AUTH"] == "off" and env["SECRET_FILE"] == "" and err == ""
    assert "spark.authenticate" not in Path(env["DAEMON_CONF"]).read_text()
    code, env, _ = _prepare(
        tmp_path / "b",
        capsys,
        "--host",
        "127.0.0.1",
        "--authenticate",
        "--io-encryption",
        "--no-rpc-encryption",
    )
    assert code == 0 and env["AUTH"] == "on" and env["IO_ENCRYPTION"] == "on"
    assert env["RPC_ENCRYPTION"] == "off"
    code, env, err = _prepare(tmp_path / "c", capsys, "--host", "10.1.2.3", "--insecure")
    assert code == 0 and env["AUTH"] == "off"
    assert "WARNING" in err and "WITHOUT authentication" in err and "arbitrary code" in err


def test_a_user_secret_file_must_be_private_and_well_formed(tmp_path, capsys):
    good = _secret_file(tmp_path / "good")
    code, env, _ = _prepare(tmp_path / "g", capsys, "--host", "10.0.0.1", "--secret-file", str(good))
    assert code == 0 and env["SECRET_FILE"] == str(good)
    assert f"spark.authenticate.secret {SECRET}" in Path(env["DAEMON_CONF"]).read_text()

    bad_cases = {
        "readable": (_secret_file(tmp_path / "r", mode=0o644), "chmod 600"),
        "short": (_secret_file(tmp_path / "s", "abc\n"), "at least 32"),
        "escape": (_secret_file(tmp_path / "e", "x\\" * 20 + "\n"), "at least 32"),
        "two lines": (_secret_file(tmp_path / "t", f"{SECRET}\n{SECRET}\n"), "exactly one"),
        "missing": (tmp_path / "none", "cannot be read"),
    }
    for name, (path, message) in bad_cases.items():
        with pytest.raises(SecretFileError, match=message) as caught:
            read_secret_file(path)
        assert SECRET not in str(caught.value), name
        code, _, err = _prepare(
            tmp_path / name.replace(" ", "_"), capsys, "--host", "10.0.0.1", "--secret-file", str(path)
        )
        assert code == 2 and message in err and SECRET not in err, (name, err)
    code, _, err = _prepare(
        tmp_path / "x", capsys, "--host", "10.0.0.1", "--insecure", "--secret-file", str(good)
    )
    assert code == 2 and "--secret-file" in err
    code, _, err = _prepare(tmp_path / "y", capsys, "--host", "10.0.0.1", "--admin-users", "a b")
    assert code == 2 and "--admin-users" in err


def test_job_settings_carry_security_but_never_the_secret(tmp_path):
    secret_file = _secret_file(tmp_path / "secret")
    spark = SparkConfig(
        master="spark://10.0.0.1:7077",
        auth_secret_file=str(secret_file),
        io_encryption=True,
        ui_admin_users=["alice", "bob"],
        ui_view_users=["carol"],
    )
    settings = check_spark_config(spark)
    assert settings["spark.authenticate"] == "true"
    assert settings["spark.network.crypto.enabled"] == "true"
    assert settings["spark.io.encryption.enabled"] == "true"
    assert settings["spark.acls.enable"] == "true" and settings["spark.ui.killEnabled"] == "false"
    assert settings["spark.admin.acls"] == "alice,bob" and settings["spark.ui.view.acls"] == "carol"
    assert SECRET not in repr(settings)
    assert "spark.network.crypto.enabled" not in spark_settings(
        SparkConfig(master="spark://h:7077", auth_secret_file=str(secret_file), rpc_encryption=False)
    )
    plain = spark_settings(SparkConfig(master="local[2]"))
    assert "spark.authenticate" not in plain and plain["spark.ui.killEnabled"] == "false"


def test_the_secret_is_refused_as_a_setting(tmp_path):
    conf_file = tmp_path / "extra.conf"
    conf_file.write_text(f"spark.authenticate.secret {SECRET}\n")
    for make in (
        lambda: SparkConfig(conf={"spark.authenticate.secret": SECRET}),
        lambda: SparkConfig(conf_file=str(conf_file)),
    ):
        with pytest.raises(UsageError, match="--auth-secret-file") as caught:
            check_spark_config(make())
        assert SECRET not in str(caught.value)
    with pytest.raises(PreprocessConfigError, match="no secret file"):
        check_spark_config(SparkConfig(master="spark://h:7077", conf={"spark.authenticate": "true"}))
    with pytest.raises(PreprocessConfigError, match="chmod 600"):
        check_spark_config(
            SparkConfig(
                master="spark://h:7077", auth_secret_file=str(_secret_file(tmp_path / "s", mode=0o640))
            )
        )


def test_pipeline_refuses_a_world_readable_secret_file_before_any_stage(tmp_path):
    secret_file = _secret_file(tmp_path / "secret", mode=0o644)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipeline",
            "--workdir",
            str(tmp_path / "w"),
            "--stages",
            "preprocess",
            "--spark-master",
            "spark://10.0.0.1:7077",
            "--spark-secret-file",
            str(secret_file),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert proc.returncode == 2, proc.stderr
    assert "chmod 600" in proc.stderr and SECRET not in proc.stderr + proc.stdout
    assert not (tmp_path / "w").exists()


def test_submit_passes_the_secret_file_never_the_secret(tmp_path):
    """submit.sh's command for an authenticated cluster: the job gets the secret file's path
    and the cluster's settings; the real submission is in tests/test_spark_cluster.py."""
    python = fake_spark_submit(tmp_path, 'echo "SPARK_LOCAL_IP=$SPARK_LOCAL_IP"\n')
    cluster = tmp_path / "cl"
    (cluster / "auth").mkdir(parents=True)
    secret_file = _secret_file(cluster / "auth" / "secret")
    (cluster / "cluster.env").write_text(
        f"MASTER_URL=spark://10.0.0.1:7077\nHOST=10.0.0.1\nAUTH=on\nSECRET_FILE={secret_file}\n"
        "RPC_ENCRYPTION=on\nIO_ENCRYPTION=on\nADMIN_USERS=alice\nVIEW_USERS=\n"
    )
    env = {"PATH": os.environ["PATH"], "PYTHON": str(python)}
    proc = subprocess.run(
        ["bash", str(SUBMIT), "--dir", str(cluster), "--", "--input", "x"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    args = proc.stdout.splitlines()
    assert args[args.index("--auth-secret-file") + 1] == str(secret_file)
    assert "--io-encryption" in args and "--no-rpc-encryption" not in args
    assert args[args.index("--ui-admin-users") + 1] == "alice"
    assert "SPARK_LOCAL_IP=127.0.0.1" in args  # the driver's web UI: loopback only
    assert args[args.index("spark.driver.host=10.0.0.1") - 1] == "--conf"
    assert "spark.driver.bindAddress=10.0.0.1" in args
    assert SECRET not in proc.stdout + proc.stderr
    secret_file.unlink()
    proc = subprocess.run(
        ["bash", str(SUBMIT), "--dir", str(cluster), "--", "--input", "x"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=tmp_path,
    )
    assert proc.returncode == 1 and "secret file" in proc.stderr


def test_submit_passes_insecure_for_a_cluster_started_insecure(tmp_path):
    """A cluster started with --insecure (AUTH=off): the job says --insecure too, since it
    refuses an unauthenticated master off loopback otherwise."""
    python = fake_spark_submit(tmp_path)
    cluster = tmp_path / "cl"
    cluster.mkdir()
    (cluster / "cluster.env").write_text(
        "MASTER_URL=spark://10.0.0.1:7077\nHOST=10.0.0.1\nAUTH=off\nSECRET_FILE=\nRPC_ENCRYPTION=off\n"
    )
    proc = subprocess.run(
        ["bash", str(SUBMIT), "--dir", str(cluster), "--", "--input", "x"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env={"PATH": os.environ["PATH"], "PYTHON": str(python)},
    )
    assert proc.returncode == 0, proc.stderr
    args = proc.stdout.splitlines()
    assert "--insecure" in args and "--auth-secret-file" not in args


SECRET_NAMED = [
    "spark.org.apache.spark.ui.JWSFilter.param.secretKey",
    "spark.ssl.keyPassword",
    "spark.ssl.keyStorePassword",
    "spark.ssl.ui.trustStorePassword",
    "spark.hadoop.fs.s3a.secret.key",
    "spark.hadoop.fs.s3a.access.key",
    "spark.hadoop.fs.s3a.session.token",
    "spark.kubernetes.authenticate.oauthToken",
    "spark.executorEnv.AWS_SECRET_ACCESS_KEY",
    "spark.executorEnv.GITHUB_TOKEN",
    "spark.hadoop.fs.azure.account.key.acct.blob.core.windows.net",
    "spark.hadoop.fs.gs.auth.service.account.private.key",
    "spark.hadoop.fs.azure.account.oauth2.client.secret",
    "spark.authenticate.secret",
]
NOT_SECRET_NAMED = [
    "spark.ssl.keyStore",
    "spark.ssl.keyStoreType",
    "spark.kerberos.keytab",
    "spark.authenticate",
    "spark.authenticate.secretBitLength",
    "spark.network.crypto.keyLength",
    "spark.network.crypto.keyFactoryAlgorithm",
    "spark.io.encryption.keySizeBits",
    "spark.io.encryption.keygen.algorithm",
    "spark.kubernetes.driver.secrets.spark-auth",
    "spark.kubernetes.executor.secretKeyRef.ENV_NAME",
    "spark.kubernetes.authenticate.oauthTokenFile",
    "spark.hadoop.fs.s3a.security.credential.provider.path",
    "spark.security.credentials.hive.enabled",
    "spark.redaction.regex",
    "spark.sql.shuffle.partitions",
    "spark.ui.filters",
]


def test_secret_settings_are_known_by_their_names():
    assert [name for name in SECRET_NAMED if not secret_setting(name)] == []
    assert [name for name in NOT_SECRET_NAMED if secret_setting(name)] == []


@pytest.mark.parametrize(
    "name",
    [
        "spark.org.apache.spark.ui.JWSFilter.param.secretKey",
        "spark.ssl.keyStorePassword",
        "spark.hadoop.fs.s3a.secret.key",
    ],
)
def test_a_secret_setting_is_refused_before_anything_is_written_or_started(tmp_path, name):
    """In the YAML's spark.conf, in a --conf-file, or as spark_jobs' --conf: exit 2, the
    setting named, its value nowhere (stdout, stderr, any file), no workdir."""
    value = "s3cr3t-" + SECRET
    for argv in _setting_runs(tmp_path, name, value):
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=tmp_path)
        assert proc.returncode == ExitCode.USAGE, proc.stderr
        assert f"{name} looks like a secret" in proc.stderr and "Traceback" not in proc.stderr
        assert value not in proc.stdout + proc.stderr
        assert not (tmp_path / "w").exists()
    with pytest.raises(SecretSettingError):
        SparkConfig(conf={name: value})


def test_authentication_without_rpc_encryption_is_refused_off_loopback(tmp_path, capsys):
    """Executors get the driver's settings, the shared secret among them, over RPC
    (RetrieveSparkAppConfig): unencrypted, the secret crosses the network in clear."""
    code, _, err = _prepare(tmp_path / "a", capsys, "--host", "10.1.2.3", "--no-rpc-encryption")
    assert code == 2 and "--no-rpc-encryption" in err and "unencrypted" in err
    assert not (tmp_path / "a" / "auth" / "daemon.conf").exists()
    code, _, err = _prepare(
        tmp_path / "b", capsys, "--host", "10.1.2.3", "--authenticate", "--no-rpc-encryption"
    )
    assert code == 2 and "--no-rpc-encryption" in err
    code, env, err = _prepare(
        tmp_path / "c", capsys, "--host", "10.1.2.3", "--insecure", "--no-rpc-encryption"
    )
    assert code == 0 and env["AUTH"] == "off" and "WARNING" in err
    code, env, _ = _prepare(
        tmp_path / "d", capsys, "--host", "127.0.0.1", "--authenticate", "--no-rpc-encryption"
    )
    assert code == 0 and env["AUTH"] == "on" and env["RPC_ENCRYPTION"] == "off"
    secret_file = _secret_file(tmp_path / "secret")
    with pytest.raises(PreprocessConfigError, match="unencrypted"):
        check_spark_config(
            SparkConfig(
                master="spark://10.0.0.1:7077", rpc_encryption=False, auth_secret_file=str(secret_file)
            )
        )
    check_spark_config(
        SparkConfig(master="spark://127.0.0.1:7077", rpc_encryption=False, auth_secret_file=str(secret_file))
    )


# Secrets inside values (issue: a secret hidden by its name only): (setting, value) pairs.
SECRET_IN_VALUE = [
    ("spark.driver.extraJavaOptions", "-XX:+UseParallelGC -Dspark.authenticate.secret=" + SECRET),
    ("spark.executor.extraJavaOptions", "-Djavax.net.ssl.keyStorePassword=" + SECRET),
    ("spark.executorEnv.DB_PASSWORD", SECRET),
    ("spark.executorEnv.JAVA_TOOL_OPTIONS", "-Dfs.s3a.secret.key=" + SECRET),
    ("spark.yarn.appMasterEnv.OPTS", "MODE=fast DB_PASSWORD=" + SECRET),
    ("spark.eventLog.dir", f"s3a://AKIAEXAMPLE:{SECRET}@bucket/spark-events"),
    ("spark.hadoop.fs.defaultFS", f"hdfs://etl:{SECRET}@namenode:8020/"),
]
NOT_SECRET_VALUES = [
    "-XX:-DontCompileHugeMethods -XX:CompileCommand=MaxNodeLimit,Gen*::*,40000",
    "-Dspark.authenticate.secretBitLength=256",
    "s3a://bucket/spark-events",
    "hdfs://namenode:8020/logs",
    "k8s://https://10.0.0.1:6443",
    "spark://host1:7077,host2:7077",
    "file:///tmp/events",
    "MODE=fast",
    "https://user@example.com/repo",
]


def test_secrets_inside_values_are_recognised_and_plain_values_are_not():
    from dlrm_contracts.security import secret_in_value

    assert [v for _, v in SECRET_IN_VALUE if not (secret_in_value(v) or secret_setting(_))] == []
    assert [v for v in NOT_SECRET_VALUES if secret_in_value(v)] == []


@pytest.mark.parametrize("name,value", SECRET_IN_VALUE)
def test_a_secret_inside_a_value_is_refused_before_anything_is_written_or_started(tmp_path, name, value):
    """A YAML spark.conf entry, a --conf-file line, spark_jobs' --conf: exit 2 naming the
    setting, the secret in no output and no file (effective_config.yaml, logs), no workdir."""
    for argv in _setting_runs(tmp_path, name, value):
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=tmp_path)
        assert proc.returncode == ExitCode.USAGE, proc.stderr
        assert name in proc.stderr and "Traceback" not in proc.stderr
        assert SECRET not in proc.stdout + proc.stderr
        assert not (tmp_path / "w").exists()
    with pytest.raises(SecretSettingError):
        SparkConfig(conf={name: value})


def test_a_url_with_a_password_is_refused_in_any_setting(tmp_path):
    """The event-log directory, the input and a score file are recorded in
    effective_config.yaml and passed on command lines like settings."""
    from dlrm_contracts.config import config_from_dict

    url = f"s3a://AKIAEXAMPLE:{SECRET}@bucket/path"
    with pytest.raises(SecretSettingError, match="spark.event_log_dir") as raised:
        SparkConfig(event_log_dir=url)
    assert SECRET not in str(raised.value)
    for data in ({"input": url}, {"score": {"input": [url]}}):
        with pytest.raises(SecretSettingError) as raised:
            config_from_dict(data)
        assert SECRET not in str(raised.value)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipeline",
            "--workdir",
            str(tmp_path / "w"),
            "--stages",
            "preprocess",
            "--input",
            url,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert proc.returncode == ExitCode.USAGE and SECRET not in proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "w").exists()


# ------------------------------------------------------------ every deploy mode's settings
def _plan(
    spark: SparkConfig,
    master: str | None = None,
    submitted: bool = False,
    environment: dict[str, str] | None = None,
):
    from spark_jobs.session import session_plan

    return session_plan(spark, submitted, master or spark.master, environment or {})


def _encrypted_without_fallback(settings: dict[str, str]) -> bool:
    return (
        settings.get("spark.authenticate") == "true"
        and settings.get("spark.network.crypto.enabled") == "true"
        and settings.get("spark.network.crypto.saslFallback") == "false"
    )


def test_local_and_loopback_modes_stay_on_loopback_without_a_secret():
    for master in ("local[2]", "spark://127.0.0.1:7077"):
        environment, settings = _plan(SparkConfig(master=master, bind_address="127.0.0.1"))
        assert environment == {"SPARK_LOCAL_IP": "127.0.0.1"}
        assert "spark.authenticate" not in settings
        assert settings.get("spark.ui.enabled") != "false"


def test_a_standalone_master_off_loopback_needs_the_secret_file_or_insecure(tmp_path, capsys):
    master = "spark://10.1.2.3:7077"
    with pytest.raises(PreprocessConfigError, match="--insecure"):
        _plan(SparkConfig(master=master, bind_address="10.1.2.4"))
    for submitted in (False, True):  # python -m spark_jobs; submit.sh / spark-submit
        with pytest.raises(PreprocessConfigError, match="no secret file"):
            _plan(
                SparkConfig(master="local[2]"),
                master=master,
                submitted=submitted,
                environment={"SPARK_LOCAL_IP": "127.0.0.1"},
            )
    secret_file = str(_secret_file(tmp_path / "secret"))
    environment, settings = _plan(
        SparkConfig(master=master, bind_address="10.1.2.4", auth_secret_file=secret_file)
    )
    assert _encrypted_without_fallback(settings) and SECRET not in str(settings)
    assert environment["SPARK_LOCAL_IP"] == "127.0.0.1"
    with pytest.raises(PreprocessConfigError, match="unencrypted"):
        _plan(
            SparkConfig(
                master=master, bind_address="10.1.2.4", auth_secret_file=secret_file, rpc_encryption=False
            )
        )
    capsys.readouterr()
    _, settings = _plan(SparkConfig(master=master, bind_address="10.1.2.4", insecure=True))
    assert "spark.authenticate" not in settings and "WARNING" in capsys.readouterr().err


@pytest.mark.parametrize("master", ["k8s://https://10.0.0.1:6443", "yarn"])
def test_kubernetes_and_yarn_authenticate_and_encrypt_with_sparks_own_secret(master, tmp_path):
    """Spark makes a secret per application there and hands it to the executors itself;
    settings from a conf file (spark-submit --conf-file's way) cannot switch that off."""
    conf_file = tmp_path / "spark.conf"
    conf_file.write_text("spark.authenticate false\nspark.network.crypto.enabled false\n")
    for spark in (
        SparkConfig(master=master, bind_address="10.0.0.5"),
        SparkConfig(master=master, bind_address="10.0.0.5", conf_file=str(conf_file)),
    ):
        _, settings = _plan(spark)
        assert _encrypted_without_fallback(settings)
    with pytest.raises(PreprocessConfigError, match="unencrypted"):
        _plan(SparkConfig(master=master, bind_address="10.0.0.5", rpc_encryption=False))


def test_under_spark_submit_the_driver_ui_stays_on_loopback_or_behind_a_filter_or_is_off(capsys):
    """The image's driver mode and spark-submit: the JVM already runs; its UI listens on the
    SPARK_LOCAL_IP it started with, else on every pod interface."""
    master = "k8s://https://10.0.0.1:6443"
    spark = SparkConfig(master="local[2]")
    _, settings = _plan(spark, master, submitted=True, environment={})
    assert settings["spark.ui.enabled"] == "false" and _encrypted_without_fallback(settings)
    assert "web UI" in capsys.readouterr().err
    for environment in ({"SPARK_LOCAL_IP": "127.0.0.1"}, {"SPARK_LOCAL_IP": "::1"}):
        _, settings = _plan(spark, master, submitted=True, environment=environment)
        assert "spark.ui.enabled" not in settings
    filtered = SparkConfig(conf={"spark.ui.filters": "org.example.AuthFilter"})
    _, settings = _plan(filtered, master, submitted=True, environment={})
    assert "spark.ui.enabled" not in settings
    _, settings = _plan(SparkConfig(master="yarn", bind_address="10.0.0.5"))
    assert settings["spark.ui.enabled"] == "false"


def test_the_job_refuses_an_unauthenticated_master_off_loopback_before_the_workdir(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "spark_jobs",
            "--input",
            str(tmp_path),
            "--workdir",
            str(tmp_path / "w"),
            "--master",
            "spark://10.1.2.3:7077",
            "--bind-address",
            "10.1.2.4",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert proc.returncode == ExitCode.USAGE, proc.stderr
    assert "--insecure" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "w").exists()


def test_the_pipeline_refuses_an_unauthenticated_master_off_loopback_before_any_stage(tmp_path):
    (tmp_path / "in").mkdir()
    base = [
        sys.executable,
        "-m",
        "pipeline",
        "--workdir",
        str(tmp_path / "w"),
        "--stages",
        "preprocess",
        "--input",
        str(tmp_path / "in"),
        "--spark-master",
        "spark://10.1.2.3:7077",
    ]
    proc = subprocess.run(base, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == ExitCode.USAGE, proc.stderr
    assert "no secret file" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "w").exists()
