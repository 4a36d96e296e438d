"""ResNet-50 (He et al., 2016; the bottleneck v1.5 layout, 25.6M parameters) as a torch model
module, on synthetic ImageNet-size records: the model of ``bench.gpu_check``.

Written out here because the GPU machines have torch without torchvision. A record is one int64
(its index) and a label in [0, 1000) (``bench.gpu_check.Synthetic`` reads them); ``feed`` makes each record's image on the device the worker
trains on (random uint8 pixels, 3 x 224 x 224, scaled in the model's first step): synthetic data, so
no input pipeline is measured, in the worker and in the run alone alike.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch
from torch import nn

SIZE = 32 if os.environ.get("ELASTICPS_GPU_CHECK_SMALL") else 224  # 32: bench.gpu_check --small, on a CPU
CLASSES = 1000


class Bottleneck(nn.Module):
    def __init__(self, inputs: int, width: int, stride: int) -> None:
        super().__init__()
        out = width * 4
        self.body = nn.Sequential(
            nn.Conv2d(inputs, width, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
            nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
            nn.Conv2d(width, out, 1, bias=False), nn.BatchNorm2d(out),
        )  # fmt: skip
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or inputs != out:
            self.shortcut = nn.Sequential(nn.Conv2d(inputs, out, 1, stride=stride, bias=False), nn.BatchNorm2d(out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y: torch.Tensor = torch.relu(self.body(x) + self.shortcut(x))
        return y


class ResNet50(nn.Module):
    def __init__(self, classes: int = CLASSES) -> None:
        super().__init__()
        layers: list[nn.Module] = [
            nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True),
            nn.MaxPool2d(3, stride=2, padding=1),
        ]  # fmt: skip
        inputs = 64
        for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
            for i in range(blocks):
                layers.append(Bottleneck(inputs, width, stride if i == 0 else 1))
                inputs = width * 4
        layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(inputs, classes)]
        self.net = nn.Sequential(*layers)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        y: torch.Tensor = self.net(pixels.float() / 255.0)
        return y


def model(classes: int = CLASSES) -> nn.Module:
    return ResNet50(classes)


def loss(outputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(outputs, labels)


def optimizer(parameters: Any) -> torch.optim.Optimizer:
    return torch.optim.SGD(parameters, lr=0.1, momentum=0.9)


def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def images(count: int, seed: int = 0) -> torch.Tensor:
    """``count`` synthetic images (uint8, N x 3 x 224 x 224) made on the training device."""
    generator = torch.Generator(device=device()).manual_seed(seed)
    return torch.randint(0, 256, (count, 3, SIZE, SIZE), dtype=torch.uint8, device=device(), generator=generator)


def feed(features: np.ndarray, labels: np.ndarray | None, mode: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    first = int(np.asarray(features).reshape(-1)[0]) if len(features) else 0
    y = None if labels is None else torch.from_numpy(np.asarray(labels, dtype=np.int64).reshape(-1)).to(device())
    return images(len(features), seed=first), y
