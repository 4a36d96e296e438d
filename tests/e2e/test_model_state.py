"""BatchNormalization's moving statistics live on the PS shards: a whole sync job (`elasticps run`,
2 PS + 2 workers, real processes) with a model that has them (``bn_net.py``, loaded from this folder),
then kill -9 of the shard holding them and its restore from its checkpoint."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from pathlib import Path

import numpy as np
import pytest

from local_jobs import elasticps, job_document, wait_for, write_data, write_job
from elasticps.coordinator.client import CoordinatorClient
from elasticps.local.fleet import observer_token
from elasticps.ps import checkpoint
from elasticps.psclient.client import PSClient
from elasticps.psclient.sharding import Placement, TensorInfo, place

pytestmark = pytest.mark.slow

RECORDS = 4000
NAME = "bnstate"
STATISTICS = ("bn_net/batch_normalization/moving_mean", "bn_net/batch_normalization/moving_variance")
ROLLED_BACK = re.compile(r"rolled back to version (\d+) \(incarnation (\d+)\)")


def assert_trained(statistics: dict[str, np.ndarray]) -> None:
    """Neither the initial mean 0 nor the initial variance 1 (the model's inputs are far from both)."""
    mean, variance = (statistics[name] for name in STATISTICS)
    assert mean.shape == variance.shape == (16,)
    assert not np.allclose(mean, 0.0, atol=1e-3), mean
    assert not np.allclose(variance, 1.0, atol=1e-3), variance


def placement_of_bn_net() -> Placement:
    """Where the PS client places bn_net's tensors (by size; see bn_net.py for the shapes)."""
    f32 = np.dtype(np.float32)
    shapes = {
        "bn_net/dense/kernel": (8, 16),
        "bn_net/dense/bias": (16,),
        "bn_net/batch_normalization/gamma": (16,),
        "bn_net/batch_normalization/beta": (16,),
        "bn_net/dense_1/kernel": (16, 2),
        "bn_net/dense_1/bias": (2,),
    }
    infos = [TensorInfo(name, shape, f32) for name, shape in shapes.items()]
    return place(infos + [TensorInfo(name, (16,), f32, state=True) for name in STATISTICS], 2)


def test_the_ps_keeps_batchnorm_statistics_and_a_killed_shard_restores_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert {placement_of_bn_net().shards_of(name) for name in STATISTICS} == {(1,)}  # the shard killed below
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(Path(__file__).parent), os.environ.get("PYTHONPATH")])))
    train, validation = write_data(tmp_path, records=RECORDS)
    document = job_document(NAME, train, validation, checkpointSteps=10)
    document["spec"]["model"] = {"modelDef": "bn_net"}  # type: ignore[index]
    job = write_job(tmp_path / "job.yaml", document)
    run_dir, result_file = tmp_path / "run", tmp_path / "result.json"
    process = elasticps("run", str(job), "--run_dir", str(run_dir), "--result_file", str(result_file), cwd=tmp_path)
    workers: list[int] = []
    try:
        wait_for(lambda: (run_dir / "ps-1.port").exists() and (run_dir / "ps-0.port").exists(), 60, "both PS")
        addresses = [f"127.0.0.1:{int((run_dir / f'ps-{i}.port').read_text())}" for i in range(2)]
        status = CoordinatorClient(addresses[0], worker="test", token=observer_token(run_dir))
        wait_for(lambda: status.status().model_version >= 30, 180, "30 sync rounds")

        # Workers frozen: nothing moves on the shards while the test looks at them.
        workers = [int((run_dir / f"{NAME}-worker-{i}.pid").read_text()) for i in range(2)]
        for pid in workers:
            os.kill(pid, signal.SIGSTOP)
        observer = PSClient(addresses, worker="observer", deadline_s=120.0, timeout_s=60.0, token=observer_token(run_dir))
        try:
            before = observer.pull([-1, -1])
            assert sorted(before.state) == sorted(STATISTICS)
            assert_trained(before.state)

            os.kill(int((run_dir / f"{NAME}-ps-1.pid").read_text()), signal.SIGKILL)
            ps0_log = run_dir / f"{NAME}-ps-0.log"
            wait_for(lambda: ROLLED_BACK.search(ps0_log.read_text()) is not None, 120, "the rollback")
            version, incarnation = (int(g) for g in ROLLED_BACK.findall(ps0_log.read_text())[-1])
            after = observer.pull([-1, -1], only=[1])
        finally:
            observer.close()
        assert (after.versions[1], after.incarnations[1]) == (version, incarnation)
        saved = checkpoint.load(checkpoint.path_of(run_dir / "checkpoints" / "ps-1", version))
        assert sorted(after.state) == sorted(STATISTICS)
        for name in STATISTICS:
            np.testing.assert_array_equal(after.state[name], saved.arrays[f"state/{name}"], err_msg=name)
        assert_trained(after.state)
    finally:
        for pid in workers:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
    try:
        _, stderr = process.communicate(timeout=300)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            process.wait(timeout=60)
    assert process.returncode == 0, stderr
    assert f"{NAME}-ps-1 exited with code -9: replacing it" in stderr
    result = json.loads(result_file.read_text())
    assert result["epoch_records"] == [RECORDS, RECORDS]
    assert result["metrics"]["accuracy"] > 0.8  # evaluated with the PS's statistics
