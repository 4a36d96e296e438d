"""bench.elasticdl_zoo's rewrite of ElasticDL's import lines: those lines and nothing else."""

from __future__ import annotations

from bench.elasticdl_zoo import rewritten

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
