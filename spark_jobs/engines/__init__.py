"""The preprocess job's two engines, one subpackage each; neither imports the other.

``spark_jobs.engine.Engine`` is the contract both keep; ``spark_jobs.preprocess`` picks one.
"""
