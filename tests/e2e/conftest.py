"""Whole jobs on this machine: real `elasticps run`, real processes, real gRPC, generated data."""

from __future__ import annotations

from pathlib import Path

import pytest

from local_jobs import write_data


@pytest.fixture
def data(tmp_path: Path) -> tuple[Path, Path]:
    return write_data(tmp_path, records=4000)
