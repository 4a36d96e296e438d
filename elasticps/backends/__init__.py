"""Framework backends: what turns a model module into something the worker can train.

``api.py`` is the seam (the :class:`~elasticps.backends.api.Trainer` the training loop drives,
the :class:`~elasticps.backends.api.Backend` a framework provides), ``registry.py`` picks one by
``spec.model.framework``, and ``keras/`` is the one there is. Nothing outside a backend's own
package imports its framework.
"""
