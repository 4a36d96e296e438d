"""bench.elasticdl_zoo's rewrite of ElasticDL's import lines: those lines and nothing else."""

from __future__ import annotations

from bench.elasticdl_zoo import export_summary, rate_segments, report, rewritten, schedule_summary

MODULE = '''import os

import tensorflow as tf

from elasticdl.python.common.constants import MaxComputeConfig, Mode
from elasticdl.python.common.log_utils import default_logger as logger
from elasticdl.python.worker.prediction_outputs_processor import (
    BasePredictionOutputsProcessor,
)
from model_zoo.cifar10.data_parser import parse_data

# from elasticdl.python.common import not_an_import
x = "from elasticdl.python.common import in_a_string"
'''


def test_only_the_elasticdl_import_lines_change_and_they_import_the_same_names() -> None:
    text, changed = rewritten(MODULE)
    assert changed == 5  # two one-line imports and one of three lines
    assert "from elasticps.elasticdl import MaxComputeConfig, Mode\n" in text
    assert "from elasticps.elasticdl import default_logger as logger\n" in text
    assert "from elasticps.elasticdl import (\n    BasePredictionOutputsProcessor,\n)\n" in text
    kept = [line for line in MODULE.splitlines() if not line.startswith(("from elasticdl", "    Base", ")"))]
    assert all(line in text.splitlines() for line in kept)  # every other line as it was
    assert "from elasticdl" not in text.replace("# from elasticdl", "").replace('"from elasticdl', "")


def test_the_report_gives_each_module_its_epochs_and_both_one_process_differences() -> None:
    ran = {"succeeded": True, "accuracy": 0.9, "model_version": 10, "export": "saved"}
    result = {"when": "now", "import_lines_changed": 3, "records": 100, "epochs": 2, "cifar_records": 50, "cifar_epochs": 6,
              "rows": [{"model_def": "a.mnist.m", "data": "mnist", "epochs": 2, "job": ran,
                        "one_process": {"accuracy": 0.8, "updates": 10, "recalibrated": 0.95}},
                       {"model_def": "a.cifar10.m", "data": "cifar10", "epochs": 6, "job": {"succeeded": False}}]}  # fmt: skip
    lines = report(result).splitlines()
    assert "--cifar_records 50 --cifar_epochs 6" in lines[0]
    assert lines[-2] == "| `a.mnist.m` | mnist, 2 | 0.9000 (10 updates) | 0.8000 | +10.0 | 0.9500 | -5.0 | saved | - |"
    assert lines[-1] == "| `a.cifar10.m` | cifar10, 6 | failed | - | - | - | - | - | - |"
    ran["auc"], result["rows"][0]["one_process"]["auc"] = 0.75, 0.74  # type: ignore[index]
    assert "| 0.9000, AUC 0.7500 (10 updates) | 0.8000, AUC 0.7400 | +10.0 |" in report(result).splitlines()[-2]
    ran["learning_rates"] = [[3, 0.1], [5001, 0.01]]
    assert report(result).splitlines()[-4].endswith("| saved | 0.1 (v3-v3), 0.01 (v5001-v5001) |")
    assert report(result).splitlines()[-1] == "![the PS's learning rate by model version](img/elasticdl-zoo-schedule.png)"


def test_the_schedule_column_gives_each_rate_the_versions_it_was_applied_at() -> None:
    points = [[40, 0.1], [16, 0.1], [4990, 0.1], [5010, 0.01], [5620, 0.01], [15020, 0.001]]
    assert rate_segments(points) == [{"rate": 0.1, "first": 16, "last": 4990}, {"rate": 0.01, "first": 5010, "last": 5620},
                                     {"rate": 0.001, "first": 15020, "last": 15020}]  # fmt: skip
    assert schedule_summary(points) == "0.1 (v16-v4990), 0.01 (v5010-v5620), 0.001 (v15020-v15020)"
    assert schedule_summary([]) == "-"
    assert schedule_summary([[1, 0.01], [300, 0.01]]) == "0.01 (v1-v300)"


def test_the_export_column_says_how_model_keras_loads() -> None:
    assert export_summary({"model.keras": {"keras.models.load_model": True, "needs": []}}) == "`model.keras` loads with Keras alone"
    twin = {"keras.models.load_model": True, "needs": [], "functional_twin_of": "CustomModel"}
    assert export_summary({"model.keras": twin}) == "`model.keras` (the functional twin of `CustomModel`) loads with Keras alone"
    needs = {"keras.models.load_model": True, "needs": ["import m"]}
    assert export_summary({"model.keras": needs}) == "`model.keras` loads after `import m`"
    custom = {"keras.models.load_model": True, "needs": ["import m"], "custom_objects": ["ApplyMask"]}
    assert export_summary({"model.keras": custom}) == "`model.keras` loads after `import m` with `custom_objects` `ApplyMask`"
    left = {"model.keras": None, "reason": "TypeError: Could not locate class 'X'."}
    assert export_summary(left) == "`model.keras` left out (TypeError: Could not locate class 'X'.); `saved_model/`"
