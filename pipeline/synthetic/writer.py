"""Streams chunks from a process pool into day files, then writes generator_meta.json.

Chunks are submitted a bounded window ahead and written strictly in (day, chunk) order, so
memory stays at a few chunks whatever the row count, and the bytes do not depend on the
number of workers. Each day file is written under a temporary name and renamed when
complete: a crash never leaves a truncated ``day_k`` behind, a failed run removes what it
wrote, and a killed one leaves a marker naming its files so the rerun may replace them.
generator_meta.json is written last: its presence means the output is complete. A
directory that holds day files no generator run wrote is refused rather than overwritten.
"""

from __future__ import annotations

import json
import math
import multiprocessing
import os
import re
import signal
import threading
from collections import deque
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Iterator

from dlrm_contracts.atomic import atomic_file, fsync_tree, write_text_atomic
from dlrm_contracts.config import GeneratorConfig
from dlrm_contracts.errors import UsageError
from dlrm_contracts.schema import NUM_FIELDS
from pipeline.synthetic.bayes_auc import BINS, LOGIT_MAX, LOGIT_MIN, LogitHistogram
from pipeline.synthetic.source import Chunk, SyntheticSource

META_FILE = "generator_meta.json"
# Lists the day files of a run in progress, so a rerun after a kill knows they are ours.
IN_PROGRESS_FILE = ".generator_in_progress.json"
META_FORMAT_VERSION = 1
_DAY_FILE = re.compile(r"^day_(\d+)(\.gz)?$")
# What an interrupted run of ours leaves behind: day files and chunks being written.
_LEFTOVER = re.compile(
    r"^\.(day_\d+(\.gz)?|generator_meta\.json|\.generator_in_progress\.json)"
    r"\.tmp-\d+-[0-9a-f]+$|^\.day_\d+\.chunk\d+\.part$"
)

_worker_source: SyntheticSource | None = None


class OutputDirectoryError(UsageError):
    """The output directory holds files the generator cannot take over; choose another."""


class ForeignDayFilesError(OutputDirectoryError, FileExistsError):
    """Day files no run of the generator wrote: never overwritten."""


def _init_worker(source: SyntheticSource) -> None:
    global _worker_source
    _worker_source = source
    _die_with_parent()


