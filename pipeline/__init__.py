"""Orchestration of the Criteo/DLRM pipeline: stages, runner, preflight, lock, reports.

The top of the building: it imports the three wings (spark_jobs, converters, trainer) and the
contracts package they share (dlrm_contracts); none of them imports it.
"""
