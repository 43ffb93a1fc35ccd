"""Warm start (train.init: previous), versioned exports and the previous model's score, on
planted datasets of one stream whose tables grow from day to day (stable ids: id i keeps its
planted effect whatever the table sizes)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from dlrm_contracts.binary_format import CHECKSUMS_KEY, cat_dtype, cat_file, describe, read_info, write_json
from dlrm_contracts.config import ConfigError, ExportConfig, PipelineConfig
from dlrm_contracts.dataset_identity import IDENTITY_KEY, dataset_identity
from dlrm_contracts.layout import DATASET_JSON, complete_checkpoints, export_versions
from dlrm_contracts.schema import SPLITS
from trainer.checkpoint import CheckpointError
from trainer.warm_start import check_schedule, check_warm_start, plan_start
from trainer_helpers import (
    STREAM_SIZES_1,
    STREAM_SIZES_2,
    checkpoint_arrays,
    small_config,
    step_losses,
    stream_day,
)

SIZES_1, SIZES_2 = STREAM_SIZES_1, STREAM_SIZES_2
DIMS = {"embedding_dim": 16, "bottom_mlp": [64, 32, 16], "top_mlp": [128, 64, 1]}


def day(path, seed: int, sizes=SIZES_1, dictionaries=None):
    return stream_day(path, seed, sizes, dictionaries=dictionaries)


def config(**overrides):
    base = dict(optimizer="adagrad", learning_rate=0.05, max_steps=8, epochs=2)
    return small_config(**{**base, **overrides})


def identity_of(dataset) -> dict:
    return dataset_identity(read_info(dataset))


def _meta_checkpoint(root, step: int, identity: dict, **meta) -> None:
    path = root / f"step-{step:09d}"
    path.mkdir(parents=True)
    (path / "meta.json").write_text(json.dumps({"step": step, IDENTITY_KEY: identity, **meta}))


# -- how a run starts (no TensorFlow) ------------------------------------------------------
def test_the_settings_are_checked_where_they_are_read():
    from dlrm_contracts.config import config_from_dict

    loaded = config_from_dict(
        {"train": {"init": "previous", "init_optimizer": "restart"}, "export": {"keep_versions": 5}}
    )
    assert (loaded.train.init, loaded.train.init_optimizer) == ("previous", "restart")
    assert loaded.export.keep_versions == 5
    for section, bad, words in [
        ("train", {"init": "yesterday"}, "train.init 'yesterday'"),
        ("train", {"init_optimizer": "keep"}, "init_optimizer 'keep'"),
        ("export", {"keep_versions": 0}, "keep_versions must be"),
    ]:
        with pytest.raises(ConfigError, match=words):
            config_from_dict({section: bad})


def test_the_newest_checkpoint_decides_how_a_run_starts(tmp_path):
    today, yesterday = {"source_fingerprint": "b"}, {"source_fingerprint": "a"}
    root = tmp_path / "checkpoints"
    previous, scratch = config(init="previous"), config()
    assert plan_start(root, today, previous).kind == "scratch"  # a daily job's first run
    assert "no checkpoint" in plan_start(root, today, previous).note
    _meta_checkpoint(root, 20, yesterday, early_stopping={"best_step": 20})
    _meta_checkpoint(root, 40, yesterday, early_stopping={"best_step": 20})
    plan = plan_start(root, today, previous)
    assert (plan.kind, plan.path.name) == ("previous", "step-000000020")  # the run's best model
    with pytest.raises(CheckpointError, match="trained on another dataset.*train.init: previous"):
        plan_start(root, today, scratch)
    assert plan_start(root, today, config(resume=False)).kind == "scratch"
    _meta_checkpoint(root, 50, today)  # an interrupted run of today's dataset
    plan = plan_start(root, today, previous)
    assert (plan.kind, plan.path.name) == ("resume", "step-000000050")
    plan = plan_start(root, today, config(init="previous", resume=False))
    assert (plan.kind, plan.path.name) == ("previous", "step-000000020")


def test_a_warm_start_refuses_a_shrunk_table_other_dims_another_optimizer_or_an_ended_schedule(tmp_path):
    meta = {"table_sizes": list(SIZES_1), "dims": DIMS, "optimizer": "adagrad"}
    grown = check_warm_start(meta, tmp_path, list(SIZES_2), DIMS, config(init="previous"))
    assert grown == {"C2": [20, 24], "C5": [200, 260], "C7": [3000, 3500], "C17": [900, 1000]}
    shrunk = list(SIZES_1)
    shrunk[2] = 19
    with pytest.raises(CheckpointError, match=r"shrank.*C3 20 -> 19 rows.*preprocess.ids: stable"):
        check_warm_start(meta, tmp_path, shrunk, DIMS, config(init="previous"))
    with pytest.raises(CheckpointError, match="dims"):
        check_warm_start(meta, tmp_path, list(SIZES_1), {**DIMS, "embedding_dim": 8}, config(init="previous"))
    with pytest.raises(CheckpointError, match="trained with adagrad.*init_optimizer: restart"):
        check_warm_start(meta, tmp_path, list(SIZES_1), DIMS, config(init="previous", optimizer="adam"))
    check_warm_start(
        meta,
        tmp_path,
        list(SIZES_1),
        DIMS,
        config(init="previous", optimizer="adam", init_optimizer="restart"),
    )
    decayed = config(init="previous", decay_start_step=10, decay_steps=20)
    check_schedule(29, decayed)
    with pytest.raises(ConfigError, match="ended at step 30.*rate 0"):
        check_schedule(30, decayed)
    check_schedule(30, config(init="previous", init_optimizer="restart", decay_start_step=10, decay_steps=20))


def test_the_pipeline_keeps_the_previous_model_when_it_retrains_a_dataset(tmp_path, monkeypatch):
    """init: previous and a train stage to redo (--force, another setting): the checkpoints of
    the dataset now in the workdir go, those of earlier datasets (the model to start from)
    stay. init: scratch removes them all, as before."""
    from dlrm_contracts.layout import WorkdirLayout
    from pipeline import stages
    from pipeline.manifest import ManifestStore
    from pipeline.processes import ChildResult

    layout = WorkdirLayout.at(tmp_path / "w")
    day(layout.binary, seed=2, sizes=SIZES_2)
    pipeline_config = PipelineConfig()
    pipeline_config.train = config(init="previous")
    pipeline_config.force = True
    ctx = stages.StageContext(pipeline_config, layout, ManifestStore(layout.manifests), tmp_path / "c.yaml")
    monkeypatch.setattr(stages, "verify_binary_dataset", lambda ctx: None)
    seen = []
    monkeypatch.setattr(
        stages,
        "run_child",
        lambda argv, log, **_: (
            seen.append([s for s, _ in complete_checkpoints(layout.checkpoints)]) or ChildResult(0, {}, [])
        ),
    )
    _meta_checkpoint(layout.checkpoints, 10, {"source_fingerprint": "yesterday"})
    _meta_checkpoint(layout.checkpoints, 20, identity_of(layout.binary))
    stages.run_train(ctx)
    pipeline_config.train = config(init="scratch")
    stages.run_train(ctx)
    assert seen == [[10], []]


# -- warm start, for real ------------------------------------------------------------------
@pytest.fixture(scope="module")
def day1_run(tmp_path_factory):
    """Day 1 and day 2 of the stream, and a workdir trained on day 1 from scratch (``config()``,
    one checkpoint, step 8; day 1's dictionaries in its parquet/dictionaries, as convert
    leaves them for an export): the previous model of the tests below, each on its own copy
    (``_copy_of_day1_run``), the day files read-only."""
    root = tmp_path_factory.mktemp("stream")
    dictionaries = root / "work" / "parquet" / "dictionaries"
    day1 = day(root / "day1", seed=1, dictionaries=dictionaries)
    day2 = day(root / "day2", seed=2, sizes=SIZES_2)
    from trainer.loop import run

    run(config(), day1, root / "work")
    assert [s for s, _ in complete_checkpoints(root / "work" / "checkpoints")] == [8]
    return {"day1": day1, "day2": day2, "work": root / "work"}


def _copy_of_day1_run(day1_run, target):
    shutil.copytree(day1_run["work"], target)
    return target


def _owned(trainer) -> dict:
    return {name: var.numpy() for name, var in trainer._owned_state() + trainer._replicated_state()}


def test_warm_start_grows_the_tables_and_continues_the_optimizer(day1_run, tmp_path):
    """Day 2's tables are larger: every old row (and its Adagrad accumulator) comes from the
    previous model, every new one is what a fresh model has; the MLPs are copied; the step and
    the schedule go on; the previous model's checkpoint outlives keep_checkpoints."""
    from trainer.checkpoint import CheckpointReader, latest_checkpoint
    from trainer.loop import Trainer
    from trainer.model import initial_table_piece
    from trainer.placement import Piece

    work = _copy_of_day1_run(day1_run, tmp_path / "work")  # day 1's run: one checkpoint kept
    before = checkpoint_arrays(work)
    reader = CheckpointReader(latest_checkpoint(work / "checkpoints"))
    slots = {t: reader.value(f"table/{t}/0-16/adagrad", (old, 16)) for t, old in enumerate(SIZES_1)}
    reader.close()
    warm = config(init="previous", keep_checkpoints=1, checkpoint_every=3)
    trainer = Trainer(warm, day1_run["day2"], work)
    plan = trainer._start()
    assert (plan.kind, trainer.step, trainer.run_start) == ("previous", 8, 8)
    state = _owned(trainer)
    for t, (old, new) in enumerate(zip(SIZES_1, SIZES_2)):
        table, slot = state[f"table/{t}/0-16"], state[f"table/{t}/0-16/adagrad"]
        assert table.shape == (new, 16)
        np.testing.assert_array_equal(table[:old], before[f"table/{t}"])
        fresh = initial_table_piece(Piece(t, 0, 16, new), warm.seed).numpy()
        np.testing.assert_array_equal(table[old:], fresh[old:])
        np.testing.assert_array_equal(slot[:old], slots[t])
        np.testing.assert_array_equal(slot[old:], np.float32(warm.adagrad_initial_accumulator))
    assert any((slots[t] > warm.adagrad_initial_accumulator).any() for t in slots)  # trained
    for name in [n for n in before if not n.startswith("table/")]:  # MLPs, their slots
        np.testing.assert_array_equal(state[name], before[name], err_msg=name)
    summary = trainer.train()  # plans its start again: the same, nothing was saved meanwhile
    assert summary["step"] == 16 and summary["steps_run"] == 8
    assert summary["init"]["mode"] == "previous" and summary["init"]["from_step"] == 8
    assert summary["init"]["grown_tables"]["C7"] == [3000, 3500]
    assert 0.5 < summary["previous_model_test_auc"] < 1
    # checkpoints 11, 14 and 16 were saved with keep 1: the previous model (8) stays
    assert [s for s, _ in complete_checkpoints(work / "checkpoints")] == [8, 16]
    records = [json.loads(l) for l in (work / "logs" / "metrics.jsonl").read_text().splitlines()]
    first = next(r for r in records if r.get("step") == 9 and "lr" in r)
    assert first["lr"] == pytest.approx(warm.learning_rate)  # past the warm-up: continued
    assert any(r.get("model") == "previous" and r["step"] == 8 for r in records)


