"""Parquet from spark_jobs → the split binary dataset the trainer reads; new thresholds without
Spark; a threshold planner. Never imports TensorFlow, Horovod or pyspark.

Python API: ``converters.convert.convert_parquet``, ``converters.verify.verify_dataset``,
``converters.rethreshold.rethreshold``, ``converters.counts.read_histogram``,
``converters.planner.plan``. CLI: ``python -m converters {convert,verify,rethreshold,plan}``.
"""
