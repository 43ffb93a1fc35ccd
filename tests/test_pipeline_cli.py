"""Flag handling of the pipeline CLI (no stages run: these fail or stop before the lock)."""

import fcntl
import json
import subprocess
import sys

import pytest

from dlrm_contracts.config import PipelineConfig
from dlrm_contracts.errors import ExitCode, PipelineError
from pipeline import runner
from pipeline.cli import apply_flags, build_parser, main, validate
from pipeline.hosts import horovodrun_hosts, host_slots


def flags(*argv):
    return apply_flags(PipelineConfig(), build_parser().parse_args(["run", *argv]))


def test_hosts_without_np_uses_every_slot():
    assert flags("--hosts", "node1:4,node2:4").launch.np == 8
    assert flags("--hosts", "node1:4,node2:4", "--np", "6").launch.np == 6
    assert host_slots("a,b:3") == 4


def test_horovodrun_gets_exactly_np_slots():
    # with Gloo, horovodrun starts every slot of -H whatever -np says
    assert horovodrun_hosts("a:4,b:4", 6) == "a:4,b:2"
    assert horovodrun_hosts("a:2", 1) == "a:1"
    assert horovodrun_hosts("a, b:3", 4) == "a:1,b:3"  # horovodrun itself refuses a bare host


@pytest.mark.parametrize(
    "hosts, words",
    [
        ("a:2,a:2", "twice"),
        ("a:0,b:2", "offers no slot"),
        ("a:", "HOST:SLOTS"),
        (":4", "HOST:SLOTS"),
        ("a:\u00b2", "HOST:SLOTS"),
        ("a b:2", "HOST:SLOTS"),
        (",", "names no host"),
    ],
)
def test_bad_host_lists_are_usage_errors(hosts, words):
    with pytest.raises(PipelineError, match=words) as caught:
        validate(flags("--hosts", hosts, "--np", "1"))
    assert caught.value.code == ExitCode.USAGE


def test_np_beyond_the_host_slots_is_refused():
    with pytest.raises(PipelineError, match="more than the 4 slots"):
        validate(flags("--hosts", "a:2,b:2", "--np", "5"))


def test_flags_override_config_sections():
    config = flags(
        "--frequency-threshold",
        "15,C3:3",
        "--spark-master",
        "spark://m:7077",
        "--max-steps",
        "7",
        "--stages",
        "preprocess,convert",
        "--gpu",
        "--force",
    )
    assert str(config.preprocess.frequency_threshold) == "15,C3:3"
    assert config.spark.master == "spark://m:7077" and config.spark.gpu
    assert config.train.max_steps == 7 and config.force
    assert config.stages == ["preprocess", "convert"]


def test_export_alone_needs_no_input_and_names_the_missing_checkpoint(tmp_path, capsys):
    """export/score read no raw days: no --input is fine, the missing model is the error."""
    assert main(["--workdir", str(tmp_path / "w"), "--stages", "export"]) == ExitCode.EXPORT
    captured = capsys.readouterr()
    assert "no checkpoint" in captured.err and "--input" not in captured.err
    assert json.loads(captured.out.strip().splitlines()[-1])["status"] == "failed: export"


def test_default_stages_end_at_eval_and_score_input_is_a_list(tmp_path):
    from pipeline.cli import apply_flags, build_parser
    from dlrm_contracts.config import PipelineConfig

    assert PipelineConfig().stages == ["generate", "preprocess", "convert", "train", "eval"]
    args = build_parser().parse_args(["run", "--stages", "score", "--score-input", "a.gz, b"])
    assert apply_flags(PipelineConfig(), args).score.input == ["a.gz", "b"]


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--stages", "preprocess,bogus"], "unknown stage"),
        (["--frequency-threshold", "5,C99:1"], "unknown column"),
        (["--np", "0"], "at least 1"),
        (["--stages", "export,score"], "needs --score-input"),
        (["--stages", "score", "--score-input", "/nonexistent/day_9.gz"], "not a file"),
    ],
)
def test_bad_flags_exit_with_the_usage_code(argv, words, tmp_path, capsys):
    assert main(["--workdir", str(tmp_path), *argv]) == ExitCode.USAGE
    assert words in capsys.readouterr().err


def test_show_config_prints_every_section():
    out = subprocess.run(
        [sys.executable, "-m", "pipeline", "show-config"], capture_output=True, text=True, check=True
    ).stdout
    for section in (
        "generator:",
        "spark:",
        "preprocess:",
        "convert:",
        "train:",
        "launch:",
        "export:",
        "score:",
    ):
        assert section in out


# ---- defects found by adversarial runs (each failed before its fix) ----


