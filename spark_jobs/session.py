"""One Spark session for count, dictionaries and transform, built from ``SparkConfig``.

Precedence (later wins): our defaults, the ``--gpu`` profile, the conf file, ``--conf k=v``.
If a session is already active (tests, notebooks, ``spark-submit``), it is reused and only the
runtime-settable SQL options are applied to it.

An authenticated cluster's secret is never one of these settings: they go on the JVM's command
line (visible in ``ps``) and into the run's records. It is read from ``auth_secret_file`` and
set in the JVM through the py4j socket, where SparkConf picks it up (docs/cluster.md §2.2).
"""

from __future__ import annotations

import os
import re
import socket
import sys
from pathlib import Path

from dlrm_contracts.config import SparkConfig
from dlrm_contracts.secret_file import SecretFileError, read_secret_file
from dlrm_contracts.security import is_loopback, refuse_secret_settings
from spark_jobs.class_archive import with_archive
from spark_jobs.errors import PreprocessConfigError, PreprocessJobError
from spark_jobs.gpu import rapids_conf

# Whole-stage code generation over 40 columns and 26 joins yields methods above HotSpot's
# 8000-byte JIT limit, which HotSpot would leave interpreted: -DontCompileHugeMethods compiles
# them. The parallel collector suits this throughput-bound batch job better than G1.
#
# Generated methods can still be too big for C2: it then works for seconds and gives up ("out of
# nodes"), several times per job, CPU taken from the tasks on a small machine. Half the default
# node budget for Spark's generated classes only makes C2 give up early on those (they then run
# C1 code) and leaves every other method as it was.
_GENERATED = "org.apache.spark.sql.catalyst.expressions.GeneratedClass*::*"
JVM_OPTIONS = (
    "-XX:-DontCompileHugeMethods -XX:+UseParallelGC "
    f"-XX:CompileCommand=quiet -XX:CompileCommand=MaxNodeLimit,{_GENERATED},40000"
)
# Code generation, for the JIT's sake. Without the stage id in the class name, the same plan
# over another day file is the same source, so it is compiled (by Janino and by HotSpot) once
# instead of once per day. A lower split threshold cuts big expressions into methods small
# enough for C2 to compile.
CODEGEN_OPTIONS = {
    "spark.sql.codegen.useIdInClassName": "false",
    "spark.sql.codegen.methodSplitThreshold": "256",
}
_LOCAL_CORES = re.compile(r"^local\[(\d+|\*)(?:,\d+)?\]$")


def parse_conf_pairs(pairs: list[str]) -> dict[str, str]:
    """``["k=v", ...]`` → dict; a pair without '=' is a config error naming it."""
    conf = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise PreprocessConfigError(f"--conf {pair!r} must look like key=value")
        conf[key.strip()] = value.strip()
    return conf


def read_conf_file(path: str | Path) -> dict[str, str]:
    """A spark-defaults.conf style file: 'key value' or 'key=value' per line, '#' comments."""
    path = Path(path)
    if not path.exists():
        raise PreprocessConfigError(f"--conf-file {path} does not exist")
    if not path.is_file():
        raise PreprocessConfigError(f"--conf-file {path} is not a file")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise PreprocessConfigError(
            f"--conf-file {path} is not UTF-8 text ({error.reason} at byte {error.start})"
        ) from None
    except OSError as error:
        raise PreprocessConfigError(f"--conf-file {path} cannot be read: {error.strerror}") from None
    conf = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = re.match(r"^(\S+?)\s*(?:=|\s)\s*(.*)$", line)
        if not match:
            raise PreprocessConfigError(f"{path}:{number}: expected 'key value', got {line!r}")
        conf[match.group(1)] = match.group(2).strip()
    return conf


