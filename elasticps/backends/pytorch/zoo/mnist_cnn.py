"""MNIST (or Fashion-MNIST) CNN in PyTorch: the same network as the Keras ``mnist_cnn``
(Conv32-pool-Conv64-pool-Dense128-Dense10, 225k parameters), trained with SGD and momentum 0.9.
Records are 784 uint8 pixels and an integer label."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn


def model(learning_rate: float = 0.05) -> nn.Module:
    del learning_rate  # the optimizer's; accepted so spec.model.params may carry it
    return nn.Sequential(
        nn.Conv2d(1, 32, 3), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 5 * 5, 128), nn.ReLU(), nn.Linear(128, 10),
    )  # fmt: skip


def loss(outputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(outputs, labels)


def optimizer(parameters: Any) -> torch.optim.Optimizer:
    return torch.optim.SGD(parameters, lr=0.05, momentum=0.9)


def feed(features: np.ndarray, labels: np.ndarray | None, mode: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    images = torch.from_numpy(np.asarray(features, dtype=np.float32).reshape(-1, 1, 28, 28) / 255.0)
    return images, None if labels is None else torch.from_numpy(np.asarray(labels, dtype=np.int64))


def eval_metrics_fn() -> dict[str, Any]:
    def accuracy(outputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return (outputs.argmax(dim=-1) == labels).float()

    return {"accuracy": accuracy}
