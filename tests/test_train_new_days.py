"""train.days: new, so that a daily run trains on each day once: a warm-started run trains
only the train days its previous model has not seen, read as row ranges of the train split; every checkpoint records
the days its model was trained on, so a rerun trains nothing twice and a skipped day is picked
up by the next run. Planted datasets that list their days as convert does, then a real Spark
preprocess and convert of stable-id days."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from dlrm_contracts.binary_format import LABEL_FILE, NUMERICAL_FILE, cat_file
from dlrm_contracts.config import ConfigError, config_from_dict
from dlrm_contracts.layout import complete_checkpoints
from trainer.data import SplitReader, open_dataset
from trainer.synthetic import write_planted_dataset
from trainer.train_days import TRAIN_DAYS_KEY, plan_days
from trainer_helpers import STREAM_SIGNAL, STREAM_SIZES_1, STREAM_SIZES_2, small_config

BATCH = 128
DAY_ROWS = {0: 512, 1: 384, 2: 256, 3: 640}  # train rows of each day: whole batches


def window(path: Path, train_days: list[int], test_day: int, seed: int, sizes=STREAM_SIZES_2) -> Path:
    """A dataset whose train split is ``train_days`` in that order and whose test/validation
    are ``test_day``'s, listed in dataset.json as convert lists them."""
    rows = {"train": sum(DAY_ROWS[d] for d in train_days), "test": 300, "validation": 200}
    segments = {
        "train": [{"day": d, "rows": DAY_ROWS[d], "token": f"t{d}"} for d in train_days],
        "test": [{"day": test_day, "rows": 300, "token": f"s{test_day}"}],
        "validation": [{"day": test_day, "rows": 200, "token": f"v{test_day}"}],
    }
    write_planted_dataset(
        path, rows, seed=seed, table_sizes=sizes, signal_seed=STREAM_SIGNAL, extra={"segments": segments}
    )
    return path


def config(**overrides):
    base = dict(batch_size=BATCH, init="previous", days="new", keep_checkpoints=10)
    return small_config(**{**base, **overrides})


def recorded(workdir: Path) -> list[dict]:
    """(step, train_days record) of every checkpoint of the workdir."""
    return [
        (step, json.loads((path / "meta.json").read_text()).get(TRAIN_DAYS_KEY))
        for step, path in complete_checkpoints(workdir / "checkpoints")
    ]


# -- no TensorFlow --------------------------------------------------------------------------
def test_the_setting_is_checked_and_read_from_yaml():
    assert config_from_dict({"train": {"days": "new"}}).train.days == "new"
    assert config_from_dict({}).train.days == "window"
    with pytest.raises(ConfigError, match="train.days 'today'"):
        config_from_dict({"train": {"days": "today"}})


def test_the_plan_trains_the_unseen_days_and_says_why_else_the_window():
    segments = [(0, 0, 512), (1, 512, 896), (2, 896, 1152)]
    plan = plan_days("new", segments, 1152, (0,))
    assert (plan.ranges, plan.run_days, plan.rows) == (((512, 1152),), (1, 2), 640)
    assert plan.to_meta(True)["trained"] == [0, 1, 2]
    assert plan.to_meta(False)["trained"] == [0]  # not yet over every row: only what it had
    assert "day(s) 1, 2 only" in plan.note
    middle = plan_days("new", segments, 1152, (0, 2))  # a day in the middle
    assert middle.ranges == ((512, 896),) and middle.run_days == (1,)
    gaps = plan_days("new", segments, 1152, (1,))
    assert gaps.ranges == ((0, 512), (896, 1152))
    nothing = plan_days("new", segments, 1152, (0, 1, 2, 7))
    assert nothing.rows == 0 and "nothing new to train on" in nothing.note
    assert nothing.to_meta(True)["trained"] == [0, 1, 2, 7]
    for before, words in [((), "from scratch"), (None, "records no trained days")]:
        whole = plan_days("new", segments, 1152, before)
        assert whole.ranges == ((0, 1152),) and words in whole.note
    assert plan_days("window", segments, 1152, (0,)).ranges == ((0, 1152),)
    frequency = plan_days("new", None, 1152, (0,))
    assert frequency.ranges == ((0, 1152),) and "lists no days" in frequency.note
    assert frequency.to_meta(True)["trained"] is None