_LOCAL_MASTER = re.compile(
    r"^local(?:\[(?:\*|[1-9]\d*)(?:,[1-9]\d*)?\]|-cluster\[[1-9]\d*,[1-9]\d*,[1-9]\d*\])?$"
)
_URL_MASTER = re.compile(r"^[a-z][a-z0-9+.-]*://\S+$")
_JVM_SIZE = re.compile(r"^[1-9]\d*[kmgt]$", re.IGNORECASE)


def check_spark_config(spark: SparkConfig) -> dict[str, str]:
    """Refuse, before anything is written or a JVM started, what Spark would only reject with a
    Java trace (or ignore); returns ``spark_settings(spark)`` (which reads --conf-file and the
    --gpu jar, so their errors come here too)."""
    master = spark.master or ""
    if master.startswith("local") and not _LOCAL_MASTER.match(master):
        raise PreprocessConfigError(
            f"--master {master!r}: local masters are local, local[N], local[*] or local[N,F] with N >= 1"
        )
    if not (master.startswith("local") or master == "yarn" or _URL_MASTER.match(master)):
        raise PreprocessConfigError(
            f"--master {master!r} is not a Spark master URL (local[N], spark://HOST:PORT, yarn, "
            "k8s://https://HOST:PORT)"
        )
    if not _JVM_SIZE.match(str(spark.driver_memory or "")):
        raise PreprocessConfigError(
            f"--driver-memory {spark.driver_memory!r} must be a size with a unit, e.g. 12g or 512m"
        )
    settings = spark_settings(spark)
    if not launched_by_spark_submit():  # under spark-submit, get_session checks its master
        deploy_security(spark, master)
    if spark.auth_secret_file:
        _read_secret(spark)
        _refuse_clear_secret(spark, settings)
    elif settings.get("spark.authenticate", "").lower() == "true" and master.startswith("spark://"):
        raise PreprocessConfigError(
            "spark.authenticate is on but no secret file is named: give the cluster's secret "
            "file with --auth-secret-file (spark.auth_secret_file)"
        )
    return settings


# Keys whose value is a secret: refused in --conf/--conf-file (Spark 4 reads secret *files* on
# Kubernetes only, so the .file variants would not help on a standalone cluster either).
_SECRET_KEYS = re.compile(r"^spark\.authenticate\.secret")
SECRET_KEY = "spark.authenticate.secret"


def _refuse_secret_settings(conf: dict[str, str]) -> None:
    """A cluster's shared secret has its own way in (the secret file); any other setting
    whose name says it holds a secret (a password, a token, a key) is refused too, since
    settings reach the JVM's command line (dlrm_contracts.security)."""
    for key in conf:
        if _SECRET_KEYS.match(key):
            raise PreprocessConfigError(
                f"{key} may not be given as a Spark setting (settings appear on command lines "
                "and in the run's records): put the secret in a file of mode 0600 and name it "
                "with --auth-secret-file (spark.auth_secret_file)"
            )
    refuse_secret_settings(conf, "Spark settings (--conf, --conf-file, spark.conf)")


def _master_host(master: str) -> str | None:
    """The host of a ``spark://HOST:PORT[,HOST:PORT]`` master URL (the first), else None."""
    match = re.match(r"^spark://\[?([^\]/:,]+)\]?(?::\d+)?", master)
    return match.group(1) if match else None


def _refuse_clear_secret(spark: SparkConfig, settings: dict[str, str]) -> None:
    """Authentication without RPC encryption off loopback: the driver would send the secret to
    its executors in clear (start-cluster.sh refuses such a cluster too)."""
    encrypted = settings.get("spark.network.crypto.enabled", "false").lower() == "true"
    host = _master_host(spark.master or "")
    if not encrypted and host is not None and not is_loopback(host):
        raise PreprocessConfigError(
            f"--no-rpc-encryption (spark.rpc_encryption: false) with an authenticated cluster "
            f"at {host}, which is not a loopback address: Spark would send the shared secret "
            "to every executor unencrypted (executors get the driver's settings over RPC); "
            "keep RPC encryption on"
        )


