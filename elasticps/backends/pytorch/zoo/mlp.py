"""A small multi-layer perceptron in PyTorch for tabular records (float features, integer class
label): the torch twin of the Keras ``mlp``, used by the tests and quick examples."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn


def model(features: int = 8, hidden: int | Sequence[int] = 16, classes: int = 2) -> nn.Module:
    widths = [hidden] if isinstance(hidden, int) else list(hidden)
    layers: list[nn.Module] = []
    width_in = features
    for width in widths:
        layers += [nn.Linear(width_in, width), nn.ReLU()]
        width_in = width
    return nn.Sequential(*layers, nn.Linear(width_in, classes))


def loss(outputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(outputs, labels)


def optimizer(parameters: Any) -> torch.optim.Optimizer:
    return torch.optim.SGD(parameters, lr=0.1)


def eval_metrics_fn() -> dict[str, Any]:
    def accuracy(outputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return (outputs.argmax(dim=-1) == labels).float()

    return {"accuracy": accuracy}
