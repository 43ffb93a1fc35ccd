"""The stages: what each depends on, whether it is up to date, and how it runs.

Each stage declares its *inputs* (fingerprints of what it reads plus the settings that change
its output — never settings like the Spark master or worker counts, which do not) and a
fingerprint of its outputs. The runner skips a stage whose inputs and outputs match its last
manifest, and reruns it otherwise. The threshold gets special care: raising it never needs Spark
(ids are ordered by count, so a higher threshold is a prefix of the ids), so the preprocess stage
is satisfied by parquet made at any threshold the requested one is at least, and the convert
stage derives the dataset from the existing binary one (converters.api decides; the stage tells
it what the manifests know).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from converters.api import (
    ConvertRequest,
    Published,
    convert_workdir,
    derivable_from_binary,
    lean_record,
    listed,
    parquet_fingerprint,
)
from dlrm_contracts.byte_units import human_bytes
from dlrm_contracts.atomic import is_complete, write_json_atomic
from dlrm_contracts.binary_format import DatasetError, read_info
from dlrm_contracts.config import (
    TRAIN_EXTENT_SETTINGS,
    PipelineConfig,
    changed_settings,
    config_to_dict,
    train_model_settings,
)
from dlrm_contracts.errors import ExitCode, PipelineError, failing_as, says_disk_full
from dlrm_contracts.dataset_identity import dataset_identity, trained_on
from dlrm_contracts.id_modes import recorded_or_default
from dlrm_contracts.object_commit import publish_directory
from dlrm_contracts.layout import (
    DATASET_JSON,
    PREPROCESS_JSON,
    SUPERSEDED_DIR,
    WorkdirLayout,
    best_checkpoint,
    checkpoint_dir,
    complete_checkpoints,
    read_checkpoint_meta,
    run_checkpoints,
)
from dlrm_contracts.serving_state import ServingStateError, served_export
from dlrm_contracts.storage import is_url
from dlrm_contracts.superseded import set_aside
from dlrm_contracts.thresholds import ThresholdSpec, parse_threshold_spec
from dlrm_contracts.verify import verify_dataset
from dlrm_contracts.fingerprint import file_content_hash, stable_hash, tree_fingerprint
from pipeline.fingerprint import changed_files, input_fingerprint
from pipeline.hosts import horovodrun_hosts
from pipeline.manifest import ManifestStore, read_record
from pipeline.processes import KNOWN_ERROR, run_child
from pipeline.remote import RemoteWorkdir, drop_local_parquet, input_fingerprint as url_fingerprint
from trainer.checkpoint import recorded_settings
from trainer.warm_start import holds_previous_model

log = logging.getLogger("pipeline")


@dataclass
class StageContext:
    config: PipelineConfig
    layout: WorkdirLayout
    manifests: ManifestStore
    config_path: Path  # the effective config, written as YAML for the child processes
    # What a child needs in its environment: the running stage's progress channel.
    child_env: dict[str, str] = field(default_factory=dict)
    # A workdir URL (pipeline.remote): ``layout`` is then its local side on this node.
    remote: RemoteWorkdir | None = None
    staged: bool = False  # the binary dataset was staged in (and checked) by this run

    @property
    def raw_dir(self) -> Path | str:
        if self.config.input and is_url(self.config.input):
            return self.config.input
        return Path(self.config.input).resolve() if self.config.input else self.layout.raw

    @property
    def workdir(self) -> str:
        """The workdir as the wings are told it (the URL for a workdir URL)."""
        return str(self.remote.root) if self.remote else str(self.layout.root)

    @property
    def threshold(self) -> ThresholdSpec:
        return self.config.preprocess.frequency_threshold

    def stage_log(self, stage: str) -> Path:
        return self.layout.logs / f"{stage}.log"


@dataclass
class Outcome:
    """What a stage's run function reports back to the runner."""

    action: str  # ran | derived | skipped
    engine: str
    summary: dict[str, Any]
    rows: int | None = None  # rows (samples, lines) the stage went through: its rows/s


@dataclass
class Stage:
    name: str
    inputs: Callable[[StageContext], dict[str, Any]]
    outputs_fingerprint: Callable[[StageContext], str]
    run: Callable[[StageContext], Outcome]
    # Extra condition under which existing outputs already satisfy the request even though the
    # recorded key differs (the threshold raise). Returns an Outcome to record, or None.
    satisfied_without_rerun: Callable[[StageContext], Outcome | None] | None = None
    # Outputs whose files later stages check by name (ManifestStore records each file's size
    # and mtime): the binary dataset.
    output_dir: Callable[[StageContext], Path] | None = None


def _python() -> str:
    return sys.executable


