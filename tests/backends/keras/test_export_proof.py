"""An export proven in a fresh process (``elasticps/backends/keras/export_proof.py``): a functional
model loads with plain Keras, one with elasticps's Embedding once its layers are registered, a
subclassed one does not (the reason said) but its functional twin does (``functional_twin.py``),
and outputs that differ fail the proof."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import keras
import numpy as np
import pytest

from elasticps.backends.keras.export_proof import ExportProofError, prove
from elasticps.backends.keras.functional_twin import functional_twin, is_subclassed
from elasticps.backends.keras.layers import Embedding

pytestmark = pytest.mark.slow  # each proof starts a Python process that imports Keras


def saved(model: keras.Model, tmp_path: Path, x: Any) -> tuple[Path, list[np.ndarray]]:
    path = tmp_path / "model.keras"
    model.save(path)
    return path, [np.asarray(o) for o in keras.tree.flatten(model(x, training=False))]


def test_a_functional_model_loads_with_keras_alone_and_computes_the_same(tmp_path: Path) -> None:
    inputs = {"a": keras.Input((3,), name="a"), "b": keras.Input((2,), name="b")}
    joined = keras.layers.Concatenate()([inputs["a"], inputs["b"]])
    model = keras.Model(inputs, {"logits": keras.layers.Dense(2)(joined), "probs": keras.layers.Dense(1, "sigmoid")(joined)})
    x = {"a": np.ones((4, 3), np.float32), "b": np.full((4, 2), 0.5, np.float32)}
    path, expected = saved(model, tmp_path, x)
    proof = prove(path, x, expected, "not_needed")
    assert (proof.loaded, proof.needs) == (True, ())
    assert proof.document() == {"model.keras": {"keras.models.load_model": True, "needs": []}}
    with pytest.raises(ExportProofError, match="computes other outputs than the worker's model on 4 records"):
        prove(path, x, [expected[0] + 1.0, expected[1]], "not_needed")


def test_a_model_with_elasticps_embedding_needs_only_its_layers_registered(tmp_path: Path) -> None:
    ids = keras.Input((3,), dtype="int64")
    model = keras.Model(ids, keras.layers.Flatten()(Embedding("t", 4, local_rows=32)(ids)))
    x = np.array([[1, 2, 3], [4, 5, 31]], np.int64)
    path, expected = saved(model, tmp_path, x)
    proof = prove(path, x, expected, "not_needed")
    assert (proof.loaded, proof.needs) == (True, ("elasticps.backends.keras.layers",))
    assert proof.document()["model.keras"]["needs"] == ["import elasticps.backends.keras.layers"]


def test_a_model_with_layers_of_its_own_loads_beside_its_module(tmp_path: Path) -> None:
    from elasticps.backends.keras.zoo import deepfm  # its layers are the module's (registered there)

    model = deepfm.custom_model(dim=4, hidden=8, local_rows=64)
    x = np.arange(39 * 3, dtype=np.int64).reshape(3, 39)
    path, expected = saved(model, tmp_path, x)
    proof = prove(path, x, expected, deepfm.__name__)
    assert proof.loaded and proof.needs == ("elasticps.backends.keras.layers", deepfm.__name__)


class Subclassed(keras.Model):
    def __init__(self) -> None:
        super().__init__()
        self.dense = keras.layers.Dense(2)

    def call(self, inputs: Any, training: bool = False) -> Any:
        return self.dense(inputs)


def test_a_subclassed_model_does_not_load_without_its_class_and_the_proof_says_so(tmp_path: Path) -> None:
    x = np.ones((2, 3), np.float32)
    model = Subclassed()
    model(x)
    path, expected = saved(model, tmp_path, x)
    proof = prove(path, x, expected, __name__)  # not even beside its module: the class is not registered
    assert not proof.loaded and proof.reason == "TypeError: Could not locate class 'Subclassed'."
    assert proof.document()["model.keras"] is None


class SubclassedOnNamedInputs(keras.Model):
    """ElasticDL's zoo style: a dict of named inputs, layers of Keras's own, a training flag."""

    def __init__(self) -> None:
        super().__init__(name="named")
        self.hidden = keras.layers.Dense(4, activation="relu")
        self.dropout = keras.layers.Dropout(0.5)
        self.out = keras.layers.Dense(2)

    def call(self, inputs: Any, training: bool = False) -> Any:
        joined = keras.ops.concatenate([inputs["a"], keras.ops.cast(inputs["b"], "float32")], axis=-1)
        return self.out(self.dropout(self.hidden(joined), training=training))


def test_the_functional_twin_of_a_subclassed_model_loads_with_keras_alone_and_computes_the_same(tmp_path: Path) -> None:
    x = {"a": np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3), "b": np.arange(8, dtype=np.int64).reshape(4, 2)}
    model = SubclassedOnNamedInputs()
    expected = [np.asarray(model(x, training=False))]
    assert is_subclassed(model)

    twin, why = functional_twin(model, x)

    assert why == "" and twin is not None and not is_subclassed(twin)
    assert {id(w) for w in twin.weights} == {id(w) for w in model.weights}  # the same variables, shared
    twin.save(tmp_path / "model.keras")
    proof = prove(tmp_path / "model.keras", x, expected, "not_needed")
    assert (proof.loaded, proof.needs) == (True, ())  # Keras alone: no class to locate
    assert not is_subclassed(keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)]))


class SubclassedBranchingOnValues(keras.Model):
    def __init__(self) -> None:
        super().__init__()
        self.dense = keras.layers.Dense(2)

    def call(self, inputs: Any) -> Any:
        return self.dense(inputs if float(inputs.numpy().sum()) > 0 else -inputs)  # a symbolic tensor has no value


def test_a_subclassed_model_whose_call_cannot_be_traced_has_no_twin_and_says_why() -> None:
    x = np.ones((2, 3), np.float32)
    model = SubclassedBranchingOnValues()
    model(x)
    twin, why = functional_twin(model, x)
    assert twin is None and why.startswith("its call cannot be traced on symbolic inputs (")


def test_a_relative_path_is_proven_where_the_worker_is(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # spec.output relative to where the run started; the proof runs elsewhere
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    x = np.ones((2, 3), np.float32)
    model.save("m.keras")
    assert prove(Path("m.keras"), x, [np.asarray(model(x))], "not_needed").loaded


def test_a_loading_process_that_dies_keeps_the_file_unproven(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from elasticps.backends.keras import export_proof

    monkeypatch.setattr(export_proof, "SCRIPT", "import os; os._exit(9)")  # killed, as by the OOM killer
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    x = np.ones((2, 3), np.float32)
    path, expected = saved(model, tmp_path, x)
    proof = prove(path, x, expected, "not_needed")
    assert proof.loaded and proof.unproven.startswith("the loading process failed")
    assert proof.document() == {"model.keras": {"proven": False, "reason": proof.unproven}}


def test_a_loading_process_that_hangs_is_stopped_and_the_file_kept_unproven(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from elasticps.backends.keras import export_proof

    monkeypatch.setattr(export_proof, "SCRIPT", "import time; time.sleep(60)")
    monkeypatch.setattr(export_proof, "TIMEOUT_S", 1)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    x = np.ones((2, 3), np.float32)
    path, expected = saved(model, tmp_path, x)
    proof = prove(path, x, expected, "not_needed")
    assert proof.loaded and proof.unproven == "the loading process took over 1 s and was stopped"
