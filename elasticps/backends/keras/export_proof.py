"""Proof that an exported ``model.keras`` loads where the job's code is not: a fresh Python process
loads it with ``keras.models.load_model`` and runs it on a sample of the records, and its outputs
must be the worker's.

Caller: the Keras trainer's export (``trainer.py``), once the files are written. The fresh process
runs :data:`SCRIPT` (``python -c``) in an empty folder with ``PYTHONPATH`` unset, so only installed
packages are importable, and tries in turn: Keras alone; with ``elasticps.backends.keras.layers``
imported (the registered serialisation of elasticps's ``Embedding``); with the model module
imported from the worker's path and its own Keras classes given to Keras by name (``custom_objects``:
a model with layers of its own loads only where they are, as in a prediction job). ``loading.json``
in the export says which it took (:meth:`Proof.document`).
Outcomes (:class:`Proof`):

* loads and agrees: the export stands;
* does not load even beside its module (a subclassed model, whose class Keras cannot rebuild from
  its config): the trainer writes the model's functional twin instead (``functional_twin.py``: its
  ``call`` traced into a graph of its layers) and proves that; where there is no twin, or it does
  not load either, ``model.keras`` is left out of the export, ``saved_model/`` (which TensorFlow
  loads without any Python class) holds the model, and the reason is said (``loading.json``, a
  warning in the worker's log);
* loads but computes other outputs: the export fails with that line (:class:`ExportProofError`);
* the loading process itself fails (killed, out of memory) or outlasts :data:`TIMEOUT_S`: the
  export keeps ``model.keras``, unproven, and ``loading.json`` says why.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

# Seconds the fresh process may take (importing TensorFlow is most of it).
TIMEOUT_S = 300

SCRIPT = r"""
import importlib, json, sys
import numpy as np
model_file, sample_file, out_file, module, path = sys.argv[1:6]
import keras
sample = np.load(sample_file)
names = [n for n in sample.files if n.startswith("x/")]
x = {n[2:]: sample[n] for n in names} if names else sample["x"]

def imports_elasticps_layers():
    import elasticps.backends.keras.layers  # its layers' registered serialisation

custom = {}

def imports_the_module():
    sys.path[:0] = json.loads(path)  # the worker's path: where the model module is
    found = importlib.import_module(module)
    # Its own Keras classes (layers, models), by name: Keras locates no class outside its packages.
    custom.update({name: value for name, value in vars(found).items() if isinstance(value, type)
                   and issubclass(value, keras.layers.Layer) and value.__module__ == found.__name__})

model, needs, reason = None, [], ""
for name, before in (("", None), ("elasticps.backends.keras.layers", imports_elasticps_layers),
                     (module, imports_the_module)):
    try:
        if before is not None:
            before()
            needs.append(name)
        model = keras.models.load_model(model_file, compile=False, custom_objects=custom or None)
        break
    except Exception as err:
        reason = reason or ((type(err).__name__ + ": " + str(err)).strip().splitlines() or ["unknown"])[0]
if model is None:
    json.dump({"loaded": False, "reason": reason}, open(out_file, "w"))
    sys.exit(0)
outputs = keras.tree.flatten(model(x, training=False))
np.savez(out_file + ".npz", **{str(i): np.asarray(o) for i, o in enumerate(outputs)})
json.dump({"loaded": True, "needs": needs, "custom_objects": sorted(custom)}, open(out_file, "w"))
"""


class ExportProofError(Exception):
    """The exported model loads but does not compute what the worker's model computes."""


