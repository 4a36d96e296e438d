"""The container image for real: built by hack/image/build.sh on a Docker engine, run as a user would.

Skipped, with the reason printed, only where no engine can run (hack/image/engine.sh exits 3).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import yaml

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
TAG = "elasticps:latest"


@pytest.fixture(scope="module")
def docker_env() -> Iterator[dict[str, str]]:
    started = subprocess.run(
        ["bash", "hack/image/engine.sh", "start"], cwd=REPO, capture_output=True, text=True, timeout=600
    )
    if started.returncode == 3:
        pytest.skip(f"no Docker engine can run on this machine: {started.stderr.strip()}")
    assert started.returncode == 0, started.stderr
    env = dict(os.environ)
    for line in started.stdout.splitlines():
        if line.startswith("export DOCKER_HOST="):
            env["DOCKER_HOST"] = line.split("=", 1)[1]
    build = subprocess.run(
        ["bash", "hack/image/build.sh"], cwd=REPO, env={**env, "PY": sys.executable},
        capture_output=True, text=True, timeout=1800,
    )
    assert build.returncode == 0, build.stdout + build.stderr
    print(build.stdout.strip().splitlines()[-1])  # "elasticps:latest: N bytes"
    yield env
    if "DOCKER_HOST" in env and env.get("DOCKER_HOST") != os.environ.get("DOCKER_HOST"):
        subprocess.run(["bash", "hack/image/engine.sh", "stop"], cwd=REPO, timeout=60)


def docker(env: dict[str, str], *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *args], env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("command", [[], ["ps"], ["worker"], ["operator"]], ids=["elasticps", "ps", "worker", "operator"])
def test_entrypoints_answer_help(docker_env: dict[str, str], command: list[str]) -> None:
    done = docker(docker_env, "run", "--rm", "--network", "none", TAG, *command, "--help")
    assert done.returncode == 0, done.stderr
    assert "usage: elasticps" in done.stdout


def test_runs_as_a_non_root_user(docker_env: dict[str, str]) -> None:
    done = docker(docker_env, "run", "--rm", "--network", "none", "--entrypoint", "id", TAG, "-u")
    assert done.stdout.strip() == "1000"


def test_a_short_local_job_inside_the_image(docker_env: dict[str, str], tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2500, 8)).astype(np.float32)
    y = (x @ rng.normal(size=8) > 0).astype(np.int64)
    np.savez(tmp_path / "train.npz", x=x[:2000], y=y[:2000])
    np.savez(tmp_path / "validation.npz", x=x[2000:], y=y[2000:])
    job = {
        "apiVersion": "elasticps.io/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": "in-image"},
        "spec": {
            "model": {"modelDef": "elasticps.backends.keras.zoo.mlp"},
            "data": {"reader": "npz", "training": "/data/train.npz", "validation": "/data/validation.npz"},
            "training": {"numEpochs": 2, "recordsPerTask": 500, "minibatchSize": 32},
            "ps": {"replicas": 2},
            "worker": {"replicas": 2},
        },
    }
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    tmp_path.chmod(0o777)  # the container's user (1000) writes the result here
    done = docker(
        docker_env, "run", "--rm", "--network", "none", "--read-only", "--tmpfs", "/tmp",
        "-v", f"{tmp_path}:/data", TAG,
        "run", "/data/job.yaml", "--run_dir", "/tmp/run", "--result_file", "/data/result.json",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["succeeded"] and result["epoch_records"] == [2000, 2000]
    assert result["metrics"]["accuracy"] > 0.85
