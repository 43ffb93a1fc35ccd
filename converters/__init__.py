"""Parquet from spark_jobs → the split binary dataset the trainer reads; new thresholds without
Spark; a threshold planner. Never imports TensorFlow, Horovod or pyspark.

Python API: ``converters.api.convert_workdir`` (the convert stage's decisions),
``converters.convert.convert_parquet``, ``dlrm_contracts.verify.verify_dataset``,
``converters.rethreshold.rethreshold``, ``dlrm_contracts.table_sizes.read_histogram``,
``converters.planner.plan``. CLI: ``python -m converters {convert,verify,rethreshold,plan}``.
"""
