"""The type checker's proof that both engines keep the ``Engine`` contract (spark_jobs.engine).

The contract is structural and the engines never import it, so nothing at run time ties a
method's signature in ``ArrowEngine`` or ``SqlEngine`` to the Protocol's, and the job's own
module, which makes the engine, is not yet checked strictly: a drifted signature would show only
when a real run calls it. Each function here makes an engine as the job does
(``Engine(session, days, cfg)``) and hands it on as an ``Engine``, so mypy (run_tests.sh, strict
on this module) fails when an engine's constructor, or any method or attribute the Protocol
names, no longer matches; its notes name the member and both signatures.

The product never calls these functions; they exist to be type checked (and importing the
module, like the engines', starts no JVM).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from spark_jobs.engines.arrow.engine import ArrowEngine
from spark_jobs.engines.sql.engine import SqlEngine

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from dlrm_contracts.config import PreprocessConfig
    from spark_jobs.engine import Engine
    from spark_jobs.inputs import DayFile


def arrow_engine(session: SparkSession, days: list[DayFile], cfg: PreprocessConfig) -> Engine:
    """ArrowEngine, made and held as the job makes and holds its engine."""
    return ArrowEngine(session, days, cfg)


def sql_engine(session: SparkSession, days: list[DayFile], cfg: PreprocessConfig) -> Engine:
    """SqlEngine, made and held as the job makes and holds its engine."""
    return SqlEngine(session, days, cfg)