def _read_secret(spark: SparkConfig) -> str:
    try:
        return read_secret_file(spark.auth_secret_file)
    except SecretFileError as error:
        raise PreprocessConfigError(f"--auth-secret-file: {error}") from None


# Encrypted RPC with no fallback to unencrypted SASL (as the cluster's daemons have it): a
# peer that does not encrypt is refused instead of talked to in clear. Both are executor
# startup settings, so executors get them from the driver when they are launched.
RPC_ENCRYPTION = {"spark.network.crypto.enabled": "true", "spark.network.crypto.saslFallback": "false"}

INSECURE_WARNING = (
    "WARNING: spark.insecure (--insecure): the job's Spark traffic on {where} is "
    "neither authenticated nor encrypted; anyone who reaches it can run code "
    "as this user. Use this only on a network where you trust every host."
)


def deploy_kind(master: str) -> str:
    """local, standalone, kubernetes, yarn or other: what decides who may connect."""
    if master.startswith("local"):
        return "local"
    if master.startswith("spark://"):
        return "standalone"
    if master.startswith("k8s://"):
        return "kubernetes"
    return "yarn" if master.startswith("yarn") else "other"


def deploy_security(spark: SparkConfig, master: str, warn: bool = True) -> dict[str, str]:
    """The authentication and encryption settings a deploy mode needs (docs/cluster.md §2.2),
    or a PreprocessConfigError: off loopback, nothing runs unauthenticated or unencrypted
    unless spark.insecure (--insecure) says so, loudly.

    Local mode and a standalone master on loopback stay on this machine. A standalone master
    elsewhere needs the cluster's secret file. On Kubernetes and YARN, Spark makes a secret
    per application and hands it to the executors itself, so authentication is switched on
    here; executors always talk to the driver over the network there. ``warn``: print the
    --insecure warning (the job does; the pipeline's early check leaves it to the job).
    """
    kind = deploy_kind(master)
    host = _master_host(master)
    if kind == "local" or (kind == "standalone" and host and is_loopback(host)):
        return {}
    if spark.insecure:
        if warn:
            print(INSECURE_WARNING.format(where=master), file=sys.stderr)
        return {}
    if not spark.rpc_encryption:
        raise PreprocessConfigError(
            f"--no-rpc-encryption with the master {master}, which is not on loopback: the "
            "driver's settings (the secret among them) would cross the network unencrypted; "
            "keep RPC encryption on, or say --insecure (spark.insecure) on a network you "
            "trust entirely"
        )
    if kind in ("standalone", "other") and not spark.auth_secret_file:
        raise PreprocessConfigError(
            f"the master {master} is not on loopback and no secret file is named: an "
            "unauthenticated cluster runs anyone's code; give the cluster's secret file with "
            "--auth-secret-file (run_pipeline.sh --spark-secret-file, spark.auth_secret_file), "
            "or say --insecure (spark.insecure) on a network you trust entirely"
        )
    return {"spark.authenticate": "true", **RPC_ENCRYPTION}


def ui_settings(spark: SparkConfig, settings: dict[str, str], environment: dict[str, str]) -> dict[str, str]:
    """The driver's web UI stays on loopback or behind an authentication filter: Spark binds it
    to SPARK_LOCAL_IP (of the environment the JVM started with), else to every interface, and
    its ACLs restrict nobody without a filter (spark.ui.filters). Otherwise it is switched off
    (spark.ui.enabled=false), unless spark.insecure."""
    address = environment.get("SPARK_LOCAL_IP", "")
    if (
        settings.get("spark.ui.enabled", "true").lower() == "false"
        or settings.get("spark.ui.filters")
        or (address and is_loopback(address))
        or spark.insecure
    ):
        return {}
    print(
        f"spark_jobs: the driver's web UI would listen on {address or 'every interface'} "
        "without an authentication filter: it is off (set SPARK_LOCAL_IP=127.0.0.1 or "
        "spark.ui.filters to keep it; docs/cluster.md §2.2)",
        file=sys.stderr,
    )
    return {"spark.ui.enabled": "false"}


