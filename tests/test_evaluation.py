"""Evaluation on its own (trainer/evaluation.py): a split scored once per row and in row order,
its AUC and log loss against numpy's on the same predictions, the metrics on rank 0 only, the
previous model's view of a dataset (as_served), the records and lines other code reads, and
the inference rate's contract.

Real TensorFlow, one process: one small untrained DLRM, built once for the module, scores the
session's planted dataset and two tiny ones with the same tables. Untrained is enough: its
scores differ from row to row, which is all these contracts need."""

from __future__ import annotations

import numpy as np
import pytest

from dlrm_contracts.binary_format import (
    LABEL_DTYPE,
    LABEL_FILE,
    NUM_NUMERICAL,
    NUMERICAL_DTYPE,
    NUMERICAL_FILE,
    cat_file,
)
from dlrm_contracts.config import ConfigError
from trainer import evaluation
from trainer.comm import LocalComm
from trainer.data import SplitReader, open_dataset
from trainer.evaluation import EvalResult, Evaluator, as_served, eval_line, eval_record, summary_record
from trainer.metrics import read_metrics
from trainer.run_log import RunLog
from trainer.synthetic import write_planted_dataset
from trainer_helpers import SMALL_ROWS, pairwise_auc, small_config

# Divides none of the splits' row counts: every split ends with a padded batch.
EVAL_BATCH = 300


@pytest.fixture(scope="module")
def dlrm(small_dataset, tmp_path_factory):
    """One rank's model (a Trainer of the planted dataset, evaluated 300 rows at a time)."""
    from trainer.loop import Trainer

    workdir = tmp_path_factory.mktemp("evaluation") / "w"
    return Trainer(small_config(eval_batch_size=EVAL_BATCH), small_dataset, workdir, comm=LocalComm())


@pytest.fixture(scope="module")
def odd(tmp_path_factory):
    """The model's tables, a test split shorter than a batch whose labels are all 0, no
    validation rows, a train split of more than one batch."""
    path = tmp_path_factory.mktemp("odd") / "binary"
    write_planted_dataset(path, {"train": 400, "test": 150, "validation": 0}, seed=5)
    np.zeros(150, LABEL_DTYPE).tofile(path / "test" / LABEL_FILE)
    return open_dataset(path)


def raw_labels(dataset, split: str) -> np.ndarray:
    return np.fromfile(dataset.path / split / LABEL_FILE, LABEL_DTYPE)


def whole_split_scores(dlrm, dataset, split: str, table_sizes=None) -> np.ndarray:
    """The model's probabilities of every row of a split from the raw files, in one eager call:
    no batches, no padding, no read-ahead. ``table_sizes``: an id at or past its table's size
    is given as 0."""
    import tensorflow as tf

    folder, rows = dataset.path / split, dataset.rows[split]
    categorical = []
    for t in dlrm.view.tables:
        ids = np.fromfile(folder / cat_file(t), dataset.cat_dtypes[t]).astype(np.int32)
        if table_sizes is not None:
            ids[ids >= table_sizes[t]] = 0
        categorical.append(tf.constant(ids))
    numerical = np.fromfile(folder / NUMERICAL_FILE, NUMERICAL_DTYPE).reshape(rows, NUM_NUMERICAL)
    logits = dlrm.model(categorical, tf.constant(numerical.astype(np.float32)), rows)
    return tf.sigmoid(logits).numpy()


def numpy_log_loss(labels: np.ndarray, scores: np.ndarray) -> float:
    p = scores.astype(np.float64)
    return float(-np.mean(labels * np.log(p) + (1 - labels) * np.log(1 - p)))


def test_a_split_is_scored_once_per_row_in_row_order_without_its_padding(dlrm, small_dataset):
    seen: list[tuple[str, int, int]] = []
    labels, scores = dlrm.evaluator.predictions("test", on_rows=lambda *report: seen.append(report))
    rows = SMALL_ROWS["test"]
    assert labels.shape == scores.shape == (rows,)
    np.testing.assert_array_equal(labels, raw_labels(dlrm.dataset, "test"))
    np.testing.assert_allclose(scores, whole_split_scores(dlrm, dlrm.dataset, "test"), rtol=1e-5, atol=1e-6)
    # the progress reporter hears of each batch's valid rows, the last one's 100 without padding
    assert seen == [("test", n, rows) for n in (300, 600, 900, 1000)]


