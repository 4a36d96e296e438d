"""Click-through metrics over a whole set of records, in numpy: no framework, so a Keras and a
torch model module (``backends/*/zoo/deepfm.py``) report the same figures."""

from __future__ import annotations

from typing import Any

import numpy as np


def auc(labels: Any, scores: Any) -> float:
    """The area under the ROC curve: the chance that a random click scores above a random
    non-click (ties count half), by ranks (Mann-Whitney), in numpy."""
    y = np.asarray(labels).reshape(-1).astype(bool)
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    positives, negatives = int(y.sum()), int((~y).sum())
    if not positives or not negatives:
        raise ValueError("the AUC needs clicks and non-clicks among the labels")
    _, group, counts = np.unique(s, return_inverse=True, return_counts=True)
    ends = np.cumsum(counts)  # the 1-based rank of each distinct score's last copy
    ranks = (ends - (counts - 1) / 2.0)[group]  # ties share their average rank
    return float((ranks[y].sum() - positives * (positives + 1) / 2.0) / (positives * negatives))


def log_loss(labels: Any, logits: Any) -> float:
    y = np.asarray(labels, dtype=np.float64).reshape(-1)
    z = np.asarray(logits, dtype=np.float64).reshape(-1)
    return float(np.mean(np.maximum(z, 0) - z * y + np.log1p(np.exp(-np.abs(z)))))
