"""Several ``airflow`` commands in one process of Airflow's own virtualenv (tests/test_airflow_dag.py).

Each command is what ``airflow ARGS`` runs (Airflow's own parser and command function, as its
``__main__`` calls them), so a DAG run is still ``airflow dags test``: the DAG file parsed
afresh, the run made in the metastore, the scheduler's dependency and retry loop. Only the
import of Airflow and the set-up of its settings, which is most of a short command's time, is
paid once for all of them.

Protocol: one JSON object a line on stdin, ``{"args": [...], "env": {...}, "out": PATH}``; the
command runs with ``env`` added to the environment (the AIRFLOW_VAR_* of a run, or a setting the
DAG file reads as it is parsed), its stdout and stderr (the task's log lines and those of the
processes it starts) written to PATH; then one JSON line ``{"returncode": N}`` on stdout.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import traceback


@contextlib.contextmanager
def environment(extra: dict[str, str]):
    """``extra`` set in os.environ for the block, the previous values put back after it."""
    previous = {name: os.environ.get(name) for name in extra}
    os.environ.update(extra)
    try:
        yield
    finally:
        for name, value in previous.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextlib.contextmanager
def output_to(path: str):
    """File descriptors 1 and 2 (this process's and its children's) written to ``path``."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(path, "ab") as out:
        os.dup2(out.fileno(), 1)
        os.dup2(out.fileno(), 2)
    try:
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])


def airflow(args: list[str]) -> int:
    """What ``airflow ARGS`` does after its imports: its exit status."""
    from airflow.__main__ import main

    sys.argv = ["airflow", *args]
    try:
        main()
    except SystemExit as stop:
        code = stop.code
        if code is None:
            return 0
        if isinstance(code, int):
            return code
        print(code, file=sys.stderr)  # what the interpreter prints for a SystemExit("...")
        return 1
    except Exception:  # noqa: BLE001 — what the interpreter does with it: its traceback, exit 1
        traceback.print_exc()
        return 1
    return 0


def serve(reply) -> None:
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        with environment(request.get("env") or {}), output_to(request["out"]):
            code = airflow(request["args"])
        reply.write(json.dumps({"returncode": code}) + "\n")
        reply.flush()


if __name__ == "__main__":
    # The replies go to the original stdout, kept apart from the commands' own output.
    serve(os.fdopen(os.dup(1), "w"))