def test_auc_and_log_loss_are_numpys_on_the_same_predictions(dlrm):
    labels, scores = dlrm.evaluator.predictions("validation")
    assert len(np.unique(scores)) > 100 and 0 < labels.sum() < labels.size  # a real ranking
    result = dlrm.evaluator.evaluate("validation")
    assert (result.split, result.rows) == ("validation", SMALL_ROWS["validation"])
    assert result.auc == pytest.approx(pairwise_auc(labels, scores), abs=1e-12)
    assert result.logloss == pytest.approx(numpy_log_loss(labels, scores), rel=1e-9)


def test_only_rank_0_computes_the_metrics(dlrm):
    """Every rank scores the split (the prediction step gathers every rank's rows); the AUC and
    log loss are rank 0's alone."""
    other_rank = Evaluator(dlrm.steps.predict, dlrm.view, dlrm.dataset, EVAL_BATCH, 2, rank=1)
    assert other_rank.evaluate("test") == EvalResult("test", SMALL_ROWS["test"], None, None)
    assert dlrm.evaluator.evaluate("test").auc is not None


def test_one_class_has_no_auc_and_an_empty_split_no_metrics(dlrm, odd):
    one_class = dlrm.evaluator.evaluate("test", dataset=odd)
    labels, scores = dlrm.evaluator.predictions("test", dataset=odd)
    assert one_class.rows == 150 and not labels.any() and one_class.auc is None
    assert one_class.logloss == pytest.approx(numpy_log_loss(labels, scores), rel=1e-9)
    assert dlrm.evaluator.evaluate("validation", dataset=odd) == EvalResult("validation", 0, None, None)
    labels, scores = dlrm.evaluator.predictions("validation", dataset=odd)
    assert labels.shape == scores.shape == (0,)


