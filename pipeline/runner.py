"""One pipeline run: lock the workdir, run or skip each requested stage, summarise, report.

Stages run in their fixed order (generate, preprocess, convert, train, eval, export, score) whatever order
``--stages`` lists them in. A stage that is up to date is skipped (its manifest says so);
``--force`` redoes every requested stage. The last line on stdout is a one-line JSON summary.
"""

from __future__ import annotations

import json
import logging
import signal
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from dlrm_contracts.atomic import read_json, write_json_atomic
from dlrm_contracts.config import STAGES, PipelineConfig, config_to_dict
from dlrm_contracts.errors import ExitCode, PipelineError
from dlrm_contracts.layout import WorkdirLayout
from dlrm_contracts.thresholds import parse_threshold_spec
from pipeline.diskspace import as_disk_full, fullest
from pipeline.lock import WorkdirLock
from pipeline.manifest import ManifestStore, StageRecord
from pipeline.processes import terminate_current_child
from pipeline.stages import STAGE_TABLE, Outcome, StageContext

log = logging.getLogger("pipeline")


class FallbackFileHandler(logging.FileHandler):
    """The run's log file, which gives up quietly when it cannot be written (a full disk).

    Every line also goes to stderr, so nothing is lost: the handler says once that the file is
    out of use instead of printing logging's own traceback for every line.
    """

    def __init__(self, path: Path):
        super().__init__(path, encoding="utf-8", delay=True)
        self.failed = False

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
        print(f"[pipeline] log file {self.baseFilename} cannot be written "
              f"({exc.strerror or exc}); logging to stderr only", file=sys.stderr, flush=True)


def _setup_logging(layout: WorkdirLayout) -> Path:
    """Log to stderr, and to a timestamped file under logs/ while that can be written."""
    path = layout.logs / f"pipeline-{time.strftime('%Y%m%d-%H%M%S')}.log"
    fmt = logging.Formatter("%(asctime)s %(levelname)s %(message)s", "%Y-%m-%dT%H:%M:%S%z")
    log.handlers.clear()
    log.setLevel(logging.INFO)
    log.propagate = False
    console = logging.StreamHandler(sys.stderr)
    console.setFormatter(logging.Formatter("[pipeline] %(message)s"))
    log.addHandler(console)
    try:
        layout.logs.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        print(f"[pipeline] log directory {layout.logs} cannot be created ({exc.strerror or exc}); "
              "logging to stderr only", file=sys.stderr, flush=True)
        return path
    file_handler = FallbackFileHandler(path)
    file_handler.setFormatter(fmt)
    log.addHandler(file_handler)
    return path


class Interrupted(PipelineError):
    def __init__(self, signum: int):
        super().__init__(f"interrupted by signal {signum}", ExitCode.INTERRUPTED)


def _install_signal_handlers() -> None:
    def handler(signum, _frame):
        terminate_current_child()
        raise Interrupted(signum)

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def _run_stage(name: str, ctx: StageContext, force: bool) -> StageRecord:
    stage = STAGE_TABLE[name]
    inputs = stage.inputs(ctx)
    key = ManifestStore.key_of(inputs)
    record = StageRecord(name, key, inputs, started=time.time())
    if not force and ctx.manifests.is_done(name, key, stage.outputs_fingerprint(ctx)):
        previous = ctx.manifests.load(name) or {}
        record.action, record.engine = "skipped", "-"
        record.summary = {**previous.get("summary", {}), "reason": "up to date"}
        record.outputs_fingerprint = previous.get("outputs_fingerprint", "")
        log.info("%-10s up to date, skipped", name)
        return record
    outcome: Outcome | None = None
    if not force and stage.satisfied_without_rerun is not None:
        outcome = stage.satisfied_without_rerun(ctx)
    if outcome is None:
        log.info("%-10s running", name)
        ctx.manifests.invalidate(name)
        outcome = stage.run(ctx)
    record.action, record.engine, record.summary = outcome.action, outcome.engine, outcome.summary
    record.seconds = time.time() - record.started
    record.outputs_fingerprint = stage.outputs_fingerprint(ctx)
    # A satisfied-without-rerun stage keeps its original manifest key semantics: record the new
    # key so the next run with the same request skips straight away.
    ctx.manifests.complete(record)
    log.info("%-10s %s (%s) in %.1f s", name, outcome.action, outcome.engine, record.seconds)
    return record


