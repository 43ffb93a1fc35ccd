"""One pipeline run: lock the workdir, run or skip each requested stage, summarise, report.

Stages run in their fixed order (generate, preprocess, convert, train, eval, export, score) whatever order
``--stages`` lists them in. A stage that is up to date is skipped (its manifest says so);
``--force`` redoes every requested stage. The last line on stdout is a one-line JSON summary.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from dlrm_contracts.atomic import open_append, write_json_atomic, write_text_atomic
from dlrm_contracts.binary_format import DatasetError
from dlrm_contracts.config import STAGES, PipelineConfig, config_to_dict
from dlrm_contracts.errors import ExitCode, PipelineError, not_permitted_message, permission_cause
from dlrm_contracts.layout import DATASET_JSON, WorkdirLayout, export_versions
from dlrm_contracts.lock import WorkdirLock, workdir_lock
from dlrm_contracts.storage import is_url
from dlrm_contracts.serving_state import ServingStateError, served_export
from dlrm_contracts.progress_display import Display
from dlrm_contracts.superseded import superseded_runs
from dlrm_contracts.thresholds import parse_threshold_spec
from pipeline import preflight
from pipeline.diskspace import as_disk_full, fullest
from dlrm_contracts.fingerprint import file_stats
from pipeline.manifest import ManifestStore, StageRecord, read_record
from pipeline.processes import terminate_current_child
from pipeline.progress import BarAwareStreamHandler, ConsoleFilter, StageWatch, make_display
from pipeline.remote import RemoteWorkdir, local_side
from pipeline.stages import STAGE_TABLE, Outcome, StageContext, current_training_summary
from pipeline.synthetic.writer import IN_PROGRESS_FILE

log = logging.getLogger("pipeline")


class FallbackFileHandler(logging.FileHandler):
    """The run's log file, which gives up quietly when it cannot be written (a full disk).

    Every line also goes to stderr, so nothing is lost: the handler says once that the file is
    out of use instead of printing logging's own traceback for every line.
    """

    def __init__(self, path: Path):
        super().__init__(path, encoding="utf-8", delay=True)
        self.failed = False

    def _open(self):
        """Appended to, never through a symbolic link planted at its name."""
        return open_append(self.baseFilename)

    def emit(self, record: logging.LogRecord) -> None:
        if not self.failed:
            super().emit(record)

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 — logging's name
        exc = sys.exc_info()[1]
        if not isinstance(exc, OSError):
            super().handleError(record)
            return
        self.failed = True
        try:
            if self.stream is not None:
                self.stream.close()
        except OSError:
            pass
        self.stream = None
        print(
            f"[pipeline] log file {self.baseFilename} cannot be written "
            f"({exc.strerror or exc}); logging to stderr only",
            file=sys.stderr,
            flush=True,
        )


class IsoTimeFormatter(logging.Formatter):
    """ISO 8601 local time with milliseconds and the UTC offset (2026-11-24T02:17:45.120+00:00):
    whole seconds cannot show whether progress lines came every 30 s."""

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:  # noqa: N802
        local = datetime.fromtimestamp(record.created).astimezone()
        return local.isoformat(timespec="milliseconds")


def _setup_logging(layout: WorkdirLayout, display: Display) -> Path:
    """Log to stderr, and to a timestamped file under logs/ while that can be written.

    Progress lines go to both, except to a terminal where the display draws a bar instead."""
    path = layout.logs / f"pipeline-{time.strftime('%Y%m%d-%H%M%S')}.log"
    fmt = IsoTimeFormatter("%(asctime)s %(levelname)s %(message)s")
    log.handlers.clear()
    log.setLevel(logging.INFO)
    log.propagate = False
    console = BarAwareStreamHandler(sys.stderr)
    console.addFilter(ConsoleFilter(display.use_bar))
    console.setFormatter(logging.Formatter("[pipeline] %(message)s"))
    log.addHandler(console)
    try:
        layout.logs.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        print(
            f"[pipeline] log directory {layout.logs} cannot be created ({exc.strerror or exc}); "
            "logging to stderr only",
            file=sys.stderr,
            flush=True,
        )
        return path
    file_handler = FallbackFileHandler(path)
    file_handler.setFormatter(fmt)
    log.addHandler(file_handler)
    return path


class Interrupted(PipelineError):
    def __init__(self, signum: int):
        super().__init__(f"interrupted by signal {signum}", ExitCode.INTERRUPTED)


def install_signal_handlers() -> None:
    """SIGINT / SIGTERM stop the running child and end the run as interrupted (exit 130)."""

    def handler(signum, _frame):
        terminate_current_child()
        raise Interrupted(signum)

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def _run_stage(name: str, ctx: StageContext, force: bool, display: Display) -> StageRecord:
    stage = STAGE_TABLE[name]
    inputs = stage.inputs(ctx)
    key = ManifestStore.key_of(inputs)
    record = StageRecord(name, key, inputs, started=time.time())
    if not force and ctx.manifests.is_done(name, key, stage.outputs_fingerprint(ctx)):
        previous = ctx.manifests.load(name) or {}
        record.action, record.engine = "skipped", "-"
        record.summary = {**previous.get("summary", {}), "reason": "up to date"}
        record.outputs_fingerprint = previous.get("outputs_fingerprint", "")
        record.output_files = previous.get("output_files")
        log.info("%-10s up to date, skipped", name)
        return record
    outcome: Outcome | None = None
    if not force and stage.satisfied_without_rerun is not None:
        outcome = stage.satisfied_without_rerun(ctx)
    if outcome is None:
        running = time.time()  # progress lines count their interval from this line
        log.info("%-10s running", name)
        ctx.manifests.invalidate(name)
        with StageWatch(name, ctx.layout.logs, display, running) as watch:
            ctx.child_env = watch.env()
            outcome = stage.run(ctx)
        ctx.child_env = {}
        record.cpu_seconds = watch.cpu_seconds
    record.action, record.engine, record.summary = outcome.action, outcome.engine, outcome.summary
    record.seconds = time.time() - record.started
    record.rows = outcome.rows
    record.outputs_fingerprint = stage.outputs_fingerprint(ctx)
    if stage.output_dir is not None:
        record.output_files = file_stats(stage.output_dir(ctx))
    # A satisfied-without-rerun stage keeps its original manifest key semantics: record the new
    # key so the next run with the same request skips straight away.
    ctx.manifests.complete(record)
    log.info(
        "%-10s %s (%s) in %.1f s%s", name, outcome.action, outcome.engine, record.seconds, _throughput(record)
    )
    return record


def _throughput(record: StageRecord) -> str:
    rate = record.rows_per_s()
    text = f", {record.rows:,} rows, {rate:,.0f} rows/s" if rate else ""
    if record.cpu_seconds is not None:
        text += f", {record.cpu_seconds:,.1f} CPU-s"
    return text


def _write_effective_config(config: PipelineConfig, layout: WorkdirLayout) -> Path:
    path = layout.manifests / "effective_config.yaml"
    write_text_atomic(path, yaml.safe_dump(config_to_dict(config), sort_keys=False))
    return path


def _current_evaluation(ctx: StageContext | None, layout: WorkdirLayout) -> dict[str, Any]:
    """eval.json, but only when it evaluated the checkpoints and dataset now in the workdir.

    After a threshold change or a retrain without eval, the AUC on disk belongs to another
    model or dataset; the summary must not pass it off as this run's result.
    """
    try:
        evaluation = read_record(layout.root / "eval.json") or {}
        if not evaluation or ctx is None:
            return {}
        stage = STAGE_TABLE["eval"]
        key = ManifestStore.key_of(stage.inputs(ctx))
        current = ctx.manifests.is_done("eval", key, stage.outputs_fingerprint(ctx))
    except (OSError, ValueError) as exc:  # the summary must be written whatever the workdir holds
        log.warning("evaluation not read: %s", exc)
        return {}
    return evaluation if current else {}


def _current_training(ctx: StageContext | None) -> dict[str, Any]:
    """The train stage's summary, when it trained the checkpoints and dataset now in the
    workdir (how the run started; the previous model's test AUC after a warm start)."""
    try:
        return current_training_summary(ctx) if ctx is not None else {}
    except (OSError, ValueError) as exc:  # the summary must be written whatever the workdir holds
        log.warning("training summary not read: %s", exc)
        return {}


def _daily_fields(
    evaluation: dict[str, Any], training: dict[str, Any], layout: WorkdirLayout
) -> dict[str, Any]:
    """What a scheduled (daily) job is judged by (docs/pipeline.md, "Daily runs").

    next_day_auc: the model's AUC on the newest day of the data (its test half), which no
    training step has seen: the model trained through day k scored on day k+1. The test AUC,
    named for what it means here. previous_model_test_auc: after a warm start, the previous
    model (the one being served) on the same rows before this run trained.
    """
    init = training.get("init") or {}
    newest = export_versions(layout.export)
    return {
        "next_day_auc": evaluation.get("test_auc"),
        "previous_model_test_auc": training.get("previous_model_test_auc"),
        # a warm-started run resumed after a kill is still a warm start
        "init": "previous" if "from_step" in init else init.get("mode"),
        # the train days this run trained on (train.days: new trains the unseen ones only)
        "days_trained": (training.get("train_days") or {}).get("run"),
        "export_version": newest[-1][0] if newest else None,
        "served_version": _served_version(layout),
    }


def _served_version(layout: WorkdirLayout) -> int | None:
    """The export version the score stage and the serving image load (None: none, or a
    damaged serving.json, which the export stage and the export commands name)."""
    try:
        served = served_export(layout.export)
    except ServingStateError:
        return None
    return int(served.name) if served else None


def _summary(
    config: PipelineConfig,
    layout: WorkdirLayout,
    records: list[StageRecord],
    status: str,
    ctx: StageContext | None = None,
    remote: RemoteWorkdir | None = None,
) -> dict[str, Any]:
    dataset = read_record(layout.binary / DATASET_JSON) or {}
    evaluation = _current_evaluation(ctx, layout)
    return {
        "status": status,
        "workdir": str(remote.root) if remote else str(layout.root),
        **({"local_side": str(layout.root)} if remote else {}),
        "threshold": str(config.preprocess.frequency_threshold),
        # The threshold of the binary dataset in the workdir (what train/eval used); differs
        # from "threshold" when the convert stage was not part of the run.
        "dataset_threshold": dataset.get("threshold_spec"),
        "stages": {
            r.stage: {
                "action": r.action,
                "engine": r.engine,
                "seconds": round(r.seconds, 2),
                "rows": r.rows,
                "rows_per_s": r.rows_per_s(),
                "cpu_seconds": r.cpu_seconds,
            }
            for r in records
        },
        "seconds": round(sum(r.seconds for r in records), 2),
        "rows": dataset.get("splits"),
        "table_sizes": dataset.get("table_sizes"),
        "test_auc": evaluation.get("test_auc"),
        "validation_auc": evaluation.get("validation_auc"),
        **_daily_fields(evaluation, _current_training(ctx), layout),
        # earlier runs' checkpoints set aside by a change of the model (never deleted): each
        # folder, its size and why; `rm -r` of a folder removes it
        "checkpoints_set_aside": superseded_runs(layout.checkpoints),
        "report": str(remote.root / "report" / "report.md") if remote else str(layout.report / "report.md"),
    }


def _warn_if_dataset_threshold_differs(ctx: StageContext) -> None:
    made_at = (read_record(ctx.layout.binary / DATASET_JSON) or {}).get("threshold_spec")
    try:
        differs = made_at is not None and parse_threshold_spec(made_at) != ctx.threshold
    except PipelineError:  # a damaged description: the stages that read it say so
        return
    if differs:
        log.warning(
            "the binary dataset is at threshold %s, not the requested %s: add the convert "
            "stage to change it (train/eval use the dataset as it is)",
            made_at,
            ctx.threshold,
        )


def _generation_interrupted(layout: WorkdirLayout) -> bool:
    return (layout.raw / IN_PROGRESS_FILE).exists()


def _prepare_workdir(layout: WorkdirLayout, display: Display) -> Path:
    try:
        layout.root.mkdir(parents=True, exist_ok=True)
        _check_writable(layout.root)
    except OSError as exc:
        full = as_disk_full(exc, "setup", layout.root)
        if full is not None:
            raise full from None
        raise PipelineError(
            f"workdir {layout.root} cannot be created or written: {exc.strerror or exc}", ExitCode.USAGE
        ) from None
    return _setup_logging(layout, display)


def _check_writable(directory: Path) -> None:
    """Create and remove a file in ``directory``: a read-only workdir (permissions, a read-only
    mount, an immutable directory) is refused here, before the lock, the log or any stage."""
    fd, probe = tempfile.mkstemp(prefix=".write-check-", dir=directory)
    os.close(fd)
    os.unlink(probe)


def _spark_local_dirs(config: PipelineConfig) -> list[str]:
    """Where a local Spark job writes its shuffle files (a full disk there fails preprocess)."""
    return [str(p) for p in preflight.spark_local_dirs(config)]


def _classify(
    exc: BaseException, stage: str, config: PipelineConfig, layout: WorkdirLayout
) -> PipelineError | None:
    """A failure caused by a full disk, as its one-line error (None for any other failure)."""
    if isinstance(exc, PipelineError) and exc.code == ExitCode.DISK_FULL:
        return exc
    try:
        outputs = {
            "generate": layout.raw,
            "preprocess": layout.parquet,
            "convert": layout.binary,
            "train": layout.checkpoints,
        }
        default = layout.manifests if stage == "setup" else layout.root
        cause = None if isinstance(exc, PipelineError) else permission_cause(exc)
        if cause is not None:
            return PipelineError(
                not_permitted_message(cause, f"stage {stage}", str(outputs.get(stage, default))),
                ExitCode.USAGE,
            )
        candidates = [str(outputs.get(stage, default))]
        if stage == "preprocess":
            candidates += _spark_local_dirs(config)
        return as_disk_full(exc, stage, fullest(candidates))
    except OSError:
        return as_disk_full(exc, stage, layout.root)


def _save_quietly(what: str, write) -> None:
    """History, summary: worth a warning, never a crash, when the disk is full."""
    try:
        write()
    except OSError as exc:
        log.warning("%s not saved: %s", what, exc.strerror or exc)


def _publish_quietly(remote: RemoteWorkdir, stage: str) -> None:
    """The models a failed or stopped stage kept: worth a warning, never a second failure."""
    try:
        remote.publish_models(stage)
    except (OSError, DatasetError) as exc:
        log.warning("the checkpoints and exports at %s not published: %s", remote.root, exc)


@dataclass
class RunState:
    """What a run has done so far: its summary is made from it however the run ends."""

    config: PipelineConfig
    layout: WorkdirLayout
    wanted: list[str]
    records: list[StageRecord] = field(default_factory=list)
    ctx: StageContext | None = None
    running: tuple[str, float] | None = None  # the stage under way: name, start time
    display: Display | None = None
    status: str = "ok"
    code: ExitCode = ExitCode.OK
    summary: dict[str, Any] = field(default_factory=dict)
    remote: RemoteWorkdir | None = None  # a workdir URL (``layout`` is then its local side)


def run_pipeline(config: PipelineConfig) -> int:
    """Run the requested stages in their fixed order under the workdir's lock.

    Args:
        config: the whole configuration, flags applied (see pipeline.cli).

    Returns:
        The process exit code (dlrm_contracts.errors.ExitCode): 0, or the code of the failure.
        The one-line JSON summary is printed last on stdout either way.
    """
    url = str(config.workdir) if is_url(str(config.workdir)) else None
    layout = WorkdirLayout.at(local_side(url, config.train.stage_dir) if url else config.workdir)
    display = make_display(config.progress)
    log_path = _prepare_workdir(layout, display)
    run = RunState(
        config,
        layout,
        [s for s in STAGES if s in config.stages],
        display=display,
        remote=RemoteWorkdir(url, layout) if url else None,
    )
    _check_raw_input(run)
    # its children (the wings) run under this lock: they inherit its token (dlrm_contracts.lock)
    with workdir_lock(url, "pipeline") if url else WorkdirLock(layout.lock_file, "pipeline") as lock:
        install_signal_handlers()
        log.info("workdir %s, stages %s, log %s", url or layout.root, ",".join(run.wanted), log_path)
        if url:
            log.info(
                "workdir URL: this node's local side (staged dataset, checkpoints, logs, exports) is %s",
                layout.root,
            )
        try:
            if run.remote:
                run.remote.pull_records()
            _run_stages(run)
        except Exception as exc:  # noqa: BLE001 — sorted by _record_failure: known kinds, a bug
            _record_failure(run, lock.lost or exc)  # a lock taken over interrupts the run
        finally:
            _close_run(run)
    if run.remote:
        log.info(
            "outputs: parquet %s, binary %s, records and report at %s; checkpoints %s, logs %s on this node",
            run.remote.parquet,
            run.remote.binary,
            run.remote.root,
            layout.checkpoints,
            layout.logs,
        )
    else:
        log.info(
            "outputs: parquet %s, binary %s, checkpoints %s, logs %s, report %s",
            layout.parquet,
            layout.binary,
            layout.checkpoints,
            layout.logs,
            layout.report,
        )
    print(json.dumps(run.summary, sort_keys=True), flush=True)
    return int(run.code)


def _check_raw_input(run: RunState) -> None:
    """Refuse a run that needs raw days the workdir does not have (before taking the lock)."""
    config, layout = run.config, run.layout
    # export and score read the workdir's model and their own files, never the raw days
    if config.input or "generate" in run.wanted or set(run.wanted) <= {"export", "score"}:
        return
    if not layout.raw.exists():
        raise PipelineError(
            "no --input given and no generated data in the workdir: add the "
            "generate stage or pass --input RAW_DIR",
            ExitCode.USAGE,
        )
    if _generation_interrupted(layout):
        raise PipelineError(
            f"the generated data in {layout.raw} is incomplete (a generate run was "
            "interrupted): add the generate stage",
            ExitCode.USAGE,
        )


def _run_stages(run: RunState) -> None:
    config = run.config
    # A shortfall refuses the run here, before any stage; what needs the counts (tables per
    # rank, checkpoints) is checked again before train when it is unknown now, or when this
    # run's preprocess grows the tables (stable ids: today's newcomers are not counted yet).
    # (with a workdir URL the preflight's disk figures would be the local side's: not run)
    check_before_train = False
    if config.preflight.enabled and run.remote is None:
        tables_sized = _run_preflight(config)
        grows_tables = config.preprocess.mode.grows_tables and "preprocess" in run.wanted
        check_before_train = not tables_sized or grows_tables
    run.ctx = StageContext(
        config,
        run.layout,
        ManifestStore(run.layout.manifests),
        _write_effective_config(config, run.layout),
        remote=run.remote,
    )
    first_model_stage = next((s for s in run.wanted if s in ("train", "eval")), None)
    for name in run.wanted:
        if name == "generate" and config.input:
            log.info("generate   not needed: --input %s given", config.input)
            continue
        if name == first_model_stage and "convert" not in run.wanted:
            _warn_if_dataset_threshold_differs(run.ctx)
        run.running = (name, time.time())
        if name == "train" and check_before_train:
            preflight.before_train(config, log.info)
        if run.remote:  # a stage moved to this node continues the published model
            run.remote.restore_models(name)
        run.records.append(_run_stage(name, run.ctx, config.force, run.display))
        if run.remote:  # a rerun after a kill, on any node, sees this stage done
            run.remote.publish_models(name)
            run.remote.push_records()
        run.running = None


def _run_preflight(config: PipelineConfig) -> bool:
    """Run the preflight, which raises on a shortfall; returns whether it could size the
    tables per rank (else they are checked again before train)."""
    return "embedding_bytes_per_rank" in preflight.check(config, log.info).facts


def _record_failure(run: RunState, exc: Exception) -> None:
    """A full disk or a known failure: one line and its code; anything else is a bug, logged
    with its traceback, exit 1. Called while ``exc`` is being handled."""
    known = _classify(exc, run.running[0] if run.running else "setup", run.config, run.layout)
    if known is None and isinstance(exc, PipelineError):
        known = exc
    if known is not None:
        run.status, run.code = f"failed: {known.kind}", known.code
        log.error("%s", known)
    else:
        run.status, run.code = "failed: failed", ExitCode.FAILED
        log.exception("unexpected error: %s", exc)


def _close_run(run: RunState) -> None:
    """The record of a stage that failed or was interrupted, then history, summary, report."""
    if run.running is not None:
        name, started = run.running
        action = "interrupted" if run.code == ExitCode.INTERRUPTED else "failed"
        run.records.append(
            StageRecord(
                name, "", {}, action=action, engine="-", started=started, seconds=time.time() - started
            )
        )
    summary = run.summary = _summary(run.config, run.layout, run.records, run.status, run.ctx, run.remote)
    history = ManifestStore(run.layout.manifests)
    _save_quietly(
        "run history",
        lambda: history.append_history({"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **summary}),
    )
    _save_quietly("summary.json", lambda: write_json_atomic(run.layout.root / "summary.json", summary))
    _write_report_safely(run.layout)
    if run.remote and run.code != ExitCode.LOCKED:  # a run whose lock was taken over writes no more there
        if run.running is not None:  # what a failed or stopped stage kept is not lost either
            _publish_quietly(run.remote, run.running[0])
        _save_quietly(f"the records at {run.remote.root}", run.remote.push_records)


def _write_report_safely(layout: WorkdirLayout) -> None:
    """A report that fails to render must not turn a good run into a failed one."""
    try:
        from pipeline.report import write_report

        write_report(layout)
    except Exception as exc:  # noqa: BLE001 — reported, not hidden
        log.warning("report not written: %s", exc)
