"""The task queue of a job (todo / doing / done), pure and clock-injected, one module per task kind.

``base.py`` holds the values every kind shares (tasks, settings, progress, ids), ``queue.py`` the
queue's mechanics (who holds what, the failure rules, the order tasks are handed out in, the
ledger a journal keeps), and ``training.py``, ``evaluation.py``, ``export.py`` and
``prediction.py`` the state and rules of each kind.
"""
