"""``python -m trainer``: train, evaluate or benchmark the DLRM on a split binary dataset.

Settings come from the ``train`` section of dlrm_contracts/config.py: defaults, then ``--config
YAML``, then the flags below. Launch several ranks with
``horovodrun -np N -H hosts --gloo python -m trainer ...``. The last stdout line (rank 0) is a
one-line JSON summary (test and validation AUC among it); progress goes to stderr.
Exit codes are the pipeline's (dlrm_contracts.errors): 2 bad flags or settings, 3 the
workdir in use by another run (every mode holds its lock, dlrm_contracts.lock), 7 a dataset
that does not verify, 8/9/10 a checkpoint or export that fails in train/eval/export mode, 1 a
bug (with its traceback).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from dlrm_contracts.atomic import write_text_atomic
from dlrm_contracts.config import (
    INIT_OPTIMIZERS,
    INTERACTIONS,
    LEARNING_RATE_SCALINGS,
    OPTIMIZERS,
    ROW_L2_SCALINGS,
    TRAIN_DAYS,
    TRAIN_INITS,
    TrainConfig,
    flag_overrides,
    load_config,
)
from dlrm_contracts.errors import ExitCode, UsageError, failing_as, run_cli
from dlrm_contracts.layout import WorkdirLayout
from dlrm_contracts.lock import workdir_lock

# What a known failure of a mode (an unreadable or incompatible checkpoint, an export that
# cannot be made) exits with: the pipeline stage that runs the mode.
MODE_FAILURE = {
    "train": ExitCode.TRAIN,
    "eval": ExitCode.EVAL,
    "inference_benchmark": ExitCode.TRAIN,
    "export": ExitCode.EXPORT,
}


def _bool(text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"{text!r} is not a boolean")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m trainer", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--dataset", required=True, help="split binary dataset (DIR/binary)")
    p.add_argument("--workdir", required=True, help="pipeline workdir: checkpoints/ and logs/ go here")
    p.add_argument(
        "--mode",
        default="train",
        choices=list(MODE_FAILURE),
        help="export: the run's checkpoint + dictionaries -> a new version DIR/export/<N> (one process)",
    )
    p.add_argument("--config", help="YAML file with a 'train' section")
    p.add_argument("--preset", choices=["default", "small"])
    p.add_argument("--embedding-dim", type=int)
    p.add_argument("--bottom-mlp", help="comma-separated layer sizes, e.g. 512,256,128")
    p.add_argument("--top-mlp", help="comma-separated layer sizes ending in 1")
    p.add_argument(
        "--wide",
        type=_bool,
        metavar="BOOL",
        help="a per-id scalar weight per table summed into the logit (train.wide)",
    )
    p.add_argument(
        "--interaction",
        choices=list(INTERACTIONS),
        help="dot products, or DCNv2's low-rank cross layers (train.interaction)",
    )
    p.add_argument("--dcn-layers", type=int, help="cross layers with --interaction dcn")
    p.add_argument("--dcn-rank", type=int, help="their rank with --interaction dcn")
    p.add_argument("--batch-size", type=int, help="global batch over all ranks")
    p.add_argument("--eval-batch-size", type=int)
    p.add_argument("--epochs", type=int)
    p.add_argument("--max-steps", type=int, help="stop after this many steps in total")
    p.add_argument("--optimizer", choices=list(OPTIMIZERS))
    p.add_argument(
        "--learning-rate",
        "--lr",
        type=float,
        dest="learning_rate",
        help="the rate at a global batch of learning_rate_batch (1024 by default)",
    )
    p.add_argument(
        "--learning-rate-scaling",
        choices=list(LEARNING_RATE_SCALINGS),
        help="how the rate follows the global batch (default sqrt)",
    )
    p.add_argument(
        "--table-l2",
        type=float,
        help="L2 on the embedding rows a step looks up, on the summed train loss (train.table_l2)",
    )
    p.add_argument(
        "--wide-l2",
        type=float,
        help="L2 on the wide weights a step looks up, on the summed train loss: a "
        "logistic regression's 1/C (train.wide_l2)",
    )
    p.add_argument(
        "--row-l2-scaling",
        choices=list(ROW_L2_SCALINGS),
        help="none, or inverse_frequency: the row L2 divided by the row's batch "
        "presence (train.row_l2_scaling)",
    )
    p.add_argument(
        "--wide-learning-rate-factor",
        type=float,
        help="the wide weights' rate over the schedule's (train.wide_learning_rate_factor)",
    )
    p.add_argument("--warmup-steps", type=int)
    p.add_argument("--decay-start-step", type=int)
    p.add_argument("--decay-steps", type=int)
    p.add_argument("--evals-per-epoch", type=int)
    p.add_argument(
        "--early-stopping-patience",
        type=int,
        help="validation evaluations without a better AUC before stopping (0 = off)",
    )
    p.add_argument(
        "--early-stopping-min-delta",
        type=float,
        help="validation AUC changes this small neither reset nor spend the patience "
        "(train.early_stopping_min_delta)",
    )
    p.add_argument("--amp", action="store_const", const=True)
    p.add_argument("--xla", action="store_const", const=True)
    p.add_argument("--bottom-mlp-data-parallel", type=_bool, metavar="BOOL")
    p.add_argument("--column-split-threshold-mb", type=float)
    p.add_argument("--force-column-split", help="comma-separated columns, e.g. C3,C20")
    p.add_argument("--seed", type=int)
    p.add_argument("--shuffle-batches", type=_bool, metavar="BOOL")
    p.add_argument("--checkpoint-every", type=int)
    p.add_argument("--keep-checkpoints", type=int)
    p.add_argument("--no-resume", dest="resume", action="store_const", const=False)
    p.add_argument(
        "--init",
        choices=list(TRAIN_INITS),
        help="a new run starts from scratch or from the workdir's previous model "
        "(tables grown; docs/trainer.md, 'Warm start')",
    )
    p.add_argument(
        "--init-optimizer",
        choices=list(INIT_OPTIMIZERS),
        help="with --init previous: continue the optimizer state and schedule, or "
        "restart them (weights only)",
    )
    p.add_argument(
        "--days",
        choices=list(TRAIN_DAYS),
        help="train on the whole window, or (with --init previous) only on the train "
        "days the previous model has not seen (docs/trainer.md, 'Warm start')",
    )
    p.add_argument("--frequency-threshold", help="read the dataset at this higher threshold")
    p.add_argument("--counts-dir", help="counts for --frequency-threshold (default WORKDIR/counts)")
    p.add_argument("--verify-dataset", choices=["quick", "full", "none"])
    p.add_argument("--log-every", type=int)
    p.add_argument("--inference-steps", type=int)
    p.add_argument("--intra-op-threads", type=int)
    p.add_argument("--inter-op-threads", type=int)
    return p


def _list(text: str | None, kind=int) -> list | None:
    return None if text is None else [kind(x) for x in text.split(",") if x.strip()]


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    return flag_overrides(
        load_config(args.config).train,
        args,
        bottom_mlp=_list(args.bottom_mlp),
        top_mlp=_list(args.top_mlp),
        force_column_split=_list(args.force_column_split, str.strip),
    )


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    return run_cli("trainer", lambda: _run(args))


def _run(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    with _workdir_lock(args):
        return _run_locked(args, config)


def _workdir_lock(args: argparse.Namespace):
    """The workdir's lock, for every mode (each writes into the workdir). Rank 0 takes it
    for the job (under the pipeline, as a guest of the pipeline's lock); the other ranks run
    under rank 0's. They never take it themselves: with a token in their environment that is
    not the holder's (one a parent left behind), they would be refused by their own rank 0."""
    from contextlib import nullcontext

    if _rank() != 0:
        return nullcontext()
    return workdir_lock(args.workdir, f"trainer --mode {args.mode}")


def _run_locked(args: argparse.Namespace, config: TrainConfig) -> int:
    from trainer.data import open_dataset

    # The dataset check runs before TensorFlow is even imported: bad input fails fast.
    open_dataset(
        args.dataset,
        threshold=config.frequency_threshold,
        counts_dir=config.counts_dir or WorkdirLayout.at(args.workdir).counts,
        verify=config.verify_dataset,
    )
    from trainer.checkpoint import CheckpointError
    from trainer.tf_import import import_tensorflow

    import_tensorflow()  # before the modules below import it, so that it comes in lean
    from trainer.export import ExportError
    from trainer.loop import nan_to_none, run

    with failing_as(MODE_FAILURE[args.mode], CheckpointError, ExportError):
        if args.mode == "export":
            summary = _export(args)
        else:
            summary = run(
                config,
                Path(args.dataset),
                Path(args.workdir),
                mode=args.mode,
                eval_speedup=load_config(args.config).preflight.eval_speedup,
            )
    if summary is not None and _rank() == 0:
        line = json.dumps(nan_to_none(summary))
        # horovodrun prefixes every forwarded line with "[0]<stdout>:", so the summary is also
        # left in a file for whoever launched the run.
        logs = WorkdirLayout.at(args.workdir).logs
        logs.mkdir(parents=True, exist_ok=True)
        write_text_atomic(logs / f"summary_{args.mode}.json", line + "\n")
        print(line, flush=True)
    return 0


def _export(args: argparse.Namespace) -> dict:
    import os

    if int(os.environ.get("HOROVOD_SIZE", "1")) > 1:
        raise UsageError(
            "--mode export runs in one process (it reads every rank's checkpoint "
            "files); start it without horovodrun"
        )
    from trainer.export import export_model

    return export_model(args.workdir, args.dataset, load_config(args.config).export)


def _rank() -> int:
    import os

    return int(os.environ.get("HOROVOD_RANK", "0"))
