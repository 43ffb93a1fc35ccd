"""The daily Criteo/DLRM job as an Airflow DAG: one task that runs the pipeline's CLI.

Put this file (or a symlink to it) in Airflow's DAGs folder; docs/pipeline.md ("Airflow")
says how. The pipeline does the incremental work itself (a day already counted is reused from
``counts/days.json``, an up-to-date stage is skipped, a workdir in use is refused), so the DAG
adds no logic of its own: it runs ``python -m pipeline run`` on the landing directory and
turns the pipeline's exit code and JSON summary into the task's state. The summary is the
task's XCom ``summary`` whatever the state, for a downstream task or a look in the UI.

- success: exit 0 with some stage run;
- skipped: exit 0 with every stage reused (``skipped``): no new day landed since the last run;
- retried: a later attempt can succeed without a person: the workdir locked by another run
  (3), a Spark or trainer failure (5, 8, 9: a lost executor or host), a full disk (12), an
  interrupted or killed run (130, a signal), a run that outlived its time limit;
- failed without retry: a person must act: bad flags or config (2), bad input data or a
  preflight shortfall (4), a dataset that did not verify (7), a conversion, export or score
  refusal naming what to fix (6, 10, 11), a trainer's refusal (8 or 9 with the summary's status
  ``failed: train_refused`` or ``failed: eval_refused``: a previous model that cannot fit the
  new tables or shape, a damaged checkpoint, a setting the model cannot take), a bug (1), or a
  setting of this DAG missing.

Time limit: before the run, the task asks the pipeline's preflight (``python -m pipeline
preflight``, the same arguments) how long the run should take on this machine (its rates are
calibrated on the machine itself, docs/pipeline.md "Preflight") and sets the task's
``execution_timeout`` to the preflight's ``timeout_s``: the estimate's bound (every epoch,
under the load as the run starts) times ``preflight.timeout_factor``, at least
``preflight.timeout_floor_s`` (the pipeline's config).
When the preflight cannot tell (a Spark cluster's cores, no rows), the DAG's own limit
``CRITEO_DLRM_EXECUTION_TIMEOUT_S`` (default 86400, below) holds. At the limit Airflow stops
the task: the pipeline gets SIGTERM, records the run as interrupted and frees the workdir, and
the attempt is retried like any interrupted run.

Settings of a run (Airflow Variables, read when the task runs; each can also be given as the
environment variable ``AIRFLOW_VAR_<NAME>`` in capitals, Airflow's own mechanism):

- ``criteo_dlrm_input`` (required): the directory the day files land in (day_0, day_1, ...);
- ``criteo_dlrm_workdir`` (default ``<home>/workdir``): where every output goes;
- ``criteo_dlrm_config`` (default: none, the product's defaults): the pipeline's YAML file;
  everything about the run (threshold, ranks, hosts, Spark, training, exports) lives there;
- ``criteo_dlrm_stages`` (default ``preprocess,convert,train,eval,export``): overrides the
  config file's ``stages``;
- ``criteo_dlrm_home`` (default: the checkout this file belongs to, found through a symlink):
  the product's directory, the pipeline's working directory;
- ``criteo_dlrm_python`` (default ``<home>/.venv/bin/python``, what scripts/install.sh makes).

The last two name the code every task runs: they are administrator settings. Each must be an
absolute path owned by the Airflow user or root and writable by no one else (nor the directory
holding it), or the task fails without retry (trusted_paths.py beside this file).

Settings of the schedule (environment of the scheduler and DAG processor, read when the file is
parsed, since Variables should not be read at parse time): ``CRITEO_DLRM_SCHEDULE`` (default
``@daily``), ``CRITEO_DLRM_CATCHUP`` (default ``false``), ``CRITEO_DLRM_START_DATE`` (default
``2026-01-01``), ``CRITEO_DLRM_RETRIES`` (default 3), ``CRITEO_DLRM_RETRY_DELAY_S``
(default 900) and ``CRITEO_DLRM_EXECUTION_TIMEOUT_S`` (default 86400: the limit when the
preflight gives none). No secret belongs here: an authenticated Spark cluster's secret is a
file named by the config (``spark.auth_secret_file``).

Only the standard library and Airflow (3.x) are imported: the product's packages live in its
own virtualenv, which the task calls as a child process.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, NamedTuple

from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowSkipException
from airflow.sdk import DAG, BaseOperator, Variable

DAG_ID = "criteo_dlrm_daily"
DEFAULT_STAGES = "preprocess,convert,train,eval,export"
# The task's time limit when the preflight gives none (CRITEO_DLRM_EXECUTION_TIMEOUT_S); a
# daily run that takes a day blocks the next one anyway.
DEFAULT_TIMEOUT_S = 86400.0
PREFLIGHT_TIMEOUT_S = 600

# The pipeline's exit codes (dlrm_contracts/errors.py, ExitCode; docs/pipeline.md), by the
# names its summary's status uses. Written out because this file imports nothing of the
# product; tests/test_airflow_dag.py checks it against ExitCode.
EXIT_CODES = {
    0: "ok",
    1: "failed",
    2: "usage",
    3: "locked",
    4: "input_data",
    5: "preprocess",
    6: "convert",
    7: "dataset_invalid",
    8: "train",
    9: "eval",
    10: "export",
    11: "score",
    12: "disk_full",
    130: "interrupted",
}
# What another attempt can fix without a person: another run finishing, a lost Spark executor
# or trainer host, space freed, a killed run. Every other failure names what a person must fix.
RETRIED = frozenset({"locked", "preprocess", "train", "eval", "disk_full", "interrupted"})
# Finer statuses of a retried exit code that no later attempt can change: the trainer refused
# the run with one line naming what a person must change.
REFUSED = frozenset({"failed: train_refused", "failed: eval_refused"})


class Verdict(NamedTuple):
    state: str  # "success", "skipped", "retry" or "failed"
    reason: str


def verdict(returncode: int, summary: dict[str, Any] | None) -> Verdict:
    """The task's state for a pipeline run that ended with ``returncode`` and ``summary`` (its
    last stdout line, None when it printed none)."""
    if returncode < 0:  # the pipeline itself was killed (the OOM killer, a kill -9)
        return Verdict("retry", f"the pipeline was killed by signal {-returncode}")
    kind = EXIT_CODES.get(returncode)
    error = (summary or {}).get("error") or (summary or {}).get("status") or "see the task log"
    if kind is None:
        return Verdict(
            "failed",
            f"the pipeline exited {returncode}, not one of its exit codes "
            "(docs/pipeline.md): see the task log",
        )
    if kind != "ok":
        state = "retry" if kind in RETRIED and (summary or {}).get("status") not in REFUSED else "failed"
        return Verdict(state, f"the pipeline exited {returncode} ({kind}): {error}")
    stages = (summary or {}).get("stages") or {}
    if stages and all(stage.get("action") == "skipped" for stage in stages.values()):
        return Verdict("skipped", "nothing new: every stage was up to date (" + ", ".join(stages) + ")")
    return Verdict(
        "success", "ok: " + ", ".join(f"{name} {stage.get('action')}" for name, stage in stages.items())
    )


class SettingError(Exception):
    """A setting of this DAG that is missing or points nowhere: a person must set it."""


def _variable(name: str, default: str | None) -> str | None:
    value = Variable.get(name, default=default)
    return value.strip() if isinstance(value, str) and value.strip() else default


def _check_code_settings(home: Path, python: str) -> None:
    """criteo_dlrm_home (and its pipeline package) and criteo_dlrm_python name code: refused
    unless only the Airflow user or root can change them (trusted_paths.py)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "criteo_dlrm_trusted_paths", Path(__file__).resolve().with_name("trusted_paths.py")
    )
    trusted = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(trusted)
    try:
        trusted.check_trusted_path("criteo_dlrm_home", str(home), "directory")
        trusted.check_trusted_path("criteo_dlrm_home", str(home / "pipeline"), "directory")
        trusted.check_trusted_path("criteo_dlrm_python", python, "executable")
    except trusted.UntrustedPathError as error:
        raise SettingError(str(error)) from None


