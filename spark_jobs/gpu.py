"""The RAPIDS Accelerator profile (``--gpu``): the Spark settings that put SQL on GPUs.

Only the configuration is produced here; nothing in this module needs a GPU. The plugin jar is
named by an environment variable (``SparkConfig.gpu_jar_env``) because its version must match
the cluster's CUDA and Spark builds, which only the operator knows.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from dlrm_contracts.config import SparkConfig
from spark_jobs.errors import PreprocessConfigError

RAPIDS_PLUGIN = "com.nvidia.spark.SQLPlugin"


def _discovery_script(spark: SparkConfig) -> str | None:
    if spark.gpu_discovery_script:
        return spark.gpu_discovery_script
    spark_home = os.environ.get("SPARK_HOME")
    if spark_home:
        candidate = Path(spark_home) / "examples/src/main/scripts/getGpusResources.sh"
        if candidate.exists():
            return str(candidate)
    return None


def rapids_jar(spark: SparkConfig, environ: Mapping[str, str] | None = None) -> Path:
    """The plugin jar named by the environment, or a PreprocessConfigError saying how to set it."""
    env = os.environ if environ is None else environ
    value = env.get(spark.gpu_jar_env, "").strip()
    if not value:
        raise PreprocessConfigError(
            f"--gpu needs the RAPIDS Accelerator jar: set {spark.gpu_jar_env} to the path of "
            "rapids-4-spark_2.13-<version>.jar (https://nvidia.github.io/spark-rapids/)"
        )
    jar = Path(value)
    if not jar.is_file():
        raise PreprocessConfigError(f"--gpu: {spark.gpu_jar_env}={value} does not name an existing jar file")
    return jar


def rapids_conf(spark: SparkConfig, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Spark settings enabling the RAPIDS SQL plugin with GPU scheduling and pinned memory."""
    jar = str(rapids_jar(spark, environ))
    conf = {
        "spark.plugins": RAPIDS_PLUGIN,
        "spark.jars": jar,
        "spark.driver.extraClassPath": jar,
        "spark.executor.extraClassPath": jar,
        "spark.rapids.sql.enabled": "true",
        "spark.rapids.sql.concurrentGpuTasks": str(spark.gpu_concurrent_tasks),
        "spark.rapids.memory.pinnedPool.size": spark.gpu_pinned_pool_size,
        "spark.rapids.sql.explain": "NOT_ON_GPU",
        "spark.executor.resource.gpu.amount": str(spark.gpu_per_executor),
        "spark.task.resource.gpu.amount": f"{1.0 / spark.gpu_tasks_per_gpu:g}",
        # Parquet and CSV scans are GPU-accelerated; the raw text is read as lines.
        "spark.sql.files.maxPartitionBytes": "512m",
    }
    script = _discovery_script(spark)
    if script:
        conf["spark.executor.resource.gpu.discoveryScript"] = script
        conf["spark.driver.resource.gpu.discoveryScript"] = script
    return conf
