"""The torch backend's tests (``tests/backends/pytorch``), run by pytest in a process of their own:
TensorFlow, which the Keras tests load into this process, and torch cannot share one (each brings
its own LLVM; the second aborts the process). A worker never holds both."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
def test_the_torch_backends_tests_pass_in_a_process_of_their_own() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(HERE / "pytorch")],
        capture_output=True, text=True, timeout=900, cwd=HERE.parents[1],
        env={**os.environ, "ELASTICPS_TORCH_TESTS": "1"},
    )  # fmt: skip
    print(done.stdout.strip().splitlines()[-1])
    assert done.returncode == 0, done.stdout[-5000:] + done.stderr[-2000:]
    assert re.search(r"\b\d+ passed\b", done.stdout) and "skipped" not in done.stdout.splitlines()[-1], done.stdout[-500:]
