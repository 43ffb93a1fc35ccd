"""``python -m converters {convert,verify,rethreshold,plan,mlperf-multihot}``.

Exit codes are the pipeline's (dlrm_contracts.errors): 0 success; 2 wrong usage or a bad
threshold spec; 3 the output's directory (the workdir) in use by another run (convert and
rethreshold hold its lock, dlrm_contracts.lock); 6 convert, rethreshold or mlperf-multihot failed on its input (a broken parquet, counts or source
dataset, or a threshold below the source's, which needs a Spark rerun); 7 the dataset does not
verify (verify, plan's counts); 1 a bug (with its traceback). With ``--json`` the last stdout
line is the JSON summary.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

from dlrm_contracts.binary_format import DatasetError
from dlrm_contracts.config import ConvertConfig, flag_overrides, load_config
from dlrm_contracts.errors import ExitCode, UsageError, failing_as, run_cli
from dlrm_contracts.layout import WorkdirLayout
from dlrm_contracts.lock import output_lock
from dlrm_contracts.storage import is_url


def _add_convert_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="pipeline YAML; its 'convert' section is used")
    parser.add_argument("--workers", type=int, help="threads (default: config, 2)")
    parser.add_argument("--batch-rows", type=int, help="rows per record batch / chunk")
    parser.add_argument(
        "--no-progress",
        dest="progress",
        action="store_false",
        default=None,
        help="report no progress (no bar on a terminal, no lines on stderr)",
    )
    parser.add_argument(
        "--no-fsync",
        dest="fsync",
        action="store_false",
        default=None,
        help="skip fsync (faster; atomic against a crash of the process only)",
    )
    parser.add_argument(
        "--keep-existing",
        dest="overwrite",
        action="store_false",
        default=None,
        help="refuse to replace a complete output instead of swapping it",
    )
    parser.add_argument(
        "--copy-unchanged",
        dest="link_unchanged",
        action="store_false",
        default=None,
        help="rethreshold: copy unchanged files instead of hard-linking them",
    )
    parser.add_argument(
        "--full-verify",
        dest="verify_full",
        action="store_true",
        default=None,
        help="scan every value of the result before marking it complete",
    )
    parser.add_argument(
        "--formats", type=_names, help="datasets to write, e.g. binary,mlperf_multihot (convert.formats)"
    )
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")


def _names(text: str) -> list[str]:
    return [name.strip() for name in text.split(",") if name.strip()]


def _sizes(text: str) -> list[int]:
    try:
        return [int(k) for k in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected 26 comma-separated integers, not {text!r}")


def _convert_config(args: argparse.Namespace) -> ConvertConfig:
    return _convert_settings(args)[0]


def _convert_settings(args: argparse.Namespace) -> tuple[ConvertConfig, bool]:
    """The convert section with the flags over it, and whether to keep the parquet (the
    config's preprocess.keep_parquet: false is the lean mode, as in the pipeline): the config
    file read once."""
    config = load_config(args.config)
    return flag_overrides(config.convert, args), config.preprocess.keep_parquet


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m converters", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)

    convert = commands.add_parser("convert", help="parquet -> split binary dataset")
    convert.add_argument(
        "--workdir",
        help="reads WORKDIR/parquet, writes WORKDIR/binary; then removes the parquet splits "
        "when the config says preprocess.keep_parquet: false",
    )
    convert.add_argument("--parquet", help="parquet directory (instead of --workdir)")
    convert.add_argument("--output", help="binary dataset directory (instead of --workdir)")
    convert.add_argument("--threshold-spec", help="override preprocess.json's threshold_spec")
    convert.add_argument(
        "--frequency-threshold",
        help="with --workdir: this threshold as the pipeline's convert stage makes it "
        "(derived from the binary dataset in place when it is a raise of it, a damaged one "
        "rebuilt, else converted and rethresholded), e.g. '15,C3:3'",
    )
    convert.add_argument(
        "--multi-hot-sizes",
        type=_sizes,
        help="ids per row of C1..C26, e.g. MLPerf's 3,2,1,2,6,...; "
        "materialized as the MLPerf DLRMv2 reference does",
    )
    _add_convert_options(convert)

    verify = commands.add_parser("verify", help="check a split binary dataset")
    verify.add_argument("dataset", help="the dataset directory (e.g. DIR/binary)")
    verify.add_argument("--quick", action="store_true", help="metadata and file sizes only")
    verify.add_argument("--workers", type=int, default=ConvertConfig().workers)
    verify.add_argument("--json", action="store_true")

    re = commands.add_parser("rethreshold", help="derive a higher-threshold dataset, no Spark")
    re.add_argument("--source", required=True, help="existing binary dataset (e.g. DIR/binary)")
    re.add_argument("--counts", required=True, help="DIR/counts (holds histogram.parquet)")
    re.add_argument("--frequency-threshold", required=True, help="new spec, e.g. '15,C3:3'")
    re.add_argument("--output", required=True, help="where the new dataset goes")
    _add_convert_options(re)

    mlperf = commands.add_parser(
        "mlperf-multihot", help="the MLPerf DLRMv2 reference's multi-hot layout of a dataset"
    )
    mlperf.add_argument("dataset", help="a complete split binary dataset (e.g. DIR/binary)")
    mlperf.add_argument("--output", help="default: beside it (DIR/mlperf_multihot)")
    _add_convert_options(mlperf)

    stage = commands.add_parser(
        "stage-in",
        help="copy the binary dataset from the workdir URL "
        "to this node's disk once, checked against its checksums",
    )
    stage.add_argument(
        "--source", required=True, help="the dataset's URL or path (e.g. s3://bucket/workdir/binary)"
    )
    stage.add_argument("--target", required=True, help="the local directory it is copied to")
    stage.add_argument("--json", action="store_true")

    plan = commands.add_parser("plan", help="table sizes and memory per threshold, from counts")
    plan.add_argument("--counts", required=True, help="DIR/counts or its histogram.parquet")
    plan.add_argument("--thresholds", default="", help="global thresholds, e.g. 1,2,5,15")
    plan.add_argument(
        "--spec", action="append", default=[], help="a full spec with overrides, e.g. '15,C3:3' (repeatable)"
    )
    plan.add_argument("--embedding-dim", type=int, default=128)
    plan.add_argument("--dtype-bytes", type=int, default=4, help="bytes per embedding weight")
    plan.add_argument("--json", action="store_true")
    return parser


def _print_summary(summary: Any, as_json: bool) -> None:
    if as_json:
        print(json.dumps(summary, default=str))
    else:
        print(json.dumps(summary, indent=2, default=str))


def _run_convert(args: argparse.Namespace) -> int:
    from converters.api import remove_parquet_splits
    from converters.convert import convert_parquet

    if args.frequency_threshold is not None:
        return _run_convert_workdir(args)
    own_workdir = False  # the lean mode applies to a workdir's own parquet and dataset only
    if args.workdir:
        layout = WorkdirLayout.at(args.workdir)
        parquet, output = args.parquet or layout.parquet, args.output or layout.binary
        if is_url(args.workdir) and not args.parquet:
            raise UsageError(
                "convert --workdir URL: the converter reads parquet splits from a "
                "local or shared path; give --parquet DIR (the output may be a URL)"
            )
        output = str(output) if is_url(str(output)) else output
        own_workdir = not (args.parquet or args.output)
    elif args.parquet and args.output:
        parquet, output = args.parquet, args.output
    else:
        raise UsageError("give --workdir DIR, or both --parquet and --output")
    config, keep_parquet = _convert_settings(args)
    lean = own_workdir and not keep_parquet
    with output_lock(output, "converters convert"), failing_as(ExitCode.CONVERT, DatasetError):
        if is_url(str(output)):
            summary = _convert_to_url(parquet, str(output), config, args.threshold_spec)
        else:
            summary = convert_parquet(parquet, output, config, args.threshold_spec)
        removed = remove_parquet_splits(layout) if lean else None
    if removed:
        summary = {**summary, "parquet_removed": removed}
    _print_summary(summary, args.json)
    return 0


def _run_convert_workdir(args: argparse.Namespace) -> int:
    """``convert --workdir DIR --frequency-threshold T``: the convert stage's decision
    (converters.api), made from what the workdir's files say."""
    from converters.api import convert_workdir, request_from_workdir
    from dlrm_contracts.thresholds import parse_threshold_spec

    if not args.workdir or is_url(args.workdir) or args.parquet or args.output or args.threshold_spec:
        raise UsageError(
            "--frequency-threshold needs --workdir DIR (a local path), without --parquet, "
            "--output or --threshold-spec"
        )
    layout = WorkdirLayout.at(args.workdir)
    config, keep_parquet = _convert_settings(args)
    request = request_from_workdir(
        layout, config, parse_threshold_spec(args.frequency_threshold), keep_parquet
    )
    with output_lock(layout.binary, "converters convert"):
        result = convert_workdir(request)
    _print_summary({"action": result.action, "engine": result.engine, **result.summary}, args.json)
    return 0


def _convert_to_url(parquet, output: str, config: ConvertConfig, spec: str | None) -> dict:
    """The dataset written on this machine's disk (the converter writes its columns in place),
    then published at the URL by its commit marker (dlrm_contracts.object_commit). Needs the
    dataset's size in local temporary space; training nodes copy it back with stage-in."""
    import tempfile

    from converters.convert import convert_parquet
    from dlrm_contracts.object_commit import publish_directory
    from dlrm_contracts.storage import resolve

    target = resolve(output)
    with tempfile.TemporaryDirectory(prefix="criteo-binary-") as scratch:
        local = Path(scratch) / "binary"
        summary = convert_parquet(parquet, local, config, spec)
        version = publish_directory(local, target)
    return {**summary, "output": output, "version": version.name}


def _run_verify(args: argparse.Namespace) -> int:
    from dlrm_contracts.verify import verify_dataset

    info = verify_dataset(args.dataset, full=not args.quick, workers=args.workers)
    summary = {
        "dataset": str(info.path),
        "ok": True,
        "mode": "quick" if args.quick else "full",
        **info.to_json(),
    }
    if args.json:
        print(json.dumps(summary))
    else:
        rows = ", ".join(f"{s} {n:,}" for s, n in info.splits.items())
        print(f"{info.path}: OK ({summary['mode']} check; rows: {rows}; threshold {info.threshold_spec})")
    return 0


def _run_rethreshold(args: argparse.Namespace) -> int:
    from converters.rethreshold import rethreshold

    config = _convert_config(args)
    with output_lock(args.output, "converters rethreshold"), failing_as(ExitCode.CONVERT, DatasetError):
        summary = rethreshold(args.source, args.counts, args.frequency_threshold, args.output, config)
    _print_summary(summary, args.json)
    return 0


def _run_mlperf_multihot(args: argparse.Namespace) -> int:
    from converters.mlperf_multihot import output_dir, write_mlperf_multihot

    config = _convert_config(args)
    output = args.output or output_dir(args.dataset)
    with output_lock(output, "converters mlperf-multihot"), failing_as(ExitCode.CONVERT, DatasetError):
        summary = write_mlperf_multihot(args.dataset, output, config)
    _print_summary(summary, args.json)
    return 0


def _run_stage_in(args: argparse.Namespace) -> int:
    from converters.stage_in import stage_in

    with output_lock(args.target, "converters stage-in"), failing_as(ExitCode.DATASET_INVALID, DatasetError):
        summary = stage_in(args.source, args.target)
    _print_summary({"source": args.source, "target": args.target, **summary}, args.json)
    return 0


def _run_plan(args: argparse.Namespace) -> int:
    from converters.planner import format_plan, plan

    if args.embedding_dim < 1 or args.dtype_bytes < 1:
        raise UsageError("--embedding-dim and --dtype-bytes must be at least 1")
    specs = [t.strip() for t in args.thresholds.split(",") if t.strip()] + list(args.spec)
    if not specs:
        raise UsageError("give --thresholds 1,2,5,15 and/or --spec SPEC")
    rows = plan(args.counts, specs, args.embedding_dim, args.dtype_bytes)
    print(json.dumps(rows) if args.json else format_plan(rows))
    return 0


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", stream=sys.stderr)
    args = build_parser().parse_args(argv)
    run = {
        "convert": _run_convert,
        "verify": _run_verify,
        "rethreshold": _run_rethreshold,
        "plan": _run_plan,
        "mlperf-multihot": _run_mlperf_multihot,
        "stage-in": _run_stage_in,
    }[args.command]
    return run_cli(f"converters {args.command}", lambda: run(args))


if __name__ == "__main__":
    sys.exit(main())
