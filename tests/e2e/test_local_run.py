"""`elasticps run` end to end: sync, async with staleness modulation and SSP, bad YAML."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from local_jobs import elasticps, job_document, write_job

pytestmark = pytest.mark.slow
MINIBATCHES = 2 * 10 * 13  # epochs x tasks of 400 records x minibatches of 32 (12 and one of 16)


def run_job(tmp_path: Path, document: dict[str, object]) -> tuple[int, str, dict[str, object]]:
    job = write_job(tmp_path / "job.yaml", document)
    result_file = tmp_path / "result.json"
    process = elasticps(
        "run", str(job), "--run_dir", str(tmp_path / "run"), "--result_file", str(result_file), cwd=tmp_path
    )
    _, stderr = process.communicate(timeout=240)
    result = json.loads(result_file.read_text()) if result_file.exists() else {}
    return process.returncode, stderr, result


@pytest.mark.parametrize(
    "training",
    [
        pytest.param({}, id="sync"),
        pytest.param({"gradsToWait": 1}, id="sync-backup-workers"),
        pytest.param({"useAsync": True, "lrStalenessModulation": True}, id="async-staleness"),
        pytest.param({"useAsync": True, "getModelFrequency": 4, "useLocking": True}, id="async-ssp"),
    ],
)
def test_job_trains_every_record_and_learns(tmp_path: Path, data: tuple[Path, Path], training: dict[str, object]) -> None:
    code, stderr, result = run_job(tmp_path, job_document("e2e", *data, evaluationSteps=40, **training))
    assert code == 0, stderr
    assert result["epoch_records"] == [4000, 4000]
    assert result["records_done"] == result["records_total"] == 8000
    metrics = result["metrics"]
    assert isinstance(metrics, dict) and metrics["accuracy"] > 0.85, result
    history = result["history"]  # the learning curve: every evaluation, in time order
    assert isinstance(history, list) and history[-1]["metrics"] == metrics
    assert [h["elapsed_s"] for h in history] == sorted(h["elapsed_s"] for h in history)
    assert "Traceback" not in stderr
    # PS 0 sees every push (a push reaches every shard): 13 minibatches per task of 400, 20 tasks.
    pushes = {(low, high): n for low, high, n in result["staleness"]}  # type: ignore[union-attr]
    stale = sum(n for (low, _), n in pushes.items() if low > 0)
    if training.get("useAsync"):
        assert sum(pushes.values()) == MINIBATCHES  # each pushed once, none refused
    elif "gradsToWait" in training:
        assert sum(pushes.values()) >= MINIBATCHES  # and again when a round went on without it
    else:
        assert pushes[(0, 0)] == MINIBATCHES and stale == 0  # every round waits for both workers
    if training.get("getModelFrequency", 1) > 1:
        assert stale > 0  # a worker's own pushes make its model older between its pulls


def test_malformed_job_is_one_line_and_exit_2(tmp_path: Path, data: tuple[Path, Path]) -> None:
    document = job_document("bad", *data, getModelFrequency=0)
    code, stderr, _ = run_job(tmp_path, document)
    assert code == 2
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert "spec.training.getModelFrequency: must be >= 1, got 0" in lines[0]


def test_an_absurd_epoch_count_is_refused_naming_the_field(tmp_path: Path, data: tuple[Path, Path]) -> None:
    # It used to reach the coordinator and end in a bare MemoryError (exit 1).
    code, stderr, _ = run_job(tmp_path, job_document("huge", *data, numEpochs=1_000_000_000_000))
    assert code == 2
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert "spec.training.numEpochs: must be <= 1000000, got 1000000000000" in lines[0]


@pytest.mark.parametrize(
    "text, message",
    [
        ("spec: [unclosed", "line"),
        ("apiVersion: elasticps.io/v1alpha1\nkind: TrainingJob\nmetadata: {name: x}\nspec: {model: {}}\n", "spec.model.modelDef: required"),
        ("apiVersion: v1\nkind: Pod\n", "apiVersion: must be elasticps.io/v1alpha1"),
    ],
)
def test_bad_yaml_gets_a_clear_error(tmp_path: Path, text: str, message: str) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(text)
    process = elasticps("run", str(job), cwd=tmp_path)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 2
    assert message in stderr and "Traceback" not in stderr
    assert len(stderr.strip().splitlines()) == 1


def test_missing_job_file(tmp_path: Path) -> None:
    process = elasticps("run", str(tmp_path / "nope.yaml"), cwd=tmp_path)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 2 and "cannot read" in stderr and "Traceback" not in stderr


@pytest.mark.parametrize(
    "worker",
    [pytest.param({"restartPolicy": "OnFailure"}, id="on-failure"), pytest.param({"restartPolicy": "Always"}, id="always")],
)
def test_a_user_error_fails_the_job_once_with_the_replicas_line(
    tmp_path: Path, data: tuple[Path, Path], worker: dict[str, object]
) -> None:
    """Exit code 2 (a mistake in the job's input) is permanent under every policy: no replacement,
    the job fails with the replica's own line as its reason, said once, without a log tail."""
    document = job_document("broken", *data)
    spec: dict[str, Any] = document["spec"]  # type: ignore[assignment]
    spec["model"] = {"modelDef": "elasticps.backends.keras.zoo.no_such_model"}  # the worker exits 2: a user error
    spec["ps"], spec["worker"] = {"replicas": 1}, {"replicas": 2, **worker}
    spec["runPolicy"] = {"backoffLimit": 3}
    code, stderr, result = run_job(tmp_path, document)
    assert code == 1, stderr
    failed = [line for line in stderr.splitlines() if line.startswith("job broken failed:")]
    assert len(failed) == 1, stderr
    assert re.fullmatch(r"job broken failed: UserError: worker-[01]: error: model module "
                        r"'elasticps\.backends\.keras\.zoo\.no_such_model' cannot be imported.*", failed[0]), stderr
    assert "replacing it" not in stderr and "its log ends with" not in stderr and "Traceback" not in stderr
    assert result["succeeded"] is False and result["reason"] == failed[0].split(": ", 1)[1]
    assert_every_replica_stopped(tmp_path / "run")


def test_a_model_whose_own_code_raises_fails_the_job_once_naming_its_line(
    tmp_path: Path, data: tuple[Path, Path]
) -> None:
    """A model module's loss that raises is the user's mistake: the job fails once, reason
    UserError, with the module's file and line instead of a traceback, and no replacement."""
    model = tmp_path / "crashing_model.py"
    model.write_text(
        "from elasticps.backends.keras.zoo.mlp import *  # noqa: F403\n\n\n"
        "def loss(labels, predictions):\n    raise RuntimeError('the loss breaks')\n"
    )
    document = job_document("crash", *data)
    spec: dict[str, Any] = document["spec"]  # type: ignore[assignment]
    spec["model"] = {"modelDef": "crashing_model"}  # importable from the run's folder
    spec["ps"], spec["worker"] = {"replicas": 1}, {"replicas": 1, "restartPolicy": "OnFailure"}
    code, stderr, result = run_job(tmp_path, document)
    assert code == 1, stderr
    failed = [line for line in stderr.splitlines() if line.startswith("job crash failed:")]
    assert failed == [f"job crash failed: UserError: worker-0: error: {model}:5 (in loss): RuntimeError: the loss breaks"], stderr
    assert "replacing it" not in stderr and "Traceback" not in stderr
    assert result["succeeded"] is False


@pytest.mark.parametrize("fail", [False, True], ids=["warns", "fails"])
def test_a_job_made_to_diverge_says_so(tmp_path: Path, data: tuple[Path, Path], fail: bool) -> None:
    """Plain async SGD at a learning rate of 1,000: the loss leaves the finite numbers within the
    first epoch. The job says Diverged: a warning line and the result's health; with failUnhealthy
    it fails with that reason instead, and exports nothing."""
    document = job_document("wild", *data, useAsync=True, learningRate=1000.0, failUnhealthy=fail)
    document["spec"]["output"] = str(tmp_path / "model")  # type: ignore[index]
    code, stderr, result = run_job(tmp_path, document)
    assert "Traceback" not in stderr
    if not fail:
        assert code == 0, stderr
        assert result["health"] == "Diverged", result
        assert result["health"] == "Diverged", result
        message = str(result["health_message"])
        assert re.match(r"the training loss (was not finite|grew from)", message), message
        assert message in stderr  # said as it happened (the planner's event), not only at the end
        return
    assert code == 1, stderr
    failed = [line for line in stderr.splitlines() if line.startswith("job wild failed:")]
    assert len(failed) == 1 and failed[0].startswith("job wild failed: Diverged: the training loss"), stderr
    assert failed[0].endswith("(spec.training.failUnhealthy)")
    exported = [p.name for p in (tmp_path / "model").iterdir() if p.name != "tensorboard"]
    assert result["succeeded"] is False and exported == [], exported  # no useless model exported
    assert_every_replica_stopped(tmp_path / "run")


def test_the_deadline_fails_the_job_and_stops_every_replica(tmp_path: Path, data: tuple[Path, Path]) -> None:
    document = job_document("late", *data)
    document["spec"]["runPolicy"] = {"activeDeadlineSeconds": 3}  # type: ignore[index]
    code, stderr, result = run_job(tmp_path, document)
    assert code == 1, stderr
    assert "job late failed: DeadlineExceeded: TrainingJob ran longer than activeDeadlineSeconds=3." in stderr
    assert result["succeeded"] is False
    assert_every_replica_stopped(tmp_path / "run")


def assert_every_replica_stopped(run_dir: Path) -> None:
    pids = [int(p.read_text()) for p in run_dir.glob("*.pid")]
    assert pids
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text()
