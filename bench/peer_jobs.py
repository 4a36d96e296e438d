"""The systems ``bench.peer`` compares, and the TrainingJob each one runs, derived from one job.

Every system gets the same model, data, minibatch, learning rate, optimizer and epochs: one YAML
document (``examples/mnist-async.yaml`` by default) with only the settings below changed.

* 1 PS + 2 workers for all (the peer's cluster: ``bench.peer_tf``);
* ``evaluationSteps: 0``: the test set is evaluated once, at the end, as the peer does (no
  evaluation runs during epoch 2);
* no ``spec.output`` (no export, no TensorBoard file: the peer writes neither) and no checkpoints;
* the learning rate: the job's ``learningRate`` (none in the example: the model's 0.05), for all systems;
* ``sync``: ``useAsync: false`` (each round averages one gradient per live worker);
  ``async``: ``useAsync: true``, ``lrStalenessModulation: false``;
  ``async+lr``: ``useAsync: true``, ``lrStalenessModulation: true`` (lr / staleness).

The peer reads the same derived document (``bench.peer_tf`` uses its model, data, minibatch, lr and
epochs; its own cluster is always 1 PS + 2 workers).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

PS_REPLICAS = 1
WORKER_REPLICAS = 2


@dataclass(frozen=True)
class System:
    key: str  # in results and on the command line
    label: str  # in tables and plots
    use_async: bool | None  # None: the peer
    staleness_lr: bool = False


PEER = System("peer", "TensorFlow ParameterServerStrategy", None)
SYNC = System("sync", "elasticps sync", False)
ASYNC = System("async", "elasticps async", True, False)
ASYNC_LR = System("async+lr", "elasticps async + staleness-aware lr", True, True)
SYSTEMS = (PEER, SYNC, ASYNC, ASYNC_LR)
BY_KEY = {s.key: s for s in SYSTEMS}


def derive(document: dict[str, Any], system: System, epochs: int | None = None) -> dict[str, Any]:
    """The TrainingJob ``system`` runs: ``document`` (a parsed YAML TrainingJob, left unchanged)
    with the cluster, evaluation, output and mode settings of this benchmark."""
    job = copy.deepcopy(document)
    metadata = job.setdefault("metadata", {})
    metadata["name"] = f"{metadata.get('name', 'job')}-bench-{system.key.replace('+', '-')}"
    spec = job.setdefault("spec", {})
    spec.pop("output", None)
    spec.pop("prediction", None)
    spec.setdefault("ps", {})["replicas"] = PS_REPLICAS
    spec.setdefault("worker", {})["replicas"] = WORKER_REPLICAS
    training = spec.setdefault("training", {})
    training["evaluationSteps"] = 0
    training["checkpointSteps"] = 0
    training.pop("exportSteps", None)
    if epochs is not None:
        training["numEpochs"] = epochs
    if system.use_async is not None:
        training["useAsync"] = system.use_async
        training["lrStalenessModulation"] = system.staleness_lr
        if not system.use_async:
            training.pop("gradsToWait", None)  # one gradient per live worker per round
    return job


def settings(document: dict[str, Any]) -> dict[str, Any]:
    """What every system shares, for the results file and the doc."""
    spec = document.get("spec", {})
    training = spec.get("training", {})
    return {
        "model_def": spec.get("model", {}).get("modelDef"),
        "training": spec.get("data", {}).get("training"),
        "validation": spec.get("data", {}).get("validation"),
        "minibatch": training.get("minibatchSize", 64),
        "learning_rate": training.get("learningRate", 0.0),
        "num_epochs": training.get("numEpochs", 1),
        "records_per_task": training.get("recordsPerTask", 2048),
        "ps": PS_REPLICAS,
        "workers": WORKER_REPLICAS,
    }
