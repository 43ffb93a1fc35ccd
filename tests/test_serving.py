"""Serving, for real: one small pipeline run (local Spark, two Horovod ranks with a table split
across them), exported as a SavedModel, loaded in a fresh process that imports only TensorFlow.

The raw test day is salted with the lines a real log holds: every kind of reject, uppercase hex,
CRLF ends, short lines, values never seen in training. ``serve_lines`` must reproduce the Spark
job's decisions line by line (the plain-Python reference of tests/spark_fixtures.py), and on the
kept lines the trainer's own eval predictions and AUC.
"""

from __future__ import annotations

import gzip
import json
import random
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from dlrm_contracts.errors import ExitCode
from dlrm_contracts.layout import export_versions, latest_export
from pipeline.generate import main as generate_main
from tests.pipeline_helpers import run_in_process
from tests.spark_fixtures import BAD_LINES, reference_parse

pytestmark = [pytest.mark.spark, pytest.mark.horovod, pytest.mark.slow]

CONFIG = """
generator:
  days: 3
  rows_per_day: 2000
  seed: 777
spark:
  driver_memory: 2g
preprocess:
  frequency_threshold: "2,C1:3"
convert:
  batch_rows: 512
train:
  preset: small
  batch_size: 512
  warmup_steps: 5
  learning_rate: 0.2
  epochs: 2
  force_column_split: [C3]
launch:
  np: 2
score:
  max_reject_rate: 0.03  # the salted test day is about 2% rejects
"""

# Imports nothing of this project: a SavedModel must serve with TensorFlow alone.
SERVE_SCRIPT = textwrap.dedent("""
    import json, sys
    import numpy as np
    import tensorflow as tf

    model = tf.saved_model.load(sys.argv[1])
    requests = json.load(open(sys.argv[2]))
    out = {}
    for name, request in requests.items():
        if request["signature"] in ("serve_lines", "serving_default"):
            lines = [line.encode("latin-1") for line in request["lines"]]
            result = model.signatures[request["signature"]](
                lines=tf.constant(lines, tf.string),
                has_label=tf.constant([request["has_label"]] * len(lines)))
        else:
            result = model.signatures["serve_features"](
                int_features=tf.constant(request["ints"], tf.int64),
                cat_features=tf.constant(request["cats"], tf.string))
        out[name] = {"probability": [float(p) for p in result["probability"].numpy()],
                     "reject_reason": [r.decode() for r in result["reject_reason"].numpy()]}
        if "label" in result:
            out[name]["label"] = result["label"].numpy().tolist()
    # What TensorFlow Serving's batching needs: a batch dimension first on every tensor.
    out["_signatures"] = {
        name: {"inputs": {k: v.shape.as_list() for k, v in fn.structured_input_signature[1].items()},
               "outputs": {k: v.shape.as_list() for k, v in fn.structured_outputs.items()}}
        for name, fn in model.signatures.items()}
    project = sorted(m for m in sys.modules if m.split(".")[0] in ("trainer", "pipeline", "converters"))
    out["_project_modules"] = project
    # a strict JSON writer: no NaN or infinity anywhere in a response
    json.dump(out, open(sys.argv[3], "w"), allow_nan=False)
""")


