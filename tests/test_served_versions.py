"""Nothing served is lost: a version a scorer may be reading, or one a person chose to serve,
outlives pruning, and damaged files end a stage in one line instead of serving the wrong model.

Pruning keeps the pinned, the served and the newest verified export versions; `run_pipeline.sh
export pin|unpin|rollback|latest` change which, and the score stage follows (a real tiny
SavedModel). Damaged checkpoint, dataset or SavedModel files make eval, export and score end
with one line naming the file and the fix, their exit code, no traceback (one real two-rank
horovodrun); an older intact checkpoint of the run is used where training would resume from it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dlrm_contracts.errors import ExitCode
from dlrm_contracts.layout import EXPORT_FINGERPRINT, SAVED_MODEL_PB
from dlrm_contracts.schema import CAT_COLUMNS, NUM_INTEGER
from dlrm_contracts.serving_state import (
    ServingState,
    ServingStateError,
    read_state,
    served_export,
    write_state,
)

# ------------------------------------------------------------------ pruning and the commands
# Version directories with an empty saved_model.pb: what pruning and the commands look at.


def fake_versions(export: Path, versions) -> None:
    for version in versions:
        (export / str(version)).mkdir(parents=True)
        (export / str(version) / SAVED_MODEL_PB).write_bytes(b"")
        (export / str(version) / EXPORT_FINGERPRINT).write_text(
            json.dumps({"version": version, "checkpoint_step": 10 * version})
        )


def on_disk(export: Path) -> list[int]:
    return sorted(int(p.name) for p in export.iterdir() if p.name.isdigit())


def export_cli(workdir: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pipeline", "export", *args, "--workdir", str(workdir)],
        capture_output=True,
        text=True,
        timeout=300,
    )


def export_here(workdir: Path, *args: str) -> subprocess.CompletedProcess:
    """``export_cli``'s command line run in this process (its main, its exit code and output;
    the commands start no process): the real command line's exit codes and its lock are
    checked through ``export_cli`` in the tests that use it."""
    from pipeline_helpers import run_in_process

    return run_in_process(workdir.parent, "export", *args, "--workdir", str(workdir))[0]


def test_pruning_keeps_the_pinned_and_the_newest_verified_version(tmp_path):
    """Versions 1-6, 1 pinned, 2 and 3 verified (4-6 exported before anything was verified,
    or by a run killed before recording it), keep_versions 2: 1, 3 (the newest verified, and
    served), 5 and 6 stay. Unpinned, 1 goes at the next pruning."""
    from trainer.export import prune_versions

    export = tmp_path / "export"
    fake_versions(export, range(1, 7))
    write_state(export, ServingState(pinned={1}, verified={2: "t", 3: "t"}))
    assert served_export(export) == export / "3"
    assert prune_versions(export, 2) == [2, 4]
    assert on_disk(export) == [1, 3, 5, 6]
    state = read_state(export)
    state.pinned.discard(1)
    write_state(export, state)
    assert prune_versions(export, 2) == [1]
    assert on_disk(export) == [3, 5, 6]


def test_a_held_version_is_never_pruned_and_latest_releases_it(tmp_path):
    from trainer.export import prune_versions

    export = tmp_path / "w" / "export"
    fake_versions(export, range(1, 5))
    write_state(export, ServingState(verified={v: "t" for v in range(1, 5)}))
    proc = export_cli(tmp_path / "w", "rollback")  # the version before the served 4
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.splitlines()[-1])["served_version"] == 3
    proc = export_here(tmp_path / "w", "rollback", "1")
    assert proc.returncode == 0 and served_export(export) == export / "1", proc.stderr
    fake_versions(export, [5])  # a later export: 1 stays served
    state = read_state(export)
    state.verified[5] = "t"
    write_state(export, state)
    assert served_export(export) == export / "1"
    assert prune_versions(export, 1) == [2, 3, 4]
    assert on_disk(export) == [1, 5]
    proc = export_here(tmp_path / "w", "latest")
    assert proc.returncode == 0 and served_export(export) == export / "5", proc.stderr
    assert prune_versions(export, 1) == [1]


def test_pin_unpin_and_wrong_versions_through_the_command(tmp_path):
    export = tmp_path / "w" / "export"
    fake_versions(export, [1, 2])
    proc = export_here(tmp_path / "w", "pin", "1")
    assert proc.returncode == 0, proc.stderr
    listed = json.loads(proc.stdout.splitlines()[-1])
    assert listed["pinned"] == [1] and listed["served_version"] == 2
    assert [(r["version"], r["pinned"], r["served"]) for r in listed["versions"]] == [
        (1, True, False),
        (2, False, True),
    ]
    assert read_state(export).pinned == {1}
    for args, words in [
        (("pin", "7"), "no export version 7"),
        (("rollback", "9"), "no export version 9"),
        (("pin",), "needs a VERSION"),
        (("latest", "1"), "takes no"),
    ]:
        proc = export_here(tmp_path / "w", *args)
        assert proc.returncode == ExitCode.USAGE and words in proc.stderr, (args, proc.stderr)
        assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert export_here(tmp_path / "w", "unpin", "1").returncode == 0
    assert read_state(export).pinned == set()
    proc = export_here(tmp_path / "w", "rollback", "1")
    proc = export_here(tmp_path / "w", "rollback")  # nothing older than 1
    assert proc.returncode == ExitCode.USAGE and "no version older" in proc.stderr


def test_the_commands_wait_for_no_run_they_exit_3_while_one_holds_the_workdir(tmp_path):
    import os

    from dlrm_contracts.layout import WorkdirLayout
    from dlrm_contracts.lock import LOCK_TOKEN_ENV, WorkdirLock

    export = tmp_path / "w" / "export"
    fake_versions(export, [1, 2])
    with WorkdirLock(WorkdirLayout.at(tmp_path / "w").lock_file):
        # the command as another run's, not as a child of this holder (which would inherit
        # its lock: dlrm_contracts.lock). Not monkeypatch.delenv: its teardown would put the
        # token back after the lock's release, and every later child would carry it.
        token = os.environ.pop(LOCK_TOKEN_ENV)
        try:
            proc = export_cli(tmp_path / "w", "rollback")
        finally:
            os.environ[LOCK_TOKEN_ENV] = token
    assert LOCK_TOKEN_ENV not in os.environ  # the lock's exit took its token away
    assert proc.returncode == ExitCode.LOCKED and "in use by another" in proc.stderr, proc.stderr
    assert not (export / "serving.json").exists()


def test_a_damaged_serving_record_deletes_nothing_and_is_named(tmp_path):
    from trainer.export import prune_versions

    export = tmp_path / "w" / "export"
    fake_versions(export, [1, 2, 3])
    (export / "serving.json").write_text('{"format_version": 1, "pinned": [1')
    with pytest.raises(ServingStateError, match="serving.json is damaged"):
        prune_versions(export, 1)
    assert on_disk(export) == [1, 2, 3]
    proc = export_cli(tmp_path / "w", "list")
    assert proc.returncode == ExitCode.USAGE and "serving.json is damaged" in proc.stderr
    assert "Traceback" not in proc.stderr


# ------------------------------------------------------------------ a real tiny model
CONFIG = """
preflight: {enabled: false}
train: {preset: small, wide: false, batch_size: 256, optimizer: sgd, learning_rate: 0.5,
        learning_rate_scaling: none, seed: 7, intra_op_threads: 1}