def test_the_reader_reads_exactly_the_ranges_as_one_run_of_rows(tmp_path):
    """Batches over row ranges equal the same rows cut out of the whole split, across the gap
    between two ranges and into the zero padding past the end, for every rank's share."""
    from trainer.data import RankView, single_process_view

    data = open_dataset(window(tmp_path / "d", [0, 1, 2, 3], 4, seed=3))
    ranges = ((0, 512), (896, 1152), (1200, 1300))
    reader, whole = SplitReader(data, "train", ranges), SplitReader(data, "train")
    assert reader.rows == 512 + 256 + 100
    wanted = np.concatenate([np.arange(a, b) for a, b in ranges])
    label = np.fromfile(data.path / "train" / LABEL_FILE, np.uint8)
    for start in (0, 448, 500, 768, 800):
        batch = reader.read(single_process_view(), 0, start, BATCH)
        rows = wanted[start : start + BATCH]
        assert batch.valid == len(rows)
        np.testing.assert_array_equal(batch.label[: len(rows)], label[rows])
        np.testing.assert_array_equal(batch.label[len(rows) :], 0)
        for t in (0, 6, 25):
            ids = np.fromfile(data.path / "train" / cat_file(t), data.cat_dtypes[t])
            np.testing.assert_array_equal(batch.categorical[t][: len(rows)], ids[rows])
        numerical = np.fromfile(data.path / "train" / NUMERICAL_FILE, np.float16).reshape(-1, 13)
        np.testing.assert_array_equal(batch.numerical[: len(rows)], numerical[rows])
        for rank in range(2):  # the ranks split a batch of the run as they split the split's
            view = RankView(2, rank, (0,), "local")
            half = reader.read(view, 0, start, BATCH).label
            np.testing.assert_array_equal(half, batch.label[rank * 64 : (rank + 1) * 64])
    assert whole.rows == 1792
    with pytest.raises(Exception, match="outside the train split"):
        SplitReader(data, "train", ((0, 1793),))


# -- training -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def first_run(tmp_path_factory):
    """Window [0] | 1 trained from scratch (its summary, its workdir): the first run of the
    tests below, each going on from its own copy (``_copy_of_first_run``)."""
    from trainer.loop import run

    root = tmp_path_factory.mktemp("first_run")
    summary = run(config(), window(root / "w1", [0], 1, seed=1, sizes=STREAM_SIZES_1), root / "work")
    return {"summary": summary, "work": root / "work"}


def _copy_of_first_run(first_run, target: Path) -> Path:
    shutil.copytree(first_run["work"], target)
    return target


def test_new_trains_the_new_days_only_records_them_and_a_rerun_trains_nothing(first_run, tmp_path):
    """Window [0] | 1, then [0, 1] | 2: the second run trains day 1's 384 rows (3 steps); a
    re-made dataset of the same window trains nothing (eval still runs on the model re-saved
    for it); the run after a skipped day trains days 2 and 3."""
    from trainer.loop import Trainer, run

    work = _copy_of_first_run(first_run, tmp_path / "work")
    first = first_run["summary"]
    assert first["init"]["mode"] == "scratch" and first["steps_run"] == 512 // BATCH
    assert first["train_days"]["trained"] == [0] and first["train_days"]["rows"] == 512

    trainer = Trainer(config(), window(tmp_path / "w2", [0, 1], 2, seed=2), work)
    second = trainer.train()
    assert second["init"]["mode"] == "previous"
    assert trainer.day_plan.ranges == ((512, 896),)  # day 1's rows of the train split
    assert second["steps_run"] == 384 // BATCH and second["step"] == 4 + 3
    assert second["train_days"] == {"mode": "new", "rows": 384, "trained": [0, 1], "before": [0], "run": [1]}
    assert recorded(work)[-1] == (7, {"trained": [0, 1], "before": [0], "run": [1]})

    again = run(config(), window(tmp_path / "w2", [0, 1], 2, seed=2), work)  # same dataset
    assert again["init"]["mode"] == "resume" and again["steps_run"] == 0
    remade = run(config(), window(tmp_path / "w2b", [0, 1], 2, seed=22), work)
    assert remade["init"]["mode"] == "previous" and remade["steps_run"] == 0
    assert remade["step"] == 7 and remade["train_days"]["trained"] == [0, 1]
    assert 0.5 < remade["test_auc"] < 1  # the kept model, evaluated on this dataset
    assert remade["test_auc"] == pytest.approx(remade["previous_model_test_auc"], abs=1e-6)

    skipped = run(config(), window(tmp_path / "w4", [0, 1, 2, 3], 4, seed=4), work)
    assert skipped["steps_run"] == (256 + 640) // BATCH
    assert skipped["train_days"]["run"] == [2, 3]
    assert skipped["train_days"]["trained"] == [0, 1, 2, 3]


