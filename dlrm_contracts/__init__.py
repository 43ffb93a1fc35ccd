"""The contracts between the wings of the pipeline: what one writes and another reads.

spark_jobs, converters and trainer import this package and nothing else of the project;
pipeline (the orchestrator) sits on top of all of them. It imports none of the project, nor
pyspark, TensorFlow or Horovod, so any wing can ship it alone (pyproject's [tool.importlinter]
checks that). Its modules:

- :mod:`dlrm_contracts.schema`        the Criteo record: columns, splits
- :mod:`dlrm_contracts.thresholds`    the frequency-threshold spec
- :mod:`dlrm_contracts.layout`        the workdir and every file name the wings share
- :mod:`dlrm_contracts.binary_format` the split binary dataset (files, dtypes, dataset.json)
- :mod:`dlrm_contracts.verify`        the check of a binary dataset before anyone trusts it
- :mod:`dlrm_contracts.table_sizes`   table sizes at a threshold, from the count histogram
- :mod:`dlrm_contracts.config`        the typed configuration sections and their range checks
- :mod:`dlrm_contracts.errors`        failure kinds, exit codes and the one exception-to-exit map
- :mod:`dlrm_contracts.atomic`        all-or-nothing file and directory writes (one fsync policy)
- :mod:`dlrm_contracts.lock`          the workdir's lock, taken by every entry point that writes it
- :mod:`dlrm_contracts.progress`      progress records, their channel, the ETA, the bar and lines
- :mod:`dlrm_contracts.secret_file`   the shared-secret file of an authenticated cluster
"""