def _write_effective_config(config: PipelineConfig, layout: WorkdirLayout) -> Path:
    path = layout.manifests / "effective_config.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config_to_dict(config), sort_keys=False), encoding="utf-8")
    return path


def _current_evaluation(ctx: StageContext | None, layout: WorkdirLayout) -> dict[str, Any]:
    """eval.json, but only when it evaluated the checkpoints and dataset now in the workdir.

    After a threshold change or a retrain without eval, the AUC on disk belongs to another
    model or dataset; the summary must not pass it off as this run's result.
    """
    try:
        evaluation = read_json(layout.root / "eval.json") or {}
        if not evaluation or ctx is None:
            return {}
        stage = STAGE_TABLE["eval"]
        key = ManifestStore.key_of(stage.inputs(ctx))
        current = ctx.manifests.is_done("eval", key, stage.outputs_fingerprint(ctx))
    except (OSError, ValueError) as exc:  # the summary must be written whatever the workdir holds
        log.warning("evaluation not read: %s", exc)
        return {}
    return evaluation if current else {}


def _summary(config: PipelineConfig, layout: WorkdirLayout, records: list[StageRecord],
             status: str, ctx: StageContext | None = None) -> dict[str, Any]:
    dataset = read_json(layout.binary / "dataset.json") or {}
    evaluation = _current_evaluation(ctx, layout)
    return {
        "status": status,
        "workdir": str(layout.root),
        "threshold": str(parse_threshold_spec(config.preprocess.frequency_threshold)),
        # The threshold of the binary dataset in the workdir (what train/eval used); differs
        # from "threshold" when the convert stage was not part of the run.
        "dataset_threshold": dataset.get("threshold_spec"),
        "stages": {r.stage: {"action": r.action, "engine": r.engine, "seconds": round(r.seconds, 2)}
                   for r in records},
        "seconds": round(sum(r.seconds for r in records), 2),
        "rows": dataset.get("splits"),
        "table_sizes": dataset.get("table_sizes"),
        "test_auc": evaluation.get("test_auc"),
        "validation_auc": evaluation.get("validation_auc"),
        "report": str(layout.report / "report.md"),
    }


def _warn_if_dataset_threshold_differs(ctx: StageContext) -> None:
    made_at = (read_json(ctx.layout.binary / "dataset.json") or {}).get("threshold_spec")
    if made_at is not None and parse_threshold_spec(made_at) != ctx.threshold:
        log.warning("the binary dataset is at threshold %s, not the requested %s: add the convert "
                    "stage to change it (train/eval use the dataset as it is)", made_at, ctx.threshold)


def _generation_interrupted(layout: WorkdirLayout) -> bool:
    from pipeline.synthetic.writer import IN_PROGRESS_FILE

    return (layout.raw / IN_PROGRESS_FILE).exists()


def _prepare_workdir(layout: WorkdirLayout) -> Path:
    try:
        layout.root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        full = as_disk_full(exc, "setup", layout.root)
        if full is not None:
            raise full from None
        raise PipelineError(f"workdir {layout.root} cannot be created or written: "
                            f"{exc.strerror or exc}", ExitCode.USAGE) from None
    return _setup_logging(layout)


def _spark_local_dirs(config: PipelineConfig) -> list[str]:
    """Where a local Spark job writes its shuffle files (a full disk there fails preprocess)."""
    from pipeline.preflight import spark_local_dirs

    return [str(p) for p in spark_local_dirs(config)]


def _classify(exc: BaseException, stage: str, config: PipelineConfig,
              layout: WorkdirLayout) -> PipelineError | None:
    """A failure caused by a full disk, as its one-line error (None for any other failure)."""
    if isinstance(exc, PipelineError) and exc.code == ExitCode.DISK_FULL:
        return exc
    try:
        outputs = {"generate": layout.raw, "preprocess": layout.parquet, "convert": layout.binary,
                   "train": layout.checkpoints}
        default = layout.manifests if stage == "setup" else layout.root
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


