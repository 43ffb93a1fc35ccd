"""Orchestration of the Criteo/DLRM pipeline: configuration, workdir layout, stages, reports.

Kept free of heavy imports (Spark, TensorFlow) so that every wing can use its small shared
modules (schema, thresholds, config, layout) without pulling the others in.
"""
