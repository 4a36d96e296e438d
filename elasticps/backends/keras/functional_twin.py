"""The functional twin of a subclassed Keras model: its ``call`` traced on symbolic inputs shaped as
a sample of records, so that the model's own layers (the same objects, their weights shared) form a
functional graph. Keras 3 rebuilds a functional model from its config alone, so the twin's
``model.keras`` loads with plain ``keras.models.load_model`` in a fresh process, where the subclass
cannot (Keras imports no class outside its own packages: ``Could not locate class``).

Caller: the Keras trainer's export (``trainer.py``), when the proof (``export_proof.py``) finds the
model itself does not load; the twin is proven the same way before it is kept. A ``call`` that
runs what a symbolic tensor cannot take (a TensorFlow op on its inputs, Python branching on values)
has no twin: :func:`functional_twin` returns why, and the export keeps ``saved_model/`` alone.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import numpy as np


def is_subclassed(model: Any) -> bool:
    """Whether ``model`` is a subclass of ``keras.Model`` of its own (not a functional or
    ``Sequential`` model, which Keras rebuilds from their configs)."""
    import keras
    from keras.src.models.functional import Functional

    return isinstance(model, keras.Model) and not isinstance(model, (Functional, keras.Sequential))


def symbolic_inputs(sample: Any) -> Any:
    """``keras.Input`` tensors shaped and typed as a batch of records (a mapping: one per name)."""
    import keras

    def one(array: Any, name: str | None) -> Any:
        value = np.asarray(array)
        return keras.Input(shape=value.shape[1:], dtype=str(value.dtype), name=name)

    if isinstance(sample, Mapping):
        return {name: one(value, name) for name, value in sample.items()}
    return one(sample, None)


def functional_twin(model: Any, sample: Any) -> tuple[Any, str]:
    """``(twin, "")``: a functional model of ``model``'s layers computing what ``model(x,
    training=False)`` does, or ``(None, why)`` where its ``call`` cannot be traced."""
    import keras

    inputs = symbolic_inputs(sample)
    takes_training = "training" in inspect.signature(model.call).parameters
    try:
        outputs = model.call(inputs, training=False) if takes_training else model.call(inputs)
        twin = keras.Model(inputs, outputs, name=model.name)
    except Exception as err:  # what a symbolic tensor cannot take: any error of the user's code
        first = (f"{type(err).__name__}: {err}".strip().splitlines() or ["unknown"])[0]
        return None, f"its call cannot be traced on symbolic inputs ({first[:200]})"
    return twin, ""
