"""The train stage after a config change, for real: the pipeline's CLI, one rank, then two
horovodrun ranks, then one again, a tiny binary dataset written with numpy
(tests/trainer_helpers.py's write_tiny_dataset).

A change of a setting that does not change the model (log_every, threads, ranks, max_steps)
resumes the checkpoints; a missing or damaged ``manifests/train.started`` decides nothing; a
change of the model's settings moves the checkpoints to ``checkpoints/superseded/<time>/``
(never deletes them: they may be the only copy of a model worth keeping) and says so in one
line.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dlrm_contracts.layout import complete_checkpoints
from pipeline_helpers import run_in_process
from trainer_helpers import write_tiny_dataset

pytestmark = [pytest.mark.horovod, pytest.mark.slow]

BASE = {
    "batch_size": 256,
    "eval_batch_size": 512,
    "log_every": 2,
    "warmup_steps": 0,
    "intra_op_threads": 1,
    "learning_rate": 0.05,
}


def _train(
    tmp_path: Path, workdir: Path, np_: int, max_steps: int, **train
) -> tuple[subprocess.CompletedProcess, dict]:
    """One pipeline run of the train stage; returns the process and the stage's summary. The
    two-rank run is the real ``python -m pipeline``; the one-rank runs its main in this
    process (run_in_process: the trainer still runs as a process of its own)."""
    config = tmp_path / "train.yaml"
    config.write_text("train:\n" + "".join(f"  {k}: {json.dumps(v)}\n" for k, v in {**BASE, **train}.items()))
    argv = ["--config", str(config), "--workdir", str(workdir), "--input", str(tmp_path / "raw")]
    argv += ["--stages", "train", "--np", str(np_), "--max-steps", str(max_steps)]
    if np_ == 1:
        proc, _ = run_in_process(tmp_path, *argv)
    else:
        proc = subprocess.run(
            [sys.executable, "-m", "pipeline", *argv],
            capture_output=True,
            text=True,
            timeout=900,
            cwd=tmp_path,
        )
    log = workdir / "logs" / "train.log"
    assert proc.returncode == 0, proc.stderr[-3000:] + (log.read_text()[-3000:] if log.exists() else "")
    manifest = json.loads((workdir / "manifests" / "train.json").read_text())
    return proc, manifest["summary"]


def _steps(workdir: Path) -> list[int]:
    return [step for step, _ in complete_checkpoints(workdir / "checkpoints")]


def test_harmless_changes_resume_and_a_model_change_sets_the_checkpoints_aside(tmp_path):
    workdir = tmp_path / "work"
    write_tiny_dataset(workdir / "binary", {"train": 4096, "test": 1024, "validation": 1024})
    (tmp_path / "raw").mkdir()  # the run needs an input directory; train never reads it

    _, first = _train(tmp_path, workdir, 1, 6)
    assert first["step"] == 6 and _steps(workdir) == [6]

    # two ranks instead of one; log_every, prefetch, threads and the evaluation's batch
    # changed, max_steps raised, and train.started missing: resumed from step 6, not 0
    (workdir / "manifests" / "train.started").unlink()
    _, second = _train(
        tmp_path, workdir, 2, 10, log_every=3, prefetch_batches=2, inter_op_threads=2, eval_batch_size=256
    )
    assert second["init"]["mode"] == "resume", second["init"]
    assert second["steps_run"] == 4 and second["step"] == 10, second
    assert second["ranks"] == 2
    assert "resumed from" in (workdir / "logs" / "train.log").read_text()

    # one rank left (a node died), and train.started damaged: still resumed, nothing moved
    (workdir / "manifests" / "train.started").write_text("{not json")
    _, third = _train(tmp_path, workdir, 1, 12, log_every=3, keep_checkpoints=3, checkpoint_every=1)
    assert third["init"]["mode"] == "resume" and third["steps_run"] == 2, third
    assert third["ranks"] == 1
    assert not (workdir / "checkpoints" / "superseded").exists()
    kept = _steps(workdir)
    assert kept[-1] == 12

    # a setting of the model changed: the checkpoints are moved aside, one line says so
    # (one rank: setting aside is the pipeline's, before any rank starts)
    proc, fifth = _train(tmp_path, workdir, 1, 4, learning_rate=0.1)
    assert fifth["init"]["mode"] == "scratch" and fifth["step"] == 4, fifth
    said = [line for line in proc.stderr.splitlines() if "moved to" in line]
    assert len(said) == 1 and "train.learning_rate 0.05 -> 0.1" in said[0], proc.stderr[-3000:]
    assert "rm -r" in said[0]
    [folder] = (workdir / "checkpoints" / "superseded").iterdir()
    assert sorted(int(p.name[5:]) for p in folder.glob("step-*")) == kept
    assert all((p / "meta.json").exists() for p in folder.glob("step-*"))
    assert fifth["checkpoints_set_aside"]["path"] == str(folder)
    assert _steps(workdir) == [4]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert [r["path"] for r in summary["checkpoints_set_aside"]] == [str(folder)]
    assert str(folder) in (workdir / "report" / "report.md").read_text()
