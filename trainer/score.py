"""``python -m trainer.score``: score raw day files with the exported SavedModel, streaming.

For each input file (plain or .gz) it writes ``OUT/<name>.parquet`` with ``line_number``
(int64, 1-based, as in the preprocess rejects), ``probability`` (float32) and, for labelled
files, ``label`` (int8), one row per scored line in line order; and ``OUT/rejects/<name>.jsonl``
with one record per line the model refused (``file``, ``line_number``, ``reason``, ``line``
without its line end), as the Spark job writes its rejects. Every line is one or the other: the
summary counts both. A file with more than ``score.max_reject_rate`` of its lines rejected
keeps its rejects and gets no scores (exit 11, as a truncated .gz or a file that does not say
whether it is labelled).

Lines are read ``batch_rows`` at a time and written as one parquet row group each, so memory
is bounded whatever the file size. Each file is written under a temporary name and renamed
when complete. Only TensorFlow, pyarrow and the SavedModel are needed (no project model code).
The last stdout line is a JSON summary.
"""

from __future__ import annotations

import argparse
import gzip
import io
import itertools
import json
import re
import sys
import time
import zlib
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from dlrm_contracts.atomic import atomic_file, remove_stale_temporaries
from dlrm_contracts.config import ProgressConfig, ScoreConfig, load_config
from dlrm_contracts.errors import ExitCode, failing_as, run_cli
from dlrm_contracts.layout import SAVED_MODEL_PB
from dlrm_contracts.lock import output_lock
from dlrm_contracts.model_digest import ModelDigestError, verify_saved_model
from dlrm_contracts.serving_state import ServingStateError, served_export
from dlrm_contracts.progress import Reporter, open_reporter
from dlrm_contracts.schema import NUM_FIELDS, NUM_INTEGER

# Lines read to decide whether a file carries the label (has_label unset).
LABEL_SNIFF_LINES = 1000
# The Spark job's field rules (docs/spark_jobs.md), on bytes.
_INTEGER = re.compile(rb"-?[0-9]{1,19}")
_HEX = re.compile(rb"[0-9a-fA-F]{1,8}")
_INT64 = (-(2**63), 2**63 - 1)


class ScoreError(ValueError):
    """An input the scorer cannot read as asked (missing file, undecidable label column)."""


def output_name(path: Path) -> str:
    return path.name[:-3] if path.name.endswith(".gz") else path.name


@contextmanager
def _open(path: Path) -> Iterator[tuple[io.BufferedIOBase, io.BufferedIOBase]]:
    """(the file's text, the file itself): the second's position is how many of its bytes
    (compressed ones for .gz) were read, the progress of a scan."""
    with open(path, "rb") as raw:
        if not path.name.endswith(".gz"):
            yield raw, raw
            return
        with gzip.GzipFile(fileobj=raw, mode="rb") as text:
            yield text, raw


def _lines(path: Path) -> Iterator[bytes]:
    """Lines ending at b"\\n" only (a lone \\r is data, as in the Spark job); the model drops
    the trailing \\n and \\r itself. A truncated or corrupt .gz is a ScoreError naming it."""
    with _reading(path):
        with _open(path) as (text, _):
            yield from text


@contextmanager
def _reading(path: Path) -> Iterator[None]:
    """A truncated or corrupt .gz read inside becomes a ScoreError naming the file."""
    try:
        yield
    except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
        raise ScoreError(
            f"{path} is not a readable gzip file (truncated or corrupt: {exc}); nothing was written for it"
        ) from None


def line_text(line: bytes) -> bytes:
    """A line without its end: one trailing \\n, then one trailing \\r (as Spark reads it)."""
    line = line[:-1] if line.endswith(b"\n") else line
    return line[:-1] if line.endswith(b"\r") else line


def _integer(field: bytes) -> bool:
    return not field or (_INTEGER.fullmatch(field) is not None and _INT64[0] <= int(field) <= _INT64[1])


def fits_rules(line: bytes, labelled: bool) -> bool:
    """Whether the Spark job would keep ``line`` read with (or without) a label field."""
    fields = line_text(line).split(b"\t")
    if not labelled:
        fields = [b"0", *fields]
    if len(fields) > NUM_FIELDS or fields[0] not in (b"0", b"1"):
        return False
    ints, cats = fields[1 : 1 + NUM_INTEGER], fields[1 + NUM_INTEGER :]
    return all(map(_integer, ints)) and all(not f or _HEX.fullmatch(f) for f in cats)


def detect_label(path: Path, max_reject_rate: float) -> bool | None:
    """Whether the file's lines start with the label, from its first lines read both ways.

    The field count alone cannot tell: a labelled line that lost its empty last field has 39
    fields, like an unlabelled one. The reading that keeps more lines by the Spark job's rules
    wins, unless the other keeps all but ``max_reject_rate`` of them too (then either could be
    meant) or the winner keeps fewer than half (then the file is not of this format): both are
    refused, asking for score.has_label. None for a file with no lines.
    """
    lines = [line for line in itertools.islice(_lines(path), LABEL_SNIFF_LINES) if line_text(line)]
    if not lines:
        return None
    fit = {
        labelled: sum(fits_rules(line, labelled) for line in lines) / len(lines) for labelled in (True, False)
    }
    winner = fit[True] >= fit[False]
    if fit[not winner] < 1.0 - max_reject_rate and fit[winner] >= 0.5:
        return winner
    raise ScoreError(
        f"cannot tell whether the lines of {path} start with the label: of its "
        f"first {len(lines)} lines, {fit[True]:.1%} are valid read as labelled and "
        f"{fit[False]:.1%} read as unlabelled (a line of 39 fields can be either); "
        "set score.has_label: true or false in the config"
    )