def last_json(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.parametrize(
    "text, words",
    [
        ("launch: [\n", "not valid YAML"),
        ("launch:\n  np: two\n", "config.launch.np: 'two' is not a valid int"),
        ("train:\n  amp: 'yes'\n", "config.train.amp"),
        ("stages: train\n", "config.stages"),
        ("train:\n  init: previous\n", "needs preprocess.ids: stable"),
    ],
)
def test_bad_config_files_are_usage_errors_not_tracebacks(text, words, tmp_path, capsys):
    config = tmp_path / "c.yaml"
    config.write_text(text)
    assert main(["--workdir", str(tmp_path / "w"), "--config", str(config)]) == ExitCode.USAGE
    assert words in capsys.readouterr().err


def test_config_that_is_a_directory_is_a_usage_error(tmp_path, capsys):
    assert main(["--workdir", str(tmp_path / "w"), "--config", str(tmp_path)]) == ExitCode.USAGE
    assert "cannot be read" in capsys.readouterr().err


def test_numbers_still_fit_string_settings():
    from dlrm_contracts.config import config_from_dict

    assert (
        str(config_from_dict({"preprocess": {"frequency_threshold": 15}}).preprocess.frequency_threshold)
        == "15"
    )


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--stages", ","], "names no stage"),
        (["--max-steps", "-5"], "at least 1"),
    ],
)
def test_empty_stage_list_and_negative_steps_are_refused(argv, words, tmp_path, capsys):
    assert main(["--workdir", str(tmp_path), "--input", str(tmp_path), *argv]) == ExitCode.USAGE
    captured = capsys.readouterr()
    assert words in captured.err
    assert last_json(captured.out)["status"] == "failed: usage"


def test_plan_with_a_bad_threshold_list_is_a_usage_error(tmp_path, capsys):
    assert main(["plan", "--workdir", str(tmp_path), "--thresholds", "1,5,x"]) == ExitCode.USAGE
    assert "not a whole number" in capsys.readouterr().err


def test_plan_without_counts_is_a_usage_error(tmp_path, capsys):
    assert main(["plan", "--workdir", str(tmp_path), "--thresholds", "1,5"]) == ExitCode.USAGE
    assert "run the preprocess stage" in capsys.readouterr().err


def test_workdir_that_cannot_be_created_is_a_clear_usage_error(tmp_path):
    blocker = tmp_path / "a file"
    blocker.write_text("")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipeline",
            "--workdir",
            str(blocker / "sub"),
            "--input",
            str(tmp_path),
            "--stages",
            "train",
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == ExitCode.USAGE, proc.stderr
    assert "cannot be created or written" in proc.stderr and "Traceback" not in proc.stderr
    assert last_json(proc.stdout)["status"] == "failed: usage"


def test_locked_workdir_still_ends_stdout_with_a_json_summary(tmp_path):
    workdir = tmp_path / "w"
    workdir.mkdir()
    with open(workdir / ".pipeline.lock", "a+") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "pipeline",
                "--workdir",
                str(workdir),
                "--input",
                str(tmp_path),
                "--stages",
                "generate",
            ],
            capture_output=True,
            text=True,
        )
    assert proc.returncode == ExitCode.LOCKED
    assert last_json(proc.stdout)["status"] == "failed: locked"


def _workdir_with_old_results(tmp_path):
    """A workdir whose binary dataset is at threshold 5 and whose eval.json is from a model
    that no eval manifest vouches for (e.g. left from before a threshold change)."""
    workdir = tmp_path / "w"
    (workdir / "binary").mkdir(parents=True)
    (workdir / "binary" / "dataset.json").write_text(
        json.dumps({"threshold_spec": "5", "splits": {"train": 1, "test": 1, "validation": 1}})
    )
    (workdir / "eval.json").write_text(json.dumps({"test_auc": 0.7, "validation_auc": 0.7}))
    return workdir


def test_summary_does_not_report_a_stale_auc_and_names_the_dataset_threshold(tmp_path):
    workdir = _workdir_with_old_results(tmp_path)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipeline",
            "--workdir",
            str(workdir),
            "--input",
            str(tmp_path),
            "--stages",
            "generate",
            "--frequency-threshold",
            " 15, c3:3 ",
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    summary = last_json(proc.stdout)
    assert summary["test_auc"] is None and summary["validation_auc"] is None
    assert summary["threshold"] == "15,C3:3"  # canonical form, as in manifests
    assert summary["dataset_threshold"] == "5"


def test_unexpected_error_still_prints_the_summary_with_the_failed_stage(tmp_path, monkeypatch, capsys):
    def boom(ctx):
        raise RuntimeError("a bug")

    monkeypatch.setattr(runner, "install_signal_handlers", lambda: None)
    monkeypatch.setitem(
        runner.STAGE_TABLE,
        "generate",
        runner.STAGE_TABLE["generate"].__class__("generate", lambda ctx: {}, lambda ctx: "", boom),
    )
    assert main(["--workdir", str(tmp_path / "w"), "--stages", "generate"]) == ExitCode.FAILED
    summary = last_json(capsys.readouterr().out)
    assert summary["status"] == "failed: failed"
    assert summary["stages"]["generate"]["action"] == "failed"
    log = next((tmp_path / "w" / "logs").glob("pipeline-*.log")).read_text()
    assert "RuntimeError: a bug" in log


