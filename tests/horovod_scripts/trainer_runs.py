"""Run under horovodrun: several trainer command lines, one after another, in one launch.

Each command line goes through ``trainer.cli.main``, the very function ``python -m trainer``
runs, so a rank runs what it would run alone; only the process (TensorFlow's import, Horovod's
start and its Gloo rendezvous) is shared by the runs, which is what the tests' launches spent
most of their time on.

argv[1] is a JSON plan ``{"jobs": {name: [argv, ...]}, "results": folder}``. Every rank runs
every job's command lines in order, each one's stdout and stderr captured, and writes
``results/rank-<r>.json``: per job, per command line, its exit code and what it printed. A job
whose command line fails goes no further (its later lines would start from a broken state);
the other jobs still run. The rank exits 1 if any line failed.
"""

import contextlib
import io
import json
import os
import sys
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


def main() -> int:
    plan = json.loads(Path(sys.argv[1]).read_text())
    rank = int(os.environ["HOROVOD_RANK"])
    results: dict[str, list[dict]] = {}
    for name, lines in plan["jobs"].items():
        results[name] = []
        for argv in lines:
            results[name].append(run_line(argv))
            print(f"rank {rank}: {name}: exit {results[name][-1]['returncode']}", flush=True)
            if results[name][-1]["returncode"] != 0:
                break
    folder = Path(plan["results"])
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"rank-{rank}.json").write_text(json.dumps(results))
    failed = any(r["returncode"] != 0 for job in results.values() for r in job)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
