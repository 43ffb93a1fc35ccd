"""Command line of the pipeline (``./run_pipeline.sh`` and ``python -m pipeline``).

    run_pipeline.sh [run] [--input RAW_DIR] [--workdir DIR] [--frequency-threshold SPEC] [--np N]
                    [--hosts H] [--spark-master URL] [--spark-secret-file FILE] [--gpu]
                    [--max-steps N] [--stages generate,preprocess,convert,train,eval,export,score]
                    [--score-input FILE[,FILE...]] [--config YAML] [--force]
    run_pipeline.sh preflight --input RAW_DIR --workdir DIR [--config YAML] [run flags]
                                                     # disk, memory, time: will it fit?
    run_pipeline.sh plan --workdir DIR [--thresholds 1,2,5,15] [--embedding-dim 128]
    run_pipeline.sh show-config [--config YAML]      # the full effective configuration
    run_pipeline.sh export list|pin V|unpin V|rollback [V]|latest [--workdir DIR]
                                                     # the served model version (docs/pipeline.md)

Flag and stage names are an interface: schedulers call them. Flags override the YAML file,
which overrides the defaults in dlrm_contracts/config.py.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

from converters.cli import main as converters_main
from dlrm_contracts.config import (
    DEFAULT_STAGES,
    STAGES,
    PipelineConfig,
    config_to_dict,
    load_config,
    with_overrides,
)
from dlrm_contracts.errors import ExitCode, PipelineError, UsageError
from dlrm_contracts.layout import WorkdirLayout, histogram_path
from dlrm_contracts.secret_file import SecretFileError, read_secret_file
from dlrm_contracts.security import refuse_secret_settings
from dlrm_contracts.storage import check_url, is_url
from dlrm_contracts.thresholds import parse_threshold_spec
from pipeline.hosts import horovodrun_hosts, host_slots
from pipeline.preflight import preflight_failed, report
from pipeline.runner import run_pipeline
from pipeline.served import ACTIONS, export_command
from spark_jobs.session import deploy_security, read_conf_file

DEFAULT_WORKDIR_NOTE = "default: ./workdir, or the YAML file's workdir"
EXIT_CODES_HELP = (
    "exit codes: 0 ok, 1 unexpected error, 2 bad flags/config/threshold spec or "
    "unwritable workdir, "
    "3 workdir locked by another run, 4 input data or preflight shortfall, "
    "5 Spark job, 6 convert, 7 dataset did not verify, 8 train, 9 eval, "
    "10 export, 11 score, 12 disk full, 130 interrupted "
    "(docs/pipeline.md). The last stdout line is a one-line JSON summary."
)


def _run_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="YAML file with any of the settings (see show-config)")
    parser.add_argument(
        "--input",
        help="directory of raw day files day_0..day_N[.gz]; "
        "without it the generate stage makes synthetic data",
    )
    parser.add_argument(
        "--workdir",
        help=f"where every output goes ({DEFAULT_WORKDIR_NOTE}); a "
        "path or a URL such as s3://bucket/criteo/workdir "
        "(docs/cluster.md §2.0.3)",
    )
    parser.add_argument("--frequency-threshold", help="e.g. 15 or 15,C3:3,C20:40")
    parser.add_argument("--np", type=int, help="trainer ranks (horovodrun when > 1)")
    parser.add_argument("--hosts", help="horovodrun hosts, e.g. node1:4,node2:4")
    parser.add_argument("--spark-master", help="Spark master URL (default local[2])")
    parser.add_argument(
        "--spark-secret-file",
        metavar="FILE",
        help="an authenticated Spark cluster's secret file, mode 0600 (e.g. "
        "DIR/auth/secret of start-cluster.sh); docs/cluster.md",
    )
    parser.add_argument(
        "--gpu", action="store_true", default=None, help="RAPIDS accelerator profile for Spark"
    )
    parser.add_argument("--max-steps", type=int, help="stop training after this many steps")
    parser.add_argument(
        "--stages", help=f"comma-separated subset of {','.join(STAGES)} (default: {','.join(DEFAULT_STAGES)})"
    )
    parser.add_argument(
        "--score-input",
        help="raw files (plain or .gz), comma-separated, for the score stage: DIR/scores/<name>.parquet each",
    )
    parser.add_argument(
        "--force", action="store_true", default=None, help="redo the requested stages even if up to date"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="run_pipeline.sh", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command")
    _run_parser(
        sub.add_parser(
            "run",
            help="run stages (the default command)",
            description=__doc__,
            epilog=EXIT_CODES_HELP,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
    )
    _run_parser(
        sub.add_parser(
            "preflight",
            help="disk, memory and time the run needs, against "
            "what this machine has (no Spark; exit 4 when it cannot fit)",
        )
    )
    plan = sub.add_parser("plan", help="table sizes and embedding memory per threshold")
    plan.add_argument("--workdir", default="workdir")
    plan.add_argument("--thresholds", default="1,2,3,5,10,15,25,50")
    plan.add_argument("--embedding-dim", type=int, default=128)
    plan.add_argument("--json", action="store_true")
    show = sub.add_parser("show-config", help="print the effective configuration as YAML")
    show.add_argument("--config")
    export = sub.add_parser(
        "export",
        help="which export version is served: list, pin, unpin, "
        "rollback [VERSION], latest (DIR/export/serving.json)",
    )
    export.add_argument(
        "action",
        choices=ACTIONS,
        help="list the versions; pin/unpin VERSION (a pinned version is never "
        "pruned); rollback [VERSION] (serve it, by default the one before "
        "the served one, until `latest`); latest (serve the newest verified)",
    )
    export.add_argument("version", nargs="?", type=int)
    export.add_argument("--workdir", help=f"the workdir ({DEFAULT_WORKDIR_NOTE})")
    export.add_argument("--config", help="YAML file (for its workdir)")
    return parser


def _items(text: str | None) -> list[str] | None:
    return None if text is None else [item.strip() for item in text.split(",") if item.strip()]


def apply_flags(config: PipelineConfig, args: argparse.Namespace) -> PipelineConfig:
    """The run's flags over the configuration (each section's range checks run again)."""
    if args.max_steps is not None and args.max_steps < 1:  # 0 trains nothing: not a run
        raise UsageError("--max-steps must be at least 1")
    # --hosts alone: every slot the host list offers, as horovodrun users expect
    np = host_slots(args.hosts) if args.hosts is not None and args.np is None else args.np
    return with_overrides(
        config,
        {
            "input": args.input,
            "workdir": args.workdir,
            "stages": _items(args.stages),
            "force": args.force or None,
            "preprocess": with_overrides(
                config.preprocess, {"frequency_threshold": args.frequency_threshold}
            ),
            "launch": with_overrides(config.launch, {"hosts": args.hosts, "np": np}),
            "spark": with_overrides(
                config.spark,
                {
                    "master": args.spark_master,
                    "auth_secret_file": args.spark_secret_file,
                    "gpu": args.gpu or None,
                },
            ),
            "train": with_overrides(config.train, {"max_steps": args.max_steps}),
            "score": with_overrides(config.score, {"input": _items(args.score_input)}),
        },
    )


def _check_locations(config: PipelineConfig) -> None:
    """A URL with a secret or a store setting in it is refused (dlrm_contracts.storage)."""
    for value in (config.input, config.workdir):
        if value:
            check_url(str(value))


def _refuse_url(workdir: str, command: str) -> None:
    """``plan`` and ``export`` read files of a workdir by path: with a workdir URL they act on
    a node's local side (docs/cluster.md §2.0.3), named here rather than taken as a path."""
    check_url(str(workdir))
    if is_url(str(workdir)):
        raise UsageError(
            f"{command} --workdir {workdir}: give the local side of the workdir "
            "URL on this node instead (summary.json's local_side, train.stage_dir)"
        )