def test_window_trains_every_day_and_a_killed_run_records_only_what_it_had(first_run, tmp_path):
    """days: window trains the whole split and records all its days; a checkpoint saved
    before the run has passed over its rows once records only the days seen before, and the
    resumed run trains the same rows on."""
    from trainer.loop import run

    work = _copy_of_first_run(first_run, tmp_path / "work")
    whole = run(config(days="window"), window(tmp_path / "w2", [0, 1], 2, seed=2), work)
    assert whole["steps_run"] == (512 + 384) // BATCH
    assert whole["train_days"]["trained"] == [0, 1] and whole["train_days"]["run"] == [0, 1]

    other = _copy_of_first_run(first_run, tmp_path / "other")
    w3 = window(tmp_path / "w3", [0, 1, 2], 3, seed=3)
    full = run(config(checkpoint_every=1), w3, other)  # steps 5..9: days 1 and 2
    assert full["steps_run"] == (384 + 256) // BATCH
    records = recorded(other)
    assert [s for s, _ in records] == list(range(4, 10))
    assert [r["trained"] for _, r in records[1:]] == [[0]] * 4 + [[0, 1, 2]]
    for step, path in complete_checkpoints(other / "checkpoints"):
        if step > 6:  # killed after step 6's checkpoint
            shutil.rmtree(path)
    resumed = run(config(checkpoint_every=1), w3, other)
    assert resumed["init"]["mode"] == "resume" and resumed["steps_run"] == 3
    assert resumed["train_days"]["run"] == [1, 2]
    assert recorded(other)[-1] == (9, {"trained": [0, 1, 2], "before": [0], "run": [1, 2]})


# -- a real stable-ids preprocess and convert -------------------------------------------------
@pytest.mark.spark
def test_stable_id_days_from_spark_train_the_new_day_only(tmp_path, spark):
    """Days 0-1 (train day 0), then day 2 lands (train days 0, 1): real Spark preprocess and
    convert; the warm-started run trains exactly day 1's rows of the train split."""
    from converters.convert import convert_parquet
    from dlrm_contracts.binary_format import read_info
    from dlrm_contracts.config import ConvertConfig, PreprocessConfig
    from dlrm_contracts.layout import WorkdirLayout
    from spark_fixtures import random_days, spark_config
    from spark_jobs.preprocess import run_preprocess
    from trainer.loop import Trainer, run

    days = random_days(2626, 3, 700)
    raw, work = tmp_path / "raw", tmp_path / "work"
    layout = WorkdirLayout.at(work)
    raw.mkdir()
    train = small_config(batch_size=64, init="previous", days="new", keep_checkpoints=10)
    trained = []
    for k in range(3):
        (raw / f"day_{k}").write_text("".join(line + "\n" for line in days[k]))
        if k == 0:
            continue
        run_preprocess(
            raw, work, spark_config(), PreprocessConfig(frequency_threshold="2", ids="stable", output_files=2)
        )
        convert_parquet(
            layout.parquet, layout.binary, ConvertConfig(progress=False, fsync=False, overwrite=True)
        )
        segments = read_info(layout.binary).extra["segments"]["train"]
        assert [s["day"] for s in segments] == list(range(k))
        trainer = Trainer(train, layout.binary, work)
        summary = trainer.train()
        trained.append(summary)
        day_rows = {s["day"]: s["rows"] for s in segments}
        first_row = sum(day_rows[d] for d in range(k - 1))
        assert trainer.day_plan.ranges == ((first_row, first_row + day_rows[k - 1]),)
        assert summary["train_days"]["run"] == [k - 1]
        assert summary["train_days"]["trained"] == list(range(k))
        assert summary["steps_run"] == day_rows[k - 1] // 64
    assert [s["init"]["mode"] for s in trained] == ["scratch", "previous"]
    again = run(train, layout.binary, work)  # the same day's run again: nothing trained
    assert again["steps_run"] == 0 and again["train_days"]["trained"] == [0, 1]