# Stages whose child's known failure is a refusal that the same inputs meet again: the
# trainer's one-line errors name a setting, a dataset or a checkpoint that a person must change
# (a previous model whose shape or tables do not fit this run's, a damaged checkpoint, a batch
# that does not divide). Their status is ``failed: <stage>_refused``, which a scheduler does not
# retry; a crash, a kill or a lost host keeps the stage's own status.
_REFUSING_STAGES = frozenset({"train", "eval"})


def _refused(stage: str, result, error: str) -> bool:
    """Whether a known error of ``stage``'s child is a refusal: not an interrupted child (exit
    130 or a signal; an interrupted rank's line names no cause)."""
    interrupted = result.returncode < 0 or result.returncode == ExitCode.INTERRUPTED
    cause = error.split(": error", 1)[-1].lstrip(":").strip()
    return stage in _REFUSING_STAGES and not interrupted and bool(cause)


def _child_failed(stage: str, result, code: ExitCode, ctx: StageContext) -> PipelineError:
    """A known failure of the child is its own one line (it names the file and the fix) and
    the log's path; anything else (a crash, a kill) shows the last lines of the log."""

    def known_of(lines: list[str]) -> list[str]:
        # Of several ranks, the first to fail with a known error is the cause: the others then
        # fail in a collective (an "unexpected error" with a traceback) because it left.
        return [e for e in lines if "unexpected error" not in e]

    # The tail's first (the end of the output says why it ended), else the whole output's:
    # horovodrun's and the other ranks' tracebacks may have pushed it out of the tail.
    known = known_of([m.group(1) for m in map(KNOWN_ERROR.match, result.tail) if m]) or known_of(
        result.errors
    )
    # A full disk is recognised from the whole tail (the JVM says it in its own words).
    if known and not says_disk_full("\n".join(result.tail)):
        return PipelineError(
            f"{stage} failed (exit {result.returncode}): {known[0]} (log: {ctx.stage_log(stage)})",
            code,
            kind=f"{stage}_refused" if _refused(stage, result, known[0]) else None,
        )
    tail = "\n    ".join(result.tail[-12:])
    return PipelineError(
        f"{stage} failed (exit {result.returncode}); last lines of {ctx.stage_log(stage)}:\n    {tail}", code
    )


# ---------------------------------------------------------------- generate
def _generate_inputs(ctx: StageContext) -> dict[str, Any]:
    return {"generator": config_to_dict(ctx.config.generator)}


def _generate_run(ctx: StageContext) -> Outcome:
    from pipeline.synthetic import generate  # light: numpy + pyarrow only

    if ctx.layout.raw.exists():
        shutil.rmtree(ctx.layout.raw)
    meta = generate(ctx.layout.raw, ctx.config.generator)
    return Outcome(
        "ran",
        "python",
        {"rows": meta.get("rows"), "days": ctx.config.generator.days, "bayes_auc": meta.get("bayes_auc")},
        rows=meta.get("rows"),
    )


# ---------------------------------------------------------------- preprocess
def _recorded_spec(meta: dict[str, Any] | None) -> ThresholdSpec | None:
    """The threshold a stage's description records; None when it is missing or damaged."""
    try:
        return parse_threshold_spec((meta or {})["threshold_spec"])
    except (KeyError, TypeError, PipelineError):
        return None


def _parquet_spec(ctx: StageContext) -> ThresholdSpec | None:
    if ctx.remote is not None:
        if not ctx.remote.parquet_complete():
            return None
        return _recorded_spec(read_record(ctx.remote.parquet / PREPROCESS_JSON))
    if not is_complete(ctx.layout.parquet):
        return None
    return _recorded_spec(read_record(ctx.layout.parquet / PREPROCESS_JSON))


def _preprocess_inputs(ctx: StageContext) -> dict[str, Any]:
    p = ctx.config.preprocess
    raw = ctx.raw_dir
    return {
        "raw": url_fingerprint(raw) if isinstance(raw, str) else input_fingerprint(raw),
        "shuffle_seed": p.shuffle_seed,
        "max_reject_rate": p.max_reject_rate,
        "output_files": p.output_files,
        "train_rows_per_file": p.train_rows_per_file,
        "dictionary_days": p.dictionary_days,
        "threshold": str(ctx.threshold),
        # only when set, so that a workdir made before these settings keeps its key
        **({"ids": p.ids} if not p.mode.default else {}),
        **({"caps": p.caps} if p.caps is not None else {}),
        **({"window_days": p.window_days} if p.window_days is not None else {}),
    }


def _parquet_fingerprint(ctx: StageContext) -> str:
    if ctx.remote is not None:
        return ctx.remote.parquet_fingerprint()
    return parquet_fingerprint(ctx.layout)