def _same_place(workdir: str, input_dir: str) -> bool:
    if is_url(workdir) or is_url(input_dir):
        return workdir.rstrip("/") == input_dir.rstrip("/")
    return Path(workdir).resolve() == Path(input_dir).resolve()


def validate(config: PipelineConfig) -> None:
    if not config.stages:
        raise UsageError(f"--stages names no stage; stages are {', '.join(STAGES)}")
    unknown = [s for s in config.stages if s not in STAGES]
    if unknown:
        raise UsageError(f"unknown stage(s) {', '.join(unknown)}; stages are {', '.join(STAGES)}")
    _check_locations(config)
    if config.input and _same_place(str(config.workdir), str(config.input)):
        # (a workdir inside the input is fine: only the files directly in it are input)
        raise UsageError(
            f"--workdir {config.workdir} is the --input directory: the run's own "
            "files (summary.json, the lock) would sit among the day files and change "
            "the input on every run; use a subdirectory or another directory"
        )
    if config.launch.hosts:
        horovodrun_hosts(config.launch.hosts, config.launch.np)  # refuses a bad list or np
    if config.train.init == "previous" and not config.preprocess.mode.grows_tables:
        # ids by frequency move every day even when no table shrinks: the previous model's
        # rows would meet other values, and nothing in the sizes would tell
        raise UsageError(
            "train.init: previous needs preprocess.ids: stable (with ids by "
            "frequency a new day may move every id under the previous model's rows)"
        )
    if "score" in config.stages and not config.score.input:
        raise UsageError("the score stage needs --score-input FILE[,FILE...]")
    if "score" in config.stages:
        missing = [p for p in config.score.input if not Path(p).is_file()]
        if missing:
            raise UsageError(f"--score-input: not a file: {', '.join(missing)}")
    if config.spark.conf_file and "preprocess" in config.stages:
        # read here too: a bad file, or a secret in it, is refused before the workdir is touched
        refuse_secret_settings(
            read_conf_file(config.spark.conf_file), f"--conf-file {config.spark.conf_file}"
        )
    if config.spark.auth_secret_file and "preprocess" in config.stages:
        try:  # a missing or world-readable secret file: exit 2 before any stage runs
            read_secret_file(config.spark.auth_secret_file)
        except SecretFileError as exc:
            raise UsageError(f"--spark-secret-file: {exc}") from None
    if "preprocess" in config.stages and is_url(str(config.workdir)):
        # what the Spark job cannot do at a workdir URL (stable ids, the SQL engine): exit 2
        # before the lock is taken or a record written
        from spark_jobs.preprocess import check_url_workdir, engine_name

        check_url_workdir(config.preprocess, engine_name(config.preprocess, config.spark))
    if "preprocess" in config.stages:
        # an unauthenticated or unencrypted master off loopback: exit 2 before any stage runs
        deploy_security(config.spark, config.spark.master, warn=False)