def test_early_stoppings_best_model_counts_its_runs_days_once_the_run_ends(tmp_path):
    """The best checkpoint is saved mid-run (here after the first of day 3's five steps, the
    learning rate being too high for the next ones to help); once the run has ended, it
    records day 3 as trained: the next run does not train it again."""
    from dlrm_contracts.layout import best_checkpoint
    from trainer.loop import run

    work = tmp_path / "work"
    run(config(), window(tmp_path / "w3", [0, 1, 2], 3, seed=3), work)
    stopped = run(
        config(
            early_stopping_patience=1,
            evals_per_epoch=5,
            epochs=3,
            optimizer="adam",
            init_optimizer="restart",
            learning_rate=0.3,
            warmup_steps=0,
        ),
        window(tmp_path / "w4", [0, 1, 2, 3], 4, seed=4),
        work,
    )
    assert stopped["stopped_early"]
    best = best_checkpoint(work / "checkpoints")
    meta = json.loads((best / "meta.json").read_text())
    first = meta["warm_start"]["from_step"]
    print("best step", meta["step"], "run start", first)
    assert meta["step"] - first < 640 // BATCH  # saved before one pass over day 3
    assert meta[TRAIN_DAYS_KEY] == {"trained": [0, 1, 2, 3], "before": [0, 1, 2], "run": [3]}
    after = run(config(init_optimizer="restart"), window(tmp_path / "w4b", [0, 1, 2, 3], 4, seed=44), work)
    assert after["steps_run"] == 0 and after["train_days"]["run"] == []


def test_a_forced_rerun_after_a_run_with_nothing_new_starts_from_the_kept_model(first_run, tmp_path):
    """Window [0] | 1, then [0, 1] | 2 (trains day 1), then the same window re-made (nothing
    new: the previous model is saved unchanged for it, replacing the checkpoint it came from,
    and with keep_checkpoints 1 it is the only copy of the model). The pipeline's train stage
    forced again on that dataset keeps it and starts from it: with train.days: new nothing is
    trained, with window (a changed setting) the window is trained from it, never from scratch."""
    import yaml

    from dlrm_contracts.config import PipelineConfig, config_to_dict
    from dlrm_contracts.layout import WorkdirLayout
    from pipeline import stages
    from pipeline.manifest import ManifestStore
    from trainer.loop import run
    from trainer.warm_start import holds_previous_model
    from trainer_helpers import checkpoint_arrays

    work = tmp_path / "work"
    layout = WorkdirLayout.at(work)

    def land(train_days: list[int], test_day: int, seed: int) -> None:
        shutil.rmtree(layout.binary, ignore_errors=True)
        window(layout.binary, train_days, test_day, seed=seed)

    keep_one = config(keep_checkpoints=1)
    _copy_of_first_run(first_run, work)  # window [0] | 1 trained (its one checkpoint)
    land([0, 1], 2, seed=2)
    trained = run(keep_one, layout.binary, work)
    assert trained["steps_run"] == 384 // BATCH and trained["step"] == 7
    model = checkpoint_arrays(work)
    land([0, 1], 2, seed=22)  # the same window, re-made: nothing new
    kept = run(keep_one, layout.binary, work)
    assert kept["steps_run"] == 0 and kept["init"]["mode"] == "previous"
    [(step, path)] = complete_checkpoints(layout.checkpoints)  # the model's only copy
    assert step == 7 and holds_previous_model(json.loads((path / "meta.json").read_text()))

    def forced_train(train) -> dict:
        pipeline_config = PipelineConfig()
        pipeline_config.train, pipeline_config.force = train, True
        # one process: which checkpoint the stage keeps and starts from does not depend on the
        # ranks (test_trainer_horovod.py warm-starts two ranks as one process)
        pipeline_config.launch.np = 1
        config_path = tmp_path / "effective.yaml"
        config_path.write_text(yaml.safe_dump(config_to_dict(pipeline_config)))
        ctx = stages.StageContext(pipeline_config, layout, ManifestStore(layout.manifests), config_path)
        return stages.run_train(ctx).summary

    again = forced_train(keep_one)
    assert again["init"]["mode"] == "previous" and again["init"]["from_step"] == 7, again
    assert again["steps_run"] == 0 and again["train_days"]["trained"] == [0, 1]
    assert [s for s, _ in complete_checkpoints(layout.checkpoints)] == [7]
    arrays = checkpoint_arrays(work)
    assert all(np.array_equal(arrays[k], model[k]) for k in model), "the model changed"

    window_run = forced_train(config(keep_checkpoints=1, days="window"))
    assert window_run["init"]["mode"] == "previous" and window_run["init"]["from_step"] == 7
    assert window_run["steps_run"] == (512 + 384) // BATCH and window_run["step"] == 7 + 7
    assert window_run["train_days"]["before"] == [0, 1]
    # the model it started from stays beside the run's: a third rerun starts from it again
    assert [s for s, _ in complete_checkpoints(layout.checkpoints)] == [7, 14]
    third = forced_train(config(keep_checkpoints=1, days="window"))
    assert third["init"]["from_step"] == 7 and third["step"] == 14