def _parquet_removed(ctx: StageContext) -> dict[str, Any] | None:
    """The lean mode's record, when the splits it deleted are all that is missing (never at a
    workdir URL, whose splits stay published)."""
    if ctx.remote is not None:
        return None
    return lean_record(ctx.layout, read_record(ctx.layout.parquet_removed))


def _preprocess_outputs(ctx: StageContext) -> str:
    """The parquet's identity: after the lean mode removed the splits, still the one they had,
    so that the stages made from them (and the threshold raise) stay up to date."""
    removed = _parquet_removed(ctx)
    return removed["fingerprint"] if removed else _parquet_fingerprint(ctx)


def _preprocess_satisfied(ctx: StageContext) -> Outcome | None:
    """Parquet made from the same raw data at a lower threshold serves a raised one, when a
    higher threshold is a prefix of its ids (never with stable ids: their threshold cannot
    change, the Spark job says so; nor contiguous ids, numbered among the kept values)."""
    if not ctx.config.preprocess.mode.raisable:
        return None
    previous = ctx.manifests.load("preprocess")
    made_at = _parquet_spec(ctx)
    if not previous or made_at is None:
        return None
    if _parquet_removed(ctx) and not derivable_from_binary(ctx.layout, ctx.threshold):
        return None  # the splits are gone and the binary dataset cannot serve: Spark again
    wanted = _preprocess_inputs(ctx)
    same_data = all(previous["inputs"].get(k) == v for k, v in wanted.items() if k != "threshold")
    fresh = previous.get("outputs_fingerprint") == _preprocess_outputs(ctx)
    if same_data and fresh and ctx.threshold.is_at_least(made_at):
        return Outcome(
            "skipped",
            "-",
            {
                **previous.get("summary", {}),
                "reason": f"parquet at threshold {made_at} serves {ctx.threshold} (raise done without Spark)",
            },
        )
    return None


def _spark_argv(ctx: StageContext) -> list[str]:
    s = ctx.config.spark
    argv = [
        _python(),
        "-m",
        "spark_jobs",
        "--input",
        str(ctx.raw_dir),
        "--workdir",
        ctx.workdir,
        "--frequency-threshold",
        str(ctx.threshold),
        "--config",
        str(ctx.config_path),
        "--master",
        s.master,
    ]
    if s.conf_file:
        argv += ["--conf-file", s.conf_file]
    for key, value in sorted(s.conf.items()):
        argv += ["--conf", f"{key}={value}"]
    if s.gpu:
        argv.append("--gpu")
    if ctx.config.force:  # --force redoes the stage whole: with stable ids, every day's transform
        argv.append("--retransform")
    return argv


# `python -m spark_jobs` exits with the pipeline's own codes for the failures it recognises.
SPARK_KNOWN_CODES = (ExitCode.USAGE, ExitCode.INPUT_DATA, ExitCode.PREPROCESS)


def _preprocess_run(ctx: StageContext) -> Outcome:
    ctx.layout.parquet_removed.unlink(missing_ok=True)  # Spark writes the splits anew
    result = run_child(_spark_argv(ctx), ctx.stage_log("preprocess"), env=ctx.child_env)
    if result.returncode != 0:
        code = ExitCode(result.returncode) if result.returncode in SPARK_KNOWN_CODES else ExitCode.PREPROCESS
        raise _child_failed("preprocess", result, code, ctx)
    summary = result.summary or {}
    return Outcome("ran", "spark", summary, rows=summary.get("data_quality", {}).get("rows_read"))


# ---------------------------------------------------------------- convert
def _convert_inputs(ctx: StageContext) -> dict[str, Any]:
    convert = ctx.config.convert
    # named only when asked for, so the inputs of a one-hot, binary-only workdir are unchanged
    wanted = {
        key: value
        for key, value in (
            (
                "multi_hot",
                None
                if convert.multi_hot_sizes is None or set(convert.multi_hot_sizes) == {1}
                else [convert.multi_hot_sizes, convert.multi_hot_seed, convert.multi_hot_distribution],
            ),
            ("formats", None if convert.formats == ["binary"] else sorted(convert.formats)),
        )
        if value is not None
    }
    return {"parquet": _preprocess_outputs(ctx), "threshold": str(ctx.threshold), **wanted}


def _convert_outputs(ctx: StageContext) -> str:
    if ctx.remote is not None:
        return ctx.remote.binary_fingerprint()
    return stable_hash(
        [file_content_hash(ctx.layout.binary / DATASET_JSON), tree_fingerprint(ctx.layout.binary)]
    )