launch: {np: %d}
"""


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A workdir (binary dataset, dictionaries) with two checkpoints of one run, step 3 and 6."""
    from trainer.loop import run
    from trainer_helpers import small_config, stream_day

    root = tmp_path_factory.mktemp("served")
    work = root / "work"
    stream_day(work / "binary", 1, dictionaries=work / "parquet" / "dictionaries")
    run(small_config(max_steps=6, checkpoint_every=3, keep_checkpoints=5), work / "binary", work)
    assert sorted(p.name for p in (work / "checkpoints").glob("step-*")) == [
        "step-000000003",
        "step-000000006",
    ]
    (root / "raw").mkdir()
    return root


def workdir_copy(trained: Path, tmp_path: Path, newest_only: bool = False) -> Path:
    work = tmp_path / "work"
    shutil.copytree(trained / "work", work)
    if newest_only:
        shutil.rmtree(work / "checkpoints" / "step-000000003")
    return work


def pipeline(trained: Path, work: Path, *args: str, np_: int = 1, own_process: bool = False):
    """The pipeline's command line on ``work``: its main in this process (run_in_process; its
    stages' trainer and scorer still run as processes of their own), or with ``own_process``
    the real ``python -m pipeline``."""
    config = work.parent / "c.yaml"
    config.write_text(CONFIG % np_)
    argv = ["--input", str(trained / "raw"), "--workdir", str(work), "--config", str(config), *args]
    if not own_process:
        from pipeline_helpers import run_in_process

        return run_in_process(work.parent, *argv)
    proc = subprocess.run(
        [sys.executable, "-m", "pipeline", *argv], capture_output=True, text=True, timeout=900
    )
    lines = proc.stdout.strip().splitlines()
    return proc, json.loads(lines[-1]) if lines else None


