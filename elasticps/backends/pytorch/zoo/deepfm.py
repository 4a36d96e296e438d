"""DeepFM (Guo et al., 2017) for click-through rate in PyTorch: the same network as the Keras
``deepfm``, one embedding id per field in, a click logit out.

Records are the ``criteo`` reader's: 39 int64 ids (13 bucketed counts, 26 categoricals) and a 0/1
label. Three parts share the ids: a linear term (a 1-wide embedding per id, summed, plus a bias),
the factorisation machine's pairwise interactions of the ``dim``-wide embeddings
(``0.5 * ((sum e)^2 - sum e^2)``, summed over the width), and an MLP on the same embeddings
concatenated. The embeddings are ``elasticps.backends.pytorch.layers.Embedding`` tables: on the
PS in a job, every id of every field in one table.

Metrics: ``eval_metrics_fn`` gives the accuracy at 0.5 per record (the job's ``loss`` is the log
loss); ``eval_set_metrics_fn`` the AUC over an evaluation task's records at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from elasticps.api.metrics import auc
from elasticps.backends.pytorch.layers import Embedding

FIELDS = 39


class DeepFM(nn.Module):
    def __init__(self, dim: int, hidden: Sequence[int], fields: int, local_rows: int, seed: int, id_space: int) -> None:
        super().__init__()
        if isinstance(id_space, bool) or not isinstance(id_space, int) or id_space < 0:
            raise ValueError(f"id_space {id_space!r} must be an integer >= 0")
        self.id_space = id_space
        self.linear = Embedding("deepfm_linear", 1, initializer="zeros", seed=seed, local_rows=local_rows)
        self.factors = Embedding("deepfm_factors", dim, seed=seed, local_rows=local_rows)
        self.bias = nn.Parameter(torch.zeros(1))
        layers: list[nn.Module] = []
        width = fields * dim
        for out in hidden:
            layers += [nn.Linear(width, out), nn.ReLU()]
            width = out
        layers.append(nn.Linear(width, 1))
        self.deep = nn.Sequential(*layers)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        keys = torch.remainder(ids, self.id_space) if self.id_space > 0 else ids
        first = self.linear(keys).sum(dim=(1, 2)) + self.bias  # (n,)
        e = self.factors(keys)  # (n, fields, dim)
        pairs = 0.5 * (e.sum(dim=1) ** 2 - (e**2).sum(dim=1)).sum(dim=1)  # (n,)
        deep = self.deep(e.flatten(1)).squeeze(1)  # (n,)
        logit: torch.Tensor = (first + pairs + deep)[:, None]  # (n, 1)
        return logit


def model(dim: int = 16, hidden: int | Sequence[int] = (200, 200), fields: int = FIELDS, local_rows: int = 1 << 18,
          seed: int = 0, id_space: int = 0) -> nn.Module:  # fmt: skip
    """``id_space`` > 0: the ids are taken modulo it first (a table of that many possible ids, as
    a hashed feature column with that many buckets); 0: the reader's 64-bit ids as they are."""
    return DeepFM(dim, [hidden] if isinstance(hidden, int) else list(hidden), fields, local_rows, seed, id_space)


def loss(outputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return nn.functional.binary_cross_entropy_with_logits(outputs.reshape(-1), labels.reshape(-1).float())


def optimizer(parameters: Any) -> torch.optim.Optimizer:
    return torch.optim.Adam(parameters, lr=0.001)


def feed(features: np.ndarray, labels: np.ndarray | None, mode: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    ids = torch.from_numpy(np.asarray(features, dtype=np.int64))
    return ids, None if labels is None else torch.from_numpy(np.asarray(labels, dtype=np.float32).reshape(-1))


def eval_metrics_fn() -> dict[str, Any]:
    def accuracy(outputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return ((outputs.reshape(-1) > 0).float() == labels.reshape(-1)).float()

    return {"accuracy": accuracy}


def eval_set_metrics_fn() -> dict[str, Any]:
    return {"auc": lambda outputs, labels: auc(labels, outputs)}