def test_as_served_reads_a_value_past_the_served_tables_as_id_0(dlrm):
    """The previous model, its tables smaller than this dataset's, scores the dataset with the
    values it has no row for at id 0; a served table larger than the dataset's grows nothing."""
    dataset = dlrm.dataset
    before = dataset.table_sizes
    sizes = [max(1, s // 3) if t % 2 else s + 10 for t, s in enumerate(before)]
    served = as_served(dataset, sizes)
    assert served.table_sizes == tuple(min(a, b) for a, b in zip(sizes, before))
    assert dataset.table_sizes == before  # a new description; the run's own is unchanged
    assert (served.path, served.rows, served.written_table_sizes) == (
        dataset.path,
        dataset.rows,
        dataset.written_table_sizes,
    )
    mine, theirs = SplitReader(dataset, "test"), SplitReader(served, "test")
    rows, zeroed = dataset.rows["test"], 0
    for t, size in enumerate(served.table_sizes):
        ids = mine.categorical(t, 0, rows)
        np.testing.assert_array_equal(theirs.categorical(t, 0, rows), np.where(ids < size, ids, 0))
        zeroed += int((ids >= size).sum())
    assert zeroed > 100  # the test is about something
    _, scores = dlrm.evaluator.predictions("test", dataset=served)
    expected = whole_split_scores(dlrm, dataset, "test", table_sizes=served.table_sizes)
    np.testing.assert_allclose(scores, expected, rtol=1e-5, atol=1e-6)


def test_eval_records_are_what_the_metrics_log_and_the_report_read(tmp_path):
    """metrics.jsonl's eval records (docs/trainer.md, "Metrics"), as the run log writes them
    and the pipeline's report draws its AUC curves from them: one curve per split and model."""
    from pipeline.report import _auc_points

    log = RunLog(tmp_path, rank=0)
    for record in (
        eval_record(EvalResult("test", 1000, 0.75, 0.5), 4, model="previous"),
        eval_record(EvalResult("test", 1000, 0.8, 0.45), 10),
        eval_record(EvalResult("validation", 777, None, 0.6), 10),
    ):
        log.record(record, record["step"])
    records = [{k: v for k, v in r.items() if k != "time"} for r in read_metrics(tmp_path / "metrics.jsonl")]
    head = {"event": "eval", "split": "test"}
    assert records == [
        {**head, "step": 4, "rows": 1000, "auc": 0.75, "logloss": 0.5, "model": "previous"},
        {**head, "step": 10, "rows": 1000, "auc": 0.8, "logloss": 0.45},
        {"event": "eval", "split": "validation", "step": 10, "rows": 777, "auc": None, "logloss": 0.6},
    ]
    assert _auc_points(records) == {"test auc (previous model)": [(4, 0.75)], "test auc": [(10, 0.8)]}


def test_eval_lines_name_the_split_the_model_and_an_undefined_auc():
    assert eval_line(EvalResult("test", 1000, 0.75, 0.5), 10) == (
        "eval test at step 10: auc 0.75 logloss 0.5 (1000 rows)"
    )
    assert eval_line(EvalResult("test", 150, None, 0.6), 3, model="previous") == (
        "eval test (previous model) at step 3: auc undefined (the split has one class only) "
        "logloss 0.6 (150 rows)"
    )


def test_a_summary_holds_every_field_the_eval_stage_adopts_from_training():
    """The pipeline's eval stage takes a train summary's figures instead of evaluating again
    when they are all there (pipeline/stages.py); the export reads its test AUC."""
    from pipeline.stages import _EVALUATION_FIELDS

    head = {
        "mode": "train",
        "step": 20,
        "ranks": 1,
        "global_batch": 256,
        "preset": "small",
        "compute_dtype": "float32",
        "xla": False,
    }
    evals = [EvalResult("test", 1000, 0.75, 0.5), EvalResult("validation", 777, None, 0.6)]
    record = summary_record(head, evals, {"train_loss": 0.4})
    assert record == {
        **head,
        "test_auc": 0.75,
        "test_logloss": 0.5,
        "test_rows": 1000,
        "validation_auc": None,
        "validation_logloss": 0.6,
        "validation_rows": 777,
        "train_loss": 0.4,
    }
    assert set(_EVALUATION_FIELDS) <= set(record)
    assert list(record)[: len(head)] == list(head) and list(record)[-1] == "train_loss"


class TimedPredict:
    """The real prediction step on a clock that only it advances: the first (tracing) call
    takes ``first`` seconds, every other ``each``; it keeps each batch's labels."""

    def __init__(self, predict, monkeypatch, first: float, each: float):
        self.predict, self.first, self.each = predict, first, each
        self.now, self.labels = 1000.0, []
        monkeypatch.setattr(evaluation.time, "perf_counter", lambda: self.now)

    def __call__(self, categorical, numerical, label):
        self.now += self.each if self.labels else self.first
        self.labels.append(label.numpy())
        return self.predict(categorical, numerical, label)


def test_the_inference_rate_times_every_batch_but_the_first(dlrm, monkeypatch):
    """Samples per second over the test split's whole batches, round again when the steps
    outnumber them; the first batch, which traces the step, is left out of the time."""
    timed = TimedPredict(dlrm.steps.predict, monkeypatch, first=7.0, each=0.5)
    rate = Evaluator(timed, dlrm.view, dlrm.dataset, EVAL_BATCH, 2, 0).inference_rate(6)
    assert rate == pytest.approx(EVAL_BATCH / 0.5)
    labels = raw_labels(dlrm.dataset, "test")
    starts = [0, 300, 600, 0, 300, 600]  # 3 whole batches of 1000 rows, the partial one never
    assert len(timed.labels) == len(starts)
    for got, start in zip(timed.labels, starts):
        np.testing.assert_array_equal(got, labels[start : start + EVAL_BATCH])


def test_the_inference_rate_reads_train_when_test_is_short_and_refuses_less_than_a_batch(
    dlrm, odd, tmp_path, monkeypatch
):
    timed = TimedPredict(dlrm.steps.predict, monkeypatch, first=1.0, each=0.25)
    assert Evaluator(timed, dlrm.view, odd, EVAL_BATCH, 2, 0).inference_rate(2) == pytest.approx(1200)
    np.testing.assert_array_equal(timed.labels[0], raw_labels(odd, "train")[:EVAL_BATCH])
    write_planted_dataset(tmp_path / "short", {"train": 200, "test": 100, "validation": 10}, seed=6)
    short = Evaluator(dlrm.steps.predict, dlrm.view, open_dataset(tmp_path / "short"), EVAL_BATCH, 2, 0)
    with pytest.raises(ConfigError, match="the train split has fewer rows than one batch of 300"):
        short.inference_rate(2)