def session_plan(
    spark: SparkConfig, submitted: bool, master: str, environment: dict[str, str]
) -> tuple[dict[str, str], dict[str, str]]:
    """(environment for the JVM, settings) of the session in its deploy mode: ``master`` is
    spark-submit's under spark-submit (whose JVM already runs with ``environment``), else
    ``spark.master``. What get_session applies; what the tests read per deploy mode."""
    settings = spark_settings(spark, under_spark_submit=submitted)
    if submitted:
        settings = {k: v for k, v in settings.items() if k not in _SUBMIT_OWNED}
        jvm_environment: dict[str, str] = {}
    else:
        jvm_environment, network = driver_network(spark)
        settings = {**settings, **network}
    security = deploy_security(spark, master)
    # over the user's settings: opting out of security is spark.insecure's job, said loudly
    settings = {**settings, **security}
    if settings.get("spark.network.crypto.enabled", "").lower() == "true":
        settings.setdefault("spark.network.crypto.saslFallback", "false")
    settings.update(ui_settings(spark, settings, {**environment, **jvm_environment}))
    return jvm_environment, settings


def security_settings(spark: SparkConfig) -> dict[str, str]:
    """Authentication, encryption and the web UI's ACLs (never the secret itself).

    ACLs restrict users an authentication filter (spark.ui.filters) has named; without one
    Spark lets every request through, which docs/cluster.md §2.2 spells out."""
    conf = {"spark.acls.enable": "true", "spark.ui.killEnabled": str(spark.ui_kill_enabled).lower()}
    if spark.ui_admin_users:
        conf["spark.admin.acls"] = ",".join(spark.ui_admin_users)
    if spark.ui_view_users:
        conf["spark.ui.view.acls"] = ",".join(spark.ui_view_users)
    if spark.auth_secret_file:
        conf["spark.authenticate"] = "true"
        if spark.rpc_encryption:
            conf.update(RPC_ENCRYPTION)
    if spark.io_encryption:
        conf["spark.io.encryption.enabled"] = "true"
    return conf


def local_cores(master: str) -> int | None:
    """The cores a local master (``local``, ``local[N]``, ``local[*]``) runs on; None for a
    cluster's master, whose cores this machine cannot see."""
    match = _LOCAL_CORES.match(master)
    if master == "local":
        return 1
    if not match:
        return None
    if match.group(1) == "*":
        return os.cpu_count() or 1
    return int(match.group(1))


def spark_settings(spark: SparkConfig, under_spark_submit: bool = False) -> dict[str, str]:
    """Every Spark setting the session will get (the ``--gpu`` profile included).

    Shuffle partitions are sized from a local master's cores; under spark-submit the master is
    spark-submit's (``spark.master`` here is ignored), so Spark's own default applies unless
    ``shuffle_partitions`` or a conf sets them.
    """
    cores = None if under_spark_submit else local_cores(spark.master)
    partitions = spark.shuffle_partitions or (max(4, 4 * cores) if cores else 0)
    conf = {
        "spark.master": spark.master,
        "spark.app.name": spark.app_name,
        "spark.driver.memory": spark.driver_memory,
        "spark.sql.adaptive.enabled": "true",
        "spark.sql.parquet.compression.codec": "snappy",
        "spark.serializer": "org.apache.spark.serializer.KryoSerializer",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.session.timeZone": "UTC",
        # the Arrow engine's binary values (partial counts, totals) are large: bound a batch
        "spark.sql.execution.arrow.maxBytesPerBatch": str(64 << 20),
        "spark.driver.extraJavaOptions": JVM_OPTIONS,
        "spark.executor.extraJavaOptions": JVM_OPTIONS,
        **CODEGEN_OPTIONS,
    }
    if partitions:
        conf["spark.sql.shuffle.partitions"] = str(partitions)
    if cores:
        conf["spark.python.daemon.module"] = "spark_jobs.engines.arrow.python_daemon"
    if spark.executor_memory:
        conf["spark.executor.memory"] = spark.executor_memory
    if spark.local_dir:
        conf["spark.local.dir"] = spark.local_dir
    if spark.event_log_dir:
        conf["spark.eventLog.enabled"] = "true"
        conf["spark.eventLog.dir"] = event_log_url(spark.event_log_dir)
    conf.update(security_settings(spark))
    if spark.gpu:
        conf.update(rapids_conf(spark))
    if spark.conf_file:
        conf.update(read_conf_file(spark.conf_file))
    conf.update({str(k): str(v) for k, v in (spark.conf or {}).items()})
    _refuse_secret_settings(conf)
    return conf


