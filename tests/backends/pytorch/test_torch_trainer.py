"""The PyTorch backend (issue 36): the model contract, the optimizer mapping, and the trainer's
arithmetic against hand computations: weights and state out and in, gradients, SSP's and
LocalSGD's local steps, evaluation, and an export that runs in a fresh process without the model
module's source."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from elasticps.api.optimizer import OptimizerError  # noqa: E402
from elasticps.api.spec import Framework  # noqa: E402
from elasticps.backends.api import ModelError, TrainerOptions  # noqa: E402
from elasticps.backends.pytorch.optimizer_spec import optimizer_config  # noqa: E402
from elasticps.backends.registry import backend_for  # noqa: E402

LINEAR = '''
import numpy as np
import torch
from torch import nn

def model(features=3, outputs=2):
    return nn.Sequential(nn.Linear(features, outputs), nn.BatchNorm1d(outputs))

def loss(outputs, labels):
    return ((outputs - labels) ** 2).sum(dim=1)

def optimizer(parameters):
    return torch.optim.SGD(parameters, lr=0.5, momentum=0.9)

def feed(features, labels, mode):
    return torch.from_numpy(np.asarray(features, np.float32)), torch.from_numpy(np.asarray(labels, np.float32))

def eval_metrics_fn():
    return {"first": lambda outputs, labels: outputs[:, 0]}
'''


@pytest.fixture
def modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A folder on the import path for the tests' model modules."""
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in [m for m in sys.modules if m.startswith("torch_test_")]:
        del sys.modules[name]


def module_named(folder: Path, name: str, source: str) -> str:
    (folder / f"{name}.py").write_text(textwrap.dedent(source))
    return name


def test_the_optimizers_map_to_the_ps_and_the_rest_is_refused_in_one_line() -> None:
    w = [torch.nn.Parameter(torch.zeros(2))]
    sgd = optimizer_config(torch.optim.SGD(w, lr=0.05, momentum=0.9, nesterov=True))
    assert (sgd.name, sgd.params["learning_rate"], sgd.params["momentum"], sgd.params["nesterov"]) == ("sgd", 0.05, 0.9, 1.0)
    adam = optimizer_config(torch.optim.Adam(w, lr=1e-3, betas=(0.8, 0.99), eps=1e-6), learning_rate=0.01)
    assert adam.name == "adam" and adam.params["learning_rate"] == 0.01
    assert (adam.params["beta_1"], adam.params["beta_2"], adam.params["epsilon"]) == (0.8, 0.99, 1e-6)
    assert optimizer_config(torch.optim.Adagrad(w, lr=0.1, initial_accumulator_value=0.1)).name == "adagrad"
    rms = optimizer_config(torch.optim.RMSprop(w, lr=0.01, alpha=0.9, centered=True))
    assert (rms.name, rms.params["rho"], rms.params["centered"]) == ("rmsprop", 0.9, 1.0)
    refused = {
        "weight_decay": torch.optim.SGD(w, lr=0.1, weight_decay=1e-4),
        "dampening": torch.optim.SGD(w, lr=0.1, momentum=0.9, dampening=0.1),
        "lr_decay": torch.optim.Adagrad(w, lr=0.1, lr_decay=0.01),
        "cannot run optimizer AdamW": torch.optim.AdamW(w, lr=0.1),
        "2 parameter groups": torch.optim.SGD([{"params": w}, {"params": [torch.nn.Parameter(torch.zeros(1))], "lr": 1.0}], lr=0.1),
    }
    for words, optimizer in refused.items():
        with pytest.raises(OptimizerError, match=words) as err:
            optimizer_config(optimizer)
        assert "\n" not in str(err.value)


def test_the_contract_is_checked_before_training(modules: Path) -> None:
    backend = backend_for(Framework.TORCH)
    missing = module_named(modules, "torch_test_missing", "def model():\n    pass\ndef loss(outputs, labels):\n    pass\n")
    with pytest.raises(ModelError, match=r"no function optimizer\(parameters\)"):
        backend.load_model(missing)
    arity = module_named(modules, "torch_test_arity", LINEAR.replace("def loss(outputs, labels):", "def loss(outputs):"))
    with pytest.raises(ModelError, match=r"loss\(outputs, labels\) takes 2 arguments"):
        backend.load_model(arity)
    broken = module_named(modules, "torch_test_broken", "import no_such_package\n")
    with pytest.raises(ModelError, match="cannot be imported.*no_such_package"):
        backend.load_model(broken)
    not_a_module = module_named(modules, "torch_test_not_module", LINEAR.replace(
        "return nn.Sequential(nn.Linear(features, outputs), nn.BatchNorm1d(outputs))", "return 3"))
    with pytest.raises(ModelError, match="returned int, not a torch.nn.Module"):
        backend.trainer(backend.load_model(not_a_module), {}, TrainerOptions(minibatch_size=4))


def linear_trainer(modules: Path, minibatch: int = 4, learning_rate: float = 0.0):  # type: ignore[no-untyped-def]
    backend = backend_for(Framework.TORCH)
    module = backend.load_model(module_named(modules, "torch_test_linear", LINEAR))
    trainer = backend.trainer(module, {}, TrainerOptions(minibatch_size=minibatch, learning_rate=learning_rate))
    x = np.arange(12, dtype=np.float32).reshape(4, 3) / 10
    y = np.ones((4, 2), np.float32)
    trainer.build(x, y)
    return trainer, x, y