def _salt_test_day(lines: list[str], seed: int) -> list[str]:
    """The first half of the last day (the test split) with every awkward kind of line."""
    rng = random.Random(seed)
    head = (len(lines) + 1) // 2
    test, rest = lines[:head], lines[head:]
    for i in rng.sample(range(len(test)), 60):
        fields = test[i].split("\t")
        kind = i % 4
        if kind == 0:  # uppercase hex
            fields = fields[:14] + [f.upper() for f in fields[14:]]
        elif kind == 1:  # values never seen in training
            for j in rng.sample(range(14, 40), 5):
                fields[j] = "%x" % rng.randrange(1, 2**32)
        elif kind == 2:  # a short line: the trailing fields are missing
            fields = fields[: rng.randint(1, 39)]
        else:  # short hex, written without leading zeros
            fields = fields[:14] + [f.lstrip("0") or ("0" if f else "") for f in fields[14:]]
        test[i] = "\t".join(fields) + ("\r" if i % 3 == 0 else "")
    # the SavedModel scores request lines: the day files' line limit is not its rule
    bad = [line for reason, group in BAD_LINES.items() if reason != "line_too_long" for line in group]
    bad += [
        "1\t9223372036854775808" + "\t" * 38,
        "0\t-9223372036854775809",
        "1\t-9223372036854775808\t9223372036854775807",
    ]  # the last one is valid
    # in the first half of the test lines, so every one stays in the day's test split
    # (its first half) whatever the day's size
    for line in bad:
        test.insert(rng.randrange(len(test) // 2), line)
    return test + rest


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A two-rank pipeline run over salted raw data, exported; the fresh-process scorer."""
    root = tmp_path_factory.mktemp("serving")
    config = root / "config.yaml"
    config.write_text(CONFIG)
    raw = root / "raw"
    assert generate_main(["--out", str(raw), "--config", str(config)]) == 0
    last = raw / "day_2"
    lines = last.read_text(encoding="latin-1").split("\n")[:-1]
    salted = _salt_test_day(lines, 5)
    last.write_bytes(("\n".join(salted) + "\n").encode("latin-1"))
    workdir = root / "work"
    # the pipeline's main in this process: its stages' children (the Spark job, horovodrun's
    # ranks, the export) are processes of their own, as in a real run
    proc, _ = run_in_process(
        root,
        *["--input", str(raw), "--workdir", str(workdir), "--config", str(config)],
        *["--stages", "preprocess,convert,train,eval,export"],
    )
    assert proc.returncode == 0, proc.stderr[-5000:]
    return {
        "root": root,
        "raw": raw,
        "workdir": workdir,
        "config": config,
        "test_lines": salted[: (len(salted) + 1) // 2],
    }


def newest_fingerprint(workdir: Path) -> Path:
    """The fingerprint of the newest export version (what a server watching DIR/export serves)."""
    return latest_export(workdir / "export") / "fingerprint.json"


def serve(served, requests: dict) -> dict:
    """Score ``requests`` in a new Python process that imports TensorFlow only."""
    root = served["root"]
    script, request_file = root / "serve.py", root / "requests.json"
    answer = root / "answer.json"
    script.write_text(SERVE_SCRIPT)
    request_file.write_text(json.dumps(requests))
    model = latest_export(served["workdir"] / "export")
    proc = subprocess.run(
        [sys.executable, str(script), str(model), str(request_file), str(answer)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=root,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(answer.read_text())
    assert out.pop("_project_modules") == []
    served["signatures"] = out.pop("_signatures")
    return out


def trainer_test_predictions(workdir: Path) -> tuple[np.ndarray, np.ndarray]:
    from dlrm_contracts.config import load_config
    from trainer.loop import Trainer

    config = load_config(workdir / "manifests" / "effective_config.yaml").train
    trainer = Trainer(config, workdir / "binary", workdir)
    trainer.restore_best(required=True)  # the run's model: what eval and export use
    return trainer.predictions("test")


def test_serve_lines_equal_trainer_predictions_and_auc(served, answers):
    from trainer.metrics import roc_auc

    lines = served["test_lines"]
    out = answers
    probability = np.array(out["test"]["probability"])
    reasons = out["test"]["reject_reason"]
    # every line decided as the Spark job decides it (the reference of its rules)
    expected = [reference_parse(line.removesuffix("\r"))[0] or "" for line in lines]
    assert reasons == expected
    assert sum(r != "" for r in reasons) == 19  # the bad lines _salt_test_day inserts
    assert (probability[np.array(reasons) != ""] == -1.0).all()  # valid JSON, not a probability
    labels, predictions = trainer_test_predictions(served["workdir"])
    kept = probability[np.array(reasons) == ""]
    assert kept.shape == predictions.shape
    np.testing.assert_allclose(kept, predictions, rtol=0, atol=2e-6)
    kept_labels = [int(line.split("\t")[0]) for line, r in zip(lines, reasons) if r == ""]
    np.testing.assert_array_equal(kept_labels, labels)
    reported = json.loads((served["workdir"] / "eval.json").read_text())["test_auc"]
    assert abs(roc_auc(labels, kept) - reported) <= 1e-4
    assert out["test"]["label"] == [int(line[0]) if r == "" else -1 for line, r in zip(lines, reasons)]


def _valid_fields(served, count: int) -> list[list[str]]:
    rows = []
    for line in served["test_lines"]:
        line = line.removesuffix("\r")
        if reference_parse(line)[0] is None and len(line.split("\t")) == 40:
            rows.append(line.split("\t"))
        if len(rows) == count:
            return rows
    raise AssertionError("not enough valid lines")


def _variant_requests(rows: list[list[str]]) -> dict:
    """The requests of test_serve_features_and_line_variants_agree: ``rows`` written each way."""
    canonical = ["\t".join(r) for r in rows]
    upper = ["\t".join(r[:14] + [c.upper() for c in r[14:]]) for r in rows]
    unpadded = ["\t".join(r[:14] + [c.lstrip("0") or ("0" if c else "") for c in r[14:]]) for r in rows]
    crlf = [line + "\r\n" for line in canonical]
    # unseen values vs missing ones: both id 0
    unseen = ["\t".join(r[:14] + ["fedcba98"] * 3 + r[17:]) for r in rows]
    blank = ["\t".join(r[:14] + [""] * 3 + r[17:]) for r in rows]
    # x <= -3 is missing after the transform; a short line's tail is missing
    negative = ["\t".join(r[:1] + ["-7" if i % 2 else "" for i in range(13)] + r[14:]) for r in rows]
    empty_ints = ["\t".join(r[:1] + [""] * 13 + r[14:]) for r in rows]
    short = ["\t".join(r[:30]) for r in rows]
    short_padded = ["\t".join(r[:30] + [""] * 10) for r in rows]
    missing = -(2**63)
    ints = [[int(x) if x else missing for x in r[1:14]] for r in rows]
    requests = {
        name: {"signature": "serve_lines", "lines": lines, "has_label": True}
        for name, lines in [
            ("canonical", canonical),
            ("upper", upper),
            ("unpadded", unpadded),
            ("crlf", crlf),
            ("unseen", unseen),
            ("blank", blank),
            ("negative", negative),
            ("empty_ints", empty_ints),
            ("short", short),
            ("short_padded", short_padded),
        ]
    }
    requests["unlabelled"] = {
        "signature": "serve_lines",
        "has_label": False,
        "lines": ["\t".join(r[1:]) for r in rows],
    }
    requests["features"] = {
        "signature": "serve_features",
        "ints": ints,
        "cats": [[c.upper() for c in r[14:]] for r in rows],
    }
    requests["bad_features"] = {
        "signature": "serve_features",
        "ints": ints[:2],
        "cats": [rows[0][14:25] + ["0x1"] + rows[0][26:], rows[1][14:]],
    }
    return requests


VARIANT_ROWS = 64
SIGNATURE_LINES = 200


@pytest.fixture(scope="module")
def answers(served) -> dict:
    """Every request of this module's tests, scored in one fresh process (one TensorFlow import
    and one SavedModel load): the test day's lines, the variants of 64 valid rows, and the
    first 200 lines through serving_default and serve_lines. Each test reads its own."""
    lines = served["test_lines"]
    requests = {
        "test": {"signature": "serve_lines", "lines": lines, "has_label": True},
        **_variant_requests(_valid_fields(served, VARIANT_ROWS)),
        "default": {"signature": "serving_default", "lines": lines[:SIGNATURE_LINES], "has_label": True},
        "named": {"signature": "serve_lines", "lines": lines[:SIGNATURE_LINES], "has_label": True},
    }
    return serve(served, requests)


def test_serve_features_and_line_variants_agree(served, answers):
    """Uppercase, no leading zeros, CRLF, short lines, no label, unseen values, x <= -3 and the
    missing marker: each variant scores exactly as its canonical form."""
    rows = _valid_fields(served, VARIANT_ROWS)
    out = answers
    base = out["canonical"]["probability"]
    assert all(0 < p < 1 for p in base)
    for name in ("upper", "unpadded", "crlf", "unlabelled", "features"):
        assert out[name]["probability"] == base, name
    assert out["unseen"]["probability"] == out["blank"]["probability"]
    assert out["unseen"]["probability"] != base
    assert out["negative"]["probability"] == out["empty_ints"]["probability"]
    assert out["short"]["probability"] == out["short_padded"]["probability"]
    assert out["unlabelled"]["label"] == [-1] * len(rows)
    assert out["bad_features"]["reject_reason"] == ["non_hex_categorical", ""]
    assert out["bad_features"]["probability"][0] == -1.0
    # another batch size: the matmuls may round differently
    assert out["bad_features"]["probability"][1] == pytest.approx(base[1], rel=1e-5)


def test_fingerprint_names_what_was_exported(served):
    workdir = served["workdir"]
    assert [v for v, _ in export_versions(workdir / "export")] == [1]  # TF Serving's layout
    fingerprint = json.loads((workdir / "export" / "1" / "fingerprint.json").read_text())
    evaluation = json.loads((workdir / "eval.json").read_text())
    assert fingerprint["version"] == 1
    dataset = json.loads((workdir / "binary" / "dataset.json").read_text())
    assert fingerprint["checkpoint_step"] == evaluation["step"]
    assert fingerprint["test_auc"] == evaluation["test_auc"]
    assert fingerprint["threshold_spec"] == dataset["threshold_spec"] == "2,C1:3"
    assert fingerprint["dataset"]["source_fingerprint"] == dataset["source_fingerprint"]
    assert fingerprint["trained_ranks"] == 2
    # the default model: the wide term's weights are in the export (wide_C<i>)
    assert fingerprint["dims"] == {
        "embedding_dim": 16,
        "bottom_mlp": [64, 32, 16],
        "top_mlp": [128, 64, 1],
        "wide": True,
    }
    assert fingerprint["table_sizes"] == dataset["table_sizes"]
    vocab = workdir / "export" / "1" / "assets" / "C1.vocab"
    assert len(vocab.read_text().splitlines()) == dataset["table_sizes"][0]


def run_pipeline(served, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    """The pipeline's command line on the served workdir, its main in this process
    (run_in_process): the score stage's child (``python -m trainer.score``) is a process of
    its own, as in a real run."""
    proc, summary = run_in_process(
        served["root"],
        *["--workdir", str(served["workdir"]), "--config", str(served["config"]), *args],
    )
    assert summary is not None, proc.stderr[-4000:]
    return proc, summary


def test_score_stage_writes_scores_and_rejects(served, answers):
    root = served["root"]
    lines = served["test_lines"]
    day = root / "new" / "day_9.gz"
    day.parent.mkdir()
    with gzip.open(day, "wb") as fh:
        fh.write(("\n".join(lines) + "\n").encode("latin-1"))
    plain = root / "new" / "unlabelled"
    plain.write_text(
        "".join(
            "\t".join(line.split("\t")[1:]) + "\n"
            for line in lines[:50]
            if reference_parse(line.removesuffix("\r"))[0] is None and len(line.split("\t")) == 40
        )
    )
    proc, summary = run_pipeline(served, "--stages", "export,score", "--score-input", f"{day},{plain}")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert summary["stages"]["export"]["action"] == "skipped"  # checkpoint, dictionaries unchanged
    assert summary["export_version"] == 1  # no new version for an unchanged model
    assert summary["stages"]["score"]["action"] == "ran"
    scored_lines = len(lines) + plain.read_text().count("\n")
    assert summary["stages"]["score"]["rows"] == scored_lines
    from dlrm_contracts.progress import Progress

    reports = [
        Progress.from_line(x)
        for x in (root / "work" / "logs" / "score.progress.jsonl").read_text().splitlines()
    ]
    assert reports[0].fraction == 0.0 and reports[-1].fraction == pytest.approx(1.0)
    assert reports[-1].rows == scored_lines and reports[-1].detail == "unlabelled"
    scores = pq.read_table(root / "work" / "scores" / "day_9.parquet").to_pydict()
    rejects = [
        json.loads(r) for r in (root / "work" / "scores" / "rejects" / "day_9.jsonl").read_text().splitlines()
    ]
    expected = [reference_parse(line.removesuffix("\r"))[0] for line in lines]
    assert scores["line_number"] == [i + 1 for i, r in enumerate(expected) if r is None]
    assert [(r["line_number"], r["reason"]) for r in rejects] == [
        (i + 1, r) for i, r in enumerate(expected) if r is not None
    ]
    assert len(scores["line_number"]) + len(rejects) == len(lines)
    assert [r["line"] for r in rejects] == [  # as Spark reads them: no line end, no \r
        line.removesuffix("\r") for line, r in zip(lines, expected) if r is not None
    ]
    # the export the stage scored with is the one the module's answers came from (version 1)
    assert scores["probability"] == pytest.approx(
        [p for p, r in zip(answers["test"]["probability"], expected) if r is None], abs=1e-7
    )
    assert scores["label"] == [int(line[0]) for line, r in zip(lines, expected) if r is None]
    unlabelled = pq.read_table(root / "work" / "scores" / "unlabelled.parquet")
    assert unlabelled.column_names == ["line_number", "probability"]
    assert all(0 < p < 1 for p in unlabelled.column("probability").to_pylist())
    again, summary = run_pipeline(served, "--stages", "score", "--score-input", f"{day},{plain}")
    assert again.returncode == 0 and summary["stages"]["score"]["action"] == "skipped"


def test_export_too_big_is_refused_before_reading(served, capsys):
    """The export stage's child (the main of ``python -m trainer --mode export``, with the
    stage's arguments, run in this process; the stage's exit 10 for its child's refusal is
    checked end to end by test_a_new_day_preprocessed_does_not_export_the_old_checkpoint)."""
    from trainer.cli import main

    config = served["root"] / "tiny.yaml"
    config.write_text(CONFIG + "export:\n  max_memory_mb: 0.01\n")
    before = newest_fingerprint(served["workdir"]).read_text()
    workdir = served["workdir"]
    capsys.readouterr()
    code = main(
        ["--mode", "export", "--dataset", str(workdir / "binary"), "--workdir", str(workdir)]
        + ["--config", str(config), "--verify-dataset", "none"]
    )
    stderr = capsys.readouterr().err
    assert code == ExitCode.EXPORT, stderr[-3000:]
    assert "the export needs about" in stderr and "max_memory_mb" in stderr
    # the previous export is untouched
    assert newest_fingerprint(served["workdir"]).read_text() == before


def test_planner_prints_export_size(served, capsys):
    """``python -m converters plan``'s main, in this process."""
    from converters.cli import main

    counts = str(served["workdir"] / "counts")
    capsys.readouterr()
    code = main(["plan", "--counts", counts, "--thresholds", "2,5", "--embedding-dim", "16", "--json"])
    printed = capsys.readouterr()
    assert code == 0, printed.err
    rows = json.loads(printed.out)
    for row in rows:
        values = sum(row["table_sizes"].values()) - len(row["table_sizes"])
        assert row["export_bytes"] == row["embedding_bytes"] + 9 * values
    assert rows[0]["export_bytes"] > rows[1]["export_bytes"]
    assert main(["plan", "--counts", counts, "--thresholds", "2,5"]) == 0
    assert "export (SavedModel)" in capsys.readouterr().out


