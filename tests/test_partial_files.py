"""Partial count files: what a count task writes is what the merge reads, range by range."""

import numpy as np
import pytest

from spark_jobs.engines.arrow import partial_files
from spark_jobs.engines.arrow.value_counts import Counts, merge_counts


def _counts(rng, n, top=1 << 32):
    values = np.unique(rng.integers(0, top, n, dtype=np.int64)).astype(np.uint32)
    return Counts(values, rng.integers(1, 1000, len(values)).astype(np.uint32))


def test_ranges_of_every_file_merge_to_the_whole(tmp_path):
    """Cut at any bounds, the slices of all files (two days, three columns, an empty segment)
    add up to the merge of the whole segments, and no value lands in two ranges."""
    rng = np.random.default_rng(3)
    written = []
    for k in range(4):
        segments = [(k % 2, column, _counts(rng, 5000 if column else 0)) for column in range(3)]
        partial_files.write(tmp_path / f"chunk-{k}{partial_files.SUFFIX}", segments)
        written += segments
    paths = partial_files.files(tmp_path)
    assert len(paths) == 4
    bounds = [0, 1 << 20, 1 << 31, 3_000_000_000]
    for column in (1, 2):
        for day in (0, 1):
            whole = merge_counts([c for d, j, c in written if j == column and d == day])
            pieces = []
            for r, low in enumerate(bounds):
                high = bounds[r + 1] if r + 1 < len(bounds) else None
                part = merge_counts(partial_files.read_range(paths, column, low, high).get(day, []))
                assert np.all(part.values >= low) and (high is None or np.all(part.values < high))
                pieces.append(part)
            assert np.array_equal(np.concatenate([p.values for p in pieces]), whole.values)
            assert np.array_equal(np.concatenate([p.counts for p in pieces]), whole.counts)
    assert partial_files.read_range(paths, 0, 0, None) == {}  # empty segments are not kept


def test_a_damaged_file_is_an_error_not_a_short_count(tmp_path):
    rng = np.random.default_rng(4)
    path = tmp_path / f"chunk-0{partial_files.SUFFIX}"
    partial_files.write(path, [(0, 5, _counts(rng, 1000))])
    data = path.read_bytes()
    path.write_bytes(data[:-4])
    with pytest.raises(ValueError, match="bytes where its segment table says"):
        partial_files.read_range([str(path)], 5, 0, None)
    path.write_bytes(b"not a partial file at all")
    with pytest.raises(ValueError, match="not a partial counts file"):
        partial_files.read_range([str(path)], 5, 0, None)


def test_a_slice_found_through_the_fences_is_exact_at_any_bound(tmp_path):
    """Bounds on a fence's value, one either side of it, on the first and last values, and
    beyond them: each slice is exactly the values in [low, high)."""
    rng = np.random.default_rng(5)
    counts = _counts(rng, 3 * partial_files.FENCE + 17)
    counts.values[0], counts.values[-1] = 0, (1 << 32) - 1
    path = tmp_path / f"chunk-0{partial_files.SUFFIX}"
    partial_files.write(path, [(2, 7, counts)])
    fences = counts.values[:: partial_files.FENCE].astype(np.int64)
    bounds = sorted(
        {int(b) for f in fences for b in (f - 1, f, f + 1) if 0 <= b < 1 << 32} | {0, 1, (1 << 32) - 1}
    )
    values = counts.values.astype(np.int64)
    for low in bounds:
        for high in [b for b in bounds if b > low][:6] + [None]:
            want = (values >= low) & (values < (high if high is not None else 1 << 33))
            got = partial_files.read_range([str(path)], 7, low, high).get(2, [])
            assert len(got) == (1 if want.any() else 0)
            if got:
                assert np.array_equal(got[0].values, counts.values[want])
                assert np.array_equal(got[0].counts, counts.counts[want])


def test_the_exchange_behind_a_url_stays_on_one_host_only_under_a_local_master():
    """auto: the workdir's files on a path; behind a URL the host's disk when one host runs
    every task, Spark's shuffle on a cluster; ``local`` on a cluster is refused in one line."""
    from spark_jobs.engines.arrow.engine import choose_exchange
    from spark_jobs.errors import PreprocessConfigError

    assert choose_exchange("auto", False, "local[2]") == "files"
    assert choose_exchange("auto", False, "spark://head:7077") == "files"
    assert choose_exchange("auto", True, "local[2]") == "local"
    assert choose_exchange("auto", True, "local-cluster[2,1,1024]") == "local"
    assert choose_exchange("auto", True, "spark://head:7077") == "shuffle"
    assert choose_exchange("auto", True, "yarn") == "shuffle"
    assert choose_exchange("shuffle", True, "local[2]") == "shuffle"
    assert choose_exchange("files", True, "yarn") == "files"
    assert choose_exchange("local", True, "local[*]") == "local"
    with pytest.raises(PreprocessConfigError, match="needs a local master, not yarn"):
        choose_exchange("local", True, "yarn")


def test_a_host_directory_left_by_a_dead_run_is_removed_and_a_live_one_kept(tmp_path):
    """Each job gets its own directory; a killed job's (its process gone) goes at the next
    job's start, another live job's stays."""
    import os
    import subprocess
    import sys

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True)
    dead = tmp_path / f"criteo-dlrm-partials-{int(gone.stdout)}-abc"
    live = tmp_path / f"criteo-dlrm-partials-{os.getppid()}-def"
    other = tmp_path / "criteo-dlrm-input-xyz"
    for folder in (dead, live, other):
        (folder / "chunk-0000001.partial").parent.mkdir()
        (folder / "chunk-0000001.partial").write_bytes(b"x")
    first = partial_files.on_this_host(tmp_path)
    second = partial_files.on_this_host(tmp_path)
    assert first != second and first.is_dir() and second.is_dir()
    assert first.name.startswith(f"criteo-dlrm-partials-{os.getpid()}-")
    assert not dead.exists() and live.exists() and other.exists()