def test_convert_alone_cannot_lower_below_the_parquet_threshold_and_leaves_binary_alone(tmp_path):
    workdir = tmp_path / "w"
    (workdir / "parquet").mkdir(parents=True)
    (workdir / "parquet" / "preprocess.json").write_text(json.dumps({"threshold_spec": "5"}))
    (workdir / "parquet" / "_SUCCESS").write_text("")
    (workdir / "binary").mkdir()
    dataset = json.dumps({"threshold_spec": "10"})
    (workdir / "binary" / "dataset.json").write_text(dataset)
    (workdir / "binary" / "_SUCCESS").write_text("")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipeline",
            "--workdir",
            str(workdir),
            "--input",
            str(tmp_path),
            "--stages",
            "convert",
            "--frequency-threshold",
            "2",
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == ExitCode.CONVERT, proc.stderr
    assert "--stages preprocess,convert" in proc.stderr
    assert (workdir / "binary" / "dataset.json").read_text() == dataset
    assert last_json(proc.stdout)["stages"]["convert"]["action"] == "failed"


def test_help_of_the_default_command_names_subcommands_and_exit_codes():
    out = subprocess.run(
        [sys.executable, "-m", "pipeline", "--help"], capture_output=True, text=True, check=True
    ).stdout
    assert "plan --workdir" in out and "show-config" in out and "3 workdir locked" in out


def test_unknown_flag_exits_2_with_a_json_summary_last(capsys):
    assert main(["--bogus"]) == ExitCode.USAGE
    captured = capsys.readouterr()
    assert "unrecognized arguments: --bogus" in captured.err
    assert last_json(captured.out)["status"] == "failed: usage"