def test_weights_state_and_gradients_against_a_hand_computation(modules: Path) -> None:
    trainer, x, y = linear_trainer(modules)
    assert set(trainer.weights()) == {"0.weight", "0.bias", "1.weight", "1.bias"}
    assert set(trainer.state()) == {"1.running_mean", "1.running_var"}  # num_batches_tracked is an integer: each worker's
    w, b = np.full((2, 3), 0.5, np.float32), np.array([0.1, -0.2], np.float32)
    read_only = np.frombuffer(w.tobytes(), np.float32).reshape(2, 3)  # as a pull hands arrays over
    trainer.assign({"0.weight": read_only, "0.bias": b, "1.weight": np.ones(2, np.float32), "1.bias": np.zeros(2, np.float32)})
    np.testing.assert_array_equal(trainer.weights()["0.weight"], w)
    trainer.assign_state({"1.running_mean": np.array([1.0, 2.0], np.float32)})
    np.testing.assert_array_equal(trainer.state()["1.running_mean"], [1.0, 2.0])
    [(bx, by)] = list(trainer.batches(x, y, "evaluation"))
    # By hand: z = xW'+b, batch-normalised per column (training mode: the batch's mean and biased
    # variance, eps 1e-5), loss = mean over records of sum((n - 1)^2).
    loss, grads = trainer.gradients(bx, by)
    zt = torch.tensor(x @ w.T + b, requires_grad=True)
    mean, var = zt.mean(0), zt.var(0, unbiased=False)
    n = (zt - mean) / torch.sqrt(var + 1e-5)
    expected = ((n - 1) ** 2).sum(1).mean()
    expected.backward()
    dz = zt.grad.numpy()
    assert loss == pytest.approx(float(expected.detach()), rel=1e-5)
    np.testing.assert_allclose(grads["0.weight"], dz.T @ x, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(grads["0.bias"], dz.sum(0), rtol=1e-4, atol=1e-6)
    with pytest.raises(ModelError, match="does not have"):
        trainer.assign({"nope": w})
    with pytest.raises(ModelError, match="shape"):
        trainer.assign({"0.weight": w.T})


def test_local_steps_sgd_at_the_jobs_rate_and_the_modules_own_optimizer(modules: Path) -> None:
    trainer, x, y = linear_trainer(modules, learning_rate=0.1)
    before = trainer.weights()
    gradients = {name: np.ones_like(value) for name, value in before.items()}
    trainer.sgd_step(gradients)
    for name, value in trainer.weights().items():
        np.testing.assert_allclose(value, before[name] - 0.1, rtol=1e-6)
    assert trainer.optimizer_config(0.0).params["learning_rate"] == pytest.approx(0.1)
    # apply_local: SGD with momentum 0.9 at the job's rate: v = g, then v = 0.9 v + g.
    start = trainer.weights()
    trainer.apply_local(gradients)
    trainer.apply_local(gradients)
    for name, value in trainer.weights().items():
        np.testing.assert_allclose(value, start[name] - 0.1 * (1 + 1.9), rtol=1e-5)


def test_evaluation_sums_each_metric_times_the_minibatch(modules: Path) -> None:
    trainer, x, y = linear_trainer(modules, minibatch=3)
    sums = trainer.evaluate(x, y)
    trainer_model = trainer.model  # type: ignore[attr-defined]
    trainer_model.eval()
    with torch.no_grad():
        outputs = trainer_model(torch.from_numpy(x)).numpy()
    assert sums["first"] == pytest.approx(float(outputs[:, 0].sum()), rel=1e-5)
    assert sums["loss"] == pytest.approx(float(((outputs - 1) ** 2).sum()), rel=1e-5)


def test_the_export_runs_in_a_fresh_process_without_the_modules_source(modules: Path, tmp_path: Path) -> None:
    trainer, x, y = linear_trainer(modules)
    for bx, by in trainer.batches(x, y, "training"):
        _, grads = trainer.gradients(bx, by)
        trainer.sgd_step(grads)
    out = tmp_path / "model"
    out.mkdir()
    trainer.export(out)
    trainer.model.eval()  # type: ignore[attr-defined]
    with torch.no_grad():
        expected = trainer.model(torch.from_numpy(x[:3])).numpy()  # type: ignore[attr-defined]
    (modules / "torch_test_linear.py").unlink()
    code = textwrap.dedent(f"""
        import sys, numpy as np, torch
        from safetensors.torch import load_file
        assert "torch_test_linear" not in sys.modules
        program = torch.export.load({str(out / 'model.pt2')!r}).module()
        x = np.arange(12, dtype=np.float32).reshape(4, 3)[:3] / 10
        print(program(torch.from_numpy(x)).detach().numpy().tolist())
        print(sorted(load_file({str(out / 'model.safetensors')!r})))
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    outputs, names = done.stdout.strip().splitlines()[-2:]
    np.testing.assert_allclose(np.array(eval(outputs)), expected, rtol=1e-5)  # noqa: S307 - our own print
    assert eval(names) == sorted(trainer.model.state_dict())  # type: ignore[attr-defined]  # noqa: S307
