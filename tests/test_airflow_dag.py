"""The shipped DAG (pipeline/dags/criteo_dlrm_daily.py) run by a real Airflow.

Airflow is installed by scripts/install_airflow.sh into its own virtualenv (cached; instant when
done) and runs on SQLite in a temporary AIRFLOW_HOME, each DAG run through ``airflow dags test``
(the scheduler's own dependency and retry loop, in one process). The module's ``airflow``
commands run one after another in one process of that virtualenv (tests/airflow_commands.py),
so Airflow is imported once, not once per command. The pipeline it calls is the real one
(local Spark, TensorFlow) of the virtualenv running these tests.

Day files land in a directory one after another, as a daily job sees them: two days first (the
least the pipeline trains on), then one new day before a second run (the first warm start),
then none (and a run while another holds the workdir), then a fourth day for a run that asks
for a model of another shape: one workdir and its runs serve every test of that story, in
order, through module fixtures that depend on each other. What each run did is read from the
pipeline's own outputs (the preprocess manifest's days counted, counts/days.json,
summary.json, history.jsonl) and the task's state from Airflow's database.
"""

from __future__ import annotations

import fcntl
import json
import os
import select
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dlrm_contracts.errors import ExitCode
from pipeline.generate import main as generate_main
from tests.pipeline_helpers import run_in_process

pytestmark = [pytest.mark.spark, pytest.mark.slow]

REPO = Path(__file__).resolve().parent.parent
AIRFLOW_VENV = Path(os.environ.get("CRITEO_DLRM_AIRFLOW_VENV", REPO / ".venv-airflow"))
DAG_FILE = REPO / "pipeline" / "dags" / "criteo_dlrm_daily.py"
COMMANDS = Path(__file__).with_name("airflow_commands.py")
DAG_ID = "criteo_dlrm_daily"
TASK_ID = "run_pipeline"
STAGES = "preprocess,convert,train,eval,export"  # the DAG's default
ROWS_PER_DAY = 1250

# Small and quick: one rank, a few steps. A daily job's recommended settings (docs/pipeline.md,
# "Daily runs"): ids that never move, each day's model warm-started from the last and trained
# on the day it has not seen (train.days: new), in the pipeline's config file: the DAG passes
# it unchanged.
DAILY_CONFIG = """
spark:
  driver_memory: 1g
preprocess:
  frequency_threshold: "2"
  ids: stable
convert:
  batch_rows: 512
train:
  preset: small
  batch_size: 256
  max_steps: 12
  evals_per_epoch: 1
  init: previous
  days: new
launch:
  np: 1
progress:
  interval_s: 5
"""


