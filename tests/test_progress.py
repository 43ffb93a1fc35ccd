"""Progress: the record and its channel, the ETA, the display's bar and lines, the pipeline's
watcher and CPU count. The stages' own reports are checked where those stages run
(test_spark_cli, test_trainer_single, test_serving, test_pipeline)."""

from __future__ import annotations

import logging
import os
import pty
import subprocess
import sys
import time

import pytest

from dlrm_contracts.config import ConfigError, ProgressConfig, config_from_dict
from dlrm_contracts.progress import (
    PROGRESS_FILE_ENV,
    ChannelReader,
    ChannelWriter,
    Progress,
    Reporter,
    StageEstimate,
    channel,
    counting,
    open_reporter,
)
from dlrm_contracts.progress_display import Display, line as shown
from pipeline.progress import ConsoleFilter, CpuMeter, StageWatch, PROGRESS_RECORD


class Collect:
    def __init__(self):
        self.items = []

    def send(self, progress: Progress) -> None:
        self.items.append(progress)

    def __call__(self, text: str) -> None:
        self.items.append(text)


def test_records_round_trip_and_foreign_or_torn_lines_are_ignored():
    p = Progress(
        "train",
        fraction=0.25,
        phase="train",
        done=5,
        total=20,
        unit="steps",
        rows=5120,
        rows_unit="samples",
        metrics={"loss": 0.13},
        time=100.0,
    )
    assert Progress.from_line(p.to_line()) == p
    assert p.to_line().endswith("\n") and p.to_line().count("\n") == 1
    for junk in (
        '{"stage": "train", "fraction": 0.',
        "not json",
        "[1, 2]",
        '{"fraction": 1}',
        '{"stage": "x", "done": 1, "new_field_of_a_later_version": 2}',
    ):
        got = Progress.from_line(junk)
        assert got is None or (got.stage == "x" and got.done == 1)


def test_eta_is_the_mean_rate_since_the_first_report_and_leaves_start_up_out():
    est = StageEstimate("s", started=0.0)
    # 50 s of start-up, then 1% a second: at 30% the remaining 70% take 70 s
    for t in range(50, 81):
        est.update(
            Progress("s", fraction=(t - 50) / 100, rows=(t - 50) * 1000.0, time=float(t)), now=float(t)
        )
    assert est.eta(now=80.0) == pytest.approx(70.0)
    assert est.eta(now=90.0) == pytest.approx(60.0)  # counts down between reports
    assert est.rate() == pytest.approx(1000.0)
    line = shown(est, now=80.0)
    assert line.startswith("s  30%") and "elapsed 1m20s" in line and "ETA 1m10s" in line
    # a stage that starts over (a second pass) restarts the estimate instead of going negative
    est.update(Progress("s", fraction=0.1, time=81.0), now=81.0)
    assert est.eta(now=81.0) is None
    est.update(Progress("s", fraction=0.2, time=91.0), now=91.0)
    assert est.eta(now=91.0) == pytest.approx(80.0)


def test_rate_restarts_with_each_phase_and_metrics_are_shown():
    est = StageEstimate("train", started=0.0, rate_window_s=60.0)
    for t, step, loss in ((10.0, 50, 0.1234567), (11.0, 60, 0.12)):
        record = Progress(
            "train",
            fraction=step / 100,
            phase="train",
            done=step,
            total=100,
            unit="steps",
            rows=step * 1000.0,
            rows_unit="samples",
            metrics={"loss": loss},
            time=t,
        )
        est.update(record, now=t)
    assert "10,000 samples/s" in shown(est, now=11.0) and "loss 0.12" in shown(est, now=11.0)
    assert est.update(
        Progress(
            "train",
            fraction=0.7,
            phase="eval test",
            done=10,
            total=100,
            unit="rows",
            rows=10.0,
            metrics={"loss": 0.12345678, "test AUC": "0.75 (step 60)"},
            time=12.0,
        ),
        now=12.0,
    )
    line = shown(est, now=12.0)
    assert est.rate() is None and "rows/s" not in line  # one sample of the new phase
    assert "eval test 10/100 rows" in line and "loss 0.12346" in line
    assert "test AUC 0.75 (step 60)" in line
    assert "no report for" in shown(est, now=200.0)


