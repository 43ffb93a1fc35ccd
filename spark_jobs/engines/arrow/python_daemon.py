"""Spark's Python daemon (``pyspark.daemon``) with the Arrow engine's compiled loops loaded
before it forks the Python workers.

Without it, every worker imports numba and loads the loops' machine code from its cache itself,
once per run and worker: the same work spent again by every worker. Forked from a daemon that
did it once, the workers start with them in memory. Local mode only (``spark_jobs.session``): a
cluster's executors start their daemon before the job's code reaches them.
"""

from __future__ import annotations

from pyspark import daemon


def _load_kernels() -> None:
    try:
        from spark_jobs.engines.arrow.kernels import warm_up

        warm_up()
    except Exception:  # noqa: BLE001 - the workers then load them on first use, as on a cluster
        pass


if __name__ == "__main__":
    _load_kernels()
    daemon.manager()