class Airflow:
    """One AIRFLOW_HOME on SQLite with the DAGs folder of this checkout, and one process of
    Airflow's virtualenv that runs its commands (tests/airflow_commands.py: each is what the
    ``airflow`` command runs, without importing Airflow anew)."""

    def __init__(self, bin_dir: Path, home: Path, variables: dict[str, str]):
        self.bin_dir, self.home = bin_dir, home
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
        self.env.update(
            {
                "AIRFLOW_HOME": str(home),
                "AIRFLOW__CORE__DAGS_FOLDER": str(DAG_FILE.parent),
                "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
                "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
                # a retry comes seconds later here (the DAG's default is 15 minutes)
                "CRITEO_DLRM_RETRIES": "2",
                "CRITEO_DLRM_RETRY_DELAY_S": "4",
            }
        )
        self.env.update({f"AIRFLOW_VAR_{k.upper()}": v for k, v in variables.items()})
        self._server: subprocess.Popen | None = None
        self._commands = 0

    def start(self, *args: str, extra_env: dict[str, str] | None = None) -> "Command":
        """``airflow ARGS`` begun (``extra_env`` on top of this home's environment)."""
        if self._server is None:
            self.home.mkdir(parents=True, exist_ok=True)
            with open(self.home / "commands.err", "ab") as errors:
                self._server = subprocess.Popen(
                    [str(self.bin_dir / "python"), str(COMMANDS)],
                    env=self.env,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=errors,
                    text=True,
                )
        self._commands += 1
        out = self.home / f"command-{self._commands}.out"
        request = {"args": list(args), "env": extra_env or {}, "out": str(out)}
        self._server.stdin.write(json.dumps(request) + "\n")
        self._server.stdin.flush()
        return Command(self, list(args), out)

    def cli(
        self, *args: str, extra_env: dict[str, str] | None = None, timeout: int = 600
    ) -> subprocess.CompletedProcess:
        return self.start(*args, extra_env=extra_env).wait(timeout)

    def dags_test(self, date: str, **variables: str) -> subprocess.CompletedProcess:
        extra = {f"AIRFLOW_VAR_{k.upper()}": v for k, v in variables.items()}
        return self.cli("dags", "test", DAG_ID, date, extra_env=extra, timeout=900)

    def close(self) -> None:
        """Ends the commands' process: every command has replied, so nothing of it is lost
        (Airflow's own shutdown in it, on end of input or SIGTERM, takes seconds and checks
        nothing)."""
        if self._server is not None:
            self._server.stdin.close()
            self._server.kill()
            self._server.wait(timeout=60)
            self._server = None

    def query(self, sql: str, *params) -> list[tuple]:
        for attempt in range(50):  # Airflow may hold a write lock on the database for a moment
            try:
                with sqlite3.connect(self.home / "airflow.db", timeout=10) as db:
                    return db.execute(sql, params).fetchall()
            except sqlite3.OperationalError:
                if attempt == 49:
                    raise
                time.sleep(0.2)
        return []

    def latest_task(self) -> dict:
        """State and try number of the task in the newest run of the DAG, and its XCom."""
        rows = self.query("SELECT run_id FROM dag_run WHERE dag_id = ? ORDER BY id DESC LIMIT 1", DAG_ID)
        if not rows:
            return {}
        run_id = rows[0][0]
        ti = self.query(
            "SELECT state, try_number FROM task_instance WHERE dag_id = ? AND run_id = ? AND task_id = ?",
            DAG_ID,
            run_id,
            TASK_ID,
        )
        xcom = self.query(
            "SELECT value FROM xcom WHERE dag_id = ? AND run_id = ? AND task_id = ? AND key = 'summary'",
            DAG_ID,
            run_id,
            TASK_ID,
        )
        state, tries = ti[0] if ti else (None, 0)
        return {
            "run_id": run_id,
            "state": state,
            "try_number": tries,
            "summary": _xcom_value(xcom[0][0]) if xcom else None,
        }


class Command:
    """An ``airflow`` command sent to the process of class Airflow, until its reply."""

    def __init__(self, airflow: Airflow, args: list[str], out: Path):
        self.airflow, self.args, self.out = airflow, args, out

    def finished(self) -> bool:
        """Whether the command has replied (without waiting)."""
        return bool(select.select([self.airflow._server.stdout], [], [], 0)[0])

    def wait(self, timeout: float) -> subprocess.CompletedProcess:
        """The finished command: its exit status, and its output (stdout and stderr as one)."""
        server = self.airflow._server
        ready, _, _ = select.select([server.stdout], [], [], timeout)
        line = server.stdout.readline() if ready else ""
        if not line:
            server.kill()
            self.airflow._server = None
            errors = (self.airflow.home / "commands.err").read_text()[-4000:]
            raise AssertionError(f"airflow {self.args}: no reply in {timeout} s\n{errors}")
        output = self.out.read_text(errors="replace") if self.out.exists() else ""
        return subprocess.CompletedProcess(self.args, json.loads(line)["returncode"], output, "")


def _xcom_value(raw) -> dict:
    value = json.loads(raw)
    return json.loads(value) if isinstance(value, str) else value