class ScanProgress:
    """The score stage's progress: bytes of the input files read of their total size (the
    fraction; compressed bytes for .gz), lines scored so far."""

    def __init__(self, paths: list[Path], reporter: Reporter):
        self.reporter = reporter
        self.sizes = {output_name(p): p.stat().st_size for p in paths}
        self.total = sum(self.sizes.values())
        self.finished = 0  # bytes of the files already scored
        self.lines = 0
        self._current: str | None = None
        reporter.report(
            phase="score",
            unit="MiB",
            total=self.total / 2**20,
            done=0.0,
            fraction=0.0,
            rows=0,
            rows_unit="lines",
            force=True,
        )

    def scanned(self, name: str, lines: int, position: int) -> None:
        if name != self._current:
            if self._current is not None:
                self.finished += self.sizes[self._current]
            self._current = name
        self.lines += lines
        done = self.finished + position
        self.reporter.report(
            detail=name,
            done=done / 2**20,
            rows=self.lines,
            fraction=done / self.total if self.total else None,
        )

    def finish(self) -> None:
        self.reporter.report(done=self.total / 2**20, rows=self.lines, fraction=1.0, force=True)


SCHEMA_LABELLED = pa.schema(
    [("line_number", pa.int64()), ("probability", pa.float32()), ("label", pa.int8())]
)
SCHEMA_UNLABELLED = pa.schema([("line_number", pa.int64()), ("probability", pa.float32())])


def score_file(
    model, path: Path, out_dir: Path, config: ScoreConfig, progress: ScanProgress | None = None
) -> dict:
    """Score one file into OUT/<name>.parquet + OUT/rejects/<name>.jsonl (atomically)."""
    has_label = (
        config.has_label if config.has_label is not None else detect_label(path, config.max_reject_rate)
    )
    name = output_name(path)
    final, final_rejects = out_dir / f"{name}.parquet", out_dir / "rejects" / f"{name}.jsonl"
    (out_dir / "rejects").mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(final)  # left by a scorer that was killed
    remove_stale_temporaries(final_rejects)
    schema = SCHEMA_LABELLED if has_label else SCHEMA_UNLABELLED
    too_many = None
    with atomic_file(final_rejects) as tmp_rejects:
        try:
            with (
                atomic_file(final) as tmp,
                pq.ParquetWriter(tmp, schema) as writer,
                open(tmp_rejects, "w", encoding="utf-8") as rejects,
            ):
                lines_read, rejected = _score_lines(
                    model, path, bool(has_label), writer, rejects, config, progress
                )
                _check_reject_rate(path, lines_read, rejected, final_rejects, config)
        except TooManyRejects as exc:  # the scores are dropped, the rejects kept
            too_many = exc
    if too_many is not None:
        raise too_many
    return {
        "file": str(path),
        "output": str(final),
        "rejects": str(final_rejects),
        "has_label": has_label,
        "lines": lines_read,
        "scored": lines_read - sum(rejected.values()),
        "rejected": rejected,
    }


class TooManyRejects(ScoreError):
    """More lines refused than score.max_reject_rate allows."""


def _check_reject_rate(
    path: Path, lines: int, rejected: dict[str, int], rejects_file: Path, config: ScoreConfig
) -> None:
    count = sum(rejected.values())
    rate = count / lines if lines else 0.0
    if rate > config.max_reject_rate:
        reasons = ", ".join(f"{reason} {n:,}" for reason, n in sorted(rejected.items()))
        raise TooManyRejects(
            f"{path}: {count:,} of {lines:,} lines rejected ({rate:.2%}: "
            f"{reasons}), more than score.max_reject_rate "
            f"{config.max_reject_rate:.2%}: no scores written; the lines are "
            f"in {rejects_file}"
        )


