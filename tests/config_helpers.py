"""What the shipped-config tests share: where the configs are, which are MLPerf DLRMv2's, and the
keys of a YAML config that are no setting of the pipeline."""

from __future__ import annotations

import dataclasses
from pathlib import Path

CONFIGS = Path(__file__).resolve().parents[1] / "configs"

# MLPerf DLRMv2's ids per row of C1..C26 (its multi-hot sizes).
MLPERF_MULTI_HOT = [3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1]

# The MLPerf DLRMv2 configs (tests/test_mlperf_configs.py): their ranks and hardware.
MLPERF = {
    "mlperf_dlrmv2_8gpu.yaml": {"np": 8, "hardware": "8 GPUs"},
    "mlperf_dlrmv2_cpu_cluster.yaml": {"np": 16, "hardware": "CPU"},
}


def unknown_keys(data: dict, cls: type, where: str) -> list[str]:
    """Keys of the YAML mapping that are no field of the dataclass (recursively)."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = []
    for key, value in data.items():
        if key not in fields:
            unknown.append(f"{where}.{key}")
            continue
        default = getattr(cls(), key)
        if dataclasses.is_dataclass(default) and isinstance(value, dict):
            unknown += unknown_keys(value, type(default), f"{where}.{key}")
    return unknown
