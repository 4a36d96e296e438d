"""Embedding tables in torch models (issue 36): ``elasticps.backends.pytorch.layers.Embedding``
local, served by a row source, and held in an export, against hand computations; the torch
trainer's served tables (what it pulls, the row gradients it pushes, an AUC over a set)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from elasticps.api.embedding import EmbeddingError, TableSpec, initial_rows  # noqa: E402
from elasticps.api.spec import Framework  # noqa: E402
from elasticps.backends.api import ModelError, TrainerOptions  # noqa: E402
from elasticps.backends.pytorch.layers import Embedding, first_rows, served  # noqa: E402
from elasticps.backends.pytorch.served_tables import ServedTables  # noqa: E402
from elasticps.backends.registry import backend_for  # noqa: E402

TWO_TABLES = '''
import numpy as np
import torch
from torch import nn
from elasticps.backends.pytorch.layers import Embedding

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = Embedding("a", 2, seed=1, local_rows=64)
        self.b = Embedding("b", 2, seed=2, local_rows=64)
        self.out = nn.Linear(2, 1)

    def forward(self, ids):
        return self.out(self.a(ids[:, 0]) + self.b(ids[:, 1]) + self.a(ids[:, 2]))

def model():
    return Net()

def loss(outputs, labels):
    return nn.functional.binary_cross_entropy_with_logits(outputs.reshape(-1), labels)

def optimizer(parameters):
    return torch.optim.Adam(parameters, lr=0.01)

def feed(features, labels, mode):
    return torch.from_numpy(np.asarray(features, np.int64)), None if labels is None else torch.from_numpy(np.asarray(labels, np.float32))

def eval_set_metrics_fn():
    from elasticps.api.metrics import auc
    return {"auc": lambda outputs, labels: auc(labels, outputs)}
'''


@pytest.fixture
def modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in [m for m in sys.modules if m.startswith("torch_embed_")]:
        del sys.modules[name]


def test_a_local_table_is_a_parameter_whose_rows_start_as_the_ps_would_make_them() -> None:
    layer = Embedding("t", 3, seed=5, local_rows=10)
    assert [n for n, _ in layer.named_parameters()] == ["rows"]
    ids = torch.tensor([[3, 13], [-1, 4]])
    out = layer(ids)
    assert tuple(out.shape) == (2, 2, 3)
    expected = initial_rows(TableSpec("t", 3, "uniform", 0.05, 5), np.array([3, 3, 9, 4]))
    np.testing.assert_allclose(out.detach().numpy().reshape(4, 3), expected, rtol=1e-6)
    with pytest.raises(EmbeddingError):
        Embedding("bad name!", 3)
    with pytest.raises(ValueError, match="local_rows"):
        Embedding("t", 3, local_rows=0)


def test_a_served_table_pulls_each_calls_distinct_ids_and_its_gradient_is_summed_per_id() -> None:
    asked: list[dict[str, list[int]]] = []

    def source(ids: Mapping[str, np.ndarray], training: bool = True) -> dict[str, np.ndarray]:
        asked.append({k: v.tolist() for k, v in ids.items()})
        return {k: np.stack([np.full(2, float(i)) for i in v]).astype(np.float32) for k, v in ids.items()}

    with served():
        layer = Embedding("t", 2)
        net = torch.nn.Sequential(layer)
    assert list(net.parameters()) == []  # no rows among the parameters: never dense variables on the PS
    tables = ServedTables(net, "m")
    tables.serve(source, lambda names: {})
    ids = torch.tensor([[7, 3], [7, 7]])
    weights = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    tables.clear()
    out = net(ids)  # (2, 2, 2): row i is [i, i]
    np.testing.assert_array_equal(out[:, :, 0].detach().numpy(), [[7, 3], [7, 7]])
    (out.sum(dim=2) * weights).sum().backward()
    tables.take()
    assert asked == [{"t": [3, 7]}]
    grads = tables.gradients()["t"]
    assert grads.ids.tolist() == [3, 7]
    np.testing.assert_array_equal(grads.grads, [[2.0, 2.0], [8.0, 8.0]])  # 7: weights 1 + 3 + 4
    with torch.no_grad():
        net(ids)
    assert tables.gradients()["t"].ids.tolist() == [3, 7] and not layer.taken()  # no-grad calls keep nothing
    with tables.initial():
        first = net(torch.tensor([5]))
    np.testing.assert_allclose(first.detach().numpy(), initial_rows(layer.spec, np.array([5])), rtol=1e-6)
    assert len(asked) == 2  # the initial rows were computed here, not pulled


@pytest.mark.parametrize("initializer", ["uniform", "normal", "zeros"])
@pytest.mark.parametrize("dim", [1, 8])
def test_first_rows_in_torch_are_the_ps_first_values(initializer: str, dim: int) -> None:
    spec = TableSpec("t", dim, initializer=initializer, seed=5)
    ids = np.random.default_rng(0).integers(-(2**63), 2**63 - 1, 500, dtype=np.int64)
    np.testing.assert_array_equal(first_rows(spec, torch.from_numpy(ids)).numpy(), initial_rows(spec, ids))


def test_two_modules_naming_one_table_differently_are_refused() -> None:
    with served():
        net = torch.nn.Sequential(Embedding("t", 2), Embedding("t", 3))
    with pytest.raises(ModelError, match="two Embedding modules name table 't'"):
        ServedTables(net, "m")


def test_the_trainer_serves_tables_pushes_their_rows_gradients_and_exports_the_held_rows(modules: Path, tmp_path: Path) -> None:
    (modules / "torch_embed_two.py").write_text(textwrap.dedent(TWO_TABLES))
    backend = backend_for(Framework.TORCH)
    trainer = backend.trainer(backend.load_model("torch_embed_two"), {}, TrainerOptions(minibatch_size=4, serve_tables=True))
    x = np.array([[1, 10, 2], [2, 11, 2], [1, 10, 3], [4, 12, 1]], np.int64)
    y = np.array([1, 0, 1, 0], np.float32)
    trainer.build(x, y)  # before the PS holds the model: the first values, nothing pulled
    assert sorted(s.name for s in trainer.tables()) == ["a", "b"]
    assert sorted(trainer.weights()) == ["out.bias", "out.weight"]
    store = {"a": {}, "b": {}}  # type: dict[str, dict[int, np.ndarray]]
    specs = {s.name: s for s in trainer.tables()}

    def pull(ids: Mapping[str, np.ndarray], training: bool = True) -> dict[str, np.ndarray]:
        out = {}
        for name, wanted in ids.items():
            rows = store[name]
            first = {i: initial_rows(specs[name], np.array([i]))[0] for i in wanted.tolist()}
            if training:  # as the PS: evaluation and prediction make no row
                for i in wanted.tolist():
                    rows.setdefault(i, first[i])
            out[name] = np.stack([rows.get(i, first[i]) for i in wanted.tolist()])
        return out

    def held(names: list[str]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        return {n: (np.array(sorted(store[n]), np.int64), np.stack([store[n][i] for i in sorted(store[n])])) for n in names}

    trainer.serve_rows(pull, held)
    [(bx, by)] = list(trainer.batches(x, y, "evaluation"))
    _, dense = trainer.gradients(bx, by)
    rows = trainer.row_gradients()
    assert rows["a"].ids.tolist() == [1, 2, 3, 4] and rows["b"].ids.tolist() == [10, 11, 12]
    # Table a is called twice (columns 0 and 2): id 2 appears in both, its gradient the sum.
    w = trainer.weights()["out.weight"].reshape(-1)
    a_rows, b_rows = pull({"a": x[:, 0]})["a"] + pull({"a": x[:, 2]})["a"], pull({"b": x[:, 1]})["b"]
    z = (a_rows + b_rows) @ w + trainer.weights()["out.bias"]
    dz = (1 / (1 + np.exp(-z)) - y) / 4  # the mean log loss's gradient per record
    expected_a = {i: np.zeros(2) for i in (1, 2, 3, 4)}
    for r in range(4):
        expected_a[int(x[r, 0])] += dz[r] * w
        expected_a[int(x[r, 2])] += dz[r] * w
    np.testing.assert_allclose(rows["a"].grads, np.stack([expected_a[i] for i in (1, 2, 3, 4)]), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(dense["out.bias"], [dz.sum()], rtol=1e-5)
    sums = trainer.evaluate(x, y)
    assert 0.0 <= sums["auc"] / 4 <= 1.0 and "loss" in sums
    store["a"][2] = np.array([9.0, -9.0], np.float32)  # the PS's rows as the export must hold them
    trainer.export(tmp_path)
    assert trainer.tables() and not trainer.model.a.held  # the served modules are back after the export
    code = textwrap.dedent(f"""
        import sys, numpy as np, torch
        sys.modules["elasticps"] = None
        program = torch.export.load({str(tmp_path / 'model.pt2')!r}).module()
        print(program(torch.tensor([[2, 10, 99], [2, 10, 2], [1, 11, 3]])).detach().numpy().reshape(-1).tolist())
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    got = np.array(eval(done.stdout.strip()))
    w, b = trainer.weights()["out.weight"].reshape(-1), trainer.weights()["out.bias"][0]
    a, bt = store["a"], store["b"]
    unseen = initial_rows(trainer.model.a.spec, np.array([99]))[0]  # 99: not held, its first values as on the PS
    expected = [(a[2] + bt[10] + unseen) @ w + b, (a[2] + bt[10] + a[2]) @ w + b, (a[1] + bt[11] + a[3]) @ w + b]
    np.testing.assert_allclose(got, expected, rtol=1e-5)