def _checkout() -> Path | None:
    """The product checkout this file is part of (pipeline/dags/ in it), through a symlink."""
    home = Path(__file__).resolve().parents[2]
    return home if (home / "pipeline" / "cli.py").is_file() else None


@dataclass(frozen=True)
class RunSettings:
    home: Path
    python: str
    input: str
    workdir: str
    config: str | None
    stages: str

    @classmethod
    def from_variables(cls) -> "RunSettings":
        home_text = _variable("criteo_dlrm_home", None)
        home = Path(home_text) if home_text else _checkout()
        if home is None or not (home / "pipeline" / "cli.py").is_file():
            raise SettingError(
                f"set the Airflow Variable criteo_dlrm_home to the product's "
                f"directory (this DAG file is not in one; got {home_text!r})"
            )
        python = _variable("criteo_dlrm_python", str(home / ".venv" / "bin" / "python"))
        if not os.access(python, os.X_OK):
            raise SettingError(
                f"the product's Python {python} is not an executable: run "
                f"scripts/install.sh in {home} or set criteo_dlrm_python"
            )
        _check_code_settings(home, python)
        source = _variable("criteo_dlrm_input", None)
        if source is None:
            raise SettingError(
                "set the Airflow Variable criteo_dlrm_input to the directory the day files land in"
            )
        return cls(
            home,
            python,
            source,
            _variable("criteo_dlrm_workdir", str(home / "workdir")),
            _variable("criteo_dlrm_config", None),
            _variable("criteo_dlrm_stages", DEFAULT_STAGES),
        )

    def argv(self, command: str = "run") -> list[str]:
        argv = [
            self.python,
            "-m",
            "pipeline",
            command,
            "--input",
            self.input,
            "--workdir",
            self.workdir,
            "--stages",
            self.stages,
        ]
        return argv + (["--config", self.config] if self.config else [])