def _local_event_log_dir(directory: str) -> Path | None:
    """The event log's directory on this machine; None for a URL (hdfs://, s3a://)."""
    if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", directory) and not directory.startswith("file:"):
        return None
    return Path(re.sub(r"^file:(//)?", "", directory)).expanduser().resolve()


def event_log_url(directory: str) -> str:
    """A local event-log directory as an absolute file: URL (the driver's working directory is
    not the History Server's); a URL as it is."""
    local = _local_event_log_dir(directory)
    return directory if local is None else local.as_uri()


def _make_event_log_dir(spark: SparkConfig) -> None:
    """Spark refuses to start when the event log's local directory is missing: make it."""
    local = _local_event_log_dir(spark.event_log_dir)
    if local is None:
        return
    try:
        local.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise PreprocessConfigError(
            f"spark.event_log_dir {spark.event_log_dir} cannot be created: {error.strerror or error}"
        ) from None


# Under spark-submit the JVM already runs with spark-submit's master and driver memory.
_SUBMIT_OWNED = ("spark.master", "spark.driver.memory")


def launched_by_spark_submit() -> bool:
    return "PYSPARK_GATEWAY_PORT" in os.environ


# Where the driver's web UI listens: Spark binds every UI to SPARK_LOCAL_IP, else to every
# interface (WebUI.initServer, Spark 4.0.1), and its ACLs restrict nobody without an
# authentication filter. Reach it through an SSH tunnel (docs/cluster.md §2.2).
UI_ADDRESS = "127.0.0.1"


def driver_network(spark: SparkConfig) -> tuple[dict[str, str], dict[str, str]]:
    """(environment, settings) that put the driver's web UI on loopback and its RPC endpoint
    where the executors reach it.

    Local mode: everything on loopback. A standalone or Kubernetes master: the RPC endpoint on
    ``bind_address``, else on this machine's address towards the master, set explicitly
    (spark.driver.host/bindAddress) since SPARK_LOCAL_IP, which the UI follows, says loopback.
    YARN: Spark's own choice (or ``bind_address``), as YARN's web proxy must reach the UI.
    """
    master = spark.master or ""
    if master.startswith("local"):
        return {"SPARK_LOCAL_IP": UI_ADDRESS}, {}
    if master.startswith("yarn"):
        return ({"SPARK_LOCAL_IP": spark.bind_address} if spark.bind_address else {}), {}
    address = spark.bind_address or _address_towards(master)
    return (
        {"SPARK_LOCAL_IP": UI_ADDRESS},
        {"spark.driver.host": address, "spark.driver.bindAddress": address},
    )


def _address_towards(master: str) -> str:
    """This machine's address on the route to the master's host (no packet is sent)."""
    match = re.match(r"^[a-z0-9+]+://(?:[a-z]+://)?\[?([^\]/:,]+)", master)
    host = match.group(1) if match else None
    try:
        family = socket.AF_INET6 if host and ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect((host, 9))
            return probe.getsockname()[0]
    except (OSError, TypeError):
        raise PreprocessConfigError(
            f"cannot tell which address of this machine reaches the master {master}: name it "
            "with --bind-address (spark.bind_address)"
        ) from None