def test_interrupted_generate_is_not_preprocessed_as_if_complete(tmp_path):
    raw = tmp_path / "w" / "raw"
    raw.mkdir(parents=True)
    (raw / "day_0").write_text("")
    (raw / ".generator_in_progress.json").write_text('{"days": [{"file": "day_0"}]}')
    proc = subprocess.run(
        [sys.executable, "-m", "pipeline", "--workdir", str(tmp_path / "w"), "--stages", "preprocess"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == ExitCode.USAGE, proc.stderr
    assert "incomplete" in proc.stderr


def test_forced_train_starts_from_scratch_instead_of_resuming_the_finished_run(tmp_path, monkeypatch):
    from pipeline import stages
    from dlrm_contracts.layout import WorkdirLayout, complete_checkpoints
    from dlrm_contracts.atomic import write_json_atomic
    from pipeline.manifest import ManifestStore
    from pipeline.processes import ChildResult
    from trainer_helpers import write_tiny_dataset

    layout = WorkdirLayout.at(tmp_path / "w")
    write_tiny_dataset(layout.binary, {"train": 8, "test": 8, "validation": 8})
    config = PipelineConfig()
    ctx = stages.StageContext(config, layout, ManifestStore(layout.manifests), tmp_path / "c.yaml")
    seen = []
    monkeypatch.setattr(stages, "verify_binary_dataset", lambda ctx: None)
    monkeypatch.setattr(
        stages,
        "run_child",
        lambda argv, log, **_: (
            seen.append([s for s, _ in complete_checkpoints(layout.checkpoints)]) or ChildResult(0, {}, [])
        ),
    )
    final = layout.checkpoints / "step-000000020"
    final.mkdir(parents=True)
    (final / "meta.json").write_text('{"step": 20}')  # saved before checkpoints named their run
    # the record such a checkpoint's run left (before the key was split into kinds)
    write_json_atomic(layout.manifests / "train.started", {"key": stages._legacy_train_key(ctx)})
    stages.run_train(ctx)  # same configuration, not forced: resumes (keeps checkpoints)
    assert seen == [[20]]
    config.force = True
    stages.run_train(ctx)  # forced: the old checkpoints are set aside before training
    assert seen == [[20], []]
    # set aside, not deleted: a model change must never lose a trained model
    assert [p.name for p in layout.superseded.glob("*/step-*")] == ["step-000000020"]


@pytest.mark.parametrize("stage", ["train", "eval"])
def test_missing_or_damaged_dataset_exits_with_the_dataset_code_before_any_rank(stage, tmp_path):
    workdir = tmp_path / "w"
    (workdir / "binary").mkdir(parents=True)  # no _SUCCESS: an interrupted conversion
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipeline",
            "--workdir",
            str(workdir),
            "--input",
            str(tmp_path),
            "--stages",
            stage,
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == ExitCode.DATASET_INVALID, proc.stderr
    assert "incomplete" in proc.stderr
    assert not (workdir / "logs" / f"{stage}.log").exists()  # no horovodrun was started


def test_a_failed_multi_rank_child_is_reported_by_the_first_ranks_own_line(tmp_path):
    """horovodrun's output of a real failure (one rank's known error, then the other rank's
    traceback when the collective broke, then horovodrun's own): the stage's line is the
    first rank's error, not the traceback's last lines."""
    from dlrm_contracts.layout import WorkdirLayout
    from pipeline.processes import ChildResult
    from pipeline.stages import StageContext, _child_failed

    tail = [
        "[1]<stderr>:trainer: error: /w/checkpoints/step-000000078 does not hold all columns of 'table/0/0-16'",
        "[0]<stderr>:Traceback (most recent call last):",
        '[0]<stderr>:  File "/work/main/dlrm_contracts/errors.py", line 150, in run_cli',
        "[0]<stderr>:tensorflow.python.framework.errors_impl.UnavailableError: Gloo: connection closed",
        "[0]<stderr>:trainer: unexpected error (a bug, traceback above): UnavailableError: closed",
        "RuntimeError: Horovod detected that one or more processes exited with non-zero status",
    ]
    ctx = StageContext(PipelineConfig(), WorkdirLayout.at(tmp_path), None, tmp_path / "c.yaml")
    error = _child_failed("train", ChildResult(1, None, tail), ExitCode.TRAIN, ctx)
    assert error.code == ExitCode.TRAIN
    assert str(error).startswith("train failed (exit 1): trainer: error: /w/checkpoints/step-000000078")
    assert "Traceback" not in str(error)
    only_a_crash = ChildResult(1, None, tail[1:])  # no known error: the log's last lines
    assert "last lines of" in str(_child_failed("train", only_a_crash, ExitCode.TRAIN, ctx))


def test_a_ranks_known_error_is_a_refusal_a_crash_or_an_interruption_is_not(tmp_path):
    """The summary's status tells a scheduler what another attempt can change: a rank's known
    one-line error (a checkpoint or previous model that does not fit) is ``train_refused`` /
    ``eval_refused``; a crash, an interrupted child or another stage keeps the stage's kind."""
    from dlrm_contracts.layout import WorkdirLayout
    from pipeline.processes import ChildResult
    from pipeline.stages import StageContext, _child_failed

    ctx = StageContext(PipelineConfig(), WorkdirLayout.at(tmp_path), None, tmp_path / "c.yaml")
    refusal = [
        "[0]<stderr>:trainer: error: the previous model /w/checkpoints/step-000000012 has "
        "dims {'embedding_dim': 16}, this run {'embedding_dim': 8}: a warm start keeps "
        "the model's shape (train.init: scratch to train the new shape)"
    ]
    crash = ["[0]<stderr>:trainer: unexpected error (a bug, traceback above): ValueError: x"]
    interrupted = ["[0]<stderr>:trainer: error: "]
    kinds = {
        name: _child_failed(stage, ChildResult(code, None, tail), exit_code, ctx).kind
        for name, stage, code, tail, exit_code in (
            ("train", "train", 1, refusal, ExitCode.TRAIN),
            ("eval", "eval", 1, refusal, ExitCode.EVAL),
            ("crash", "train", 1, crash, ExitCode.TRAIN),
            ("interrupted", "train", 130, refusal, ExitCode.TRAIN),
            ("killed", "train", -9, refusal, ExitCode.TRAIN),
            ("no cause", "train", 1, interrupted, ExitCode.TRAIN),
            ("export", "export", 1, refusal, ExitCode.EXPORT),
        )
    }
    assert kinds == {
        "train": "train_refused",
        "eval": "eval_refused",
        "crash": "train",
        "interrupted": "train",
        "killed": "train",
        "no cause": "train",
        "export": "export",
    }


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--workdir", "s3://bucket/criteo/w?access_key=hunter2"], "query string"),
        (["--input", "s3://bucket/raw?secret_key=hunter2"], "query string"),
        (["--input", "s3://AKIAEXAMPLE:hunter2@bucket/raw"], "password"),
    ],
)
def test_urls_with_secrets_are_refused_before_anything_is_written(argv, words, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    base = {"--workdir": str(tmp_path / "w"), "--input": str(tmp_path / "raw")}
    base.update(dict(zip(argv[::2], argv[1::2])))
    assert main([x for pair in base.items() for x in pair]) == ExitCode.USAGE
    captured = capsys.readouterr()
    assert words in captured.err and "hunter2" not in captured.err + captured.out
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no local "s3:" directory, no workdir