def test_a_warm_start_keeps_the_wide_weights_of_old_rows_and_starts_new_rows_at_zero(day1_run, tmp_path):
    """The wide weights grow with their table: old rows keep the previous model's weights (and
    Adagrad accumulators), new rows start at 0 as in a fresh model."""
    from trainer.loop import Trainer, run

    work = tmp_path / "work"
    run(config(wide=True), day1_run["day1"], work)
    before = checkpoint_arrays(work)
    trainer = Trainer(config(wide=True, init="previous"), day1_run["day2"], work)
    assert trainer._start().kind == "previous"
    state = _owned(trainer)
    trained = 0
    for t, (old, new) in enumerate(zip(SIZES_1, SIZES_2)):
        weights, slot = state[f"table/{t}/16-17"], state[f"table/{t}/16-17/adagrad"]
        assert weights.shape == (new, 1) and before[f"table/{t}"].shape == (old, 17)
        np.testing.assert_array_equal(weights[:old, 0], before[f"table/{t}"][:, 16])
        np.testing.assert_array_equal(weights[old:], 0.0)
        np.testing.assert_array_equal(slot[old:], np.float32(config().adagrad_initial_accumulator))
        trained += int((weights[:old] != 0).sum())
    assert trained > 0  # day 1 trained them: the copy is not of zeros
    summary = trainer.train()
    assert summary["step"] == 16 and summary["init"]["grown_tables"]["C7"] == [3000, 3500]


