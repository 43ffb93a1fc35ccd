"""The convert stage's decisions (converters.api) made without the pipeline:
``python -m converters convert --workdir DIR --frequency-threshold T`` converts, derives a raise
from the binary dataset in place, refuses a threshold below the parquet's and rebuilds a damaged
dataset, as the pipeline's convert stage does (tests/test_pipeline.py covers the stage)."""

from __future__ import annotations

import json

import pytest

from converters.api import lean_record
from converters.cli import main
from dlrm_contracts.errors import ExitCode
from dlrm_contracts.layout import WorkdirLayout
from dlrm_contracts.schema import SPLITS
from tests.converter_helpers import write_workdir


def _convert(capsys, root, threshold: str | None, *more: str) -> tuple[int, dict | str]:
    """The exit code, and the JSON summary (the error line when it failed)."""
    asked = ["--frequency-threshold", threshold] if threshold else []
    code = main(["convert", "--workdir", str(root), *asked, "--no-fsync", "--no-progress", "--json", *more])
    out = capsys.readouterr()
    return code, json.loads(out.out.strip().splitlines()[-1]) if code == 0 else out.err


def _spec(root) -> str:
    return json.loads((root / "binary" / "dataset.json").read_text())["threshold_spec"]


def test_the_cli_makes_the_convert_stages_decisions(tmp_path, capsys):
    write_workdir(tmp_path)  # its parquet is at threshold 2
    code, summary = _convert(capsys, tmp_path, "2")
    assert (code, summary["action"], summary["engine"]) == (0, "ran", "converters")

    # A raise is derived from the binary dataset in place, not converted again.
    code, summary = _convert(capsys, tmp_path, "5")
    assert (code, summary["action"], summary["engine"]) == (0, "derived", "rethreshold")
    assert summary["from_threshold"] == "2" and _spec(tmp_path) == "5"

    # Below the parquet's threshold needs Spark: refused, the dataset in place kept.
    code, error = _convert(capsys, tmp_path, "1")
    assert code == ExitCode.CONVERT and _spec(tmp_path) == "5"
    assert "below the parquet's threshold 2" in error and "Traceback" not in error

    # A damaged dataset is never derived from: rebuilt from the parquet, then raised.
    label = tmp_path / "binary" / "train" / "label.bin"
    label.write_bytes(bytes(b ^ 1 for b in label.read_bytes()))
    code, summary = _convert(capsys, tmp_path, "5")
    assert (code, summary["action"], summary["engine"]) == (0, "derived", "converters+rethreshold")
    assert _spec(tmp_path) == "5"


@pytest.mark.parametrize("threshold", [None, "2"])
def test_the_cli_applies_the_lean_mode(tmp_path, capsys, threshold):
    """preprocess.keep_parquet: false in the config: the splits go once the dataset verifies,
    recorded so that the parquet is still recognised (as the pipeline's convert stage does),
    and a raise is then derived from the dataset without them."""
    write_workdir(tmp_path)
    lean = tmp_path / "lean.yaml"
    lean.write_text("preprocess:\n  keep_parquet: false\n")
    code, summary = _convert(capsys, tmp_path, threshold, "--config", str(lean))
    assert code == 0 and sorted(summary["parquet_removed"]["removed"]) == sorted(SPLITS)
    layout = WorkdirLayout.at(tmp_path)
    assert not any(layout.parquet_split(s).exists() for s in SPLITS)
    assert lean_record(layout, json.loads(layout.parquet_removed.read_text())) is not None

    code, summary = _convert(capsys, tmp_path, "5", "--config", str(lean))
    assert (code, summary["action"], summary["engine"]) == (0, "derived", "rethreshold")
    assert _spec(tmp_path) == "5"


def test_the_cli_keeps_the_parquet_by_default(tmp_path, capsys):
    write_workdir(tmp_path)
    code, summary = _convert(capsys, tmp_path, None)
    assert code == 0 and "parquet_removed" not in summary
    assert all(WorkdirLayout.at(tmp_path).parquet_split(s).is_dir() for s in SPLITS)
