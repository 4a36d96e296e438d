"""The TrainingJob, typed: frozen dataclasses, the one definition of every field.

A TrainingJob (``elasticps.io/v1alpha1``) is parsed once, at the edge (``parsing.parse_job``), into
these classes; everything after that (the local runner, the operator, the PS and worker command lines)
reads typed values. YAML spells fields in camelCase; the classes use snake_case.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum
from typing import Any

from elasticps.api.fields import spec_field
from elasticps.api.graph import KINDS as GRAPH_KINDS
from elasticps.api.graph import Graph, build
from elasticps.api.row_policy import row_policy_problem
from elasticps.api.slowdown import slowdown_problem

# Sanity bounds (see fields.FieldInfo.maximum): far above any real job, far below what breaks a process.
MAX_EPOCHS = 1_000_000
MAX_PULL_INTERVAL = 1_000_000
MAX_REPLICAS = 10_000

GROUP = "elasticps.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "TrainingJob"
PLURAL = "trainingjobs"
SHORT_NAME = "tj"


class RestartPolicy(str, Enum):
    """When a failed replica is replaced (Kubeflow's policies).

    ExitCode: exit codes 1-127 are permanent errors (no restart), 128 and above (signals, OOM kills)
    are retried.
    """

    ALWAYS = "Always"
    ON_FAILURE = "OnFailure"
    NEVER = "Never"
    EXIT_CODE = "ExitCode"


class CleanPodPolicy(str, Enum):
    """Which pods are deleted when the job finishes (Kubeflow's policies)."""

    NONE = "None"
    RUNNING = "Running"
    ALL = "All"


class DataReader(str, Enum):
    """The built-in readers (``spec.data.reader``; a plug-in reader is ``package.module:ClassName``).

    ``idx``: MNIST-style idx files, the path is the prefix before ``-images-idx3-ubyte[.gz]``;
    ``npz``: a numpy .npz file holding arrays ``x`` and ``y``; ``tfrecord``: files of serialized
    ``tf.train.Example`` records, parsed by the model's ``feed``; ``csv`` and ``tsv``: delimited text,
    one record per line; ``parquet``: Parquet files; ``criteo``: Criteo's click-log TSV, read as one
    embedding id per field (``data/criteo.py``). The path of the last five may be a glob
    (``train-*.tfrecord``): its files, sorted, are one dataset.
    """

    IDX = "idx"
    NPZ = "npz"
    TFRECORD = "tfrecord"
    CSV = "csv"
    TSV = "tsv"
    PARQUET = "parquet"
    CRITEO = "criteo"


# A plug-in reader: a module path and a class name, e.g. ``my_pkg.readers:AvroReader``.
READER_PLUGIN_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$"
READER_PATTERN = "^(" + "|".join(r.value for r in DataReader) + ")$|" + READER_PLUGIN_PATTERN


def reader_problem(value: str) -> str | None:
    """Why ``value`` names no reader (one line), or None: a built-in name or ``package.module:Class``.
    The syntax only; the plug-in's import is checked by the process that opens the data."""
    if value in {r.value for r in DataReader} or re.fullmatch(READER_PLUGIN_PATTERN, value):
        return None
    builtins = ", ".join(r.value for r in DataReader)
    return f"must be a built-in reader ({builtins}) or a plug-in class as package.module:ClassName, got {value!r}"


PULL_POLICIES = ("Always", "IfNotPresent", "Never")


def pull_policy_problem(value: str) -> str | None:
    """Why ``value`` is no imagePullPolicy Kubernetes knows ("" is: the operator's default)."""
    if value in ("", *PULL_POLICIES):
        return None
    return f"must be one of {', '.join(PULL_POLICIES)} (or empty: the operator's default), got {value!r}"


def delimiter_problem(value: str) -> str | None:
    """Why ``value`` cannot separate fields (one line), or None. ``\\t`` (backslash, t) means a tab."""
    if value in ("", "\\t"):
        return None
    if len(value) != 1:
        return f"must be one character (or \\t for a tab), got {value!r}"
    if value in "\"\r\n":
        return f"cannot be a quote or a line break, got {value!r}"
    return None


class Strategy(str, Enum):
    """How a job's workers share a model. ``parameterServer``: PS shards hold it and workers push
    gradients and pull it. ``decentralized``: every worker holds its own and averages it with its
    neighbours' in a graph (seed 004's Hop, ``spec.decentralized``); no PS, a coordinator of its own
    hands out the data. The planner, the schema and the Services and NetworkPolicy read it instead of
    assuming PS pods."""

    PARAMETER_SERVER = "parameterServer"
    DECENTRALIZED = "decentralized"


class Framework(str, Enum):
    """The framework a job's model module is written for (``spec.model.framework``): the worker,
    prediction and ``elasticps export`` build the model through that framework's backend
    (``elasticps/backends/registry.py``). The PS, the coordinator and the operator never load it."""

    KERAS = "keras"
    TORCH = "torch"


class SchedulingPolicy(str, Enum):
    """Who decorates a job's pods for a cluster's scheduler and admission (``spec.scheduling.policy``):
    a scheduler name, labels, annotations, scheduling gates, and a group object (a PodGroup) living
    with the job. ``none``: nothing, the default scheduler takes each pod as it comes.
    ``coscheduling``: the PS and the fewest workers are one gang (a PodGroup) for the scheduler-plugins'
    Coscheduling plugin, in the scheduler ``spec.scheduling.schedulerName``. The operator reads it
    (``operator/scheduling``); the local runner has no scheduler and ignores it."""

    NONE = "none"
    COSCHEDULING = "coscheduling"


SCALE_DECENTRALIZED = (
    "a decentralized job's graph is fixed when it starts: its workers cannot be scaled (delete and re-create it)"
)


class StalenessCompensation(str, Enum):
    """How an async PS corrects a push for its staleness (``spec.training.stalenessCompensation``,
    ``elasticps/ps/staleness.py``). ``momentumCorrection`` (the default): the push is applied with
    the optimizer's momentum less the momentum its staleness already carries (SGD and RMSprop
    momentum; Adam, Adagrad and embedding rows as configured). ``none``: every push as configured."""

    NONE = "none"
    MOMENTUM_CORRECTION = "momentumCorrection"


class JobPhase(str, Enum):
    """``status.phase`` of a TrainingJob: the type of its latest true condition (Kubeflow's types),
    or Pending (no condition of its own: Unschedulable or CannotStart say why).

    Created -> Queued while a queue (Kueue) has not admitted the job, or after it evicted it (condition
    Queued says why); Created -> Running (every PS and at least one worker run) <-> Restarting (a failed pod is being
    replaced, until every pod runs again); Created <-> Pending while a pod cannot be scheduled or its
    container cannot start (conditions Unschedulable, CannotStart, which say why); any non-final phase -> Suspended (``runPolicy.suspend``) -> back through Created when
    resumed; Succeeded and Failed are final. The operator's planner implements the transitions.
    """

    CREATED = "Created"
    QUEUED = "Queued"
    PENDING = "Pending"
    RUNNING = "Running"
    RESTARTING = "Restarting"
    SUSPENDED = "Suspended"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


@dataclass(frozen=True)
class ModelSpec:
    model_def: str = spec_field(help="Python module of the model (custom_model, loss, optimizer, feed, eval_metrics_fn)")
    params: dict[str, Any] = spec_field(
        default_factory=dict, help="keyword arguments passed to custom_model()", opaque=True
    )
    framework: Framework = spec_field(
        Framework.KERAS, help="what the model module is written for: keras or torch (their contracts in docs/model-zoo.md)"
    )


@dataclass(frozen=True)
class DataSpec:
    """Where the records are and how they are read; each field is also a flag of ``elasticps ps``
    and ``elasticps worker`` (``flags.data_args``)."""

    training: str = spec_field(
        "",
        help="training data: a path or an object-store URI (s3://bucket/train-*.tfrecord); see reader; "
        "[START:END] at the end takes those records only (data.txt[0:8000]); "
        "empty only for a job that predicts with an exported model (spec.prediction.model)",
        flag="training_data",
    )
    validation: str = spec_field("", help="validation data, as training; empty: no evaluation", flag="validation_data")
    reader: str = spec_field(
        DataReader.IDX.value,
        help="how records are read: idx, npz, tfrecord, csv, tsv, parquet, criteo, or a plug-in class "
        "package.module:ClassName",
        flag="data_reader",
        check=reader_problem,
    )
    delimiter: str = spec_field(
        "", help="csv/tsv: the field separator, one character or \\t (empty: ',' for csv, a tab for tsv)",
        check=delimiter_problem,
    )
    header: bool = spec_field(True, help="csv/tsv: the first line of each file names the columns")
    label_column: str = spec_field(
        "",
        help="csv/tsv/parquet: the label column, by name (by 0-based index without a header); "
        "empty: no labels (prediction data)",
    )
    feature_columns: str = spec_field(
        "",
        help="csv/tsv/parquet: the feature columns, comma-separated names (indexes without a header); "
        "empty: every column but the label",
    )
    index_dir: str = spec_field(
        "",
        help="where tfrecord/csv record-offset indexes are cached, never the data's folder (empty: "
        "~/.cache/elasticps/data-index of each process; a shared volume lets workers reuse PS 0's)",
    )


def graph_problem(value: str) -> str | None:
    """Why ``value`` names no graph kind (one line), or None."""
    return None if value in GRAPH_KINDS else f"must be one of {', '.join(GRAPH_KINDS)}, got {value!r}"


def _cells(text: str) -> list[list[str]]:
    """``'1,2;0;0'`` -> ``[['1', '2'], ['0'], ['0']]``: rows by ';', entries by ','."""
    return [[c for c in (cell.strip() for cell in row.split(",")) if c] for row in text.split(";")]


def int_rows(text: str) -> list[list[int]]:
    return [[int(c) for c in row] for row in _cells(text)]


def float_rows(text: str) -> list[list[float]]:
    return [[float(c) for c in row] for row in _cells(text)]


def neighbours_problem(value: str) -> str | None:
    try:
        int_rows(value)
    except ValueError:
        return f"must be each worker's out-neighbours, workers by ';' and ids by ',' (e.g. '1,2;0,2;0,1'), got {value!r}"
    return None


def weights_problem(value: str) -> str | None:
    try:
        float_rows(value)
    except ValueError:
        return f"must be a matrix of numbers, rows by ';' and entries by ',' (e.g. '0.5,0.5;0.5,0.5'), got {value!r}"
    return None


@dataclass(frozen=True)
class DecentralizedSpec:
    """Hop's settings (``spec.decentralized``, seed 004), read when ``spec.strategy`` is
    ``decentralized``; each field is also a flag of ``elasticps worker``."""

    graph: str = spec_field(
        "ring",
        help="the communication graph: ring, ringBased (a ring plus a chord to the opposite worker), "
        "doubleRing (two rings joined), complete (all-reduce averaging) or explicit (neighbours)",
        check=graph_problem,
    )
    neighbours: str = spec_field(
        "",
        help="explicit graph: each worker's out-neighbours, workers by ';' and ids by ',' "
        "('1,3;0,2;1,3;0,2' is a ring of 4)",
        check=neighbours_problem,
    )
    weights: str = spec_field(
        "",
        help="explicit graph: weights[i][j], the weight of worker i's model in worker j's average, rows by "
        "';' and entries by ','; doubly stochastic, every worker keeping a part of its own (empty: "
        "Metropolis-Hastings weights, which need an undirected graph)",
        check=weights_problem,
    )
    max_iteration_gap: int = spec_field(
        4,
        minimum=1,
        maximum=MAX_PULL_INTERVAL,
        help="max_ig: how many iterations a worker may run ahead of each out-neighbour (token queues); "
        "each worker keeps up to max_ig + 1 models per in-neighbour",
    )
    backup_workers: int = spec_field(
        0,
        minimum=0,
        maximum=MAX_REPLICAS,
        help="backup workers: an iteration goes on with all but this many in-neighbours' models (0: waits for all)",
    )
    staleness: int = spec_field(
        0,
        minimum=0,
        maximum=MAX_PULL_INTERVAL,
        help="bounded staleness: each in-neighbour's newest model may be this many iterations old "
        "(0: the model of the same iteration); not with backupWorkers",
    )
    skip_max_jump: int = spec_field(
        0,
        minimum=0,
        maximum=MAX_PULL_INTERVAL,
        help="skipping iterations: a straggler behind all its out-neighbours jumps ahead, skipping at "
        "most this many iterations (0: never); needs backupWorkers or staleness",
    )
    skip_trigger: int = spec_field(
        2,
        minimum=2,
        maximum=MAX_PULL_INTERVAL,
        help="skipping iterations: a worker jumps once it is this many iterations behind every out-neighbour",
    )

    def graph_for(self, workers: int) -> Graph:
        """The job's graph over ``workers`` workers; :class:`~elasticps.api.graph.GraphError` if it
        cannot train."""
        neighbours = int_rows(self.neighbours) if self.neighbours.strip() else []
        weights = float_rows(self.weights) if self.weights.strip() else []
        return build(self.graph, workers, neighbours, weights)

    @property
    def label(self) -> str:
        """``status.mode`` and the MODE column: Decentralized, with its rule and skipping."""
        label = "Decentralized"
        if self.backup_workers:
            label += f"-backup{self.backup_workers}"
        if self.staleness:
            label += f"-stale{self.staleness}"
        if self.skip_max_jump:
            label += f"-skip{self.skip_max_jump}"
        return label


# Dense variables above this many bytes are split into row slices over the PS shards (psclient/sharding.py).
DEFAULT_SPLIT_BYTES = 4 << 20


@dataclass(frozen=True)
class TrainingSpec:
    """Training settings; each one is also a flag of ``elasticps ps`` and ``elasticps worker``."""

    use_async: bool = spec_field(False, help="asynchronous SGD: the PS applies every gradient at once")
    lr_staleness_modulation: bool = spec_field(
        False, help="async: divide the learning rate by the gradient's staleness when it is > 0"
    )
    staleness_compensation: StalenessCompensation = spec_field(
        StalenessCompensation.MOMENTUM_CORRECTION,
        help="async: how the PS corrects a gradient for its staleness: momentumCorrection applies it with "
        "the optimizer's momentum less the momentum asynchrony already adds (s / (s + 1), s the larger of "
        "its staleness and the recent mean), so a job keeps the momentum it had in sync; none applies "
        "every gradient as configured",
    )
    use_locking: bool = spec_field(False, help="async: serialise the updates of each variable")
    overlap_pull: bool = spec_field(
        False,
        help="async: the pull for the next minibatch leaves with the push of the last one and travels "
        "while the worker's loop goes on, so the next gradient may be computed on a model without "
        "this worker's own last gradient (one own step more of staleness)",
    )
    get_model_frequency: int = spec_field(
        1,
        minimum=1,
        maximum=MAX_PULL_INTERVAL,
        aliases=("get_model_steps",),
        help="async: pull the model every k steps; in between apply own gradients to the local copy",
    )
    local_sgd_steps: int = spec_field(
        0,
        minimum=0,
        maximum=MAX_PULL_INTERVAL,
        help="LocalSGD: each worker takes K optimizer steps on its own copy, then the workers' models "
        "are averaged through the PS in a round (0: off); with adaptiveLocalSGD, the first K",
    )
    local_sgd_warmup_steps: int = spec_field(
        0,
        minimum=0,
        help="LocalSGD: local steps taken with K = 1 before K grows (seed 003's warm-up, counted in "
        "steps: after it, K is 1, 2, 4, ... up to localSGDSteps, each for as many steps again)",
    )
    adaptive_local_sgd: bool = spec_field(
        False,
        help="LocalSGD: K follows the training loss and learning rate after each round "
        "(AdaComm: K0 * sqrt(lr0 (F - Finf) / (lr (F0 - Finf)))); SGD optimizers only",
    )
    local_sgd_inf_loss: float = spec_field(
        0.0, help="adaptive LocalSGD: the lowest training loss the model can reach (Finf)"
    )
    grads_to_wait: int = spec_field(
        0,
        minimum=0,
        help="sync: gradients averaged into one round; 0 means one per live worker, fewer gives backup workers",
    )
    sync_version_tolerance: int = spec_field(
        0, minimum=0, help="sync: accept gradients at most this many versions old"
    )
    minibatch_size: int = spec_field(64, minimum=1, help="records per minibatch on each worker")
    num_epochs: int = spec_field(1, minimum=1, maximum=MAX_EPOCHS, help="passes over the training data")
    learning_rate: float = spec_field(
        0.0, minimum=0.0, help="overrides the model's optimizer learning rate when > 0"
    )
    records_per_task: int = spec_field(2048, minimum=1, help="records in one task handed to a worker")
    evaluation_steps: int = spec_field(
        0, minimum=0, help="evaluate every this many model versions (0: only at the end)"
    )
    checkpoint_steps: int = spec_field(0, minimum=0, help="checkpoint the PS every this many versions (0: never)")
    checkpoint_dir: str = spec_field("", help="where PS checkpoints are written (empty: the runner chooses)")
    keep_checkpoint_max: int = spec_field(3, minimum=1, help="checkpoints kept per PS shard")
    checkpoint_full_every: int = spec_field(
        0,
        minimum=0,
        help="incremental checkpoints: one whole checkpoint in this many; the ones between hold the dense "
        "tensors whole and, of each embedding table, only the rows used since the last whole one (and the "
        "ids evicted since), and a restore puts the two together (0 or 1: every checkpoint whole)",
    )
    task_timeout_seconds: float = spec_field(
        60.0,
        minimum=0.0,
        exclusive_minimum=True,
        help="a task whose worker is silent this long goes back to the queue",
    )
    export_steps: int = spec_field(
        0,
        minimum=0,
        help="with spec.output: also export the model every this many versions, into "
        "<output>/versions/<version>/ (0: only the final model)",
    )
    seed: int = spec_field(
        0,
        minimum=0,
        maximum=2**31 - 1,
        help="fixes the model's initial weights and the order of tasks and minibatches, so a run can be "
        "repeated (asynchronous updates still interleave as they come); 0: initial weights drawn afresh",
    )
    stall_epochs: float = spec_field(
        1.0,
        minimum=0.0,
        help="training health: a job whose training loss has not fallen below its first values after "
        "this many epochs of records is Stalled (a condition, an event, a warning); 0: never judged. A "
        "loss that is not finite, or 10 times its first values, is Diverged at once",
    )
    fail_unhealthy: bool = spec_field(
        False,
        help="training health: a Diverged or Stalled job fails with that reason instead of training on "
        "and exporting its model (false: it only warns)",
    )
    slowdown: str = spec_field(
        "",
        help="stragglers on purpose, for experiments: '<worker>:<factor>' (0:4: worker 0 four times "
        "slower) and/or 'random:<factor>:<probability>' (every worker, each step), comma-separated; "
        "a worker sleeps factor - 1 times its compute time after each minibatch (decentralized: its "
        "whole iteration's work, averaging included) (empty: none)",
        check=slowdown_problem,
    )
    embedding_policy: str = spec_field(
        "",
        help="which rows each embedding table keeps on each PS shard: ';'-separated clauses "
        "'[<table>:]<key>=<value>,...' (no table: every table's default) of admitAfter=<k> (an id gets a row "
        "once asked for k times; until then it reads its first values and its gradient is dropped), "
        "ttl=<n> (a row not used in the table's last n updates goes), maxRows=<c> (at most c rows a "
        "shard: beyond, the least recently used (evict=lru) or least often updated (evict=lfu) go) and "
        "filterWidth=<w> (the admission filter's counters per hash); e.g. 'admitAfter=2,ttl=100000' "
        "(empty: every row kept)",
        check=row_policy_problem,
    )
    split_bytes: int = spec_field(
        DEFAULT_SPLIT_BYTES,
        minimum=0,
        help="a dense variable larger than this many bytes is split into row slices over all PS "
        "shards (the others are placed whole, by size); 0: never split",
    )


@dataclass(frozen=True)
class PredictionSpec:
    """Batch prediction (``spec.prediction``): a model run over a dataset, one JSON line per record
    under ``<output>/predictions/``. The data is read with ``spec.data``'s reader and options and
    cut into tasks of ``spec.training.recordsPerTask`` records; each field is also a flag of
    ``elasticps ps`` and ``elasticps worker``."""

    data: str = spec_field(
        "",
        help="the records to predict, read like spec.data (labels, when the reader gives them, are "
        "written beside each output); empty: no prediction. Needs spec.output",
        flag="prediction_data",
    )
    model: str = spec_field(
        "",
        help="a folder holding an exported model.keras (a path or an object-store URI, e.g. an earlier "
        "job's spec.output): the job trains nothing and predicts with it; empty: predict with the model "
        "this job trains, after its final evaluation and export",
        flag="prediction_model",
    )

    @property
    def enabled(self) -> bool:
        return bool(self.data)

    @property
    def standalone(self) -> bool:
        """The job only predicts, with an exported model: no training, no PS traffic."""
        return bool(self.data and self.model)


@dataclass(frozen=True)
class Resources:
    requests: dict[str, str] = spec_field(default_factory=dict, help="resource requests, e.g. cpu: '1'")
    limits: dict[str, str] = spec_field(
        default_factory=dict, help="resource limits, e.g. nvidia.com/gpu: '1'"
    )


@dataclass(frozen=True)
class ReplicaSpec:
    replicas: int = spec_field(1, minimum=0, maximum=MAX_REPLICAS, help="number of replicas")
    restart_policy: RestartPolicy = spec_field(
        RestartPolicy.ON_FAILURE, help="Always, OnFailure, Never or ExitCode"
    )
    resources: Resources = spec_field(default_factory=Resources, help="container resources")
    template: dict[str, Any] = spec_field(
        default_factory=dict,
        help="pod template merged into the pods (nodeSelector, tolerations, volumes, env ...)",
        opaque=True,
    )


@dataclass(frozen=True)
class PSReplicaSpec(ReplicaSpec):
    """Parameter servers: restarted whatever their exit (a PS never finishes on its own; one
    stopped by SIGTERM exits 0 and must still come back)."""

    restart_policy: RestartPolicy = spec_field(
        RestartPolicy.ALWAYS, help="Always, OnFailure, Never or ExitCode"
    )


@dataclass(frozen=True)
class WorkerReplicaSpec(ReplicaSpec):
    """Workers: elastic between ``minReplicas`` and ``replicas`` where a queue admits the job (Kueue's
    partial admission: it starts with what the quota allows, never fewer than ``minReplicas``)."""

    min_replicas: int = spec_field(
        0, minimum=0, maximum=MAX_REPLICAS,
        help="fewest workers a queue (Kueue) may admit the job with; 0: all of replicas",
    )


@dataclass(frozen=True)
class RunPolicy:
    backoff_limit: int = spec_field(3, minimum=0, help="replacements of failed pods before the job fails")
    active_deadline_seconds: int = spec_field(
        0, minimum=0, help="the job fails after running this long (0: no deadline)"
    )
    ttl_seconds_after_finished: int = spec_field(
        -1, minimum=-1, help="delete the job this long after it finished (-1: keep)"
    )
    clean_pod_policy: CleanPodPolicy = spec_field(
        CleanPodPolicy.NONE, help="pods deleted when the job ends: None, Running or All"
    )
    suspend: bool = spec_field(False, help="stop the pods; resume from the checkpoint when unset")


@dataclass(frozen=True)
class SchedulingSpec:
    policy: SchedulingPolicy = spec_field(
        SchedulingPolicy.NONE,
        help="how the operator prepares the pods for the cluster's scheduler: none, or coscheduling (the PS and "
        "worker.minReplicas workers start together or not at all: a PodGroup for the scheduler-plugins' "
        "Coscheduling plugin)",
    )
    scheduler_name: str = spec_field(
        "scheduler-plugins-scheduler",
        help="coscheduling: the scheduler that runs the Coscheduling plugin (the scheduler-plugins chart's name)",
    )


@dataclass(frozen=True)
class TrainingJobSpec:
    model: ModelSpec = spec_field(help="the model module")
    data: DataSpec = spec_field(help="training and validation data")
    strategy: Strategy = spec_field(
        Strategy.PARAMETER_SERVER,
        help="how workers share the model: parameterServer (PS shards hold it) or decentralized (each "
        "worker averages its own with its neighbours', spec.decentralized)",
    )
    decentralized: DecentralizedSpec = spec_field(
        default_factory=DecentralizedSpec, help="decentralized strategy: the graph and Hop's rules"
    )
    image: str = spec_field("elasticps:latest", help="container image of the PS and worker pods")
    image_pull_policy: str = spec_field(
        "",
        help="when the kubelet pulls the image: Always, IfNotPresent or Never; empty: the operator's "
        "default (IfNotPresent, for an image built on the node; the chart's jobImagePullPolicy). A "
        "container in a role's template that names its own wins",
        check=pull_policy_problem,
    )
    training: TrainingSpec = spec_field(default_factory=TrainingSpec, help="training settings")
    ps: PSReplicaSpec = spec_field(default_factory=PSReplicaSpec, help="parameter servers")
    worker: WorkerReplicaSpec = spec_field(default_factory=WorkerReplicaSpec, help="workers")
    run_policy: RunPolicy = spec_field(default_factory=RunPolicy, help="run policy")
    scheduling: SchedulingSpec = spec_field(
        default_factory=SchedulingSpec, help="scheduler and admission integration of the pods (operator only)"
    )
    output: str = spec_field(
        "",
        help="where the trained model is exported (a Keras file, a SavedModel, job.json, metrics.json): "
        "a local path, a path on a volume of the pod template, or an object-store URI such as "
        "s3://bucket/prefix; empty: no export",
    )
    prediction: PredictionSpec = spec_field(
        default_factory=PredictionSpec,
        help="batch prediction: run the trained (or an exported) model over a dataset, writing "
        "<output>/predictions/part-<start>-<end>.jsonl",
    )


@dataclass(frozen=True)
class TrainingJob:
    name: str
    namespace: str
    spec: TrainingJobSpec

    @property
    def grads_to_wait(self) -> int:
        """The sync round size for this many workers (see :func:`effective_grads_to_wait`)."""
        return effective_grads_to_wait(self.spec.training.grads_to_wait, self.spec.worker.replicas)

    @property
    def uses_ps(self) -> bool:
        """Whether the job has PS replicas (and so PS Services and a NetworkPolicy for them)."""
        return self.spec.strategy is Strategy.PARAMETER_SERVER


def effective_grads_to_wait(requested: int, num_workers: int) -> int:
    """The sync round size: ``requested`` (``spec.training.gradsToWait``), or one gradient per
    worker when it is 0. The one place of that default: PS 0's coordinator applies it to the live
    workers when a round opens (``coordinator/rounds.py``), the planner to the status it shows."""
    return requested or max(1, num_workers)