def time_limit(preflight: dict[str, Any] | None, default: timedelta) -> tuple[timedelta, str]:
    """The task's execution_timeout from the preflight's figures (its last JSON line), and
    where it came from; ``default`` when the preflight gave no limit."""
    seconds = (preflight or {}).get("timeout_s")
    if isinstance(seconds, (int, float)) and not isinstance(seconds, bool) and seconds > 0:
        estimate = (preflight or {}).get("seconds_total")
        return (
            timedelta(seconds=float(seconds)),
            f"{seconds:.0f} s from the preflight's estimate of {estimate} s",
        )
    return (
        default,
        f"{default.total_seconds():.0f} s (CRITEO_DLRM_EXECUTION_TIMEOUT_S: the preflight gave no estimate)",
    )


def last_json_line(stdout: str) -> dict[str, Any] | None:
    """The pipeline's summary: its last stdout line (None when the run printed none)."""
    lines = stdout.strip().splitlines()
    try:
        summary = json.loads(lines[-1]) if lines else None
    except ValueError:
        return None
    return summary if isinstance(summary, dict) else None


class CriteoPipelineOperator(BaseOperator):
    """Runs the pipeline once and sets the task's state from its exit code (``verdict``)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._child: subprocess.Popen | None = None
        self._default_timeout = self.execution_timeout

    def pre_execute(self, context: Any) -> None:
        """Sets ``execution_timeout`` from the preflight's estimate for this very run (Airflow
        reads it after this hook, as it starts ``execute``)."""
        try:
            settings = RunSettings.from_variables()
        except SettingError:
            return  # execute fails with the reason
        default = self._default_timeout or timedelta(seconds=DEFAULT_TIMEOUT_S)
        argv = settings.argv("preflight")
        try:
            # The preflight reads no data beyond a sample per file: minutes at most, even
            # when it calibrates the machine's rates for the first time.
            done = subprocess.run(
                argv, cwd=settings.home, stdout=subprocess.PIPE, text=True, timeout=PREFLIGHT_TIMEOUT_S
            )
            figures = last_json_line(done.stdout)
        except (OSError, subprocess.TimeoutExpired) as exc:
            self.log.warning("preflight not run (%s): the default time limit holds", exc)
            figures = None
        self.execution_timeout, why = time_limit(figures, default)
        self.log.info("time limit %s", why)

    def execute(self, context: Any) -> None:
        try:
            settings = RunSettings.from_variables()
        except SettingError as exc:
            raise AirflowFailException(str(exc)) from None
        argv = settings.argv()
        self.log.info("running %s (in %s)", shlex.join(argv), settings.home)
        # The pipeline's log lines go to stderr, which the task's log captures as they come;
        # stdout carries only its summary.
        self._child = subprocess.Popen(argv, cwd=settings.home, stdout=subprocess.PIPE, text=True)
        try:
            stdout, _ = self._child.communicate()
        finally:
            self._stop_child()
        summary = last_json_line(stdout)
        self.log.info("pipeline summary: %s", json.dumps(summary, sort_keys=True))
        outcome = verdict(self._child.returncode, summary)
        if summary is not None:
            context["ti"].xcom_push(key="summary", value=summary)
        if outcome.state == "success":
            self.log.info("%s", outcome.reason)
            return
        if outcome.state == "skipped":
            raise AirflowSkipException(outcome.reason)
        if outcome.state == "retry":
            raise AirflowException(outcome.reason)
        raise AirflowFailException(outcome.reason)

    def on_kill(self) -> None:
        self._stop_child()

    def _stop_child(self) -> None:
        """SIGTERM first: the pipeline stops its stage, records the run as interrupted and
        frees the workdir's lock; SIGKILL if it has not ended within a minute."""
        child = self._child
        if child is None or child.poll() is not None:
            return
        child.send_signal(signal.SIGTERM)
        try:
            child.wait(timeout=60)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def _env_flag(name: str, default: bool) -> bool:
    value = os.environ.get(name, "").strip().lower()
    return default if not value else value in ("1", "true", "yes", "on")