def test_a_warm_started_run_stopped_midway_resumes_as_one(day1_run, tmp_path):
    """Day 2 warm-started, stopped after 3 of its 8 steps, run again: it resumes (same dataset)
    with its run start, schedule and previous model's score, and ends with the losses and
    weights of an uninterrupted warm-started run."""
    from trainer.loop import run

    day2 = day1_run["day2"]
    for work in ("whole", "stopped"):
        _copy_of_day1_run(day1_run, tmp_path / work)
    whole = run(config(init="previous", init_optimizer="restart"), day2, tmp_path / "whole")
    run(config(init="previous", init_optimizer="restart", max_steps=3), day2, tmp_path / "stopped")
    resumed = run(config(init="previous", init_optimizer="restart"), day2, tmp_path / "stopped")
    assert resumed["init"]["mode"] == "resume" and resumed["init"]["from_step"] == 8
    assert (resumed["step"], resumed["steps_run"]) == (16, 5)
    assert resumed["previous_model_test_auc"] == whole["previous_model_test_auc"]
    losses, expected = step_losses(tmp_path / "stopped"), step_losses(tmp_path / "whole")
    assert sorted(losses) == sorted(expected) == list(range(1, 17))
    np.testing.assert_allclose([losses[s] for s in expected], list(expected.values()), rtol=1e-6, atol=1e-8)
    weights = checkpoint_arrays(tmp_path / "stopped")
    for name, value in checkpoint_arrays(tmp_path / "whole").items():
        np.testing.assert_allclose(weights[name], value, rtol=1e-6, atol=1e-8, err_msg=name)