def _score_lines(
    model, path: Path, has_label: bool, writer, rejects, config: ScoreConfig, progress: ScanProgress | None
) -> tuple[int, dict[str, int]]:
    """Every line of ``path``, ``batch_rows`` at a time: scores to ``writer``, refused lines to
    ``rejects``. Returns the lines read and the rejects per reason."""
    import tensorflow as tf

    signature = model.signatures["serve_lines"]
    lines_read = 0
    rejected: dict[str, int] = {}
    name = output_name(path)
    with _reading(path), _open(path) as (text, raw):
        lines = iter(text)
        while True:
            batch = list(itertools.islice(lines, config.batch_rows))
            if not batch:
                break
            out = signature(lines=tf.constant(batch), has_label=tf.fill([len(batch)], tf.constant(has_label)))
            probability = out["probability"].numpy()
            reasons = out["reject_reason"].numpy()
            numbers = np.arange(lines_read + 1, lines_read + len(batch) + 1, dtype=np.int64)
            keep = reasons == b""
            columns = [pa.array(numbers[keep]), pa.array(probability[keep])]
            if has_label:
                columns.append(pa.array(out["label"].numpy()[keep].astype(np.int8)))
            writer.write_table(pa.Table.from_arrays(columns, schema=writer.schema))
            for i in np.flatnonzero(~keep):
                reason = reasons[i].decode()
                rejected[reason] = rejected.get(reason, 0) + 1
                rejects.write(
                    json.dumps(
                        {
                            "file": str(path),
                            "line_number": int(numbers[i]),
                            "reason": reason,
                            "line": line_text(batch[i]).decode("utf-8", "replace"),
                        }
                    )
                    + "\n"
                )
            lines_read += len(batch)
            if progress is not None:
                progress.scanned(name, len(batch), raw.tell())
    return lines_read, rejected


def score_files(
    model_dir: str | Path,
    inputs: list[str | Path],
    out_dir: str | Path,
    config: ScoreConfig,
    progress_settings: ProgressConfig | None = None,
) -> dict:
    """Score raw day files with an exported SavedModel, one output file per input.

    Args:
        model_dir: the SavedModel (an export version ``DIR/export/<N>``), or a directory of
            versions (``DIR/export``): its served version (dlrm_contracts.serving_state), as
            the serving image loads it.
        inputs: raw day files, plain or ``.gz``, with or without the label field.
        out_dir: where ``<name>.parquet`` and ``rejects/<name>.jsonl`` go.
        config: lines per model call, whether the files are labelled.
        progress_settings: how progress is shown when run alone (the pipeline shows its own).

    Returns:
        The SavedModel scored with; per file and in total: lines read, scored and rejected;
        seconds.
    """
    paths = [Path(p) for p in inputs]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise ScoreError(f"score input(s) not found or not files: {', '.join(missing)}")
    names = [output_name(p) for p in paths]
    if len(set(names)) != len(names):
        raise ScoreError(f"two inputs would write the same output name: {sorted(names)}")
    model_dir = Path(model_dir)
    if not (model_dir / SAVED_MODEL_PB).is_file():
        served = served_export(model_dir)
        if served is None:
            raise ScoreError(
                f"no SavedModel at {model_dir} (no saved_model.pb, nor a version "
                "directory <N>/ holding one): run the export stage first"
            )
        model_dir = served
    try:  # a model directory is code: only a version the export stage wrote is loaded
        verify_saved_model(model_dir)
    except ModelDigestError as error:
        raise ScoreError(
            f"{error}: serve an intact version (run_pipeline.sh export rollback "
            "[VERSION]) or export again (--stages export --force)"
        ) from None
    started = time.perf_counter()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model = load_model(model_dir)
    with open_reporter("score", config.progress, progress_settings) as reporter:
        progress = ScanProgress(paths, reporter)
        files = [score_file(model, p, out_dir, config, progress) for p in paths]
        progress.finish()
    return {
        "model": str(model_dir),
        "files": files,
        "lines": sum(f["lines"] for f in files),
        "scored": sum(f["scored"] for f in files),
        "rejected": sum(sum(f["rejected"].values()) for f in files),
        "seconds": round(time.perf_counter() - started, 2),
    }


def load_model(model_dir: Path):
    """The SavedModel with its serving signature; a version whose files are damaged (a
    truncated variables file, a saved_model.pb that is not one) is one ScoreError naming it
    and the fixes, not TensorFlow's traceback."""
    from trainer.tf_import import import_tensorflow

    tf = import_tensorflow()

    try:
        model = tf.saved_model.load(str(model_dir))
        model.signatures["serve_lines"]
        return model
    except (tf.errors.OpError, ValueError, KeyError, OSError, RuntimeError) as exc:
        cause = " ".join(str(exc).split())[:300]
        raise ScoreError(
            f"the SavedModel {model_dir} cannot be loaded ({type(exc).__name__}: "
            f"{cause}): serve an intact version (run_pipeline.sh export rollback "
            "[VERSION]) or export again (--stages export --force)"
        ) from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m trainer.score",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--model",
        required=True,
        help="SavedModel: an export version (DIR/export/<N>), or DIR/export for "
        "its served version (DIR/export/serving.json: the version held by a "
        "rollback, else the newest verified)",
    )
    parser.add_argument("--out", required=True, help="output directory (DIR/scores)")
    parser.add_argument("--input", required=True, help="comma-separated raw files (plain or .gz)")
    parser.add_argument("--config", help="YAML file with a 'score' section")
    args = parser.parse_args(argv)
    return run_cli("trainer.score", lambda: _score(args))


def _score(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    with output_lock(args.out, "trainer.score"), failing_as(ExitCode.SCORE, ScoreError, ServingStateError):
        summary = score_files(
            args.model, [p for p in args.input.split(",") if p], args.out, config.score, config.progress
        )
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
