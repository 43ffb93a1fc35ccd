"""TensorFlow imported for the trainer's processes, without the libraries Keras would bring.

``import tensorflow`` imports Keras 3 eagerly (TensorFlow's ``__init__`` loads Keras's
optimizers for their SavedModel registrations), and Keras imports pandas and matplotlib when
they are installed, for its DataFrame input adapter and its image-gallery plots. The trainer
uses neither (its model is a ``tf.Module`` fed from numpy), yet every process that trains,
exports or scores would pay for importing both at start-up.

So the command lines import TensorFlow through :func:`import_tensorflow`, which hides the two
while TensorFlow and Keras import: Keras treats them as not installed, exactly as on a machine
without them (both imports are optional there, in ``try``/``except ImportError``). Nothing
else changes: Keras itself still loads, and once TensorFlow is in, the two are importable
again for whatever asks for them later.
"""

from __future__ import annotations

import sys
from types import ModuleType

# Imported by Keras only when present (its DataFrame adapter, its plots); never used here.
KERAS_OPTIONAL = ("pandas", "matplotlib")


def import_tensorflow() -> ModuleType:
    """``tensorflow``, imported with :data:`KERAS_OPTIONAL` hidden if this process has not
    imported it yet; modules the process already imported are left as they are."""
    if "tensorflow" in sys.modules:
        import tensorflow

        return tensorflow
    hidden = [name for name in KERAS_OPTIONAL if name not in sys.modules]
    for name in hidden:
        sys.modules[name] = None  # type: ignore[assignment]  # an import of it raises ImportError
    try:
        import tensorflow
    finally:
        for name in hidden:
            if sys.modules.get(name, ...) is None:
                del sys.modules[name]
    return tensorflow
