"""Multi-host launches go through one path: the pipeline's horovodrun prefix built from --hosts.

The real run uses ``--hosts localhost:2``: the very code path a ``node1:4,node2:4`` run takes
(pipeline.stages.launcher_argv → ``horovodrun -np N -H HOSTS --gloo python -m trainer``), with
two real Horovod ranks training and evaluating a tiny binary dataset written with numpy as
docs/architecture.md specifies. The SLURM batch script is checked to build that same command
from the allocation's node list.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dlrm_contracts.config import PipelineConfig, config_from_dict
from dlrm_contracts.layout import WorkdirLayout
from dlrm_contracts.progress import Progress
from pipeline.manifest import ManifestStore
from pipeline.processes import run_child
from pipeline.stages import GLOO_TIMEOUT_ENV, StageContext, launcher_argv, launcher_env, trainer_argv
from trainer_helpers import write_tiny_dataset

REPO = Path(__file__).resolve().parent.parent
SBATCH = REPO / "docker" / "slurm" / "train.sbatch"


def _context(tmp_path: Path, np_: int, hosts: str | None) -> StageContext:
    config = PipelineConfig()
    config.launch.np, config.launch.hosts = np_, hosts
    layout = WorkdirLayout.at(tmp_path / "w")
    return StageContext(config, layout, ManifestStore(layout.manifests), tmp_path / "config.yaml")


def test_launch_prefix_names_every_host(tmp_path):
    horovodrun = str(Path(sys.executable).with_name("horovodrun"))
    assert launcher_argv(_context(tmp_path, 8, "node1:4,node2:4")) == [
        horovodrun,
        "-np",
        "8",
        "-H",
        "node1:4,node2:4",
        "--gloo",
    ]
    assert launcher_argv(_context(tmp_path, 2, "localhost:2")) == [
        horovodrun,
        "-np",
        "2",
        "-H",
        "localhost:2",
        "--gloo",
    ]
    assert launcher_argv(_context(tmp_path, 1, None)) == []  # one process: no launcher at all
    argv = trainer_argv(_context(tmp_path, 2, "localhost:2"), "train")
    assert argv[6:9] == [sys.executable, "-m", "trainer"]


def pipeline_main(argv: list[str], capsys) -> tuple[int, str, str]:
    """``python -m pipeline ARGV`` run in this process (pipeline.cli.main, what that module
    runs): its stages' children (horovodrun and its ranks) are processes of their own as in a
    real run. Returns (exit code, stdout, stderr)."""
    from pipeline.cli import main

    capsys.readouterr()
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.horovod
def test_two_ranks_train_and_evaluate_through_the_hosts_path(tmp_path, monkeypatch, capsys):
    from pipeline import runner

    monkeypatch.setattr(runner, "install_signal_handlers", lambda: None)  # pytest keeps its own
    monkeypatch.chdir(tmp_path)
    workdir = tmp_path / "work"
    write_tiny_dataset(workdir / "binary", {"train": 4096, "test": 1024, "validation": 1024})
    (tmp_path / "raw").mkdir()  # the run needs an input directory; train/eval never read it
    config = tmp_path / "launch.yaml"
    config.write_text(
        "train:\n  batch_size: 256\n  eval_batch_size: 512\n  log_every: 2\n"
        "  warmup_steps: 0\n  intra_op_threads: 1\n"
    )
    common = ["--config", str(config), "--workdir", str(workdir), "--input", str(tmp_path / "raw")]
    hosts = ["--np", "2", "--hosts", "localhost:2"]
    code, stdout, stderr = pipeline_main(
        [*common, "--stages", "train,eval", *hosts, "--max-steps", "8"], capsys
    )
    logs = workdir / "logs"
    detail = (
        stdout[-2000:]
        + stderr[-3000:]
        + "".join(p.read_text()[-3000:] for p in logs.glob("*.log") if p.name in ("train.log", "eval.log"))
    )
    assert code == 0, detail
    summary = json.loads(stdout.strip().splitlines()[-1])
    assert summary["stages"]["train"]["engine"] == "horovod", summary
    # eval adopts the figures the trainer ended with on the same checkpoint: no second launch
    assert summary["stages"]["eval"]["action"] == "derived", summary
    assert not (logs / "eval.log").exists()

    # The launch line in the stage log is the multi-host one, with two real ranks behind it.
    horovodrun = Path(sys.executable).with_name("horovodrun")
    launched = [line for line in (logs / "train.log").read_text().splitlines() if line.startswith("$ ")]
    assert launched and launched[-1].startswith(
        f"$ {horovodrun} -np 2 -H localhost:2 --gloo {sys.executable} -m trainer"
    ), launched
    evaluation = json.loads((workdir / "eval.json").read_text())
    assert evaluation["ranks"] == 2, evaluation
    assert 0.0 <= summary["test_auc"] <= 1.0
    assert any((workdir / "checkpoints").iterdir())

    # A forced eval starts both ranks again and computes the adopted figures anew.
    code, stdout, stderr = pipeline_main([*common, "--stages", "eval", *hosts, "--force"], capsys)
    assert code == 0, stderr[-3000:]
    forced = json.loads(stdout.strip().splitlines()[-1])
    assert forced["stages"]["eval"]["action"] == "ran", forced
    assert forced["stages"]["eval"]["engine"] == "horovod", forced
    progress = [Progress.from_line(line) for line in (logs / "eval.progress.jsonl").read_text().splitlines()]
    assert progress and progress[-1].fraction == pytest.approx(1.0), progress[-3:]
    recomputed = json.loads((workdir / "eval.json").read_text())
    assert recomputed["mode"] == "eval" and "evaluated_by" not in recomputed, recomputed
    for field in ("step", "test_rows", "validation_rows"):
        assert recomputed[field] == evaluation[field], (field, recomputed, evaluation)
    for field in ("test_auc", "validation_auc", "test_logloss", "validation_logloss"):
        assert recomputed[field] == pytest.approx(evaluation[field], abs=1e-6), field


def test_gloo_timeout_goes_to_the_launcher_unless_the_environment_names_one(tmp_path, monkeypatch):
    monkeypatch.delenv(GLOO_TIMEOUT_ENV, raising=False)
    ctx = _context(tmp_path, 2, None)
    ctx.child_env = {"CRITEO_PROGRESS_FILE": "/x"}  # the stage's own entries are kept
    assert launcher_env(ctx) == {"CRITEO_PROGRESS_FILE": "/x", GLOO_TIMEOUT_ENV: "300"}
    ctx.config.launch.gloo_timeout_seconds = 45
    assert launcher_env(ctx)[GLOO_TIMEOUT_ENV] == "45"
    # one process has no Gloo at all; an operator's own setting wins over the config
    assert GLOO_TIMEOUT_ENV not in launcher_env(_context(tmp_path, 1, None))
    monkeypatch.setenv(GLOO_TIMEOUT_ENV, "17")
    assert GLOO_TIMEOUT_ENV not in launcher_env(ctx)  # run_child passes os.environ's 17 on


@pytest.mark.parametrize("bad", [0, -5, 2.5, "300", True])
def test_gloo_timeout_must_be_whole_seconds(bad):
    with pytest.raises(ValueError, match="launch.gloo_timeout_seconds"):
        config_from_dict({"launch": {"gloo_timeout_seconds": bad}})


@pytest.mark.horovod
@pytest.mark.parametrize("environment", [None, "17"])
def test_both_ranks_get_the_gloo_timeout_from_a_real_horovodrun(tmp_path, monkeypatch, environment):
    """The pipeline's launch line and environment, with a probe in place of the trainer: what
    every rank really sees, after horovodrun has handed its environment on."""
    if environment is None:
        monkeypatch.delenv(GLOO_TIMEOUT_ENV, raising=False)
    else:
        monkeypatch.setenv(GLOO_TIMEOUT_ENV, environment)
    ctx = _context(tmp_path, 2, "localhost:2")
    ctx.config.launch.gloo_timeout_seconds = 123
    probe = (
        "import os, json; print(json.dumps({'rank': os.environ['HOROVOD_RANK'], "
        f"'timeout': os.environ.get('{GLOO_TIMEOUT_ENV}')}}))"
    )
    result = run_child(
        launcher_argv(ctx) + [sys.executable, "-c", probe], tmp_path / "probe.log", env=launcher_env(ctx)
    )
    assert result.returncode == 0, result.tail
    seen = {}
    for line in (tmp_path / "probe.log").read_text().splitlines():
        if "{" in line and '"rank"' in line:
            report = json.loads(line[line.index("{") :])
            seen[report["rank"]] = report["timeout"]
    assert seen == {"0": environment or "123", "1": environment or "123"}, seen


def _fake_scontrol(tmp_path: Path, nodes: list[str]) -> dict[str, str]:
    """SLURM is not installed here: a stand-in ``scontrol show hostnames`` for the node list."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "scontrol"
    script.write_text(
        "#!/usr/bin/env bash\n[[ \"$1 $2\" == 'show hostnames' ]] || exit 9\n"
        + "".join(f"echo {n}\n" for n in nodes)
    )
    script.chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}