def _as_served(day2, out, old_sizes):
    """Day 2 as the previous model reads it: an id its table has no row for becomes 0."""
    shutil.copytree(day2, out)
    info = read_info(day2)
    for split in SPLITS:
        for t, (old, new) in enumerate(zip(old_sizes, info.table_sizes)):
            ids = np.fromfile(day2 / split / cat_file(t), cat_dtype(new)).astype(np.int64)
            ids[ids >= old] = 0
            ids.astype(cat_dtype(old)).tofile(out / split / cat_file(t))
    described = describe(
        out, info.splits, list(old_sizes), info.threshold_spec, info.source_fingerprint, {CHECKSUMS_KEY: {}}
    )
    write_json(out / DATASET_JSON, described.to_json())
    return out


def test_the_previous_model_is_scored_as_it_is_served_and_restart_takes_the_weights_only(day1_run, tmp_path):
    """previous_model_test_auc is the previous model's eval of day 2 with unknown ids at 0 (the
    served vocabulary), not with fresh rows; init_optimizer: restart starts the optimizer and
    the warm-up again."""
    from trainer.loop import run

    work = _copy_of_day1_run(day1_run, tmp_path / "work")
    reference = _copy_of_day1_run(day1_run, tmp_path / "reference")
    day2 = day1_run["day2"]
    warm = config(init="previous", init_optimizer="restart")
    summary = run(warm, day2, work)
    served = run(
        config(verify_dataset="none"), _as_served(day2, tmp_path / "served", SIZES_1), reference, mode="eval"
    )
    assert summary["previous_model_test_auc"] == pytest.approx(served["test_auc"], abs=1e-6)
    records = [json.loads(l) for l in (work / "logs" / "metrics.jsonl").read_text().splitlines()]
    first = next(r for r in records if r.get("step") == 9 and "lr" in r)
    assert first["lr"] == pytest.approx(warm.learning_rate / warm.warmup_steps)  # warm-up again
    assert summary["init"]["optimizer"] == "restart"


def test_resume_refuses_another_datasets_run_and_a_warm_start_a_shrunk_table(day1_run, tmp_path):
    from trainer.loop import run

    work = _copy_of_day1_run(day1_run, tmp_path / "work")
    day2 = day1_run["day2"]
    with pytest.raises(CheckpointError, match="trained on another dataset"):
        run(config(), day2, work)
    shrunk = list(SIZES_1)
    shrunk[6] = 2000
    with pytest.raises(CheckpointError, match="C7 3000 -> 2000 rows"):
        run(config(init="previous"), day(tmp_path / "day3", seed=3, sizes=tuple(shrunk)), work)
    assert [s for s, _ in complete_checkpoints(work / "checkpoints")] == [8]  # untouched