def _die_with_parent() -> None:
    """Ask Linux to kill this pool worker if the generating process dies (even by SIGKILL):
    an orphaned worker would otherwise wait on its task queue forever."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: workers still exit with a clean shutdown
        pass


def _make_chunk(day: int, index: int, rows: int, out: str) -> Chunk:
    assert _worker_source is not None, "worker not initialised"
    chunk = _worker_source.make_chunk(day, index, rows)
    return chunk.spill(os.path.join(out, f".day_{day}.chunk{index}.part"))


def day_file_name(day: int, gzip: bool) -> str:
    return f"day_{day}" + (".gz" if gzip else "")


def _tasks(source: SyntheticSource, config: GeneratorConfig) -> list[tuple[int, int, int]]:
    return [
        (day, index, rows)
        for day in range(config.days)
        for index, rows in enumerate(source.chunk_sizes(config.rows_per_day))
    ]


def _chunks_in_order(source: SyntheticSource, config: GeneratorConfig, out: Path) -> Iterator[Chunk]:
    tasks = _tasks(source, config)
    if config.workers <= 1:
        for task in tasks:
            yield source.make_chunk(*task)
        return
    context = pool_context()
    window = 2 * config.workers
    # No more processes than chunks: --workers 64 on a 7-row run starts one.
    with ProcessPoolExecutor(
        min(config.workers, len(tasks)), mp_context=context, initializer=_init_worker, initargs=(source,)
    ) as pool:
        pending: deque[Future] = deque()
        for task in tasks:
            pending.append(pool.submit(_make_chunk, *task, str(out)))
            if len(pending) >= window:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


def pool_context() -> multiprocessing.context.BaseContext:
    """``fork`` when this process has a single thread (fast, and works from scripts without
    a ``__main__`` guard); ``forkserver`` otherwise, since forking a threaded process (a
    Spark gateway, a log reader) can deadlock the child. The output is the same either way.
    """
    methods = multiprocessing.get_all_start_methods()
    if "fork" in methods and threading.active_count() == 1:
        return multiprocessing.get_context("fork")
    context = multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")
    if context.get_start_method() == "forkserver":
        context.set_forkserver_preload(["pipeline.synthetic.writer"])
    return context


def _our_day_files(out: Path) -> set[str]:
    """Day files that a previous run wrote (its metadata) or was writing when it was
    killed (its in-progress marker)."""
    ours: set[str] = set()
    for path in (out / META_FILE, out / IN_PROGRESS_FILE):
        if path.exists():
            try:
                ours |= {d["file"] for d in json.loads(path.read_text())["days"]}
            except (ValueError, KeyError, TypeError) as err:
                raise OutputDirectoryError(
                    f"{path} is unreadable ({err}); remove it or choose another output directory"
                ) from err
    return ours


def _check_directory(out: Path) -> None:
    """Refuse to overwrite day files that no generator run wrote; remove the ones a previous
    run did (a smaller rerun must not leave stale days behind)."""
    existing = {p.name for p in out.iterdir() if _DAY_FILE.match(p.name)}
    foreign = sorted(existing - _our_day_files(out))
    if foreign:
        raise ForeignDayFilesError(
            f"{out} already holds day files the generator did not write ({', '.join(foreign)}); "
            f"refusing to overwrite them: choose an empty directory"
        )
    for name in sorted(existing):
        (out / name).unlink()
    (out / META_FILE).unlink(missing_ok=True)
    _remove_leftovers(out)


def _remove_leftovers(out: Path) -> None:
    for leftover in out.iterdir():
        if _LEFTOVER.match(leftover.name):
            leftover.unlink(missing_ok=True)


def generate(out_dir: str | os.PathLike, config: GeneratorConfig | None = None) -> dict:
    """Write synthetic Criteo-format day files, the same bytes for any number of workers.

    Args:
        out_dir: receives ``day_0 .. day_{days-1}`` (``.gz`` when ``config.gzip``) and
            ``generator_meta.json``; day files of an earlier run are replaced, day files
            it did not write are refused.
        config: days, rows, seed, vocabulary and signal settings; defaults to
            ``GeneratorConfig()``.

    Returns:
        The metadata written to ``generator_meta.json`` (rows, click rate, Bayes AUC).
    """
    config = config or GeneratorConfig()
    source = SyntheticSource.from_config(config)  # may still refuse: before any deletion
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    _check_directory(out)
    histogram = LogitHistogram()
    names = [day_file_name(day, config.gzip) for day in range(config.days)]
    write_text_atomic(out / IN_PROGRESS_FILE, json.dumps({"days": [{"file": n} for n in names]}))
    days = _write_days(out, names, source, config, histogram)
    meta = _meta(config, source, days, histogram)
    write_text_atomic(out / META_FILE, json.dumps(meta, indent=2) + "\n")
    # the day files (written without flushing, one by one) on disk before the marker that
    # says they are incomplete goes: a power cut never leaves short days looking whole
    fsync_tree(out)
    (out / IN_PROGRESS_FILE).unlink()
    return meta


def _write_days(
    out: Path, names: list[str], source: SyntheticSource, config: GeneratorConfig, histogram: LogitHistogram
) -> list[dict]:
    """Every day file in order, from the chunks the pool makes; on any failure (or interrupt)
    the days already written are deleted, so an incomplete run leaves nothing like data."""
    days: list[dict] = []
    chunks = _chunks_in_order(source, config, out)
    chunks_per_day = len(source.chunk_sizes(config.rows_per_day))
    try:
        for name in names:
            days.append(_write_day(out, name, chunks_per_day, chunks, histogram))
    except BaseException:
        chunks.close()  # stops the pool (its running chunks finish first)
        _remove_leftovers(out)
        for day in days:
            (out / day["file"]).unlink(missing_ok=True)
        (out / IN_PROGRESS_FILE).unlink(missing_ok=True)
        raise
    return days


def _meta(
    config: GeneratorConfig, source: SyntheticSource, days: list[dict], histogram: LogitHistogram
) -> dict:
    """``generator_meta.json``: the layout, the settings, rows and clicks per day, and the Bayes
    AUC of the planted model (the ceiling any trained model can reach on this data)."""
    auc, auc_error = histogram.auc()
    if math.isnan(auc):  # no click or no non-click: undefined, and NaN is not valid JSON
        auc = auc_error = None
    rows = sum(d["rows"] for d in days)
    clicks = sum(d["clicks"] for d in days)
    return {
        "format_version": META_FORMAT_VERSION,
        "layout": f"criteo-terabyte-tsv: label, I1..I13, C1..C26 ({NUM_FIELDS} fields), "
        "tab separated, empty = missing, LF",
        "seed": config.seed,
        "parameters": {k: v for k, v in asdict(config).items() if k != "workers"},
        "days": days,
        "rows": rows,
        "clicks": clicks,
        "click_rate": clicks / rows,
        "bayes_auc": auc,
        "bayes_auc_max_error": auc_error,
        "bayes_auc_method": f"ROC AUC of the planted click probabilities against the labels "
        f"over all rows, from click/non-click counts in {BINS} logit bins "
        f"on [{LOGIT_MIN}, {LOGIT_MAX}]; same-bin pairs count 1/2",
        "shape": source.shapes.describe(),
        "planted_model": source.model.describe(),
    }


def _write_day(
    out: Path, name: str, chunks_per_day: int, chunks: Iterator[Chunk], histogram: LogitHistogram
) -> dict:
    rows = clicks = size = 0
    # Day files are the bulk of the output and remade from the seed: not flushed one by one,
    # but in one pass (generate) before the in-progress marker goes.
    with atomic_file(out / name, fsync=False) as partial, open(partial, "wb", buffering=0) as fh:
        for _ in range(chunks_per_day):
            chunk = next(chunks)
            if chunk.part_file:
                _splice(chunk.part_file, fh.fileno(), chunk.size)
            else:
                fh.write(chunk.payload)
            histogram.add(chunk.counts)
            rows += chunk.rows
            clicks += chunk.clicks
            size += chunk.size
    return {"file": name, "rows": rows, "clicks": clicks, "bytes": size}


def _splice(part_file: str, fd: int, size: int) -> None:
    """Append ``part_file`` to the open file ``fd`` (kernel-side copy) and delete it."""
    with open(part_file, "rb") as src:
        left = size
        try:
            while left > 0:
                copied = os.copy_file_range(src.fileno(), fd, left)
                if copied == 0:
                    break
                left -= copied
        except OSError:  # a file system without copy_file_range: plain copy of the rest
            src.seek(size - left)
            view = memoryview(src.read())
            while view:
                view = view[os.write(fd, view) :]
            left = 0
    if left:
        raise RuntimeError(f"{part_file} is shorter than the {size} bytes its worker wrote")
    os.unlink(part_file)