def test_slurm_script_builds_the_host_list_from_the_allocation(tmp_path):
    env = _fake_scontrol(tmp_path, ["gpu-a01", "gpu-a02", "gpu-b07"])
    env.update(
        SLURM_JOB_NODELIST="gpu-a[01-02],gpu-b07",
        SLURM_GPUS_ON_NODE="4",
        CRITEO_DRY_RUN="1",
        WORKDIR=str(tmp_path / "w"),
    )
    proc = subprocess.run(
        ["bash", str(SBATCH), "--input", "/data/raw"], capture_output=True, text=True, timeout=60, env=env
    )
    assert proc.returncode == 0, proc.stderr
    command = proc.stdout.strip().splitlines()[-1].split()
    assert command[0].endswith("run_pipeline.sh")
    assert command[command.index("--np") + 1] == "12"
    assert command[command.index("--hosts") + 1] == "gpu-a01:4,gpu-a02:4,gpu-b07:4"
    assert command[command.index("--workdir") + 1] == str(tmp_path / "w")
    assert command[-2:] == ["--input", "/data/raw"]

    env.pop("SLURM_JOB_NODELIST")
    refused = subprocess.run(["bash", str(SBATCH)], capture_output=True, text=True, timeout=60, env=env)
    assert refused.returncode != 0 and "SLURM_JOB_NODELIST" in refused.stderr