def _note_parquet_removed(ctx: StageContext, record: dict[str, Any] | None) -> None:
    """The lean mode's removal (converters.api) in the preprocess manifest's summary too; its
    key and fingerprint are unchanged, so the stages made from the splits stay up to date."""
    previous = ctx.manifests.load("preprocess")
    if record and previous:
        previous.setdefault("summary", {})["parquet_removed"] = record
        write_json_atomic(ctx.manifests.manifest_path("preprocess"), previous)


def _convert_run(ctx: StageContext) -> Outcome:
    if ctx.remote is not None:
        return _convert_at_url(ctx)
    outcome = _convert(ctx)
    outcome.rows = sum((outcome.summary.get("rows") or {}).values()) or None
    _note_parquet_removed(ctx, outcome.summary.get("parquet_removed"))
    return outcome


def _convert_at_url(ctx: StageContext) -> Outcome:
    """A workdir URL: the published splits copied to the local side, converted there as for a
    local workdir, the dataset published at the URL by its marker (dlrm_contracts.object_commit);
    the local copy stays as the dataset train and eval stage in (already intact: no copy)."""
    remote, layout = ctx.remote, ctx.layout
    assert remote is not None
    with failing_as(ExitCode.CONVERT, DatasetError, what="convert failed"):
        fetched = remote.fetch_parquet(layout.parquet)
        remote.fetch_histogram(layout.counts)
    log.info("convert    %.1f MiB of published parquet copied from %s", fetched / 2**20, remote.parquet)
    try:
        outcome = _convert(ctx)
    finally:
        drop_local_parquet(layout)  # the splits; the dictionaries stay for the export stage
    with failing_as(ExitCode.CONVERT, DatasetError, what="convert failed"):
        version = publish_directory(layout.binary, remote.binary)
    ctx.staged = True
    outcome.rows = sum((outcome.summary.get("rows") or {}).values()) or None
    outcome.summary = {**outcome.summary, "published": str(remote.binary), "version": version.name}
    return outcome


def _convert(ctx: StageContext) -> Outcome:
    """The converters' decision (converters.api.convert_workdir), told what this workdir's
    records know."""
    result = convert_workdir(_convert_request(ctx))
    return Outcome(result.action, result.engine, result.summary)


def _convert_request(ctx: StageContext) -> ConvertRequest:
    previous = ctx.manifests.load("convert") or {}
    recorded = previous.get("output_files")
    binary = ctx.layout.binary
    parquet_record = read_record(ctx.layout.parquet / PREPROCESS_JSON) or {}
    return ConvertRequest(
        layout=ctx.layout,
        config=ctx.config.convert,
        threshold=ctx.threshold,
        parquet_threshold=_parquet_spec(ctx),
        ids=recorded_or_default(parquet_record),
        same_parquet=(previous.get("inputs") or {}).get("parquet") == _convert_inputs(ctx)["parquet"],
        changed_since_written=(lambda: changed_files(recorded, binary))
        if isinstance(recorded, dict)
        else None,
        splits_removed=read_record(ctx.layout.parquet_removed),
        keep_parquet=ctx.config.preprocess.keep_parquet,
        published=_published(ctx.remote) if ctx.remote else None,
    )


def _published(remote: RemoteWorkdir) -> Published:
    """What the URL holds; a derived dataset names the published source and counts, of which
    the local side holds copies."""
    return Published(
        source=str(remote.parquet),
        recorded_as=(str(remote.binary), str(remote.root / "counts")),
        description=remote.binary_description(),
    )


# ---------------------------------------------------------------- train / eval
# horovodrun reads it and hands it on to every rank, on every host (Gloo's wait for a peer).
GLOO_TIMEOUT_ENV = "HOROVOD_GLOO_TIMEOUT_SECONDS"


def launcher_argv(ctx: StageContext) -> list[str]:
    """``horovodrun -np N -H HOSTS --gloo`` for several ranks; nothing for one process."""
    launch = ctx.config.launch
    if launch.np <= 1 and not launch.hosts:
        return []
    hosts = horovodrun_hosts(launch.hosts, launch.np) if launch.hosts else f"localhost:{launch.np}"
    horovodrun = str(Path(_python()).with_name("horovodrun"))
    return [horovodrun, "-np", str(launch.np), "-H", hosts, "--gloo"]


def launcher_env(ctx: StageContext) -> dict[str, str]:
    """The environment the trainer's ranks get on top of the stage's: horovodrun's Gloo
    timeout (``launch.gloo_timeout_seconds``) when several ranks are launched, unless the
    pipeline's own environment names one, which wins (an operator's deliberate choice)."""
    if not launcher_argv(ctx) or GLOO_TIMEOUT_ENV in os.environ:
        return dict(ctx.child_env)
    return {**ctx.child_env, GLOO_TIMEOUT_ENV: str(ctx.config.launch.gloo_timeout_seconds)}


