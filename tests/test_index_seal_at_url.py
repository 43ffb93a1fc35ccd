"""The dictionary index behind a URL (a real S3-compatible server, moto on loopback) sealed
from the checksums its writers computed: the same index.json as a seal that reads every
region back, and a region no task reported is refused."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest


def _index_at(url: str, local: Path) -> dict[tuple[str, int], str]:
    """A small index of two columns written locally and copied behind ``url``; the checksum of
    each region, as the dictionary tasks report them."""
    from spark_jobs.engines.arrow import dictionary_index as di
    from spark_jobs.engines.arrow import remote
    from spark_jobs.engines.arrow.index_checks import region_checksum

    rng = np.random.default_rng(7)
    layouts = {
        "C1": di.ColumnLayout.of(np.array([0, 2**31], np.uint32), [300, 0]),
        "C2": di.ColumnLayout.of(np.array([0, 1000, 2**20], np.uint32), [5, 700, 40]),
    }
    di.create_index(url, layouts)
    di.create_index(local, layouts)
    checksums = {}
    for column, layout in layouts.items():
        for rank, size in enumerate(layout.sizes.tolist()):
            if not size:
                continue
            low = int(layout.bounds[rank])
            values = np.unique(rng.integers(low, low + 999, 100)).astype(np.uint32)
            di.write_region(str(local), column, rank, size, values, np.arange(1, len(values) + 1))
            data = di.region_path(local, column, rank).read_bytes()
            remote.write_bytes(remote.join(url, column, f"{rank:05d}.slots"), data)
            checksums[(column, rank)] = region_checksum(np.frombuffer(data, np.uint64))
    return checksums


def test_sealed_from_the_writers_checksums_as_from_the_files(moto_s3, tmp_path):
    from spark_jobs.engines.arrow import dictionary_index as di
    from spark_jobs.engines.arrow import remote
    from spark_jobs.engines.arrow.index_checks import DictionaryIndexError

    bucket = moto_s3.bucket("seal")
    read_back, reported = f"s3://{bucket}/read-back", f"s3://{bucket}/reported"
    _index_at(read_back, tmp_path / "a")
    checksums = _index_at(reported, tmp_path / "b")
    di.seal_index(read_back)  # every region read back
    di.seal_index(reported, checksums)
    sealed = remote.read_bytes(remote.join(reported, di.INDEX_JSON))
    assert sealed == remote.read_bytes(remote.join(read_back, di.INDEX_JSON))
    di.seal_index(tmp_path / "b")  # and a local seal of the same files
    assert sealed == (tmp_path / "b" / di.INDEX_JSON).read_bytes()

    del checksums[("C2", 1)]
    with pytest.raises(DictionaryIndexError, match=r"C2: the ranges \[1\] were not written"):
        di.seal_index(reported, checksums)