@pytest.mark.parametrize("gpus", ["0", "abc", "a100:4,v100:2"])
def test_slurm_script_refuses_a_gpu_count_it_cannot_read(tmp_path, gpus):
    env = _fake_scontrol(tmp_path, ["n1", "n2"])
    env.update(SLURM_JOB_NODELIST="n[1-2]", SLURM_GPUS_PER_NODE=gpus, CRITEO_DRY_RUN="1")
    env.pop("GPUS_PER_NODE", None)
    env.pop("SLURM_GPUS_ON_NODE", None)
    proc = subprocess.run(["bash", str(SBATCH)], capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 2 and proc.stdout == "", (proc.stdout, proc.stderr)
    assert proc.stderr.count("\n") == 1 and "GPUS_PER_NODE" in proc.stderr, proc.stderr


def test_slurm_dry_run_keeps_arguments_with_spaces_whole(tmp_path):
    import shlex

    env = _fake_scontrol(tmp_path, ["n1"])
    env.update(
        SLURM_JOB_NODELIST="n1", GPUS_PER_NODE="2", CRITEO_DRY_RUN="1", WORKDIR=str(tmp_path / "my work")
    )
    proc = subprocess.run(
        ["bash", str(SBATCH), "--input", "/data/my raw"], capture_output=True, text=True, timeout=60, env=env
    )
    assert proc.returncode == 0, proc.stderr
    command = shlex.split(proc.stdout.strip().splitlines()[-1])
    assert command[command.index("--workdir") + 1] == str(tmp_path / "my work")
    assert command[-2:] == ["--input", "/data/my raw"]
    assert command[command.index("--hosts") + 1] == "n1:2"


@pytest.mark.parametrize("extra", [["--hosts", "elsewhere:8"], ["--hosts=elsewhere:8"]])
def test_slurm_script_keeps_to_the_allocation_hosts(tmp_path, extra):
    """Extra arguments go to run_pipeline.sh, where a later --hosts would win: refused, so
    horovodrun never reaches (over SSH) a host outside the allocation. (A --np is harmless:
    the pipeline refuses more ranks than the allocation's slots.)"""
    env = _fake_scontrol(tmp_path, ["n1"])
    env.update(SLURM_JOB_NODELIST="n1", GPUS_PER_NODE="2", CRITEO_DRY_RUN="1")
    proc = subprocess.run(
        ["bash", str(SBATCH), "--input", "/data/raw", *extra],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert proc.returncode == 2 and proc.stdout == "", (proc.stdout, proc.stderr)
    assert "allocation" in proc.stderr and extra[0] in proc.stderr