def score_input(path: Path, rows: int = 64) -> Path:
    """Raw labelled lines whose values are the dictionaries' (stream_day's naming)."""
    rng = np.random.default_rng(3)
    lines = []
    for _ in range(rows):
        ints = [str(int(v)) for v in rng.integers(0, 50, NUM_INTEGER)]
        cats = [f"{c:02x}{int(rng.integers(1, 3)):06x}" for c in range(len(CAT_COLUMNS))]
        lines.append("\t".join([str(int(rng.integers(0, 2))), *ints, *cats]))
    path.write_text("\n".join(lines) + "\n")
    return path


def test_rollback_moves_the_score_stage_to_that_version(trained, tmp_path):
    """Version 1 from the step-3 checkpoint, version 2 from step 6: the score stage scores
    with 2, verified and served; after `export rollback` with 1 (its scores differ), and the
    stage runs again rather than being skipped; `export latest` returns to 2."""
    import pyarrow.parquet as pq

    from dlrm_contracts.config import ExportConfig
    from trainer.export import export_model

    work = workdir_copy(trained, tmp_path)
    aside = tmp_path / "aside"
    (work / "checkpoints" / "step-000000006").rename(aside)
    first = export_model(work, work / "binary", ExportConfig())
    aside.rename(work / "checkpoints" / "step-000000006")
    second = export_model(work, work / "binary", ExportConfig())
    assert (first["checkpoint_step"], second["checkpoint_step"]) == (3, 6)
    assert second["served_version"] == 2 and sorted(read_state(work / "export").verified) == [1, 2]
    day = score_input(tmp_path / "day_9")

    def score() -> tuple[str, list[float]]:
        proc, summary = pipeline(trained, work, "--stages", "score", "--score-input", str(day))
        assert proc.returncode == 0 and summary["stages"]["score"]["action"] == "ran", proc.stderr
        model = json.loads((work / "manifests" / "score.json").read_text())["summary"]["model"]
        return model, pq.read_table(work / "scores" / "day_9.parquet").column("probability").to_pylist()

    model, newest = score()
    assert model == str(work / "export" / "2")
    proc = export_cli(work, "rollback")
    assert proc.returncode == 0 and "serving version 1" in proc.stdout, proc.stderr
    model, rolled_back = score()
    assert model == str(work / "export" / "1") and rolled_back != newest
    assert export_here(work, "latest").returncode == 0
    assert score()[0] == str(work / "export" / "2")