def test_signatures_suit_tensorflow_serving(served, answers):
    """serving_default is serve_lines; every input and output has the batch dimension first
    (TensorFlow Serving's batching concatenates along it and refuses a scalar input); a
    rejected row's probability is -1, which a strict JSON writer accepts (NaN is not JSON)."""
    out = answers
    assert len(out["named"]["probability"]) == SIGNATURE_LINES
    assert out["default"] == out["named"]
    signatures = served["signatures"]
    assert {"serving_default", "serve_lines", "serve_features"} <= set(signatures)
    for name, signature in signatures.items():
        for kind in ("inputs", "outputs"):
            for tensor, shape in signature[kind].items():
                assert shape and shape[0] is None, (name, kind, tensor, shape)
    assert signatures["serving_default"]["inputs"] == {"lines": [None], "has_label": [None]}
    fingerprint = json.loads(newest_fingerprint(served["workdir"]).read_text())
    assert "serving_default" in fingerprint["signatures"]


def _score_args(served, files: list[Path], config_text: str) -> tuple[list[str], Path]:
    """``trainer.score``'s arguments: the export, a fresh output directory, ``config_text``."""
    out = served["root"] / f"scores-{len(list(served['root'].glob('scores-*')))}"
    config = out.with_suffix(".yaml")
    config.write_text(config_text or "score: {}\n")
    args = [
        "--model",
        str(latest_export(served["workdir"] / "export")),
        "--out",
        str(out),
        "--config",
        str(config),
        "--input",
        ",".join(map(str, files)),
    ]
    return args, out


