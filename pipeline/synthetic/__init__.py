"""Synthetic click logs in the Criteo Terabyte layout, with a planted, learnable click model.

``generate(out_dir, config)`` writes the day files and ``generator_meta.json``; see
docs/generator.md. Modules: ``shape`` (what columns look like), ``planted_model`` (true click
probabilities), ``hashing`` (rank → hex value, seeded weights), ``render`` (columns → text),
``source`` (one chunk, reproducibly), ``bayes_auc`` (exact-to-1e-6 streaming AUC),
``writer`` (process pool → day files + metadata).
"""

from pipeline.synthetic.writer import META_FILE, generate

__all__ = ["META_FILE", "generate"]