def trainer_argv(ctx: StageContext, mode: str) -> list[str]:
    """The whole command line of the trainer in ``mode``, launcher included."""
    argv = launcher_argv(ctx) + [
        _python(),
        "-m",
        "trainer",
        "--mode",
        mode,
        "--dataset",
        str(ctx.layout.binary),
        "--workdir",
        str(ctx.layout.root),
        "--config",
        str(ctx.config_path),
    ]
    if ctx.config.train.max_steps is not None:
        argv += ["--max-steps", str(ctx.config.train.max_steps)]
    return argv


def _dataset_hash(ctx: StageContext) -> str:
    """The binary dataset's description, by content (at a workdir URL: the published one,
    whichever node's copy the ranks read)."""
    if ctx.remote is not None:
        return ctx.remote.dataset_hash()
    return file_content_hash(ctx.layout.binary / DATASET_JSON)


def _binary_fingerprint(ctx: StageContext) -> str:
    if ctx.remote is not None:
        return ctx.remote.binary_fingerprint()
    return tree_fingerprint(ctx.layout.binary)


def stage_in_dataset(ctx: StageContext) -> None:
    """At a workdir URL: the published dataset copied to the local side once per run (nothing
    is copied when an intact copy of it is there), checked against its checksums."""
    if ctx.remote is None or ctx.staged:
        return
    from converters.stage_in import stage_in

    with failing_as(ExitCode.DATASET_INVALID, DatasetError, what="stage-in failed"):
        done = stage_in(ctx.remote.binary, ctx.layout.binary, fsync=ctx.config.convert.fsync)
    log.info(
        "stage-in   %s -> %s: %s",
        ctx.remote.binary,
        ctx.layout.binary,
        f"{done['bytes'] / 2**20:.1f} MiB copied"
        if done["copied"]
        else "the local copy is intact, nothing copied",
    )
    ctx.staged = True


def train_inputs(ctx: StageContext) -> dict[str, Any]:
    """What the train stage's key is computed from: the dataset, the settings of the model and
    those that decide where the run ends (TRAIN_SETTING_KINDS, TRAIN_EXTENT_SETTINGS). A change
    of any other setting (logging, threads, ranks, checkpoint cadence...) leaves a finished
    stage done. A changed key reruns the stage; whether that resumes the checkpoints or sets
    them aside is decided from the checkpoints themselves (``checkpoints_to_set_aside``)."""
    plain = config_to_dict(ctx.config.train)
    return {
        "dataset": _dataset_hash(ctx),
        "binary": _binary_fingerprint(ctx),
        "model": train_model_settings(ctx.config.train),
        "extent": {name: plain[name] for name in TRAIN_EXTENT_SETTINGS},
    }


def _legacy_train_key(ctx: StageContext) -> str:
    """The key ``train.started`` recorded before checkpoints named their settings: the whole
    train section and the rank count."""
    return ManifestStore.key_of(
        {
            "dataset": _dataset_hash(ctx),
            "binary": _binary_fingerprint(ctx),
            "train": config_to_dict(ctx.config.train),
            "np": ctx.config.launch.np,
        }
    )


def _train_outputs(ctx: StageContext) -> str:
    # the runs set aside are not the stage's output: removing them changes nothing
    return tree_fingerprint(ctx.layout.checkpoints, ignore=(SUPERSEDED_DIR,))


def verify_binary_dataset(ctx: StageContext) -> None:
    """The quick check (metadata, file sizes: milliseconds) before launching any rank, so that a
    missing, incomplete or damaged dataset exits with its own code (7) and a readable message
    rather than as a crashed horovodrun (8/9). A file whose size or mtime changed after the
    convert stage wrote it is refused too (naming it): the convert stage checks it and rebuilds
    what is damaged."""
    stage_in_dataset(ctx)
    if ctx.config.train.verify_dataset == "none":
        return

    recorded = (ctx.manifests.load("convert") or {}).get("output_files")
    # (a staged-in copy was checked against every checksum; its mtimes are the copy's)
    changed = (
        changed_files(recorded, ctx.layout.binary)
        if isinstance(recorded, dict) and ctx.remote is None
        else []
    )
    if changed:
        raise PipelineError(
            f"{listed(changed)} in {ctx.layout.binary} changed after the "
            "convert stage wrote it (size or modification time): add the convert "
            "stage (e.g. --stages convert,train,eval) to check it and rebuild "
            "what is damaged",
            ExitCode.DATASET_INVALID,
        )
    try:
        verify_dataset(ctx.layout.binary, full=False)
    except DatasetError as exc:
        raise PipelineError(
            f"{exc} (run the convert stage again, with --force if it is up to date)", ExitCode.DATASET_INVALID
        ) from None


