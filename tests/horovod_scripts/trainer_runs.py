"""Run under horovodrun: several trainer command lines, one after another, in one launch.

Each command line goes through ``trainer.cli.main``, the very function ``python -m trainer``
runs, so a rank runs what it would run alone; only the process (TensorFlow's import, Horovod's
start and its Gloo rendezvous) is shared by the runs, which is what the tests' launches spent
most of their time on.

argv[1] is a JSON plan ``{"jobs": {name: [argv, ...]}, "results": folder}``, with
``"collectives": true`` to run collectives_check.py's checks as the job ``collectives`` (the
build report before the trainer's lines, the collectives after them). Every rank runs every job's command lines in order, each
one's stdout and stderr captured, and writes ``results/rank-<r>.json``: per job, per command
line, its exit code and what it printed. A job whose command line fails goes no further (its
later lines would start from a broken state); the other jobs still run. The rank exits 1 if
any line failed.
"""

import contextlib
import io
import json
import os
import sys
import traceback
from pathlib import Path


def run_line(argv: list[str]) -> dict:
    from trainer.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse's refusals
            code = exc.code if isinstance(exc.code, int) else 2
    return {"argv": argv, "returncode": code, "stdout": out.getvalue(), "stderr": err.getvalue()}


def run_collectives(build: str) -> dict:
    """collectives_check.report() as a line: its report printed as JSON, exit 1 if it raised."""
    import collectives_check

    try:
        return {
            "argv": ["collectives_check"],
            "returncode": 0,
            "stdout": json.dumps(collectives_check.report(build)),
            "stderr": "",
        }
    except Exception:  # noqa: BLE001 - any failure of the checks is this line's exit 1, reported
        return {
            "argv": ["collectives_check"],
            "returncode": 1,
            "stdout": "",
            "stderr": traceback.format_exc(),
        }


def main() -> int:
    plan = json.loads(Path(sys.argv[1]).read_text())
    rank = int(os.environ["HOROVOD_RANK"])
    results: dict[str, list[dict]] = {}
    if plan.get("collectives"):
        import collectives_check

        build = collectives_check.build_report()
    for name, lines in plan["jobs"].items():
        results[name] = []
        for argv in lines:
            results[name].append(run_line(argv))
            print(f"rank {rank}: {name}: exit {results[name][-1]['returncode']}", flush=True)
            if results[name][-1]["returncode"] != 0:
                break
    if plan.get("collectives"):
        results["collectives"] = [run_collectives(build)]
    folder = Path(plan["results"])
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"rank-{rank}.json").write_text(json.dumps(results))
    failed = any(r["returncode"] != 0 for job in results.values() for r in job)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