with DAG(
    dag_id=DAG_ID,
    description="Criteo/DLRM: count the new day, rebuild what it changes, train, export",
    schedule=os.environ.get("CRITEO_DLRM_SCHEDULE", "@daily"),
    start_date=datetime.fromisoformat(os.environ.get("CRITEO_DLRM_START_DATE", "2026-01-01")).replace(
        tzinfo=timezone.utc
    ),
    # A run works on whatever the landing directory holds, not on its logical date: catching up
    # missed intervals would only repeat the same run.
    catchup=_env_flag("CRITEO_DLRM_CATCHUP", False),
    # One workdir, one run at a time (the pipeline's lock would refuse a second one anyway).
    max_active_runs=1,
    max_active_tasks=1,
    default_args={
        "retries": int(os.environ.get("CRITEO_DLRM_RETRIES", "3")),
        "retry_delay": timedelta(seconds=float(os.environ.get("CRITEO_DLRM_RETRY_DELAY_S", "900"))),
        # replaced, as each run starts, by the limit its preflight derives
        "execution_timeout": timedelta(
            seconds=float(os.environ.get("CRITEO_DLRM_EXECUTION_TIMEOUT_S", str(DEFAULT_TIMEOUT_S)))
        ),
    },
    tags=["criteo-dlrm"],
    doc_md=__doc__,
) as dag:
    CriteoPipelineOperator(task_id="run_pipeline")