def test_lines_come_on_a_fixed_grid_and_at_each_new_phase():
    lines = Collect()
    display = Display(None, ProgressConfig(interval_s=30.0), emit=lines, bar=False)
    t0 = time.time()
    display.start("preprocess", started=t0)
    t = t0
    while t < t0 + 10 * 60:  # ten minutes of ticks at an uneven pace
        t += 0.7
        display.tick(now=t)
    assert len(lines.items) == 20  # every 30 s: at 30, 60, ... 600
    display.update(Progress("preprocess", phase="count", fraction=0.0))  # the first: no line
    display.update(Progress("preprocess", phase="count", fraction=0.1))
    display.update(Progress("preprocess", phase="transform", fraction=0.5))
    assert len(lines.items) == 21 and "transform" in lines.items[20]


def test_reporter_sends_at_most_one_record_a_second_but_every_new_phase():
    sink = Collect()
    reporter = Reporter("convert", sink, min_gap_s=60.0)
    for i in range(1000):
        reporter.report(phase="convert", done=i)
    reporter.report(phase="rethreshold", done=0)
    reporter.report(done=5, force=True)
    assert [(p.phase, p.done) for p in sink.items] == [("convert", 0), ("rethreshold", 0), ("rethreshold", 5)]


def test_closing_a_reporter_sends_the_last_state_the_gap_held_back():
    """A stage's last report reaches the pipeline however soon after the one before it: the
    pipeline's bar ends where the stage ended, not at the last record a second's gap let by."""
    sink = Collect()
    with Reporter("convert", sink, min_gap_s=60.0) as reporter:
        for i in range(31):
            reporter.report(phase="convert", done=i * 100, fraction=i / 30)
    assert [p.done for p in sink.items] == [0, 3000] and sink.items[-1].fraction == 1.0
    quiet = Collect()
    with Reporter("convert", quiet, min_gap_s=60.0) as reporter:
        reporter.report(phase="convert", done=1)
    assert [p.done for p in quiet.items] == [1]  # nothing held back: nothing sent twice


def test_channel_lines_are_whole_and_a_broken_channel_never_fails_the_stage(tmp_path, capsys):
    path = tmp_path / "c.jsonl"
    writer = ChannelWriter(path)
    for i in range(3):
        writer.send(Progress("convert", done=i))
    assert [Progress.from_line(x).done for x in path.read_text().splitlines()] == [0, 1, 2]
    broken = ChannelWriter(tmp_path / "missing" / "c.jsonl")
    broken.send(Progress("convert"))
    broken.send(Progress("convert"))
    assert capsys.readouterr().err.count("cannot be written") == 1


def test_the_channel_reader_returns_whole_records_of_its_stage_in_order(tmp_path):
    path = tmp_path / "preprocess.progress.jsonl"
    reader = ChannelReader(path, "preprocess")
    assert reader.read() == []  # no file yet: nothing, no error
    first, second = Progress("preprocess", done=1), Progress("preprocess", done=2)
    other = Progress("convert", done=9)
    torn = second.to_line()
    path.write_text(first.to_line() + other.to_line() + "not json\n" + torn[:10])
    assert reader.read() == [first]  # the foreign stage, the junk and the torn half left out
    with open(path, "a") as fh:
        fh.write(torn[10:])
    assert reader.read() == [second] and reader.read() == []


def test_the_trainers_rank_0_reports_to_the_channel_in_process_or_in_its_environment(tmp_path, monkeypatch):
    from trainer.progress import NoProgress, TrainProgress, make_progress

    monkeypatch.delenv(PROGRESS_FILE_ENV, raising=False)
    args = (512, {"test": 10, "validation": 10}, 5.0)
    assert type(make_progress(0, "train", *args)) is NoProgress  # run alone: its own lines
    with channel(tmp_path / "train.progress.jsonl"):
        assert isinstance(make_progress(0, "train", *args), TrainProgress)
        assert type(make_progress(1, "train", *args)) is NoProgress
        assert type(make_progress(0, "export", *args)) is NoProgress
    monkeypatch.setenv(PROGRESS_FILE_ENV, str(tmp_path / "eval.progress.jsonl"))
    reporter = make_progress(0, "eval", *args)
    reporter.evaluated_split("test", 0, 0.75)
    [record] = ChannelReader(tmp_path / "eval.progress.jsonl", "eval").read()
    assert record.metrics == {"test AUC": "0.75000 (step 0)"} and record.fraction == 0.5


