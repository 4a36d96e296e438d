"""The modes and slowdowns ``bench.heterogeneity`` crosses, and the TrainingJob of each pair. Pure.

Every run trains one YAML document (``examples/mnist.yaml`` by default) with only these settings
changed: 1 PS + 4 workers, no output, no checkpoints, an evaluation about every eighth of an epoch
(in model versions, which each mode makes at its own rate: one per round in sync, one per
minibatch in async and SSP, one per K-step period in LocalSGD), the mode's fields and the
slowdown's. The learning rate: the model's (0.05, momentum 0.9) for sync and LocalSGD; 0.02 for the
async modes, as ``examples/mnist-async.yaml`` had when docs/heterogeneity.md was measured (plain
async at 0.05 with momentum 0.9 was not stable before the staleness compensation of issue 33:
docs/architecture.md, "Async staleness").
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

PS_REPLICAS = 1
WORKERS = 4
EVALUATIONS_PER_EPOCH = 8
ASYNC_LEARNING_RATE = 0.02
WARMUP_STEPS = 50  # LocalSGD's fixed K: K = 1 for 50 steps, then 1, 2, 4, ... each for 50


@dataclass(frozen=True)
class Mode:
    key: str
    label: str
    training: Mapping[str, Any] = field(default_factory=dict)
    minibatches_per_version: float = 1.0  # how many minibatches make one model version (roughly)
    decentralized: Mapping[str, Any] | None = None  # spec.decentralized: the strategy without PS


def hop(key: str, label: str, **settings: Any) -> Mode:
    """A decentralized mode: no PS; its "model version" is the highest iteration a worker reached,
    one per minibatch of each worker."""
    return Mode(key, label, {}, WORKERS, {"graph": "ring", "maxIterationGap": 4, **settings})


MODES = (
    Mode("sync", "sync", {}, WORKERS),
    Mode("sync-backup", "sync, 1 backup worker", {"gradsToWait": WORKERS - 1}, WORKERS - 1),
    Mode("async", "async", {"useAsync": True, "learningRate": ASYNC_LEARNING_RATE}),
    Mode("async-lr", "async + staleness lr", {"useAsync": True, "lrStalenessModulation": True, "learningRate": ASYNC_LEARNING_RATE}),
    Mode("ssp4", "SSP k=4", {"useAsync": True, "getModelFrequency": 4, "learningRate": ASYNC_LEARNING_RATE}),
    *(
        Mode(f"localsgd{k}", f"LocalSGD K={k}", {"localSGDSteps": k, "localSGDWarmupSteps": WARMUP_STEPS}, WORKERS * k)
        for k in (2, 4, 8)
    ),
    Mode("localsgd-adaptive", "LocalSGD adaptive (K0=8)", {"localSGDSteps": 8, "adaptiveLocalSGD": True}, WORKERS * 4),
    # Hop (seed 004) on a ring of 4 (a ringBased graph of 4 is the complete graph, so the ring is the
    # sparse one here); skipping rides on backup workers, which let neighbours run ahead of a straggler.
    hop("hop", "decentralized (ring)"),
    hop("hop-backup1", "decentralized, 1 backup worker", backupWorkers=1),
    hop("hop-stale5", "decentralized, staleness 5", staleness=5, maxIterationGap=6),
    hop("hop-skip2", "decentralized, backup 1 + skipping (max jump 2)", backupWorkers=1, skipMaxJump=2, maxIterationGap=12),
    hop("hop-skip10", "decentralized, backup 1 + skipping (max jump 10)", backupWorkers=1, skipMaxJump=10, maxIterationGap=12),
    hop("allreduce", "decentralized, complete graph (all-reduce averaging)", graph="complete"),
)


@dataclass(frozen=True)
class Slowdown:
    key: str
    label: str
    text: str  # spec.training.slowdown


SLOWDOWNS = (
    Slowdown("none", "no slowdown", ""),
    Slowdown("random6", f"every step 6x slower with probability 1/{WORKERS}", f"random:6:{1 / WORKERS:g}"),
    Slowdown("straggler4", "worker 0 4x slower", "0:4"),
)
MODE_BY_KEY = {m.key: m for m in MODES}
SLOWDOWN_BY_KEY = {s.key: s for s in SLOWDOWNS}


def evaluation_steps(mode: Mode, records: int, minibatch: int) -> int:
    """Model versions between evaluations: about :data:`EVALUATIONS_PER_EPOCH` per epoch."""
    versions_per_epoch = records / minibatch / mode.minibatches_per_version
    return max(1, round(versions_per_epoch / EVALUATIONS_PER_EPOCH))


def derive(document: Mapping[str, Any], mode: Mode, slowdown: Slowdown, records: int, epochs: int | None = None) -> dict[str, Any]:
    """The TrainingJob of (``mode``, ``slowdown``): ``document`` (a parsed YAML TrainingJob, left
    unchanged) with this benchmark's settings; ``records``: the training records (for the
    evaluation period)."""
    job = copy.deepcopy(dict(document))
    metadata = job.setdefault("metadata", {})
    metadata["name"] = f"{metadata.get('name', 'job')}-{mode.key}-{slowdown.key}"
    spec = job.setdefault("spec", {})
    spec.pop("output", None)
    spec.pop("prediction", None)
    if mode.decentralized is not None:
        spec.pop("ps", None)
        spec["strategy"] = "decentralized"
        spec["decentralized"] = dict(mode.decentralized)
    else:
        spec.setdefault("ps", {})["replicas"] = PS_REPLICAS
    spec.setdefault("worker", {})["replicas"] = WORKERS
    training = spec.setdefault("training", {})
    for key in ("exportSteps", "gradsToWait", "useAsync", "lrStalenessModulation", "getModelFrequency"):
        training.pop(key, None)
    training["checkpointSteps"] = 0
    if epochs is not None:
        training["numEpochs"] = epochs
    training.update(mode.training)
    training["evaluationSteps"] = evaluation_steps(mode, records, int(training.get("minibatchSize", 64)))
    if slowdown.text:
        training["slowdown"] = slowdown.text
    return job
