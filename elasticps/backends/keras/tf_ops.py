"""TensorFlow ops on Keras's symbolic tensors, as Keras 2 took them: a model module written for
``tf.keras`` 2 builds its functional model with ``tf.reshape``, ``tf.sigmoid`` or
``tf.keras.backend.sum`` applied to the ``keras.Input`` tensors themselves (ElasticDL's DeepFM
modules among them). Keras 3 refuses that ("A KerasTensor cannot be used as input to a TensorFlow
function"); Keras 2 wrapped each such op in a layer of its own.

So does this module, for Keras 3 on TensorFlow: :class:`KerasTensorOps`, a TensorFlow op
dispatcher (TensorFlow asks it when an op's arguments are not tensors it can convert), makes a
:class:`TensorFlowOp` layer of each TensorFlow API called with a symbolic tensor among its
arguments, and calls it on those tensors. The layer runs the op on real tensors (so gradients flow
as through the op itself), and saves as the op's public TensorFlow name and its other arguments,
so ``model.keras`` loads wherever this module is importable (``import
elasticps.backends.keras.layers`` registers it, as it does elasticps's ``Embedding``). An op with
an argument that cannot be written to a config (a Python object, a function) still builds and
trains; only its save says which op and why.

Registered once per process by :func:`register` (``layers.py`` calls it on import): it answers only
for calls that would otherwise fail, so any other TensorFlow call is untouched.
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
import tensorflow as tf
from keras.src.utils.naming import auto_name
from tensorflow.python.util import dispatch
from tensorflow.python.util.tf_export import get_canonical_name_for_symbol

_TENSOR, _DTYPE, _ARRAY = "__tensor__", "__dtype__", "__array__"


class _Slot:
    """Where a symbolic tensor was in an op's arguments: the ``index``-th of the layer's inputs."""

    def __init__(self, index: int) -> None:
        self.index = index


def _symbol(name: str) -> Any:
    """The TensorFlow API ``name`` names (``math.reduce_sum``: ``tf.math.reduce_sum``)."""
    found: Any = tf
    for part in name.split("."):
        found = getattr(found, part, None)
        if found is None:
            raise ValueError(f"TensorFlow has no API tf.{name}")
    return found


def _encode(value: Any, op: str) -> Any:
    """An argument as a config value (JSON)."""
    if isinstance(value, _Slot):
        return {_TENSOR: value.index}
    if isinstance(value, tf.dtypes.DType):
        return {_DTYPE: value.name}
    if isinstance(value, tf.TensorShape):
        return value.as_list()
    if isinstance(value, tf.Tensor) and not isinstance(value, keras.KerasTensor) and hasattr(value, "numpy"):
        value = value.numpy()  # a constant (tf.constant): its values
    if isinstance(value, np.ndarray):
        return {_ARRAY: value.tolist(), _DTYPE: str(value.dtype)}
    if isinstance(value, np.generic):
        return value.item()
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_encode(v, op) for v in value]
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {k: _encode(v, op) for k, v in value.items()}
    raise ValueError(f"tf.{op} on a symbolic tensor cannot be saved: its argument {value!r} "
                     f"({type(value).__name__}) has no config form")  # fmt: skip


def _decode(value: Any) -> Any:
    """A config value as the argument it was (a tensor's place as its :class:`_Slot`)."""
    if isinstance(value, dict) and _TENSOR in value:
        return _Slot(int(value[_TENSOR]))
    if isinstance(value, dict) and _ARRAY in value:
        return np.asarray(value[_ARRAY], dtype=value[_DTYPE])
    if isinstance(value, dict) and _DTYPE in value:
        return tf.as_dtype(value[_DTYPE])
    if isinstance(value, list):
        return [_decode(v) for v in value]
    if isinstance(value, dict):
        return {k: _decode(v) for k, v in value.items()}
    return value


def _fill(value: Any, tensors: list[Any]) -> Any:
    """``value`` with each :class:`_Slot` replaced by its tensor."""
    if isinstance(value, _Slot):
        return tensors[value.index]
    if isinstance(value, (list, tuple)):
        return type(value)(_fill(v, tensors) for v in value)
    if isinstance(value, dict):
        return {k: _fill(v, tensors) for k, v in value.items()}
    return value


def _slots(value: Any, tensors: list[Any]) -> Any:
    """``value`` with each symbolic tensor replaced by a :class:`_Slot`, appended to ``tensors``."""
    if isinstance(value, keras.KerasTensor):
        tensors.append(value)
        return _Slot(len(tensors) - 1)
    if isinstance(value, (list, tuple)):
        return type(value)(_slots(v, tensors) for v in value)
    if isinstance(value, dict):
        return {k: _slots(v, tensors) for k, v in value.items()}
    return value


@keras.saving.register_keras_serializable(package="elasticps")
class TensorFlowOp(keras.layers.Layer):  # type: ignore[misc]  # Keras is untyped
    """One TensorFlow API call in a functional model: ``symbol`` (its public name, e.g.
    ``math.reduce_sum``) called with ``args`` and ``kwargs``, in which :class:`_Slot` s stand for
    the layer's inputs (a list of tensors, in order)."""

    def __init__(self, symbol: str, args: Any = (), kwargs: Any = None, **base: Any) -> None:
        base.setdefault("name", auto_name("tf_" + symbol.replace(".", "_")))
        base.setdefault("autocast", False)  # the op's dtypes are its arguments', as in TensorFlow
        super().__init__(**base)
        self.symbol = symbol
        self.op = _symbol(symbol)
        self.op_args = list(args)
        self.op_kwargs = dict(kwargs or {})

    def call(self, tensors: list[Any]) -> Any:
        return self.op(*_fill(self.op_args, list(tensors)), **_fill(self.op_kwargs, list(tensors)))

    def compute_output_spec(self, tensors: list[Any]) -> Any:
        """The op traced on placeholders of its inputs; where that fails on an input Keras marks
        sparse, traced again with it dense: Keras 3 marks ``0.5 * x`` sparse (a Python number
        counts as sparse in its multiply), and the tensor there is dense."""
        try:
            return super().compute_output_spec(tensors)
        except (TypeError, ValueError):
            if not any(getattr(t, "sparse", False) for t in tensors):
                raise
        dense = [keras.KerasTensor(t.shape, t.dtype) if getattr(t, "sparse", False) else t for t in tensors]
        return super().compute_output_spec(dense)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "symbol": self.symbol,
                "args": _encode(self.op_args, self.symbol), "kwargs": _encode(self.op_kwargs, self.symbol)}  # fmt: skip

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> TensorFlowOp:
        config = dict(config)
        args, kwargs = _decode(config.pop("args")), _decode(config.pop("kwargs"))
        return cls(args=args, kwargs=kwargs, **config)


class KerasTensorOps(dispatch.GlobalOpDispatcher):  # type: ignore[misc]  # TensorFlow is untyped
    """Answers a TensorFlow op called with a symbolic Keras tensor among its arguments with a
    :class:`TensorFlowOp` layer called on them; any other call is not its to answer."""

    def handle(self, op: Any, args: Any, kwargs: Any) -> Any:
        tensors: list[Any] = []
        held_args, held_kwargs = _slots(list(args), tensors), _slots(dict(kwargs), tensors)
        if not tensors:
            return self.NOT_SUPPORTED
        symbol = get_canonical_name_for_symbol(op)
        if symbol is None:  # an op TensorFlow does not export: nothing to save it by
            return self.NOT_SUPPORTED
        return TensorFlowOp(symbol, held_args, held_kwargs)(tensors)


_REGISTERED: list[KerasTensorOps] = []


def register() -> None:
    """Registers :class:`KerasTensorOps` with TensorFlow, once per process."""
    if not _REGISTERED:
        dispatcher = KerasTensorOps()
        dispatcher.register()
        _REGISTERED.append(dispatcher)