def get_session(spark: SparkConfig):
    """The active session (with our SQL options applied) or a new one from ``spark_settings``."""
    from pyspark.sql import SparkSession

    submitted = launched_by_spark_submit()
    master = (_submit_master() or spark.master) if submitted else spark.master
    environment, settings = session_plan(spark, submitted, master, dict(os.environ))
    active = SparkSession.getActiveSession()
    if active is not None:
        for key, value in settings.items():
            if key.startswith("spark.sql.") and key != "spark.sql.session.timeZone":
                try:
                    active.conf.set(key, value)
                except Exception:  # noqa: BLE001 — a static SQL conf: the running session keeps its own
                    pass
        return active
    if not submitted and local_cores(spark.master):
        # local Python workers run this interpreter, which has the Arrow engine's packages (a
        # cluster's executors use their own: PYSPARK_PYTHON / spark.pyspark.python there)
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if not submitted:  # spark-submit's JVM has started already
        settings = with_archive(settings, spark.class_archive)
    os.environ.update(environment)  # inherited by the JVM pyspark starts (none if submitted)
    if spark.event_log_dir:
        _make_event_log_dir(spark)
    if spark.auth_secret_file:
        _start_jvm_with_secret(spark, settings)
    builder = SparkSession.builder
    for key, value in settings.items():
        builder = builder.config(key, value)
    try:
        session = builder.getOrCreate()
    except Exception:
        _check_accepted(spark)  # a refusal surfaces here as a stopped SparkContext
        raise
    _check_accepted(spark)
    session.sparkContext.setLogLevel(spark.log_level)
    return session


def stop_session() -> None:
    """Stop the running Spark application, if any, before the process exits. Left to the
    JVM's shutdown hook, the stop races the Python exit: a caller that sees the process end
    can still find the event log marked in progress (the History Server then lists the run as
    incomplete) and the JVM's executors still running."""
    from pyspark import SparkContext

    context = SparkContext._active_spark_context
    if context is not None:
        context.stop()


def _submit_master() -> str:
    """The master spark-submit started the JVM with (its spark.master system property)."""
    from pyspark import SparkContext

    SparkContext._ensure_initialized()
    return str(SparkContext._jvm.java.lang.System.getProperty("spark.master") or "")


def _check_accepted(spark: SparkConfig) -> None:
    """A standalone master that refuses the application (wrong or missing secret, or none
    reachable) leaves a SparkContext without an application id after Spark's three
    registration attempts, stopping in the background, and the session then fails with
    'Cannot call methods on a stopped SparkContext'; say what happened instead. (The context
    only exists once the master has registered the application, giving it its app-... id,
    or given up.)"""
    from pyspark import SparkContext

    context = SparkContext._active_spark_context
    if (
        context is None
        or not context.master.startswith("spark://")
        or context.applicationId.startswith("app-")
    ):
        return
    context.stop()
    hint = (
        "the secret in --auth-secret-file is not the cluster's"
        if spark.auth_secret_file
        else "an authenticated cluster needs its secret file: --auth-secret-file "
        "(run_pipeline.sh --spark-secret-file)"
    )
    raise PreprocessJobError(
        f"the Spark master {context.master} did not accept the job (All masters are "
        f"unresponsive): is it running and reachable? If so, {hint}. The driver log above and "
        "the master's log say more"
    )


def _start_jvm_with_secret(spark: SparkConfig, settings: dict[str, str]) -> None:
    """Start the JVM (or, under spark-submit, join it) with the non-secret settings, then set
    the secret as a JVM system property: the SparkConf the session is built from loads it from
    there, and no command line, environment or file of ours ever holds it."""
    from pyspark import SparkConf, SparkContext

    secret = _read_secret(spark)
    SparkContext._ensure_initialized(conf=SparkConf(loadDefaults=False).setAll(settings.items()))
    SparkContext._jvm.java.lang.System.setProperty(SECRET_KEY, secret)
