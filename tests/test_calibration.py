"""The preflight's calibration of this machine's cores (pipeline/calibration.py): measured once
per machine in a child process, cached, reused, and measured again for another CPU.

No figure is checked against a time: only that the figures exist, where they are kept, when
they are reused and when they are not.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from dlrm_contracts.config import PreflightConfig
from pipeline import calibration


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CRITEO_DLRM_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "calibration"


def _measured_again() -> dict:
    raise AssertionError("the cached calibration was measured again")


def test_the_calibration_is_measured_once_and_reused(cache):
    record = calibration.load_or_measure()
    key = calibration.machine_key()
    path = cache / f"{key}.json"
    assert record["key"] == key and json.loads(path.read_text()) == record
    assert set(record["figures"]) == set(calibration.FIGURES)
    assert all(value > 0 for value in record["figures"].values())
    assert record["cpu"] == calibration.cpu_model()
    stamp = path.stat().st_mtime_ns
    assert calibration.load_or_measure(measure=_measured_again) == record
    assert path.stat().st_mtime_ns == stamp
    # the preflight's ratios come from it: this machine's figure over the reference's
    preflight = PreflightConfig()
    speed = calibration.speed(preflight)
    assert speed.train == pytest.approx(
        record["figures"]["matmul_gflops"] / preflight.reference_matmul_gflops
    )
    assert speed.parse == pytest.approx(
        record["figures"]["parse_rows_per_s"] / preflight.reference_parse_rows_per_s
    )
    assert str(path) in speed.source
    off = calibration.speed(dataclasses.replace(preflight, calibrate=False))
    assert (off.parse, off.train, off.convert) == (1.0, 1.0, 1.0)


def test_another_cpu_or_a_damaged_record_is_calibrated_again(cache, monkeypatch):
    figures = {name: 1.0 + n for n, name in enumerate(calibration.FIGURES)}
    first = calibration.load_or_measure(measure=lambda: figures)
    with monkeypatch.context() as patch:
        patch.setattr(calibration, "cpu_model", lambda: "Another CPU, other cores")
        assert calibration.machine_key() != first["key"]
        other = calibration.load_or_measure(measure=lambda: {k: 2 * v for k, v in figures.items()})
        assert other["key"] == calibration.machine_key()
        assert other["cpu"] == "Another CPU, other cores"
    assert other["figures"] == {k: 2 * v for k, v in figures.items()}
    assert sorted(p.name for p in cache.iterdir()) == sorted([f"{first['key']}.json", f"{other['key']}.json"])
    # the same CPU with another core count, or another version of the benchmarks, is another key
    key = calibration.machine_key("x", 2)
    assert key != calibration.machine_key("x", 4)
    with monkeypatch.context() as patch:
        patch.setattr(calibration, "CALIBRATION_VERSION", calibration.CALIBRATION_VERSION + 1)
        assert calibration.machine_key("x", 2) != key
    assert calibration.load_or_measure(measure=_measured_again) == first
    (cache / f"{first['key']}.json").write_text("{not json")
    again = calibration.load_or_measure(measure=lambda: figures)
    assert again["figures"] == figures and json.loads((cache / f"{first['key']}.json").read_text()) == again


def test_a_calibration_that_cannot_run_leaves_the_rates_with_a_warning(cache, monkeypatch):
    monkeypatch.setenv("CRITEO_DLRM_CACHE", "/dev/null/not-a-directory")
    warnings: list[str] = []
    speed = calibration.speed(PreflightConfig(), warnings.append)
    assert (speed.parse, speed.train, speed.convert) == (1.0, 1.0, 1.0)
    assert len(warnings) == 1 and "calibration failed" in warnings[0]