def test_the_preprocess_job_reports_through_the_progress_it_is_given():
    """No module-global state: the job's stage timer tells the object it was handed, and a
    job that was handed none (a library call) reports nowhere."""
    from spark_jobs.progress import NO_PROGRESS, NoProgress
    from spark_jobs.timing import StageTimer

    class Heard(NoProgress):
        def __init__(self):
            self.said = []

        def phase(self, name):
            self.said.append(name)

    a, b = Heard(), Heard()
    timer = StageTimer(a)
    with timer.stage("count"):
        with StageTimer(b).stage("transform"):
            pass
    with timer.stage("dictionaries"):
        pass
    assert a.said == ["count", "dictionaries"] and b.said == ["transform"]
    assert StageTimer().progress is NO_PROGRESS
    with StageTimer().stage("count"):
        NO_PROGRESS.planned("count", [1, 2])  # a null object: takes the job's calls, says nothing


def test_a_reporter_writes_to_the_pipelines_channel_in_process_and_in_a_child(tmp_path, monkeypatch):
    path = tmp_path / "convert.progress.jsonl"
    with channel(path):
        with counting("convert", 300, "rows", phase="convert") as bar:
            for _ in range(3):
                bar.update(100)
    records = [Progress.from_line(x) for x in path.read_text().splitlines()]
    assert records[0].fraction == 0.0 and records[-1].fraction == 1.0
    assert records[-1].rows == 300 and records[-1].done == 300

    child = tmp_path / "score.progress.jsonl"
    code = (
        "from dlrm_contracts.progress import open_reporter\n"
        "r = open_reporter('score')\n"
        "r.report(phase='score', fraction=0.5, force=True)\n"
    )
    subprocess.run(
        [sys.executable, "-c", code], check=True, env={**os.environ, PROGRESS_FILE_ENV: str(child)}
    )
    assert Progress.from_line(child.read_text()).fraction == 0.5
    monkeypatch.delenv(PROGRESS_FILE_ENV, raising=False)
    quiet = open_reporter("score", enabled=False)
    quiet.report(phase="x", force=True)  # goes nowhere, fails nothing


SCRIPT = """
import time
from dlrm_contracts.config import ProgressConfig
from dlrm_contracts.progress import counting
settings = ProgressConfig(interval_s=0.3)
with counting("convert", 4000, "rows", phase="convert", settings=settings) as bar:
    for _ in range(40):
        time.sleep(0.05)
        bar.update(100)
"""