# ------------------------------------------------------------------ damaged files
def damage(work: Path, kind: str) -> str:
    """Damage the newest checkpoint (or the dataset); returns the name the error must give."""
    step = work / "checkpoints" / "step-000000006"
    if kind == "truncated rank-0.npz":
        data = (step / "rank-0.npz").read_bytes()
        (step / "rank-0.npz").write_bytes(data[: len(data) // 2])
        return "rank-0.npz"
    if kind == "garbage meta.json":
        (step / "meta.json").write_bytes(b"\x00garbage{")
        return "meta.json"
    if kind == "garbage replicated.npz":
        (step / "replicated.npz").write_bytes(b"garbage" * 100)
        return "replicated.npz"
    cat = work / "binary" / "test" / "cat_0.bin"  # int8 ids of C1 (3 rows)
    data = bytearray(cat.read_bytes())
    data[0] = 0xFE  # id -2
    cat.write_bytes(bytes(data))
    return "cat_0.bin"


DAMAGES = ["truncated rank-0.npz", "garbage meta.json", "garbage replicated.npz", "id -2"]


def one_failure_line(proc, stage: str) -> str:
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    failed = [line for line in proc.stderr.splitlines() if f"{stage} failed" in line]
    assert len(failed) == 1, proc.stderr[-3000:]
    assert "last lines of" not in failed[0], failed[0]
    return failed[0]


def test_a_known_error_buried_under_tracebacks_is_still_the_stages_line(tmp_path):
    """The first rank's line, then more traceback lines than the tail keeps (the case of the
    real two-rank run below, without its cost)."""
    from dlrm_contracts.config import PipelineConfig
    from dlrm_contracts.layout import WorkdirLayout
    from pipeline.processes import ChildResult
    from pipeline.stages import StageContext, _child_failed

    first = "trainer: error: /w/checkpoints/step-000000006/rank-0.npz is unreadable"
    tail = [f'[1]<stderr>:  File "x.py", line {i}, in f' for i in range(25)]
    ctx = StageContext(PipelineConfig(), WorkdirLayout.at(tmp_path), None, tmp_path / "c.yaml")
    error = _child_failed("eval", ChildResult(1, None, tail, [first, first]), ExitCode.EVAL, ctx)
    assert str(error).startswith(f"eval failed (exit 1): {first} (log: ")


def eval_fix(kind: str) -> str:
    return "--stages convert --force" if kind == "id -2" else "train again (--stages train"


@pytest.mark.parametrize("kind", [DAMAGES[0], DAMAGES[3]])
def test_eval_on_damaged_files_is_one_line_naming_the_file_and_the_fix(trained, tmp_path, kind):
    """The only checkpoint of the run damaged (or an id out of its table): exit 9, one line
    naming the file and the fix. The truncated rank file runs two real ranks: the line was
    buried under horovodrun's traceback. (The other damaged files: the test below.)"""
    work = workdir_copy(trained, tmp_path, newest_only=True)
    name = damage(work, kind)
    ranks = 2 if kind == "truncated rank-0.npz" else 1
    # the two-rank case through the real command line, the other through its main here
    proc, summary = pipeline(trained, work, "--stages", "eval", "--force", np_=ranks, own_process=ranks == 2)
    # a refusal (a person must retrain or reconvert): a scheduler does not retry it
    assert proc.returncode == ExitCode.EVAL and summary["status"] == "failed: eval_refused", proc.stderr
    line = one_failure_line(proc, "eval")
    assert name in line, line
    fix = eval_fix(kind)
    assert fix in line, line


@pytest.mark.parametrize("kind", DAMAGES[1:3])
def test_eval_of_another_damaged_checkpoint_file_is_the_trainers_one_line(trained, tmp_path, capsys, kind):
    """The other files of the only checkpoint damaged: the trainer's eval mode (the main of
    ``python -m trainer``, run in this process) exits 9 with one line naming the file and the
    fix, the line the eval stage above reports as a refusal."""
    from trainer.cli import main

    work = workdir_copy(trained, tmp_path, newest_only=True)
    name = damage(work, kind)
    config = tmp_path / "c.yaml"
    config.write_text(CONFIG % 1)
    capsys.readouterr()
    # the eval stage's command line (pipeline.stages.trainer_argv) for one process
    code = main(
        ["--mode", "eval", "--dataset", str(work / "binary"), "--workdir", str(work), "--config", str(config)]
    )
    stderr = capsys.readouterr().err
    assert code == ExitCode.EVAL, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    [line] = [line for line in stderr.splitlines() if line.startswith("trainer: error:")]
    assert name in line and eval_fix(kind) in line, line


def test_eval_and_export_use_the_newest_intact_checkpoint(trained, tmp_path):
    """Step 6 damaged, step 3 intact (the same run): eval moves step 6 aside and evaluates
    step 3, as training would resume from it; export exports step 3 and says why."""
    from dlrm_contracts.config import ExportConfig, load_config
    from trainer.export import export_model
    from trainer.loop import run

    work = workdir_copy(trained, tmp_path / "e")
    damage(work, "truncated rank-0.npz")
    config = tmp_path / "c.yaml"
    config.write_text(CONFIG % 1)
    summary = run(load_config(config).train, work / "binary", work, mode="eval")
    assert summary["step"] == 3 and summary["test_auc"] is not None
    assert (work / "checkpoints" / "damaged-step-000000006").is_dir()

    work = workdir_copy(trained, tmp_path / "x")
    damage(work, "garbage replicated.npz")
    made = export_model(work, work / "binary", ExportConfig())
    assert made["checkpoint_step"] == 3 and made["version"] == 1
    assert "replicated.npz is unreadable" in made["damaged_checkpoints"][0]


@pytest.mark.parametrize("kind", DAMAGES[:3])
def test_export_of_a_damaged_checkpoint_names_it_and_the_fix(trained, tmp_path, kind):
    from dlrm_contracts.config import ExportConfig
    from trainer.export import ExportError, export_model

    work = workdir_copy(trained, tmp_path, newest_only=True)
    name = damage(work, kind)
    with pytest.raises(
        ExportError,
        match=f"{name}.*no older checkpoint of this run is intact: "
        r"train again \(--stages train,eval,export --force\)",
    ):
        export_model(work, work / "binary", ExportConfig())
    assert not (work / "export").exists() or on_disk(work / "export") == []


def test_export_and_score_stages_on_damaged_files_are_one_line(trained, tmp_path):
    """Through the pipeline: export of a truncated checkpoint exits 10; scoring with a version
    whose saved_model.pb was overwritten with garbage exits 11 naming it and `export
    rollback` (the version's digest no longer matches, so it is refused before loading)."""
    from dlrm_contracts.config import ExportConfig
    from trainer.export import export_model

    work = workdir_copy(trained, tmp_path, newest_only=True)
    export_model(work, work / "binary", ExportConfig())
    (work / "export" / "1" / SAVED_MODEL_PB).write_bytes(b"\x08garbage" * 50)
    day = score_input(tmp_path / "day_9")
    proc, _ = pipeline(trained, work, "--stages", "score", "--score-input", str(day))
    assert proc.returncode == ExitCode.SCORE, proc.stderr[-3000:]
    line = one_failure_line(proc, "score")
    # refused before loading: its files differ from the digest the export recorded
    assert "export/1" in line and "differ" in line and "export rollback" in line, line

    name = damage(work, "truncated rank-0.npz")
    proc, _ = pipeline(trained, work, "--stages", "export", "--force")
    assert proc.returncode == ExitCode.EXPORT, proc.stderr[-3000:]
    line = one_failure_line(proc, "export")
    assert name in line and "train again" in line, line