@pytest.fixture(scope="module")
def airflow_bin() -> Path:
    proc = subprocess.run(
        ["bash", str(REPO / "scripts" / "install_airflow.sh")], capture_output=True, text=True, timeout=1800
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert (AIRFLOW_VENV / "bin" / "airflow").is_file()
    return AIRFLOW_VENV / "bin"


@pytest.fixture(scope="module")
def site(tmp_path_factory, airflow_bin):
    """Generated days waiting to land, an empty landing directory, the DAG's settings and an
    Airflow with its database made."""
    root = tmp_path_factory.mktemp("airflow_dag")
    staging = root / "staging"
    generated = generate_main(
        ["--out", str(staging), "--days", "4", "--rows-per-day", str(ROWS_PER_DAY), "--seed", "2525"]
    )
    assert generated == 0
    (root / "landing").mkdir()
    (root / "daily.yaml").write_text(DAILY_CONFIG)
    airflow = Airflow(
        airflow_bin,
        root / "airflow_home",
        {
            "criteo_dlrm_input": str(root / "landing"),
            "criteo_dlrm_config": str(root / "daily.yaml"),
            "criteo_dlrm_python": sys.executable,
        },
    )
    migrate = airflow.cli("db", "migrate")
    assert migrate.returncode == 0, migrate.stdout[-4000:]
    # The workdir as a Variable of the metastore (the others come from the environment): both
    # of Airflow's ways reach the task.
    workdir = root / "workdir"
    setting = airflow.cli("variables", "set", "criteo_dlrm_workdir", str(workdir))
    assert setting.returncode == 0, setting.stdout[-4000:]
    yield {
        "root": root,
        "staging": staging,
        "landing": root / "landing",
        "workdir": workdir,
        "airflow": airflow,
    }
    airflow.close()


def land(site: dict, day: int) -> None:
    """A day file arrives whole: copied beside the landing directory, then renamed into it."""
    name = f"day_{day}"
    partial = site["root"] / f".{name}.partial"
    shutil.copyfile(site["staging"] / name, partial)
    os.replace(partial, site["landing"] / name)


def _json(path: Path):
    return json.loads(path.read_text())


def _history(workdir: Path) -> list[dict]:
    path = workdir / "manifests" / "history.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def run_day(site: dict, date: str) -> dict:
    """One DAG run; what Airflow and the pipeline recorded right after it."""
    proc = site["airflow"].dags_test(date)
    workdir = site["workdir"]
    record = {"proc": proc, "task": site["airflow"].latest_task(), "history": _history(workdir)}
    if (workdir / "summary.json").exists():
        record["summary"] = _json(workdir / "summary.json")
        record["preprocess"] = _json(workdir / "manifests" / "preprocess.json")
        record["train"] = _json(workdir / "manifests" / "train.json")
        record["days"] = _json(workdir / "counts" / "days.json")
        record["quality"] = _json(workdir / "parquet" / "data_quality.json")
        record["ids"] = _dictionary_ids(workdir / "parquet" / "dictionaries")
        record["exports"] = (
            sorted(int(p.name) for p in (workdir / "export").iterdir() if p.name.isdigit())
            if (workdir / "export").is_dir()
            else []
        )
    return record


def _dictionary_ids(folder: Path) -> dict[tuple[str, str], int]:
    """(column, value) → id of every dictionary row."""
    import pyarrow.parquet as pq

    ids = {}
    for part in folder.glob("column=*/*.parquet"):
        column = part.parent.name.split("=", 1)[1]
        table = pq.read_table(part, columns=["value", "id"]).to_pydict()
        ids.update({(column, v): i for v, i in zip(table["value"], table["id"])})
    return ids


@pytest.fixture(scope="module")
def daily(site) -> list[dict]:
    """Days 0 and 1, then day 2 land, a DAG run after each; then a run with nothing new."""
    runs = []
    for date, days in (
        ("2026-11-01", (0, 1)),
        ("2026-11-02", (2,)),
        ("2026-11-04", ()),
    ):
        for day in days:
            land(site, day)
        runs.append(run_day(site, date))
    return runs


def _explain(record: dict) -> str:
    return (
        f"task {record['task']}\n--- stdout\n{record['proc'].stdout[-3000:]}"
        f"\n--- stderr\n{record['proc'].stderr[-6000:]}"
    )


def test_three_days_land_and_each_run_counts_only_the_new_day(daily, site):
    counted = [[0, 1], [2]]
    for n, record in enumerate(daily[:2]):
        assert record["task"]["state"] == "success", _explain(record)
        assert record["task"]["try_number"] == 1
        summary = record["summary"]
        assert summary["status"] == "ok"
        # every stage the DAG asks for ran: the new day changed the dictionaries and the splits
        assert set(summary["stages"]) == set(STAGES.split(","))
        # (eval adopts the train stage's final evaluation of the model it kept)
        assert {name: stage["action"] for name, stage in summary["stages"].items()} == {
            **{name: "ran" for name in STAGES.split(",")},
            "eval": "derived",
        }, summary
        # the count stage reused the days counted by earlier runs (counts/days.json)
        days_in = sorted(d for run in counted[: n + 1] for d in run)
        assert record["preprocess"]["summary"]["days_counted"] == counted[n]
        assert record["preprocess"]["summary"]["days_reused"] == days_in[: len(days_in) - len(counted[n])]
        assert [d["day"] for d in record["days"]["days"]] == days_in
        assert record["quality"]["totals"]["rows_read"] == ROWS_PER_DAY * len(days_in)
        # the task's XCom is the pipeline's own summary, and the history has one line per run
        assert record["task"]["summary"] == summary
        assert [h["status"] for h in record["history"]] == ["ok"] * (n + 1)
        # stable ids: every value keeps its id, the new day's values get new ones
        if n:
            before = daily[n - 1]["ids"]
            assert {k: record["ids"].get(k) for k in before} == before
            assert len(record["ids"]) > len(before)
        # warm start: the run after the first continues the previous day's model, trained on
        # the one day it has not seen (yesterday's test day, now train): the first run trains
        # day 0 (day 1 is its test day), the second day 1
        assert summary["init"] == ("previous" if n else "scratch"), summary
        assert summary["days_trained"] == [n], summary
        days = record["train"]["summary"]["train_days"]
        assert days["mode"] == "new" and days["trained"] == list(range(n + 1)), days
        assert summary["next_day_auc"] is not None and summary["next_day_auc"] == summary["test_auc"]
        # versioned exports: a new version per run, the newest numbered after the run
        assert record["exports"] == list(range(1, n + 2)) and summary["export_version"] == n + 1
    workdir = site["workdir"]
    assert (workdir / "export" / "2" / "saved_model.pb").is_file()
    assert daily[1]["summary"]["rows"]["train"] > daily[0]["summary"]["rows"]["train"]


def test_a_run_with_no_new_day_is_skipped(daily):
    record = daily[2]
    assert record["task"]["state"] == "skipped", _explain(record)
    assert record["task"]["try_number"] == 1
    summary = record["summary"]
    assert summary["status"] == "ok"
    assert all(stage["action"] == "skipped" for stage in summary["stages"].values()), summary
    assert record["task"]["summary"] == summary
    assert len(record["history"]) == 3  # the pipeline ran, and said there was nothing to do


@pytest.fixture(scope="module")
def locked(daily, site) -> dict:
    """A DAG run started while another run holds the workdir (after the daily runs, nothing
    new landed): its first attempt as it waits for its retry, then the end of the run."""
    airflow, workdir = site["airflow"], site["workdir"]
    before, previous_run = len(_history(workdir)), airflow.latest_task()["run_id"]
    with open(workdir / ".pipeline.lock", "a+") as held:  # another run holds the workdir
        fcntl.flock(held.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        command = airflow.start("dags", "test", DAG_ID, "2026-11-05")
        deadline = time.time() + 300
        first: dict = {}
        while time.time() < deadline and not command.finished():
            task = airflow.latest_task()
            if task.get("run_id") != previous_run and task.get("state") == "up_for_retry":
                first = task  # the first attempt failed and waits for its retry
                break
            time.sleep(0.2)
        fcntl.flock(held.fileno(), fcntl.LOCK_UN)
    proc = command.wait(timeout=600)
    return {
        "before": before,
        "first": first,
        "out": proc.stdout,
        "final": airflow.latest_task(),
        "history": _history(workdir),
    }


def test_a_locked_workdir_is_retried_until_the_other_run_ends(locked):
    first, out, final = locked["first"], locked["out"], locked["final"]
    assert first.get("try_number") == 1, out[-6000:]
    assert "exited 3 (locked)" in out
    # the retry found the workdir free and up to date (nothing new since the last run)
    assert final["state"] == "skipped" and final["try_number"] == 2, out[-6000:]
    history = locked["history"]
    assert len(history) == locked["before"] + 1 and history[-1]["status"] == "ok"


def test_a_bad_config_fails_without_retry(daily, site, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("train:\n  no_such_setting: 1\n")
    workdir = tmp_path / "workdir"
    proc = site["airflow"].dags_test(
        "2026-11-06", criteo_dlrm_config=str(bad), criteo_dlrm_workdir=str(workdir)
    )
    task = site["airflow"].latest_task()
    out = proc.stdout + proc.stderr
    assert task["state"] == "failed", out[-6000:]
    assert task["try_number"] == 1  # retries are 2, yet no second attempt
    assert "exited 2 (usage)" in out and "no_such_setting" in out
    assert task["summary"]["status"] == "failed: usage"
    assert not (workdir / "summary.json").exists()  # refused before the workdir was touched


def test_a_missing_setting_fails_without_retry_and_runs_nothing(site, tmp_path):
    workdir = tmp_path / "workdir"
    proc = site["airflow"].dags_test("2026-11-07", criteo_dlrm_input="", criteo_dlrm_workdir=str(workdir))
    task = site["airflow"].latest_task()
    out = proc.stdout + proc.stderr
    assert task["state"] == "failed" and task["try_number"] == 1, out[-6000:]
    assert "set the Airflow Variable criteo_dlrm_input" in out
    assert not workdir.exists()


PROBE = r"""
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("criteo_dlrm_daily", sys.argv[1])
module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
dag = module.dag
ran = {"stages": {"preprocess": {"action": "ran"}, "train": {"action": "skipped"}}}
reused = {"stages": {"preprocess": {"action": "skipped"}, "train": {"action": "skipped"}}}
verdicts = {code: module.verdict(code, {"status": "x", "error": "e", "stages": {}}).state
            for code in [*module.EXIT_CODES, -9, 77] if code != 0}
verdicts[0] = module.verdict(0, ran).state
verdicts["0-reused"] = module.verdict(0, reused).state
for code, status in ((8, "failed: train_refused"), (9, "failed: eval_refused")):
    verdicts[f"{code}-refused"] = module.verdict(code, {"status": status, "stages": {}}).state
    verdicts[f"{code}-crashed"] = module.verdict(code, {"status": "failed: " + module.EXIT_CODES[code],
                                                        "stages": {}}).state
from datetime import timedelta
default = timedelta(hours=5)
limits = {name: module.time_limit(figures, default)[0].total_seconds() for name, figures in (
    ("estimated", {"timeout_s": 1234, "seconds_total": 300.0}), ("unknown", {"timeout_s": None}),
    ("none", None), ("bad", {"timeout_s": "soon"}))}
task = dag.get_task("run_pipeline")
print(json.dumps({
    "exit_codes": module.EXIT_CODES, "verdicts": verdicts, "limits": limits,
    "schedule": str(dag.schedule), "catchup": dag.catchup,
    "max_active_runs": dag.max_active_runs, "tasks": [t.task_id for t in dag.tasks],
    "retries": task.retries, "retry_delay_s": task.retry_delay.total_seconds(),
    "execution_timeout_s": task.execution_timeout.total_seconds(),
}))
"""


def test_the_dag_maps_every_exit_code_of_the_pipeline(airflow_bin, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "CRITEO_DLRM_"))}
    env["AIRFLOW_HOME"] = str(tmp_path)
    proc = subprocess.run(
        [str(airflow_bin / "python"), "-c", PROBE, str(DAG_FILE)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    facts = json.loads(proc.stdout.strip().splitlines()[-1])
    # the DAG's table is the pipeline's (a new exit code must be given a state there)
    assert {int(k): v for k, v in facts["exit_codes"].items()} == {
        int(code): code.name.lower() for code in ExitCode
    }
    verdicts = facts["verdicts"]
    retried = {
        ExitCode.LOCKED,
        ExitCode.PREPROCESS,
        ExitCode.TRAIN,
        ExitCode.EVAL,
        ExitCode.DISK_FULL,
        ExitCode.INTERRUPTED,
    }
    for code in ExitCode:
        if code != ExitCode.OK:
            assert verdicts[str(int(code))] == ("retry" if code in retried else "failed"), code
    assert verdicts["-9"] == "retry" and verdicts["77"] == "failed"
    assert verdicts["0"] == "success" and verdicts["0-reused"] == "skipped"
    assert facts["schedule"] == "@daily" and facts["catchup"] is False
    assert facts["max_active_runs"] == 1 and facts["tasks"] == ["run_pipeline"]
    assert facts["retries"] == 3 and facts["retry_delay_s"] == 900
    # a trainer's refusal (a model that cannot fit the new tables) is not retried; a crash is
    assert verdicts["8-refused"] == verdicts["9-refused"] == "failed"
    assert verdicts["8-crashed"] == verdicts["9-crashed"] == "retry"
    # the time limit is the preflight's when it gives one, else the DAG's (a day by default)
    assert facts["limits"] == {"estimated": 1234, "unknown": 5 * 3600, "none": 5 * 3600, "bad": 5 * 3600}
    assert facts["execution_timeout_s"] == 86400


def _land_in(site: dict, landing: Path, days) -> None:
    landing.mkdir(exist_ok=True)
    for day in days:
        partial = landing.parent / f".day_{day}.partial"
        shutil.copyfile(site["staging"] / f"day_{day}", partial)
        os.replace(partial, landing / f"day_{day}")


@pytest.fixture(scope="module")
def refused(locked, site) -> dict:
    """The daily workdir once its runs are done (``locked`` is the last to use it as it is):
    a fourth day lands and the run that should warm-start from the kept model asks for another
    shape. The daily runs made that model, so no run of its own is needed to make one."""
    workdir = site["workdir"]
    before = _history(workdir)
    land(site, 3)  # a new day: the next run warm-starts from the kept model
    other_shape = site["root"] / "other_shape.yaml"
    other_shape.write_text(DAILY_CONFIG.replace("  preset: small\n", "  preset: small\n  embedding_dim: 8\n"))
    proc = site["airflow"].dags_test("2026-11-09", criteo_dlrm_config=str(other_shape))
    return {
        "proc": proc,
        "task": site["airflow"].latest_task(),
        "before": before,
        "history": _history(workdir),
    }


def test_a_model_that_cannot_fit_the_new_tables_fails_without_retry(refused, site):
    """A warm start (train.init: previous) whose previous model has another shape than this
    run's is refused by the trainer (exit 8 with its one line): every attempt would be refused
    the same way, so no retry is spent on it."""
    proc, task, workdir = refused["proc"], refused["task"], site["workdir"]
    out = proc.stdout + proc.stderr
    assert refused["before"] and all(h["status"] == "ok" for h in refused["before"])
    assert task["state"] == "failed", out[-6000:]
    assert task["try_number"] == 1  # retries are 2, yet no second attempt
    assert task["summary"]["status"] == "failed: train_refused", task["summary"]
    assert "exited 8 (train)" in out, out[-6000:]
    # the pipeline's one line names the cause (its log, which the task's log shows too)
    newest_log = sorted((workdir / "logs").glob("pipeline-*.log"))[-1].read_text()
    assert "has dims" in newest_log and "train.init: scratch" in newest_log, newest_log[-3000:]
    history = refused["history"]
    assert [h["status"] for h in history] == [h["status"] for h in refused["before"]] + [
        "failed: train_refused"
    ]


def test_the_time_limit_comes_from_the_preflights_estimate(site, tmp_path):
    """The task's execution_timeout is the preflight's timeout_s for this run (the estimate
    times preflight.timeout_factor, at least preflight.timeout_floor_s): a limit far below what
    the run needs stops it, the pipeline is told (SIGTERM) and frees its workdir."""
    landing, workdir = tmp_path / "landing", tmp_path / "workdir"
    _land_in(site, landing, (0, 1))
    tight = tmp_path / "tight.yaml"
    tight.write_text(DAILY_CONFIG + "preflight:\n  timeout_factor: 0.0001\n  timeout_floor_s: 3\n")
    # the preflight's command line, its main in this process (what the DAG's task asks it)
    _, figures = run_in_process(
        tmp_path,
        *["preflight", "--input", str(landing), "--workdir", str(workdir), "--stages", STAGES],
        *["--config", str(tight)],
    )
    assert figures is not None
    assert figures["timeout_s"] == 3 and figures["seconds_total"] > 3, figures
    proc = site["airflow"].cli(
        "dags",
        "test",
        DAG_ID,
        "2026-11-10",
        timeout=900,
        extra_env={
            "AIRFLOW_VAR_CRITEO_DLRM_WORKDIR": str(workdir),
            "AIRFLOW_VAR_CRITEO_DLRM_INPUT": str(landing),
            "AIRFLOW_VAR_CRITEO_DLRM_CONFIG": str(tight),
            "CRITEO_DLRM_RETRIES": "0",
        },
    )
    task = site["airflow"].latest_task()
    out = proc.stdout + proc.stderr
    assert task["state"] == "failed" and task["try_number"] == 1, out[-6000:]
    assert "time limit 3 s from the preflight's estimate" in out, out[-6000:]
    assert "AirflowTaskTimeout" in out or "Timeout" in out, out[-6000:]
    lock = workdir / ".pipeline.lock"
    if lock.exists():  # the pipeline had taken it: it is free again
        with open(lock, "rb") as held:
            fcntl.flock(held.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