def _this_dataset_identity(ctx: StageContext) -> dict[str, Any]:
    return dataset_identity(read_info(ctx.layout.binary), ctx.config.train.frequency_threshold)


def checkpoints_to_set_aside(ctx: StageContext) -> tuple[str, list[str]] | None:
    """Why the current run's checkpoints cannot be resumed by this configuration, and the
    settings that changed: None when they can (or there are none). Decided from what the
    newest readable checkpoint records (its dataset, its run's settings of the model), so a
    missing or damaged ``train.started`` never decides anything; only checkpoints from before
    they recorded their settings fall back to it, and are set aside when it does not match."""
    found = run_checkpoints(ctx.layout.checkpoints)
    if not found:
        return None
    if ctx.config.force:
        return "--force retrains from scratch", []
    metas = [m for m in (read_checkpoint_meta(p) for _, p in reversed(found)) if m is not None]
    if not metas:
        return None  # all damaged: the trainer names the damage, nothing is moved
    meta = metas[0]
    if not trained_on(meta, _this_dataset_identity(ctx)):
        return "the dataset changed (a new preprocess or convert run)", []
    recorded = recorded_settings(meta)
    if recorded is None:
        started = read_record(ctx.layout.manifests / "train.started") or {}
        if started.get("key") == _legacy_train_key(ctx):
            return None
        return (
            "they record no settings and manifests/train.started does not show this configuration wrote them"
        ), []
    changed = changed_settings(recorded, train_model_settings(ctx.config.train))
    return ("settings of the model changed", changed) if changed else None


def _set_aside_checkpoints(
    ctx: StageContext, reason: str, changed: list[str]
) -> tuple[dict[str, Any] | None, bool]:
    """Move aside the checkpoints this configuration cannot resume: every one from scratch;
    with ``train.init: previous`` only this dataset's, keeping the earlier datasets' (the
    previous model) and the previous model saved unchanged for this dataset (a run with no
    new day to train: the only copy of that model). Returns the record and whether such a
    kept checkpoint means the rerun must start from it (--no-resume), not resume it."""
    root = ctx.layout.checkpoints
    moved, kept = [], False
    if ctx.config.train.init == "previous":
        identity = _this_dataset_identity(ctx)
        for _step, path in complete_checkpoints(root):
            meta = read_checkpoint_meta(path) or {}
            if trained_on(meta, identity):
                if holds_previous_model(meta):
                    kept = True
                    continue
                moved.append(path)
    else:
        moved = [path for _step, path in complete_checkpoints(root)]
    record = set_aside(root, moved, reason, changed)
    if record:
        what = f"{reason} ({'; '.join(changed)})" if changed else reason
        log.warning(
            "train      %d checkpoints (%s) moved to %s, not deleted: %s; remove them with: %s",
            len(record["checkpoints"]),
            human_bytes(record["bytes"]),
            record["path"],
            what,
            record["remove_with"],
        )
    return record, kept


def run_train(ctx: StageContext) -> Outcome:
    """The train stage: resumes the current run's checkpoints when only settings that do not
    change the model did (logging, threads, ranks, epochs, max_steps...); otherwise sets them
    aside under ``checkpoints/superseded/`` (never deletes them) and starts anew. With
    train.init: previous, the checkpoints of earlier datasets are the model the run starts
    from: only this dataset's are set aside."""
    verify_binary_dataset(ctx)
    key = ManifestStore.key_of(train_inputs(ctx))
    argv = trainer_argv(ctx, "train")
    record = None
    why = checkpoints_to_set_aside(ctx)
    if why is not None:
        record, kept = _set_aside_checkpoints(ctx, *why)
        if kept:
            # a new run from the kept previous model (this run's settings), not a resume
            argv.append("--no-resume")
    write_json_atomic(ctx.layout.manifests / "train.started", {"key": key})
    # at a workdir URL each checkpoint is published as the trainer keeps it
    with ctx.remote.publishing_checkpoints() if ctx.remote else contextlib.nullcontext():
        result = run_child(argv, ctx.stage_log("train"), env=launcher_env(ctx))
    if result.returncode != 0:
        # A checkpoint being written when the ranks died is never used: give its space back.
        for partial in ctx.layout.checkpoints.glob(".step-*.tmp"):
            shutil.rmtree(partial, ignore_errors=True)
        raise _child_failed("train", result, ExitCode.TRAIN, ctx)
    engine = "horovod" if launcher_argv(ctx) else "tensorflow"
    summary = result.summary or {}
    if record:
        summary = {**summary, "checkpoints_set_aside": record}
    samples = (summary.get("steps_run") or 0) * (summary.get("global_batch") or 0)
    return Outcome("ran", engine, summary, rows=samples or None)