def run_pipeline(config: PipelineConfig) -> int:
    """Run the requested stages; return the process exit code (see dlrm_contracts.errors.ExitCode)."""
    layout = WorkdirLayout.at(config.workdir)
    log_path = _prepare_workdir(layout)
    wanted = [s for s in STAGES if s in config.stages]
    # export and score read the workdir's model and their own files, never the raw days
    serving_only = set(wanted) <= {"export", "score"}
    if not config.input and "generate" not in wanted and not serving_only and not layout.raw.exists():
        raise PipelineError("no --input given and no generated data in the workdir: add the "
                            "generate stage or pass --input RAW_DIR", ExitCode.USAGE)
    if (not config.input and "generate" not in wanted and not serving_only
            and _generation_interrupted(layout)):
        raise PipelineError(f"the generated data in {layout.raw} is incomplete (a generate run was "
                            "interrupted): add the generate stage", ExitCode.USAGE)
    records: list[StageRecord] = []
    ctx: StageContext | None = None
    with WorkdirLock(layout.lock_file):
        _install_signal_handlers()
        log.info("workdir %s, stages %s, log %s", layout.root, ",".join(wanted), log_path)
        status, code = "ok", ExitCode.OK
        current: tuple[str, float] | None = None
        warned = False
        try:
            preflight = None
            if config.preflight.enabled:
                from pipeline import preflight

                # A shortfall refuses the run here, before any stage; what needs the counts
                # (tables per rank, checkpoints) is checked again before train if unknown now.
                tables_known = "embedding_bytes_per_rank" in preflight.check(config, log.info).facts
            ctx = StageContext(config, layout, ManifestStore(layout.manifests),
                               _write_effective_config(config, layout))
            for name in wanted:
                if name == "generate" and config.input:
                    log.info("generate   not needed: --input %s given", config.input)
                    continue
                if name in ("train", "eval") and "convert" not in wanted and not warned:
                    _warn_if_dataset_threshold_differs(ctx)
                    warned = True
                current = (name, time.time())
                if name == "train" and preflight is not None and not tables_known:
                    preflight.before_train(config, log.info)
                records.append(_run_stage(name, ctx, config.force))
                current = None
        except Exception as exc:  # noqa: BLE001 — sorted below: known kinds, full disk, a bug
            known = _classify(exc, current[0] if current else "setup", config, layout)
            if known is None and isinstance(exc, PipelineError):
                known = exc
            if known is not None:
                status, code = f"failed: {known.kind}", known.code
                log.error("%s", known)
            else:  # a bug: logged with its traceback, exit 1
                status, code = "failed: failed", ExitCode.FAILED
                log.exception("unexpected error: %s", exc)
        finally:
            if current is not None:  # the stage that failed or was interrupted
                name, started = current
                action = "interrupted" if code == ExitCode.INTERRUPTED else "failed"
                records.append(StageRecord(name, "", {}, action=action, engine="-", started=started,
                                           seconds=time.time() - started))
            summary = _summary(config, layout, records, status, ctx)
            _save_quietly("run history", lambda: ManifestStore(layout.manifests).append_history(
                {"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **summary}))
            _save_quietly("summary.json", lambda: write_json_atomic(layout.root / "summary.json",
                                                                    summary))
            _write_report_safely(layout)
    log.info("outputs: parquet %s, binary %s, checkpoints %s, logs %s, report %s",
             layout.parquet, layout.binary, layout.checkpoints, layout.logs, layout.report)
    print(json.dumps(summary, sort_keys=True), flush=True)
    return int(code)


def _write_report_safely(layout: WorkdirLayout) -> None:
    """A report that fails to render must not turn a good run into a failed one."""
    try:
        from pipeline.report import write_report

        write_report(layout)
    except Exception as exc:  # noqa: BLE001 — reported, not hidden
        log.warning("report not written: %s", exc)
