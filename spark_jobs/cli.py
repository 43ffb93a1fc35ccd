"""``python -m spark_jobs`` / ``spark-submit spark_jobs/main.py``: the preprocess command.

Settings: defaults < ``--config YAML`` (sections ``spark`` and ``preprocess``) < flags. On a
known failure the command prints one line ``spark_jobs: error: ...`` and exits with the
pipeline's exit code for that kind (2 usage, 3 the workdir in use by another run, 4 input
data, 5 Spark job). The workdir's lock (dlrm_contracts.lock) is held for the whole job.
"""

from __future__ import annotations

import argparse
import json
from functools import partial

from dlrm_contracts.config import ID_MODES, flag_overrides, load_config
from dlrm_contracts.errors import run_cli
from dlrm_contracts.lock import workdir_lock


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m spark_jobs",
        description="Count, build frequency-thresholded dictionaries and write Criteo parquet splits.",
    )
    p.add_argument(
        "--input",
        required=True,
        help="directory or URL (s3://, gs://, abfs://, hdfs://) of day_0..day_N-1 files (optionally .gz)",
    )
    p.add_argument(
        "--workdir",
        required=True,
        help="output root, a path or URL (counts/, parquet/, rejects/); credentials "
        "from the environment (docs/cluster.md §2.0.3)",
    )
    p.add_argument(
        "--frequency-threshold",
        metavar="SPEC",
        help="global threshold with per-column overrides, e.g. '15,C3:3,C20:40'",
    )
    p.add_argument("--master", help="Spark master URL (default local[2])")
    p.add_argument(
        "--conf", action="append", default=[], metavar="KEY=VALUE", help="extra Spark setting; repeatable"
    )
    p.add_argument("--conf-file", help="spark-defaults style file of extra Spark settings")
    p.add_argument(
        "--gpu", action="store_true", default=None, help="RAPIDS accelerator profile (needs the jar)"
    )
    p.add_argument("--config", help="pipeline YAML config (sections spark, preprocess)")
    p.add_argument("--seed", type=int, dest="shuffle_seed", help="train shuffle seed")
    p.add_argument("--max-reject-rate", type=float, help="fail above this rejected fraction")
    p.add_argument("--driver-memory", help="Spark driver memory (local mode), e.g. 12g")
    p.add_argument(
        "--ids",
        choices=ID_MODES,
        help="frequency: ids by count each run; stable: ids never move across runs; "
        "modulo: hex value modulo preprocess.caps, nothing counted; "
        "contiguous: TorchRec's first-appearance ids (MLPerf DLRMv2's dataset)",
    )
    p.add_argument(
        "--caps",
        type=_caps,
        metavar="N|N1,...,N26",
        help="ids: modulo or contiguous: each column's table size, one for all or 26 (C1..C26)",
    )
    p.add_argument(
        "--window-days",
        type=int,
        metavar="N",
        help="only the newest N day files are the data (default: every day file)",
    )
    p.add_argument(
        "--retransform",
        action="store_true",
        help="stable ids: transform every day of the window again with today's "
        "dictionaries instead of reusing the days already transformed",
    )
    security = p.add_argument_group("cluster security (docs/cluster.md)")
    security.add_argument(
        "--auth-secret-file",
        metavar="FILE",
        help="file (mode 0600) with the authenticated cluster's shared secret",
    )
    security.add_argument(
        "--no-rpc-encryption",
        dest="rpc_encryption",
        action="store_false",
        default=None,
        help="authenticate without encrypting RPC traffic",
    )
    security.add_argument(
        "--io-encryption",
        action="store_true",
        default=None,
        help="encrypt shuffle and spill files (spark.io.encryption.enabled)",
    )
    security.add_argument(
        "--bind-address", metavar="ADDR", help="address the driver and its web UI bind to (SPARK_LOCAL_IP)"
    )
    security.add_argument(
        "--insecure",
        action="store_true",
        default=None,
        help="off loopback: run without authentication and RPC encryption, "
        "driver UI without an authentication filter (spark.insecure)",
    )
    security.add_argument("--ui-admin-users", metavar="U1,U2", help="spark.admin.acls")
    security.add_argument("--ui-view-users", metavar="U1,U2", help="spark.ui.view.acls")
    return p


def _caps(text: str) -> int | list[int]:
    """``--caps 1000`` or ``--caps 40000000,39060,...`` (26); their range is the config's check."""
    try:
        caps = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer or a list of integers") from None
    return caps[0] if len(caps) == 1 else caps


def _users(names: str) -> list[str]:
    return [name.strip() for name in names.split(",") if name.strip()]


def configs_from_args(args: argparse.Namespace):
    """(SparkConfig, PreprocessConfig) from the YAML file and the flags."""
    from spark_jobs.session import parse_conf_pairs

    config = load_config(args.config)
    spark = flag_overrides(
        config.spark,
        args,
        conf={**config.spark.conf, **parse_conf_pairs(args.conf)} if args.conf else None,
        ui_admin_users=_users(args.ui_admin_users) if args.ui_admin_users else None,
        ui_view_users=_users(args.ui_view_users) if args.ui_view_users else None,
    )
    return spark, flag_overrides(config.preprocess, args)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return run_cli("spark_jobs", lambda: _preprocess(args))


def _preprocess(args: argparse.Namespace) -> int:
    spark, preprocess = configs_from_args(args)
    from spark_jobs.preprocess import engine_name, input_tasks, run_preprocess
    from spark_jobs.progress import PreprocessProgress
    from spark_jobs.session import check_spark_config, stop_session

    check_spark_config(spark)  # bad settings: exit 2 before the workdir is touched
    config = load_config(args.config)
    tasks = partial(input_tasks, engine_name(preprocess, spark), cfg=preprocess)
    with workdir_lock(args.workdir, "spark_jobs"):
        try:
            with PreprocessProgress(
                args.input, args.workdir, preprocess, config.progress, tasks, config.preflight.sample_bytes
            ) as progress:
                summary = run_preprocess(
                    args.input,
                    args.workdir,
                    spark,
                    preprocess,
                    retransform=args.retransform,
                    progress=progress,
                )
        finally:
            stop_session()  # inside the lock: the application is part of the job
    print(json.dumps(summary, separators=(",", ":")))
    return 0
