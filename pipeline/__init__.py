"""Orchestration of the Criteo/DLRM pipeline: stages, runner, preflight, reports (the workdir's
lock, which the wings take too, is dlrm_contracts.lock).

The top of the building: it imports the three wings (spark_jobs, converters, trainer) and the
contracts package they share (dlrm_contracts); none of them imports it.
"""
