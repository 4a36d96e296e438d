"""The Keras backend: TensorFlow and Keras are imported here and nowhere else in elasticps.

``backend.py`` is what the registry hands out (``BACKEND``); ``trainer.py`` the worker's model,
``model_loading.py`` the model contract (ElasticDL's zoo), ``optimizer_spec.py`` the model's
optimizer as the PS's configuration, ``served_tables.py`` and ``layers.py`` embedding tables
served from the PS, ``zoo/`` the example models. Importing this package imports no framework.
"""
