"""PySpark preprocessing of Criteo-format day files: counts, dictionaries, parquet splits.

Entry points: ``python -m spark_jobs ...`` / ``spark-submit spark_jobs/main.py ...`` (the CLI in
:mod:`spark_jobs.cli`) and :func:`spark_jobs.preprocess.run_preprocess` (the Python API the
pipeline calls). Never imports TensorFlow or Horovod.
"""