def _eval_inputs(ctx: StageContext) -> dict[str, Any]:
    return {
        "checkpoints": _train_outputs(ctx),
        "dataset": _dataset_hash(ctx),
        "binary": _binary_fingerprint(ctx),
    }


def _eval_outputs(ctx: StageContext) -> str:
    return file_content_hash(ctx.layout.root / "eval.json")


# What an evaluation record holds (the trainer's eval mode writes these, and its train mode
# the same for the model it ends with).
_EVALUATION_FIELDS = (
    "step",
    "ranks",
    "global_batch",
    "preset",
    "compute_dtype",
    "xla",
    *(f"{split}_{what}" for split in ("test", "validation") for what in ("auc", "logloss", "rows")),
)


def current_training_summary(ctx: StageContext) -> dict[str, Any]:
    """The train stage's summary, when that run trained the checkpoints now in the workdir on
    the dataset now there (its key and outputs still match); else empty."""
    stage = STAGE_TABLE["train"]
    key = ManifestStore.key_of(stage.inputs(ctx))
    if not ctx.manifests.is_done("train", key, stage.outputs_fingerprint(ctx)):
        return {}
    return (ctx.manifests.load("train") or {}).get("summary") or {}


def _eval_from_training(ctx: StageContext) -> Outcome | None:
    """The train stage ends by evaluating its model on the test and validation splits. When
    that model is still the workdir's (same checkpoints, same dataset: the train manifest
    matches) and is the checkpoint eval would restore, eval adopts those figures instead of
    starting the ranks again to compute the same numbers (a second launch costs ~9 s of
    start-up on the embedded default, for ~1 s of evaluation). --force evaluates anew."""
    verify_binary_dataset(ctx)  # a damaged dataset is refused (exit 7) as when eval runs
    training = current_training_summary(ctx)
    best = best_checkpoint(ctx.layout.checkpoints)
    if best is None or not all(k in training for k in _EVALUATION_FIELDS):
        return None
    model = training.get("checkpoint")
    if (
        model is None
        or Path(model).resolve() != best.resolve()
        or checkpoint_dir(ctx.layout.checkpoints, training["step"]).resolve() != best.resolve()
    ):
        return None
    evaluation = {"mode": "eval", **{k: training[k] for k in _EVALUATION_FIELDS}, "evaluated_by": "train"}
    write_json_atomic(ctx.layout.root / "eval.json", evaluation)
    return Outcome("derived", "train", evaluation)  # no rows: no rate to report for a copy


def _eval_run(ctx: StageContext) -> Outcome:
    verify_binary_dataset(ctx)
    result = run_child(trainer_argv(ctx, "eval"), ctx.stage_log("eval"), env=launcher_env(ctx))
    if result.returncode != 0 or result.summary is None:
        raise _child_failed("eval", result, ExitCode.EVAL, ctx)
    write_json_atomic(ctx.layout.root / "eval.json", result.summary)
    engine = "horovod" if launcher_argv(ctx) else "tensorflow"
    rows = sum(result.summary.get(f"{split}_rows") or 0 for split in ("test", "validation"))
    return Outcome("ran", engine, result.summary, rows=rows or None)


# ---------------------------------------------------------------- export / score
def _export_inputs(ctx: StageContext) -> dict[str, Any]:
    """The run's checkpoint and the dictionaries: an unchanged pair is not exported again."""
    model = best_checkpoint(ctx.layout.checkpoints)
    return {
        "checkpoint": model.name if model else None,
        "checkpoint_files": tree_fingerprint(model) if model else "missing",
        "dictionaries": ctx.remote.dictionaries_fingerprint()
        if ctx.remote
        else tree_fingerprint(ctx.layout.dictionaries),
        "dataset": _dataset_hash(ctx),
        "export": _export_settings(ctx),
    }


def _export_settings(ctx: StageContext) -> dict[str, Any]:
    """The export settings that change what a version holds (how many are kept does not)."""
    settings = config_to_dict(ctx.config.export)
    settings.pop("keep_versions")
    return settings


def _newest_export_fingerprint(ctx: StageContext) -> str:
    """The newest version only: deleting an old version by hand (or keep_versions doing it)
    does not make the current model look out of date."""
    newest = ctx.layout.latest_export
    return tree_fingerprint(newest) if newest else "missing"