@dataclass(frozen=True)
class Proof:
    loaded: bool
    needs: tuple[str, ...] = ()  # the modules imported before it loaded (none: Keras alone)
    reason: str = ""  # why it did not load (when not loaded)
    unproven: str = ""  # the loading process itself failed (not the model): the file is kept, unproven
    twin_of: str = ""  # model.keras holds the functional twin of this subclass (functional_twin.py)
    custom_objects: tuple[str, ...] = ()  # the model module's own classes it loaded with (custom_objects=)

    def document(self) -> dict[str, Any]:
        """``loading.json``: how the export's files load."""
        if not self.loaded:
            return {"model.keras": None, "reason": self.reason,
                    "saved_model": "tf.saved_model.load(saved_model/) serves the model"}  # fmt: skip
        how: dict[str, Any] = {"functional_twin_of": self.twin_of} if self.twin_of else {}
        if self.custom_objects:  # keras.models.load_model(path, custom_objects={name: module.name, ...})
            how["custom_objects"] = list(self.custom_objects)
        if self.unproven:
            return {"model.keras": {"proven": False, "reason": self.unproven, **how}}
        return {"model.keras": {"keras.models.load_model": True, "needs": [f"import {m}" for m in self.needs], **how}}


def _first_sentence(reason: str, most: int = 240) -> str:
    """Keras's reason up to its first full stop (its advice and the object's config follow)."""
    cut = reason.find(". ")
    short = reason[: cut + 1] if cut > 0 else reason
    return short if len(short) <= most else short[: most - 3] + "..."


def _where_imports_are() -> list[str]:
    """This process's import path, absolute (``''`` is its working folder): the proof runs elsewhere."""
    return [os.path.abspath(entry) if entry else os.getcwd() for entry in sys.path]


def _sample_arrays(x: Any) -> dict[str, np.ndarray]:
    if isinstance(x, Mapping):
        return {f"x/{name}": np.asarray(value) for name, value in x.items()}
    return {"x": np.asarray(x)}


def prove(
    model_file: Path, x: Any, expected: list[np.ndarray], module: str, rtol: float = 1e-4, atol: float = 1e-5
) -> Proof:
    """Loads ``model_file`` in a fresh process and runs it on ``x``; ``expected``: the worker's
    outputs on ``x``, flattened. Keras alone first; then with elasticps's layers registered; then
    with the model ``module`` imported from the worker's path (its own layers: the export then
    loads where the module does, as a prediction job's does). Raises :class:`ExportProofError`
    when the outputs differ."""
    with tempfile.TemporaryDirectory(prefix="elasticps-proof-") as scratch:
        sample, out = Path(scratch) / "sample.npz", Path(scratch) / "out.json"
        arrays: dict[str, Any] = _sample_arrays(x)
        np.savez(sample, **arrays)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env["TF_CPP_MIN_LOG_LEVEL"] = "3"
        try:
            done = subprocess.run(
                [sys.executable, "-c", SCRIPT, str(model_file.resolve()), str(sample), str(out), module,
                 json.dumps(_where_imports_are())],
                cwd=scratch, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=TIMEOUT_S,
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            return Proof(True, unproven=f"the loading process took over {TIMEOUT_S} s and was stopped")
        if done.returncode != 0 or not out.exists():
            tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
            return Proof(True, unproven=f"the loading process failed: {tail}")
        said = json.loads(out.read_text())
        if not said["loaded"]:
            return Proof(False, reason=_first_sentence(str(said["reason"])))
        with np.load(str(out) + ".npz") as got:
            outputs = [got[str(i)] for i in range(len(got.files))]
    if len(outputs) != len(expected) or any(
        a.shape != b.shape or not np.allclose(a, b, rtol=rtol, atol=atol) for a, b in zip(outputs, expected)
    ):
        worst = max((float(np.max(np.abs(a - b))) for a, b in zip(outputs, expected) if a.shape == b.shape), default=-1.0)
        raise ExportProofError(f"{model_file.name} loaded in a fresh process computes other outputs than the "
                               f"worker's model on {len(expected[0]) if expected else 0} records (largest difference "
                               f"{worst:.3g})")
    return Proof(True, tuple(said["needs"]), custom_objects=tuple(said.get("custom_objects", ())))