def _score_cli(served, files: list[Path], config_text: str = "", timeout: int = 300):
    """``python -m trainer.score`` on the export, into a fresh output directory."""
    args, out = _score_args(served, files, config_text)
    proc = subprocess.run(
        [sys.executable, "-m", "trainer.score", *args], capture_output=True, text=True, timeout=timeout
    )
    return proc, out


def _score_main(capsys):
    """``trainer.score``'s command line run in this process: the ``main`` that ``python -m
    trainer.score`` runs, its exit code and output as a finished process's, without another
    process importing TensorFlow. The exit codes themselves are checked on the real command
    line (_score_cli) too."""
    from trainer.score import main

    def score(served, files: list[Path], config_text: str = ""):
        args, out = _score_args(served, files, config_text)
        capsys.readouterr()  # what earlier steps printed is not this run's
        code = main(args)
        printed = capsys.readouterr()
        return subprocess.CompletedProcess(args, code, printed.out, printed.err), out

    return score


def test_score_input_that_cannot_be_read_as_asked_is_one_line_exit_11(served, capsys):
    """A truncated .gz, a file that fits both readings (every line 39 fields), a file with too
    many rejected lines: exit 11 and one line naming the file; the rejects of the last are
    kept, its scores are not written. The last through the real command line, the others
    through its main in this process."""
    root = served["root"] / "bad_inputs"
    root.mkdir()
    good = [l for l in served["test_lines"] if reference_parse(l.removesuffix("\r"))[0] is None]
    truncated = root / "day_t.gz"
    data = gzip.compress(("\n".join(good) + "\n").encode("latin-1"))
    truncated.write_bytes(data[: len(data) * 2 // 3])
    ambiguous = root / "day_a"
    ambiguous.write_text("".join("\t".join(l.split("\t")[:39]) + "\n" for l in good[:300]))
    noisy = root / "day_n"
    noisy.write_text("".join(l + "\n" for l in good[:200]) + "1\tnot a number\r\n" * 5)
    for path, words, score in [
        (truncated, "is not a readable gzip file", _score_main(capsys)),
        (ambiguous, "set score.has_label", _score_main(capsys)),
        (noisy, "more than score.max_reject_rate", _score_cli),
    ]:
        proc, out = score(served, [path])
        assert proc.returncode == ExitCode.SCORE, (path, proc.stderr[-2000:])
        assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
        errors = [l for l in proc.stderr.splitlines() if l.startswith("trainer.score: error:")]
        assert len(errors) == 1 and str(path) in errors[0] and words in errors[0], proc.stderr
    assert not (out / "day_n.parquet").exists()
    rejects = [json.loads(l) for l in (out / "rejects" / "day_n.jsonl").read_text().splitlines()]
    assert [(r["line_number"], r["reason"], r["line"]) for r in rejects] == [
        (201 + i, "non_integer", "1\tnot a number") for i in range(5)
    ]


def test_score_input_edge_cases_that_are_fine(served, capsys):
    """An empty file (label unknown) scores nothing; a labelled file whose lines mostly lost
    their empty last field is read as labelled; the same file with score.has_label set too.
    Through the command line's main in this process: the real command line's exit 0 and
    summary are the score stage's (test_score_stage_writes_scores_and_rejects)."""
    root = served["root"] / "edge_inputs"
    root.mkdir()
    empty = root / "empty"
    empty.write_text("")
    good = [
        l.removesuffix("\r")
        for l in served["test_lines"]
        if reference_parse(l.removesuffix("\r"))[0] is None and len(l.split("\t")) == 40
    ]
    short = [l[:-1] if l.endswith("\t") else l for l in good[:400]]  # empty C26 dropped
    assert sum(l.count("\t") == 38 for l in short) > len(short) // 4
    labelled = root / "labelled39"
    labelled.write_text("".join(l + "\n" for l in short))
    proc, out = _score_main(capsys)(served, [empty, labelled])
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    files = {Path(f["file"]).name: f for f in summary["files"]}
    assert files["empty"]["lines"] == 0 and files["empty"]["has_label"] is None
    assert files["labelled39"]["has_label"] is True and files["labelled39"]["scored"] == len(short)
    scored = pq.read_table(out / "labelled39.parquet").to_pydict()
    assert scored["label"] == [int(l[0]) for l in short]
    proc, forced = _score_main(capsys)(served, [labelled], "score: {has_label: true}\n")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert pq.read_table(forced / "labelled39.parquet").to_pydict() == scored


def _workdir_copy(served, tmp_path: Path) -> Path:
    work = tmp_path / "work"
    shutil.copytree(served["workdir"], work)
    return work


def test_a_new_day_preprocessed_does_not_export_the_old_checkpoint(served, tmp_path):
    """A new day moves the ids (they follow the counts): `--stages preprocess,export` must
    not export yesterday's weights with today's dictionaries. Exit 10, one line; the previous
    export stays as it was."""
    raw = tmp_path / "raw"
    shutil.copytree(served["raw"], raw)
    shutil.copyfile(raw / "day_0", raw / "day_3")  # the new day: every day-0 value counts twice
    work = _workdir_copy(served, tmp_path)
    before = newest_fingerprint(work).read_text()
    proc, summary = run_in_process(
        tmp_path,
        *["--input", str(raw), "--workdir", str(work), "--config", str(served["config"])],
        *["--stages", "preprocess,export"],
    )
    assert proc.returncode == ExitCode.EXPORT, proc.stderr[-3000:]
    assert summary is not None, proc.stderr[-3000:]
    assert summary["stages"]["preprocess"]["action"] == "ran"
    assert summary["stages"]["export"]["action"] == "failed"
    headline = next(l for l in proc.stderr.splitlines() if "export failed" in l)
    assert "another preprocess run's dictionaries" in headline and "Traceback" not in proc.stderr
    assert newest_fingerprint(work).read_text() == before


def test_export_names_a_missing_dictionary(served, tmp_path, capsys):
    """The export stage's child (the main of ``python -m trainer --mode export``, with the
    stage's arguments, run in this process) on a workdir whose C5 dictionary is gone: exit
    10 and one line naming it, the line the stage reports (as in the test above)."""
    from trainer.cli import main

    work = _workdir_copy(served, tmp_path)
    shutil.rmtree(work / "parquet" / "dictionaries" / "column=C5")
    capsys.readouterr()
    code = main(
        ["--mode", "export", "--dataset", str(work / "binary"), "--workdir", str(work)]
        + ["--config", str(work / "manifests" / "effective_config.yaml"), "--verify-dataset", "none"]
    )
    stderr = capsys.readouterr().err
    assert code == ExitCode.EXPORT, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    [headline] = [l for l in stderr.splitlines() if l.startswith("trainer: error:")]
    assert "the dictionary of C5 is missing" in headline and "column=C5" in headline