def _export_outputs(ctx: StageContext) -> str:
    return _newest_export_fingerprint(ctx)


def _export_run(ctx: StageContext) -> Outcome:
    if best_checkpoint(ctx.layout.checkpoints) is None:
        raise PipelineError(
            f"no checkpoint under {ctx.layout.checkpoints} to export: run the train stage first",
            ExitCode.EXPORT,
        )
    stage_in_dataset(ctx)
    if ctx.remote is not None:  # a node other than the convert stage's has none yet
        ctx.remote.fetch_dictionaries(ctx.layout.dictionaries)
    argv = [
        _python(),
        "-m",
        "trainer",
        "--mode",
        "export",
        "--dataset",
        str(ctx.layout.binary),
        "--workdir",
        str(ctx.layout.root),
        "--config",
        str(ctx.config_path),
        "--verify-dataset",
        "none",
    ]
    result = run_child(argv, ctx.stage_log("export"), env=ctx.child_env)
    if result.returncode != 0 or result.summary is None:
        raise _child_failed("export", result, ExitCode.EXPORT, ctx)
    keep = (
        "version",
        "checkpoint_step",
        "test_auc",
        "saved_model",
        "saved_model_bytes",
        "removed_versions",
        "served_version",
        "damaged_checkpoints",
        "seconds",
    )
    summary = {k: result.summary.get(k) for k in keep}
    if summary["served_version"] not in (None, summary["version"]):
        log.warning(
            "export     version %s written; version %s stays served (held by `export "
            "rollback`; `run_pipeline.sh export latest` serves the newest)",
            summary["version"],
            summary["served_version"],
        )
    return Outcome("ran", "tensorflow", summary)


def _served_model(ctx: StageContext) -> Path | None:
    """The served export version (DIR/export/serving.json: held by a rollback, else the
    newest verified): what the score stage scores with, as the serving image serves it."""
    try:
        return served_export(ctx.layout.export)
    except ServingStateError as exc:
        raise PipelineError(str(exc), ExitCode.SCORE) from None


def _score_files(ctx: StageContext) -> list[Path]:
    return [Path(p).resolve() for p in ctx.config.score.input]


def _score_inputs(ctx: StageContext) -> dict[str, Any]:
    settings = config_to_dict(ctx.config.score)
    settings.pop("progress")
    settings.pop("input")
    model = _served_model(ctx)
    return {
        "model": tree_fingerprint(model) if model else "missing",
        **({"version": model.name} if model else {}),
        "files": {str(p): tree_fingerprint(p) for p in _score_files(ctx)},
        "score": settings,
    }


def _score_outputs(ctx: StageContext) -> str:
    return tree_fingerprint(ctx.layout.scores)


def _score_run(ctx: StageContext) -> Outcome:
    files = _score_files(ctx)
    if not files:
        raise PipelineError(
            "the score stage needs --score-input FILE[,FILE...] (or score.input in the config)",
            ExitCode.USAGE,
        )
    model = _served_model(ctx)
    if model is None:
        raise PipelineError(
            f"no exported model under {ctx.layout.export} (no version "
            "directory <N>/ with a saved_model.pb): add the export stage "
            "(--stages export,score)",
            ExitCode.SCORE,
        )
    argv = [
        _python(),
        "-m",
        "trainer.score",
        "--model",
        str(model),
        "--out",
        str(ctx.layout.scores),
        "--config",
        str(ctx.config_path),
        "--input",
        ",".join(str(p) for p in files),
    ]
    result = run_child(argv, ctx.stage_log("score"), env=ctx.child_env)
    if result.returncode != 0 or result.summary is None:
        raise _child_failed("score", result, ExitCode.SCORE, ctx)
    return Outcome("ran", "tensorflow", result.summary, rows=result.summary.get("lines"))


STAGE_TABLE: dict[str, Stage] = {
    "generate": Stage(
        "generate", _generate_inputs, lambda ctx: tree_fingerprint(ctx.layout.raw), _generate_run
    ),
    "preprocess": Stage(
        "preprocess", _preprocess_inputs, _preprocess_outputs, _preprocess_run, _preprocess_satisfied
    ),
    "convert": Stage(
        "convert", _convert_inputs, _convert_outputs, _convert_run, output_dir=lambda ctx: ctx.layout.binary
    ),
    "train": Stage("train", train_inputs, _train_outputs, run_train),
    "eval": Stage("eval", _eval_inputs, _eval_outputs, _eval_run, _eval_from_training),
    "export": Stage("export", _export_inputs, _export_outputs, _export_run),
    "score": Stage("score", _score_inputs, _score_outputs, _score_run),
}
