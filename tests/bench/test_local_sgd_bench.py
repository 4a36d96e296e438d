"""bench.local_sgd's verdict: medians per system and the issue's two targets."""

from __future__ import annotations

from typing import Any

import pytest

from bench.local_sgd import verdict


def figures(accuracy: float, moved: int, wall: float = 60.0) -> dict[str, Any]:
    return {"test_accuracy": accuracy, "tensor_bytes_epoch2": moved, "wall_s": wall}


def test_medians_and_both_targets_met() -> None:
    runs = {
        "sync": [figures(0.986, 4000), figures(0.988, 4100), figures(0.984, 3900)],
        "localsgd4": [figures(0.983, 1000), figures(0.990, 1050), figures(0.985, 990)],
    }
    got = verdict(runs)
    assert got["medians"]["sync"]["test_accuracy"] == 0.986
    assert got["accuracy_gap"] == pytest.approx(0.001)
    assert got["bytes_ratio_epoch2"] == pytest.approx(1000 / 4000)
    assert got["accuracy_ok"] and got["bytes_ok"]


def test_each_target_can_be_missed() -> None:
    got = verdict({"sync": [figures(0.99, 4000)], "localsgd4": [figures(0.98, 1300)]})
    assert got["accuracy_gap"] == pytest.approx(0.01) and not got["accuracy_ok"]
    assert got["bytes_ratio_epoch2"] == pytest.approx(0.325) and not got["bytes_ok"]