def _run_on_a_terminal(argv: list[str], env: dict[str, str]) -> str:
    """Run ``argv`` with a pseudo-terminal as its stdin, stdout and stderr; its output."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: exec at once
        os.execve(argv[0], argv, env)
    out = b""
    while True:
        try:
            data = os.read(fd, 65536)
        except OSError:  # the child closed the terminal
            break
        if not data:
            break
        out += data
    os.waitpid(pid, 0)
    return out.decode("utf-8", "replace")


def test_a_standalone_tool_draws_a_bar_with_an_eta_on_a_terminal_and_lines_elsewhere(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != PROGRESS_FILE_ENV}
    screen = _run_on_a_terminal([sys.executable, "-c", SCRIPT], env)
    frames = screen.replace("\r\n", "\r").split("\r")
    bars = [f for f in frames if "%|" in f]
    assert bars, screen[-2000:]
    assert any("ETA" in f and "rows/s" in f for f in bars), bars[-3:]
    assert "100%|" in bars[-1]
    piped = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=60
    )
    lines = piped.stderr.splitlines()
    # reports come once a second (the reporter's pace), each due for a line at this interval
    assert "%|" not in piped.stderr and len(lines) >= 3
    assert all(line.startswith("convert ") and "elapsed" in line for line in lines)
    assert lines[-1].startswith("convert 100%")


def test_the_watcher_follows_a_child_shows_lines_while_it_is_silent_and_counts_its_cpu(tmp_path):
    lines = Collect()
    display = Display(None, ProgressConfig(interval_s=0.5), emit=lines, bar=False)
    code = (
        "import time, os\n"
        "from dlrm_contracts.progress import open_reporter\n"
        "time.sleep(1.2)\n"  # silent start-up: the watcher still says the stage runs
        "r = open_reporter('preprocess')\n"
        "r.report(phase='count', fraction=0.25, force=True)\n"
        "end = time.process_time() + 0.8\n"
        "while time.process_time() < end: pass\n"  # ~0.8 CPU-s
        "r.report(phase='transform', fraction=1.0, force=True)\n"
    )
    with StageWatch("preprocess", tmp_path, display) as watch:
        subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ, **watch.env()})
    assert lines.items[0].startswith("preprocess · running · elapsed")
    assert any("count" in x and "25%" in x for x in lines.items)
    assert any("transform" in x and "100%" in x for x in lines.items)
    assert watch.latest.fraction == 1.0
    assert 0.7 <= watch.cpu_seconds < 5.0
    assert (tmp_path / "preprocess.progress.jsonl").exists()


def test_cpu_meter_counts_this_process_and_children_nobody_waited_for():
    meter = CpuMeter()
    # a grandchild left running on its own (as a JVM is), sampled while it lives
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time\nend = time.process_time() + 1.0\n"
            "while time.process_time() < end: pass\n"
            "time.sleep(30)",
        ]
    )
    try:
        deadline = time.time() + 20
        while time.time() < deadline and meter.seconds() < 1.0:  # seconds() samples too
            time.sleep(0.2)
    finally:
        proc.kill()
        proc.wait()
    assert 1.0 <= meter.seconds() < 10.0


def test_the_console_leaves_progress_lines_out_only_while_a_bar_is_drawn():
    record = logging.LogRecord("pipeline", logging.INFO, "", 0, "x", None, None)
    setattr(record, PROGRESS_RECORD, True)
    plain = logging.LogRecord("pipeline", logging.INFO, "", 0, "y", None, None)
    assert not ConsoleFilter(display_has_bar=True).filter(record)
    assert ConsoleFilter(display_has_bar=True).filter(plain)
    assert ConsoleFilter(display_has_bar=False).filter(record)


def test_a_preprocess_phase_reads_then_writes_or_sums_and_its_fraction_follows():
    from spark_jobs.progress import _Phase

    count = _Phase("count", "", read_tasks=10, after_tasks=0, rows=1000.0, started=0.0)
    count.stages = {1: (10, 5, 0)}
    assert count.fraction(0.6, now=50.0) == pytest.approx(0.3) and count.read_fraction() == 0.5
    count.stages = {1: (10, 5, 2)}  # two running: a task's worth more done
    assert count.fraction(0.6, now=50.0) == pytest.approx(0.36) and count.tasks() == (5, 10)
    count.stages = {1: (10, 10, 0), 2: (8, 3, 1)}  # reading took 100 s: the sums should take 66.7
    assert count.fraction(0.6, now=100.0) == pytest.approx(0.6)
    assert count.fraction(0.6, now=100.0 + 100 / 3) == pytest.approx(0.8)
    assert count.fraction(0.6, now=1000.0) == 0.99  # late: held below 1 until the phase ends
    transform = _Phase("transform", "", read_tasks=10, after_tasks=5, rows=1000.0, started=0.0)
    transform.stages = {1: (1, 1, 0), 2: (9, 9, 0), 3: (5, 2, 0)}
    assert transform.fraction(0.6, now=10.0) == pytest.approx(0.6 + 0.4 * 2 / 5)
    assert transform.tasks() == (12, 15)
    dictionaries = _Phase("dictionaries", "", read_tasks=0, after_tasks=0, rows=None, started=0.0)
    dictionaries.stages = {4: (4, 3, 0)}
    assert dictionaries.fraction(0.6, now=1.0) == pytest.approx(0.75)


@pytest.mark.parametrize(
    "section, message",
    [
        ({"interval_s": 0}, "interval_s"),
        ({"interval_s": "often"}, "interval_s"),
        ({"preprocess_phase_shares": {"count": -1}}, "preprocess_phase_shares"),
        ({"preprocess_phase_shares": {"count": 0}}, "preprocess_phase_shares"),
        ({"preprocess_read_shares": {"count": 1.0, "transform": 0.5}}, "preprocess_read_shares"),
        ({"preprocess_read_shares": {"count": 0.8}}, "preprocess_read_shares"),
        ({"every": 3}, "unknown setting"),
    ],
)
def test_bad_progress_settings_are_refused(section, message):
    with pytest.raises(ConfigError, match=message):
        config_from_dict({"progress": section})


def test_event_log_setting_turns_the_spark_event_log_on(tmp_path):
    from dlrm_contracts.config import SparkConfig
    from spark_jobs.session import spark_settings

    off = spark_settings(SparkConfig())
    assert "spark.eventLog.enabled" not in off
    on = spark_settings(SparkConfig(event_log_dir=str(tmp_path / "events")))
    assert on["spark.eventLog.enabled"] == "true"
    assert on["spark.eventLog.dir"] == (tmp_path / "events").resolve().as_uri()
    remote = spark_settings(SparkConfig(event_log_dir="hdfs://namenode:8020/spark-events"))
    assert remote["spark.eventLog.dir"] == "hdfs://namenode:8020/spark-events"


PIPELINE_ON_A_TERMINAL = """
import subprocess, sys, time
from pathlib import Path
from dlrm_contracts.config import ProgressConfig
from dlrm_contracts.layout import WorkdirLayout
from pipeline import runner
from pipeline.progress import StageWatch, make_display

