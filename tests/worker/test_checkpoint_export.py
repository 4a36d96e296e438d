"""``elasticps export`` on checkpoints written by the store's file format directly: the newest
version every shard has, variables by name, and one-line errors (exit 2) for whatever is wrong."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from elasticps import cli
from elasticps.ps import checkpoint
from elasticps.backends.api import Variable
from elasticps.worker.checkpoint_export import ExportProblem, join_slices, match

SHAPES = {"mlp/dense/kernel": (8, 16), "mlp/dense/bias": (16,), "mlp/dense_1/kernel": (16, 2), "mlp/dense_1/bias": (2,)}
SHARD_OF = {"mlp/dense/kernel": 0, "mlp/dense/bias": 1, "mlp/dense_1/kernel": 1, "mlp/dense_1/bias": 0}


def weights(version: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(version)
    return {name: rng.normal(size=shape).astype(np.float32) for name, shape in SHAPES.items()}


def save(root: Path, version: int, tensors: dict[str, np.ndarray] | None = None, shards: int = 2) -> None:
    """Each shard's checkpoint of ``version`` as the PS writes it: its variables under var/, Adam-like
    optimizer slots and step counts under opt/."""
    tensors = weights(version) if tensors is None else tensors
    for shard in range(shards):
        arrays: dict[str, np.ndarray] = {}
        for name, value in tensors.items():
            if SHARD_OF.get(name, 0) == shard:
                arrays[f"var/{name}"] = value
                arrays[f"opt/slot/m/{name}"] = np.zeros_like(value)
                arrays[f"opt/step/{name}"] = np.array(version, np.int64)
        meta = {"shard": shard, "optimizer": {"name": "sgd", "params": {}}}
        checkpoint.save(root / f"ps-{shard}", checkpoint.Checkpoint(version, arrays, meta), keep=10)


@pytest.fixture
def job(tmp_path: Path) -> Path:
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "train.npz", x=rng.normal(size=(20, 8)).astype(np.float32), y=np.zeros(20, np.int64))
    document = {
        "apiVersion": "elasticps.io/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": "tiny"},
        "spec": {"model": {"modelDef": "elasticps.backends.keras.zoo.mlp"}, "data": {"reader": "npz", "training": str(tmp_path / "train.npz")}},
    }
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def export(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = cli.main(["export", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_the_newest_version_every_shard_has_is_exported(tmp_path: Path, job: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "checkpoints"
    save(root, 10)
    save(root, 20)
    save(root, 30, shards=1)  # shard 1 never wrote 30: 20 is the newest common version
    out = tmp_path / "out"
    code, stdout, stderr = export(capsys, str(root), "--job", str(job), "--out", str(out))
    assert code == 0, stderr
    assert stdout.strip() == f"exported model version 20 of job tiny to {out}"
    assert sorted(p.name for p in out.iterdir()) == ["job.json", "loading.json", "metrics.json", "model.keras", "saved_model"]
    metrics = json.loads((out / "metrics.json").read_text())
    assert (metrics["model_version"], metrics["source"]) == (20, "checkpoints")
    assert json.loads((out / "job.json").read_text())["metadata"]["name"] == "tiny"
    import keras

    model = keras.models.load_model(out / "model.keras")
    expected = weights(20)  # in model order (names get suffixes when loaded in a process that built one)
    assert all(np.array_equal(v.numpy(), expected[name]) for v, name in zip(model.variables, SHAPES, strict=True))


def test_shard_folders_named_one_by_one_and_a_version_asked_for(
    tmp_path: Path, job: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "checkpoints"
    save(root, 10)
    save(root, 20)
    out = tmp_path / "out"
    code, stdout, stderr = export(
        capsys, str(root / "ps-1"), str(root / "ps-0"), "--job", str(job), "--out", str(out), "--version", "10"
    )
    assert code == 0, stderr
    assert "version 10" in stdout


def test_a_corrupt_newest_checkpoint_falls_back_to_an_older_common_one(
    tmp_path: Path, job: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "checkpoints"
    save(root, 10)
    save(root, 20)
    newest = checkpoint.path_of(root / "ps-1", 20)
    newest.write_bytes(newest.read_bytes()[:-5])
    code, stdout, stderr = export(capsys, str(root), "--job", str(job), "--out", str(tmp_path / "out"))
    assert code == 0 and "version 10" in stdout
    assert "skipping version 20" in stderr


def one_line_error(code: int, stderr: str) -> str:
    assert code == 2
    lines = stderr.strip().splitlines()
    assert "Traceback" not in stderr
    return lines[-1]


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        pytest.param(lambda t: t.pop("mlp/dense/bias"), "no checkpoint holds the model's variables ['mlp/dense/bias']", id="missing"),
        pytest.param(lambda t: t.update({"mlp/extra/kernel": np.zeros(3, np.float32)}), "'var/mlp/extra/kernel'", id="extra"),
        pytest.param(lambda t: t.update({"mlp/dense/bias": np.zeros(15, np.float32)}), "has shape (15,)", id="shape"),
    ],
)
def test_a_checkpoint_of_another_model_is_refused(
    tmp_path: Path, job: Path, capsys: pytest.CaptureFixture[str], damage: object, message: str
) -> None:
    tensors = weights(5)
    damage(tensors)  # type: ignore[operator]
    save(tmp_path / "ck", 5, tensors)
    code, _, stderr = export(capsys, str(tmp_path / "ck"), "--job", str(job), "--out", str(tmp_path / "out"))
    assert message in one_line_error(code, stderr)
    assert not (tmp_path / "out").exists()


def test_one_line_errors(tmp_path: Path, job: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = str(tmp_path / "out")
    root = tmp_path / "ck"
    code, _, stderr = export(capsys, str(tmp_path / "nowhere"), "--job", str(job), "--out", out)
    assert "no such checkpoint folder" in one_line_error(code, stderr)

    (tmp_path / "empty").mkdir()
    code, _, stderr = export(capsys, str(tmp_path / "empty"), "--job", str(job), "--out", out)
    assert "holds no checkpoint" in one_line_error(code, stderr)

    save(root, 10, shards=1)
    save(root / "later", 20, shards=1)
    code, _, stderr = export(capsys, str(root / "ps-0"), str(root / "later" / "ps-0"), "--job", str(job), "--out", out)
    assert "no version is checkpointed by every shard" in one_line_error(code, stderr)

    code, _, stderr = export(capsys, str(root), "--job", str(job), "--out", out, "--version", "7")
    assert "version 7 is not checkpointed by every shard" in one_line_error(code, stderr)

    code, _, stderr = export(capsys, str(root), "--job", str(tmp_path / "missing.yaml"), "--out", out)
    assert "cannot read" in one_line_error(code, stderr)

    only = checkpoint.path_of(root / "ps-0", 10)
    only.write_bytes(b"EPSCKPT1 garbage")
    code, _, stderr = export(capsys, str(root / "ps-0"), "--job", str(job), "--out", out)
    assert "no good checkpoint" in one_line_error(code, stderr)
    assert not (tmp_path / "out").exists()


def test_a_shard_given_twice_is_refused(tmp_path: Path, job: Path, capsys: pytest.CaptureFixture[str]) -> None:
    save(tmp_path / "a", 3)
    save(tmp_path / "b", 3)
    code, _, stderr = export(capsys, str(tmp_path / "a" / "ps-0"), str(tmp_path / "b" / "ps-0"), "--job", str(job),
                             "--out", str(tmp_path / "out"))  # fmt: skip
    assert "both hold PS shard 0" in one_line_error(code, stderr)


def test_match_takes_non_trainable_state_and_skips_what_the_ps_does_not_keep() -> None:
    variables = {
        "m/bn/gamma": Variable((4,), True),
        "m/bn/moving_mean": Variable((4,), False),
        "m/dropout/seed_generator_state": Variable((2,), False),
    }
    tensors = {"var/m/bn/gamma": np.ones(4), "state/m/bn/moving_mean": np.full(4, 0.5)}
    assigned, untouched = match(tensors, variables)
    assert sorted(assigned) == ["m/bn/gamma", "m/bn/moving_mean"]
    assert untouched == ["m/dropout/seed_generator_state"]
    with pytest.raises(ExportProblem, match="m/bn/gamma"):
        match({"state/m/bn/moving_mean": np.zeros(4)}, variables)


def test_row_slices_of_a_split_variable_are_joined_and_gaps_refused() -> None:
    """Checkpoints of shards that each hold row slices of a variable (``psclient/sharding.py``)."""
    kernel = np.arange(40, dtype=np.float32).reshape(10, 4)
    tensors = {
        "var/mlp/dense/kernel#rows5:10": kernel[5:],
        "var/mlp/dense/kernel#rows0:5": kernel[:5],
        "var/mlp/dense/bias": np.zeros(4, np.float32),
    }
    joined = join_slices(tensors)
    assert sorted(joined) == ["var/mlp/dense/bias", "var/mlp/dense/kernel"]
    np.testing.assert_array_equal(joined["var/mlp/dense/kernel"], kernel)
    with pytest.raises(ExportProblem, match="do not join"):
        join_slices({"var/k#rows0:5": kernel[:5], "var/k#rows6:10": kernel[6:]})  # row 5 missing
    with pytest.raises(ExportProblem, match="do not join"):
        join_slices({"var/k#rows0:5": kernel[:5], "var/k#rows5:10": np.zeros((5, 3), np.float32)})
    with pytest.raises(ExportProblem, match="both whole"):
        join_slices({"var/k": kernel, "var/k#rows0:10": kernel})
