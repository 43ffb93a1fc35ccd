"""Streams chunks from a process pool into day files, then writes generator_meta.json.

Chunks are submitted a bounded window ahead and written strictly in (day, chunk) order, so
memory stays at a few chunks whatever the row count, and the bytes do not depend on the
number of workers. Each day file is written under a temporary name and renamed when
complete: a crash never leaves a truncated ``day_k`` behind. A directory that holds day
files the generator did not write is refused rather than overwritten.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import re
import threading
from collections import deque
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Iterator

from pipeline.config import GeneratorConfig
from pipeline.schema import NUM_FIELDS
from pipeline.synthetic.bayes_auc import BINS, LOGIT_MAX, LOGIT_MIN, LogitHistogram
from pipeline.synthetic.source import Chunk, SyntheticSource

META_FILE = "generator_meta.json"
META_FORMAT_VERSION = 1
_DAY_FILE = re.compile(r"^day_(\d+)(\.gz)?$")
# What an interrupted run of ours leaves behind: day files and chunks being written.
_LEFTOVER = re.compile(r"^\.day_\d+(\.gz)?\.partial$|^\.day_\d+\.chunk\d+\.part$")

_worker_source: SyntheticSource | None = None


def _init_worker(source: SyntheticSource) -> None:
    global _worker_source
    _worker_source = source


def _make_chunk(day: int, index: int, rows: int, out: str) -> Chunk:
    assert _worker_source is not None, "worker not initialised"
    chunk = _worker_source.make_chunk(day, index, rows)
    return chunk.spill(os.path.join(out, f".day_{day}.chunk{index}.part"))


def day_file_name(day: int, gzip: bool) -> str:
    return f"day_{day}" + (".gz" if gzip else "")


def _tasks(source: SyntheticSource, config: GeneratorConfig) -> list[tuple[int, int, int]]:
    return [(day, index, rows) for day in range(config.days)
            for index, rows in enumerate(source.chunk_sizes(config.rows_per_day))]


def _chunks_in_order(source: SyntheticSource, config: GeneratorConfig, out: Path
                     ) -> Iterator[Chunk]:
    tasks = _tasks(source, config)
    if config.workers <= 1:
        for task in tasks:
            yield source.make_chunk(*task)
        return
    context = _pool_context()
    window = 2 * config.workers
    with ProcessPoolExecutor(config.workers, mp_context=context, initializer=_init_worker,
                             initargs=(source,)) as pool:
        pending: deque[Future] = deque()
        for task in tasks:
            pending.append(pool.submit(_make_chunk, *task, str(out)))
            if len(pending) >= window:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


def _pool_context() -> multiprocessing.context.BaseContext:
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


def _check_directory(out: Path) -> None:
    """Refuse to overwrite day files that a previous generator run did not write; remove
    the ones it did (a smaller rerun must not leave stale days behind)."""
    existing = {p.name for p in out.iterdir() if _DAY_FILE.match(p.name)}
    ours: set[str] = set()
    meta_path = out / META_FILE
    if meta_path.exists():
        try:
            ours = {d["file"] for d in json.loads(meta_path.read_text())["days"]}
        except (ValueError, KeyError, TypeError) as err:
            raise RuntimeError(f"{meta_path} is unreadable ({err}); remove it or choose another "
                               f"output directory") from err
    foreign = sorted(existing - ours)
    if foreign:
        raise FileExistsError(
            f"{out} already holds day files the generator did not write ({', '.join(foreign)}); "
            f"refusing to overwrite them: choose an empty directory")
    for name in sorted(existing):
        (out / name).unlink()
    for leftover in out.iterdir():
        if _LEFTOVER.match(leftover.name):
            leftover.unlink()
    meta_path.unlink(missing_ok=True)


def _validate(config: GeneratorConfig) -> None:
    if config.days < 1:
        raise ValueError(f"days must be >= 1, got {config.days}")
    if config.rows_per_day < 1:
        raise ValueError(f"rows_per_day must be >= 1, got {config.rows_per_day}")
    if config.workers < 1:
        raise ValueError(f"workers must be >= 1, got {config.workers}")
    if config.gzip and not 0 <= config.gzip_level <= 9:
        raise ValueError(f"gzip_level must be 0..9, got {config.gzip_level}")


def generate(out_dir: str | os.PathLike, config: GeneratorConfig | None = None) -> dict:
    """Write ``day_0 .. day_{days-1}`` (``.gz`` when ``config.gzip``) and generator_meta.json
    into ``out_dir``; returns the metadata that was written."""
    config = config or GeneratorConfig()
    _validate(config)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    _check_directory(out)
    source = SyntheticSource.from_config(config)
    histogram = LogitHistogram()
    days: list[dict] = []
    chunks = _chunks_in_order(source, config, out)
    chunks_per_day = len(source.chunk_sizes(config.rows_per_day))
    for day in range(config.days):
        days.append(_write_day(out, day_file_name(day, config.gzip), chunks_per_day, chunks,
                               histogram))
    auc, auc_error = histogram.auc()
    rows = sum(d["rows"] for d in days)
    clicks = sum(d["clicks"] for d in days)
    meta = {
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
    _atomic_write(out / META_FILE, (json.dumps(meta, indent=2) + "\n").encode())
    return meta


def _write_day(out: Path, name: str, chunks_per_day: int, chunks: Iterator[Chunk],
               histogram: LogitHistogram) -> dict:
    partial = out / f".{name}.partial"
    rows = clicks = size = 0
    with open(partial, "wb", buffering=0) as fh:
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
    os.replace(partial, out / name)
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
                view = view[os.write(fd, view):]
            left = 0
    if left:
        raise RuntimeError(f"{part_file} is shorter than the {size} bytes its worker wrote")
    os.unlink(part_file)


def _atomic_write(path: Path, data: bytes) -> None:
    partial = path.with_name(f".{path.name}.partial")
    partial.write_bytes(data)
    os.replace(partial, path)