# -- versioned exports -----------------------------------------------------------------------
def test_a_daily_cycle_exports_new_versions_and_keeps_the_last_k(day1_run, tmp_path, monkeypatch):
    """Day 1 trained (a copy of the day-1 run) and exported (version 1); day 2's dictionaries
    extend day 1's, the model is warm-started and exported (version 2, its vocabularies
    grown); one more export with keep_versions 2 leaves 2 and 3. A failed export adds nothing
    and leaves no temporary."""
    import trainer.export as export
    from trainer.loop import run
    from trainer.score import score_files

    work = _copy_of_day1_run(day1_run, tmp_path / "work")
    dictionaries = work / "parquet" / "dictionaries"
    day1 = day1_run["day1"]
    keep_2 = ExportConfig(keep_versions=2)
    first = export.export_model(work, day1, keep_2)
    assert first["version"] == 1 and first["saved_model"] == str(work / "export" / "1")
    day2 = day(tmp_path / "day2", seed=2, sizes=SIZES_2, dictionaries=dictionaries)
    run(config(init="previous"), day2, work)
    second = export.export_model(work, day2, keep_2)
    assert (second["version"], second["checkpoint_step"]) == (2, 16)
    version_2 = work / "export" / "2"
    assert json.loads((version_2 / "fingerprint.json").read_text())["version"] == 2
    vocabulary = (version_2 / "assets" / "C7.vocab").read_text().splitlines()
    assert len(vocabulary) == SIZES_2[6]  # header + ids 1..3499
    assert (work / "export" / "1" / "assets" / "C7.vocab").read_text().splitlines() == vocabulary[
        : SIZES_1[6]
    ]  # the ids of day 1 kept their values
    third = export.export_model(work, day2, keep_2)
    assert third["removed_versions"] == [1]
    assert [v for v, _ in export_versions(work / "export")] == [2, 3]

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(export, "_save", broken)
    with pytest.raises(OSError):
        export.export_model(work, day2, keep_2)
    assert [v for v, _ in export_versions(work / "export")] == [2, 3]
    assert sorted(p.name for p in (work / "export").iterdir()) == ["2", "3", "serving.json"]
    empty = tmp_path / "empty"
    empty.write_text("")
    scored = score_files(work / "export", [empty], tmp_path / "scores", PipelineConfig().score)
    assert scored["lines"] == 0  # DIR/export resolves to its newest version


def test_the_report_lists_the_next_day_auc_of_every_daily_run(tmp_path):
    from dlrm_contracts.layout import WorkdirLayout
    from pipeline.report import write_report

    layout = WorkdirLayout.at(tmp_path / "w")
    layout.manifests.mkdir(parents=True)
    runs = [
        {
            "time": "day 1",
            "status": "ok",
            "init": "scratch",
            "next_day_auc": 0.71,
            "previous_model_test_auc": None,
            "export_version": 1,
        },
        {
            "time": "day 2",
            "status": "ok",
            "init": "previous",
            "next_day_auc": 0.74,
            "previous_model_test_auc": 0.72,
            "export_version": 2,
        },
        {"time": "day 3", "status": "failed: train", "next_day_auc": None},
    ]
    (layout.manifests / "history.jsonl").write_text("".join(json.dumps(r) + "\n" for r in runs))
    (layout.root / "summary.json").write_text(json.dumps(runs[1]))
    text = write_report(layout).read_text()
    assert "next-day AUC 0.74 (warm start; the previous model scored 0.72" in text
    section = text[text.index("## Daily runs") :]
    assert "| day 1 | ok | scratch | 0.71 | None | 1 |" in section
    assert "| day 2 | ok | previous | 0.74 | 0.72 | 2 |" in section
    assert "day 3" not in section  # no next-day AUC measured
    assert (layout.report / "next_day_auc.png").stat().st_size > 0


def test_no_export_version_is_one_line_for_the_score_stage_and_the_scorer(tmp_path):
    from dlrm_contracts.errors import ExitCode, PipelineError
    from dlrm_contracts.layout import WorkdirLayout
    from pipeline import stages
    from pipeline.manifest import ManifestStore
    from trainer.score import ScoreError, score_files

    layout = WorkdirLayout.at(tmp_path / "w")
    (layout.export / "saved_model").mkdir(parents=True)  # an export made before versions
    (layout.export / "saved_model" / "saved_model.pb").write_bytes(b"")
    (layout.export / ".4.tmp-1-abc").mkdir()  # a temporary is no version either
    assert layout.latest_export is None
    raw = tmp_path / "day"
    raw.write_text("")
    pipeline_config = PipelineConfig()
    pipeline_config.score.input = [str(raw)]
    ctx = stages.StageContext(pipeline_config, layout, ManifestStore(layout.manifests), tmp_path / "c.yaml")
    with pytest.raises(PipelineError, match=r"no exported model under .*<N>/") as refused:
        stages.STAGE_TABLE["score"].run(ctx)
    assert refused.value.code == ExitCode.SCORE
    with pytest.raises(ScoreError, match="nor a version directory"):
        score_files(layout.export, [raw], tmp_path / "scores", pipeline_config.score)
