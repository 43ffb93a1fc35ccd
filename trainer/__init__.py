"""TensorFlow 2 DLRM trained hybrid-parallel with Horovod, fed by the split binary dataset.

One code path serves one process and N ranks: embedding tables live on the rank that owns them
(model parallel), the MLPs are replicated (data parallel) and the two meet through an
``alltoall``. See docs/trainer.md. The modules split the job:

- :mod:`trainer.data`       dataset check, whole-batch reads per rank, threshold clamping, prefetch
- :mod:`trainer.placement`  which rank holds which table (or column slice of a table)
- :mod:`trainer.comm`       the collectives (Horovod, or their one-process identities)
- :mod:`trainer.model`      the DLRM variables, dot interaction, forward pass
- :mod:`trainer.optim`      SGD / Adam and the warm-up + polynomial-decay schedule
- :mod:`trainer.checkpoint` per-rank checkpoints that survive a kill and a change of ranks
- :mod:`trainer.checkpoint_lifecycle` a run's checkpoints: save, retain, restore, set aside
- :mod:`trainer.run_state`  where a run stands, as checkpoints record it
- :mod:`trainer.warm_start` where a run starts: scratch, resume, or the previous model grown
- :mod:`trainer.metrics`    exact ROC AUC and log loss (numpy), metrics log
- :mod:`trainer.run_log`    metrics log, TensorBoard scalars and progress lines (rank 0)
- :mod:`trainer.steps`      the training and prediction step functions
- :mod:`trainer.assembly`   one rank's model, optimizer and step functions, built once
- :mod:`trainer.step_report` the logged step: loss, learning rate, samples/s and ETA
- :mod:`trainer.step_plan`  the steps of a run and the rows of each
- :mod:`trainer.evaluation` predictions, AUC and log loss of a split; the inference rate
- :mod:`trainer.loop`       the training / evaluation / inference-benchmark loops
- :mod:`trainer.serving`    the servable module: line rules, lookups, model, two signatures
- :mod:`trainer.export`     ``--mode export``: checkpoint + dictionaries -> a SavedModel version
- :mod:`trainer.score`      ``python -m trainer.score``: raw files -> scores, streaming
- :mod:`trainer.cli`        ``python -m trainer``
- :mod:`trainer.tf_import`  TensorFlow imported for the command lines, without Keras's optional extras
"""
