"""What the parameter store refuses, as exceptions the servicer turns into gRPC status codes.

Raised by the tables (``tables.py``) and the store (``store.py``); mapped by ``servicer.py``:
:class:`GradientError` is INVALID_ARGUMENT, :class:`UninitializedError` and :class:`ModelMismatch`
FAILED_PRECONDITION.
"""

from __future__ import annotations


class GradientError(ValueError):
    """A gradient or model the store refuses; nothing was changed."""


class UninitializedError(RuntimeError):
    """The shard holds no model yet: a worker must push one first."""


class ModelMismatch(RuntimeError):
    """A PushModel whose variables or state differ from the model the shard holds; nothing was changed."""
