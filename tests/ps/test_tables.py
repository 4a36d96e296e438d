"""The dense table on its own: what it accepts, what it refuses (changing nothing), its sums and its
checkpoint arrays; and the model routing each table its gradient."""

from __future__ import annotations

import numpy as np
import pytest

from elasticps.api.optimizer import OptimizerConfig
from elasticps.ps.errors import GradientError
from elasticps.ps.model import Model
from elasticps.ps.optimizers import make_optimizer
from elasticps.ps.state_table import STATE
from elasticps.ps.tables import DENSE, DenseTable, Table

SGD = OptimizerConfig("sgd", {"learning_rate": 0.5})


def variables() -> dict[str, np.ndarray]:
    return {
        "kernel": np.array([[1.0, 2.0], [3.0, 4.0]], dtype=np.float32),
        "bias": np.array([0.5, -0.5], dtype=np.float64),
    }


def good() -> dict[str, np.ndarray]:
    return {"kernel": np.ones((2, 2), dtype=np.float32), "bias": np.ones(2, dtype=np.float64)}


def copies(table: DenseTable) -> dict[str, np.ndarray]:
    return {n: v.copy() for n, v in table.variables.items()}


BAD: dict[str, tuple[dict[str, np.ndarray], str]] = {
    "wrong shape": ({**good(), "kernel": np.ones((2, 3), dtype=np.float32)}, "shape"),
    "wrong dtype": ({**good(), "bias": np.ones(2, dtype=np.float32)}, "dtype"),
    "nan": ({**good(), "bias": np.array([1.0, np.nan])}, "NaN"),
    "infinity": ({**good(), "kernel": np.full((2, 2), np.inf, dtype=np.float32)}, "infinity"),
    "missing": ({"kernel": np.ones((2, 2), dtype=np.float32)}, "no gradient for variable 'bias'"),
    "unknown": ({**good(), "extra": np.ones(1)}, "shard 3 holds no variable 'extra'"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_dense_table_refuses_a_bad_gradient_and_changes_nothing(case: str) -> None:
    gradient, message = BAD[case]
    table = DenseTable.create(variables(), shard=3)
    model = Model(table, make_optimizer(SGD))
    before, state = copies(table), model.optimizer.state()
    with pytest.raises(GradientError, match=message):
        table.check(gradient)
    with pytest.raises(GradientError, match=message):
        model.check({DENSE: gradient})
    for name, value in before.items():
        np.testing.assert_array_equal(table.variables[name], value, err_msg=name)
    assert {k: int(v) for k, v in model.optimizer.state().items()} == {k: int(v) for k, v in state.items()}


def test_dense_table_applies_a_good_gradient_through_the_optimizer() -> None:
    table = DenseTable.create(variables())
    model = Model(table, make_optimizer(SGD))
    table.check(good())
    model.apply({DENSE: good()}, lr=0.25)
    np.testing.assert_array_equal(table.variables["kernel"], variables()["kernel"] - np.float32(0.25))
    np.testing.assert_array_equal(table.variables["bias"], variables()["bias"] - 0.25)
    table.apply(good(), model.optimizer, 0.25, locking=True)  # the same, one writer per variable
    np.testing.assert_array_equal(table.variables["bias"], variables()["bias"] - 0.5)


@pytest.mark.parametrize(
    ("tensors", "message"),
    [
        ({"steps": np.zeros(2, dtype=np.int64)}, "'steps': dtype int64 is not a float type"),
        ({"w": np.array([1.0, np.nan])}, "'w': initial value is not finite"),
    ],
)
def test_dense_table_refuses_a_model_it_cannot_train(tensors: dict[str, np.ndarray], message: str) -> None:
    with pytest.raises(GradientError, match=message):
        DenseTable.create(tensors)


def test_dense_table_copies_the_pushed_model() -> None:
    given = variables()
    table = DenseTable.create(given)
    given["bias"][:] = 9.0
    np.testing.assert_array_equal(table.variables["bias"], variables()["bias"])


def test_dense_sum_averages_and_clears() -> None:
    table = DenseTable.create(variables())
    summed = table.accumulator()
    summed.add(good())
    summed.add({n: g * 3 for n, g in good().items()})
    mean = summed.averaged(2)
    np.testing.assert_array_equal(mean["kernel"], np.full((2, 2), 2.0, dtype=np.float32))
    assert mean["kernel"].dtype == np.float32
    summed.clear()
    summed.add(good())
    np.testing.assert_array_equal(summed.averaged(1)["bias"], np.ones(2))


def test_dense_snapshot_is_a_copy_in_its_namespace_and_restores() -> None:
    table = DenseTable.create(variables())
    arrays = table.snapshot()
    assert list(arrays) == ["var/kernel", "var/bias"]
    arrays["var/bias"][:] = 7.0
    np.testing.assert_array_equal(table.variables["bias"], variables()["bias"])
    back = DenseTable.restored({**table.snapshot(), "opt/step/bias": np.array(1)})
    assert list(back.variables) == ["kernel", "bias"]
    for name, value in variables().items():
        assert back.variables[name].dtype == value.dtype
        np.testing.assert_array_equal(back.variables[name], value)


def test_the_model_refuses_an_unknown_table() -> None:
    model = Model(DenseTable.create(variables()), make_optimizer(SGD))
    with pytest.raises(GradientError, match="no table 'embedding'"):
        model.check({DENSE: good(), "embedding": good()})


def test_the_dense_table_is_a_table() -> None:
    table: Table[dict[str, np.ndarray]] = DenseTable.create(variables())
    model = Model(DenseTable.create({}), make_optimizer(SGD), others={"second": table})
    assert list(model.tables) == [DENSE, STATE, "second"]  # the state table is always there
    model.apply({"second": good()}, lr=1.0)  # a table addressed by its name
    np.testing.assert_array_equal(table.variables["bias"], variables()["bias"] - 1.0)