def _plan(args: argparse.Namespace) -> int:
    for item in args.thresholds.split(","):
        parse_threshold_spec(item)  # a bad list is a usage error (exit 2), not a crash

    counts = WorkdirLayout.at(args.workdir).counts
    if not histogram_path(counts).is_file():
        raise UsageError(f"no count histogram in {counts}: run the preprocess stage on this workdir first")
    argv = [
        "plan",
        "--counts",
        str(counts),
        "--thresholds",
        args.thresholds,
        "--embedding-dim",
        str(args.embedding_dim),
    ]
    return converters_main(argv + (["--json"] if args.json else []))


def _preflight(config: PipelineConfig) -> int:
    """The run's preflight alone: its lines on stdout, its figures as the last (JSON) line."""
    est = report(config, print)
    refusal = preflight_failed("; ".join(est.shortfalls)) if est.shortfalls else None
    status = (
        {"status": "ok"} if refusal is None else {"status": f"failed: {refusal.kind}", "error": str(refusal)}
    )
    print(json.dumps({**status, **est.facts}, sort_keys=True), flush=True)
    if refusal is not None:  # here --force has nothing to override: the verdict is the answer
        raise refusal
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0].startswith("-"):
        argv = ["run", *argv]
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse: --help (0) or a bad flag (2, message on stderr)
        if exc.code == ExitCode.USAGE and argv[0] == "run":
            return _print_refusal_summary("bad flags (see stderr)", ExitCode.USAGE)
        raise
    try:
        if args.command == "plan":
            _refuse_url(args.workdir, "plan")
            return _plan(args)
        if args.command == "export":
            workdir = args.workdir or load_config(args.config).workdir
            _refuse_url(workdir, "export")
            return export_command(workdir, args.action, args.version)
        config = load_config(args.config)
        if args.command == "show-config":
            print(yaml.safe_dump(config_to_dict(config), sort_keys=False), end="")
            return 0
        config = apply_flags(config, args)
        validate(config)
        if args.command == "preflight":
            return _preflight(config)
        return run_pipeline(config)
    except PipelineError as exc:  # bad flags or settings, a held lock, a preflight refusal
        return _refused(args, str(exc), exc.code)


def _refused(args: argparse.Namespace, message: str, code: ExitCode) -> int:
    """A run that stops before any stage (bad flags, lock held): the message on stderr and,
    for ``run``, still a one-line JSON summary as the last stdout line, for schedulers."""
    print(f"run_pipeline: {message}", file=sys.stderr)
    if args.command == "run":
        return _print_refusal_summary(message, code)
    return int(code)


def _print_refusal_summary(message: str, code: ExitCode) -> int:
    print(
        json.dumps(
            {"status": f"failed: {code.name.lower()}", "error": message, "stages": {}}, sort_keys=True
        ),
        flush=True,
    )
    return int(code)


if __name__ == "__main__":
    sys.exit(main())