layout = WorkdirLayout.at(sys.argv[1])
display = make_display(ProgressConfig(interval_s=0.5))
runner._setup_logging(layout, display)
child = ("import time\\nfrom dlrm_contracts.progress import open_reporter\\n"
         "with open_reporter('convert') as r:\\n"
         "    for i in range(31):\\n"
         "        r.report(phase='convert', done=i * 100, total=3000, unit='rows', rows=i * 100,"
         " fraction=i / 30)\\n"
         "        time.sleep(0.1)\\n")
runner.log.info("convert    running")
with StageWatch("convert", layout.logs, display) as watch:
    subprocess.run([sys.executable, "-c", child], check=True, env={**__import__("os").environ,
                                                                    **watch.env()})
runner.log.info("convert    ran")
"""


def test_the_pipeline_draws_a_bar_per_stage_on_a_terminal_and_keeps_lines_in_its_log(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != PROGRESS_FILE_ENV}
    screen = _run_on_a_terminal([sys.executable, "-c", PIPELINE_ON_A_TERMINAL, str(tmp_path)], env)
    frames = screen.replace("\r\n", "\r").split("\r")
    bars = [f for f in frames if f.startswith("convert") and "%|" in f]
    assert any("ETA" in f and "rows/s" in f for f in bars), screen[-2000:]
    assert "100%|" in bars[-1]
    assert "[pipeline] convert    running" in screen and "[pipeline] convert    ran" in screen
    assert "[pipeline] convert " not in screen.replace("[pipeline] convert    r", "")  # no lines
    [log] = (tmp_path / "logs").glob("pipeline-*.log")
    lines = [x for x in log.read_text().splitlines() if " INFO convert " in x and "elapsed" in x]
    assert len(lines) >= 4 and any("ETA" in x for x in lines)  # ~3 s at a line every 0.5 s


def test_the_cpu_meter_counts_a_child_that_was_already_running_from_its_own_start():
    """A descendant running before the stage (a Spark JVM kept by a test session, say) adds
    only what it burns during the stage, not its whole life's CPU time."""
    from pipeline.progress import CpuMeter

    code = (
        "import time\nend = time.process_time() + 1.5\n"
        "while time.process_time() < end: pass\nprint('burnt', flush=True)\ntime.sleep(30)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "burnt"
        meter = CpuMeter()
        time.sleep(0.3)
        # from its birth it would be 1.5 or more; the margin is for a test session's own JVM,
        # a descendant too, which may compile or collect in the background meanwhile
        assert meter.seconds() < 1.0
    finally:
        child.kill()
        child.wait()


def test_the_cpu_meter_counts_a_short_child_while_an_older_grandchild_ends_under_its_parent():
    """The last stop's CI failure: a Spark Python worker (a grandchild, under the test
    session's JVM) that ended during the stage was taken off the kernel's figure for this
    process's children, which never held it, and hid a short child the samples never saw."""
    parent_code = (
        "import subprocess, sys, time\n"
        "g = subprocess.Popen([sys.executable, '-c', 'import time, sys\\n"
        "end = time.process_time() + 1.0\\nwhile time.process_time() < end: pass\\n"
        "print(1, flush=True)\\nsys.stdin.readline()'], stdin=subprocess.PIPE, stdout=subprocess.PIPE)\n"
        "g.stdout.readline()\n"
        "print('ready', flush=True)\n"
        "sys.stdin.readline()\n"  # told to: let the grandchild end, and wait for it
        "g.stdin.close(); g.wait()\n"
        "print('ended', flush=True)\n"
        "time.sleep(30)\n"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", parent_code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert parent.stdout.readline().strip() == "ready"
        meter = CpuMeter()
        parent.stdin.write("go\n")
        parent.stdin.flush()
        assert parent.stdout.readline().strip() == "ended"
        burn = "import time\nend = time.process_time() + 0.8\nwhile time.process_time() < end: pass\n"
        subprocess.run([sys.executable, "-c", burn], check=True)
        assert 0.75 <= meter.seconds() < 5.0
    finally:
        parent.kill()
        parent.wait()
