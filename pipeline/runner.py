"""One pipeline run: lock the workdir, run or skip each requested stage, summarise, report.

Stages run in their fixed order (generate, preprocess, convert, train, eval) whatever order
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

from pipeline.config import STAGES, PipelineConfig, config_to_dict
from pipeline.errors import ExitCode, PipelineError
from pipeline.layout import WorkdirLayout
from pipeline.lock import WorkdirLock
from pipeline.manifest import ManifestStore, StageRecord, read_json, write_json_atomic
from pipeline.processes import terminate_current_child
from pipeline.stages import STAGE_TABLE, Outcome, StageContext

log = logging.getLogger("pipeline")


def _setup_logging(layout: WorkdirLayout) -> Path:
    layout.logs.mkdir(parents=True, exist_ok=True)
    path = layout.logs / f"pipeline-{time.strftime('%Y%m%d-%H%M%S')}.log"
    fmt = logging.Formatter("%(asctime)s %(levelname)s %(message)s", "%Y-%m-%dT%H:%M:%S%z")
    log.handlers.clear()
    log.setLevel(logging.INFO)
    log.propagate = False
    file_handler = logging.FileHandler(path, encoding="utf-8")
    file_handler.setFormatter(fmt)
    console = logging.StreamHandler(sys.stderr)
    console.setFormatter(logging.Formatter("[pipeline] %(message)s"))
    log.addHandler(file_handler)
    log.addHandler(console)
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


def _summary(config: PipelineConfig, layout: WorkdirLayout,
             records: list[StageRecord], status: str) -> dict[str, Any]:
    dataset = read_json(layout.binary / "dataset.json") or {}
    evaluation = read_json(layout.root / "eval.json") or {}
    return {
        "status": status,
        "workdir": str(layout.root),
        "threshold": str(config.preprocess.frequency_threshold),
        "stages": {r.stage: {"action": r.action, "engine": r.engine, "seconds": round(r.seconds, 2)}
                   for r in records},
        "rows": dataset.get("splits"),
        "table_sizes": dataset.get("table_sizes"),
        "test_auc": evaluation.get("test_auc"),
        "validation_auc": evaluation.get("validation_auc"),
        "report": str(layout.report / "report.md"),
    }


def run_pipeline(config: PipelineConfig) -> int:
    """Run the requested stages; return the process exit code (see pipeline.errors.ExitCode)."""
    layout = WorkdirLayout.at(config.workdir)
    layout.root.mkdir(parents=True, exist_ok=True)
    log_path = _setup_logging(layout)
    wanted = [s for s in STAGES if s in config.stages]
    if not config.input and "generate" not in wanted and not layout.raw.exists():
        raise PipelineError("no --input given and no generated data in the workdir: add the "
                            "generate stage or pass --input RAW_DIR", ExitCode.USAGE)
    records: list[StageRecord] = []
    with WorkdirLock(layout.lock_file):
        _install_signal_handlers()
        log.info("workdir %s, stages %s, log %s", layout.root, ",".join(wanted), log_path)
        ctx = StageContext(config, layout, ManifestStore(layout.manifests),
                           _write_effective_config(config, layout))
        status, code = "ok", ExitCode.OK
        try:
            for name in wanted:
                if name == "generate" and config.input:
                    log.info("generate   not needed: --input %s given", config.input)
                    continue
                records.append(_run_stage(name, ctx, config.force))
        except PipelineError as exc:
            status, code = f"failed: {exc.code.name.lower()}", exc.code
            log.error("%s", exc)
        finally:
            summary = _summary(config, layout, records, status)
            ctx.manifests.append_history({"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **summary})
            write_json_atomic(layout.root / "summary.json", summary)
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
