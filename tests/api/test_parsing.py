"""Parsing a TrainingJob: defaults, camelCase keys, and one-line SpecErrors naming the field."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from job_builders import job_document

from elasticps.api.parsing import SpecError, load_job_file, parse_job
from elasticps.api.spec import (
    CleanPodPolicy,
    DataReader,
    DataSpec,
    ModelSpec,
    PSReplicaSpec,
    WorkerReplicaSpec,
    Resources,
    RestartPolicy,
    RunPolicy,
    TrainingJob,
    TrainingJobSpec,
    TrainingSpec,
)


def minimal() -> dict[str, Any]:
    return job_document({"data": {"training": "/data/mnist/train"}})


FULL_YAML = """
apiVersion: elasticps.io/v1alpha1
kind: TrainingJob
metadata:
  name: ctr-async-2
  namespace: ml-team
spec:
  image: registry.example/elasticps:1.2
  model:
    modelDef: elasticps.backends.keras.zoo.mlp
    params: {hidden: [64, 32], dropout: 0.1}
  data:
    training: /data/train.npz
    validation: /data/validation.npz
    reader: npz
  training:
    useAsync: true
    lrStalenessModulation: true
    useLocking: true
    getModelFrequency: 4
    gradsToWait: 3
    syncVersionTolerance: 2
    minibatchSize: 128
    numEpochs: 5
    learningRate: 0.05
    recordsPerTask: 1000
    evaluationSteps: 50
    checkpointSteps: 100
    checkpointDir: /ckpt
    keepCheckpointMax: 4
    taskTimeoutSeconds: 30.5
  ps:
    replicas: 2
    restartPolicy: ExitCode
    resources:
      requests: {cpu: "2", memory: 4Gi}
  worker:
    replicas: 4
    restartPolicy: Never
    resources:
      limits: {nvidia.com/gpu: 1}
    template:
      spec:
        nodeSelector: {accelerator: h100}
        tolerations: [{key: gpu, operator: Exists}]
  runPolicy:
    backoffLimit: 6
    activeDeadlineSeconds: 3600
    ttlSecondsAfterFinished: 600
    cleanPodPolicy: Running
    suspend: false
"""


def test_minimal_job_gets_every_default() -> None:
    job = parse_job(minimal())
    assert job == TrainingJob(
        name="mnist",
        namespace="default",
        spec=TrainingJobSpec(
            model=ModelSpec(model_def="elasticps.backends.keras.zoo.mnist_cnn", params={}),
            data=DataSpec(training="/data/mnist/train", validation="", reader=DataReader.IDX),
            image="elasticps:latest",
            training=TrainingSpec(),
            ps=PSReplicaSpec(replicas=1, restart_policy=RestartPolicy.ALWAYS),
            worker=WorkerReplicaSpec(replicas=1, restart_policy=RestartPolicy.ON_FAILURE),
            run_policy=RunPolicy(),
        ),
    )
    t = job.spec.training
    assert (t.use_async, t.lr_staleness_modulation, t.use_locking) == (False, False, False)
    assert (t.get_model_frequency, t.grads_to_wait, t.sync_version_tolerance) == (1, 0, 0)
    assert (t.minibatch_size, t.num_epochs, t.learning_rate, t.records_per_task) == (64, 1, 0.0, 2048)
    assert (t.evaluation_steps, t.checkpoint_steps, t.checkpoint_dir, t.keep_checkpoint_max) == (0, 0, "", 3)
    assert t.task_timeout_seconds == 60.0
    rp = job.spec.run_policy
    assert (rp.backoff_limit, rp.active_deadline_seconds, rp.ttl_seconds_after_finished) == (3, 0, -1)
    assert (rp.clean_pod_policy, rp.suspend) == (CleanPodPolicy.NONE, False)
    assert job.grads_to_wait == 1


def test_full_job_in_camel_case() -> None:
    job = parse_job(yaml.safe_load(FULL_YAML))
    assert (job.name, job.namespace) == ("ctr-async-2", "ml-team")
    s = job.spec
    assert s.image == "registry.example/elasticps:1.2"
    assert s.model == ModelSpec("elasticps.backends.keras.zoo.mlp", {"hidden": [64, 32], "dropout": 0.1})
    assert s.data == DataSpec("/data/train.npz", "/data/validation.npz", DataReader.NPZ)
    assert s.training == TrainingSpec(
        use_async=True,
        lr_staleness_modulation=True,
        use_locking=True,
        get_model_frequency=4,
        grads_to_wait=3,
        sync_version_tolerance=2,
        minibatch_size=128,
        num_epochs=5,
        learning_rate=0.05,
        records_per_task=1000,
        evaluation_steps=50,
        checkpoint_steps=100,
        checkpoint_dir="/ckpt",
        keep_checkpoint_max=4,
        task_timeout_seconds=30.5,
    )
    assert s.ps == PSReplicaSpec(2, RestartPolicy.EXIT_CODE, Resources(requests={"cpu": "2", "memory": "4Gi"}), {})
    assert s.worker.replicas == 4
    assert s.worker.restart_policy is RestartPolicy.NEVER
    assert s.worker.resources == Resources(limits={"nvidia.com/gpu": "1"})  # numbers become strings
    assert s.worker.template == {
        "spec": {"nodeSelector": {"accelerator": "h100"}, "tolerations": [{"key": "gpu", "operator": "Exists"}]}
    }
    assert s.run_policy == RunPolicy(6, 3600, 600, CleanPodPolicy.RUNNING, False)
    assert job.grads_to_wait == 3


def test_grads_to_wait_zero_means_the_number_of_workers() -> None:
    doc = minimal()
    doc["spec"]["worker"] = {"replicas": 5}
    assert parse_job(doc).grads_to_wait == 5
    doc["spec"]["worker"] = {"replicas": 0}
    assert parse_job(doc).grads_to_wait == 1


def test_null_values_take_the_default() -> None:
    doc = minimal()
    doc["spec"]["training"] = {"numEpochs": None}
    doc["spec"]["image"] = None
    job = parse_job(doc)
    assert job.spec.training.num_epochs == 1
    assert job.spec.image == "elasticps:latest"


def test_integral_float_is_an_int_and_int_is_a_float() -> None:
    doc = minimal()
    doc["spec"]["training"] = {"numEpochs": 3.0, "learningRate": 1, "taskTimeoutSeconds": 5}
    t = parse_job(doc).spec.training
    assert (t.num_epochs, type(t.num_epochs)) == (3, int)
    assert (t.learning_rate, type(t.learning_rate)) == (1.0, float)
    assert (t.task_timeout_seconds, type(t.task_timeout_seconds)) == (5.0, float)


def test_parse_does_not_modify_the_document() -> None:
    doc = yaml.safe_load(FULL_YAML)
    before = copy.deepcopy(doc)
    parse_job(doc)
    assert doc == before


# ---- errors ------------------------------------------------------------------------------------------


def set_path(doc: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    *parents, last = path.split(".")
    node = doc
    for key in parents:
        node = node.setdefault(key, {})
    if value is DELETE:
        del node[last]
    else:
        node[last] = value
    return doc


DELETE = object()
NAN, INF = float("nan"), float("inf")

# (path to set, value, the message the SpecError must start with or contain)
ERRORS: dict[str, tuple[str, Any, str]] = {
    "unknown training field": ("spec.training.useAsynk", True, "spec.training.useAsynk: unknown field"),
    "unknown spec field": ("spec.replicas", 2, "spec.replicas: unknown field"),
    "snake_case key": ("spec.training.use_async", True, "spec.training.use_async: unknown field"),
    "unknown nested field": ("spec.worker.resources.limit", {}, "spec.worker.resources.limit: unknown field"),
    "string for an int": ("spec.training.minibatchSize", "64", "spec.training.minibatchSize: must be a number, got '64'"),
    "bool for an int": ("spec.training.numEpochs", True, "spec.training.numEpochs: must be a number, got True"),
    "fraction for an int": ("spec.training.numEpochs", 1.5, "spec.training.numEpochs: must be an integer, got 1.5"),
    "bool given as string": ("spec.training.useAsync", "true", "spec.training.useAsync: must be true or false, got 'true'"),
    "bool given as int": ("spec.runPolicy.suspend", 1, "spec.runPolicy.suspend: must be true or false, got 1"),
    "number for a string": ("spec.image", 5, "spec.image: must be a string, got 5"),
    "list for a mapping": ("spec.training", [1], "spec.training: must be a mapping, got a list"),
    "scalar for a mapping": ("spec.model.params", "x", "spec.model.params: must be a mapping, got 'x'"),
    "getModelFrequency 0": ("spec.training.getModelFrequency", 0, "spec.training.getModelFrequency: must be >= 1, got 0"),
    "numEpochs 1e12": (
        "spec.training.numEpochs",
        1_000_000_000_000,
        "spec.training.numEpochs: must be <= 1000000, got 1000000000000",
    ),
    "getModelFrequency 1e7": (
        "spec.training.getModelFrequency",
        10_000_000,
        "spec.training.getModelFrequency: must be <= 1000000, got 10000000",
    ),
    "a million workers": ("spec.worker.replicas", 1_000_000, "spec.worker.replicas: must be <= 10000, got 1000000"),
    "a million PS": ("spec.ps.replicas", 1_000_000, "spec.ps.replicas: must be <= 10000, got 1000000"),
    "minibatchSize 0": ("spec.training.minibatchSize", 0, "spec.training.minibatchSize: must be >= 1, got 0"),
    "negative gradsToWait": ("spec.training.gradsToWait", -1, "spec.training.gradsToWait: must be >= 0, got -1"),
    "negative learningRate": ("spec.training.learningRate", -0.1, "spec.training.learningRate: must be >= 0, got -0.1"),
    "taskTimeoutSeconds 0": ("spec.training.taskTimeoutSeconds", 0, "spec.training.taskTimeoutSeconds: must be > 0, got 0"),
    "ttl below -1": ("spec.runPolicy.ttlSecondsAfterFinished", -2, "spec.runPolicy.ttlSecondsAfterFinished: must be >= -1, got -2"),
    "negative replicas": ("spec.worker.replicas", -1, "spec.worker.replicas: must be >= 0, got -1"),
    "no ps": ("spec.ps.replicas", 0, "spec.ps.replicas: must be >= 1, got 0"),
    "unknown restartPolicy": (
        "spec.worker.restartPolicy",
        "Sometimes",
        "spec.worker.restartPolicy: must be one of Always, OnFailure, Never, ExitCode, got 'Sometimes'",
    ),
    "restartPolicy in lower case": ("spec.ps.restartPolicy", "always", "spec.ps.restartPolicy: must be one of"),
    "unknown reader": (
        "spec.data.reader",
        "xml",
        "spec.data.reader: must be a built-in reader (idx, npz, tfrecord, csv, tsv, parquet, criteo) or a plug-in class "
        "as package.module:ClassName, got 'xml'",
    ),
    "plug-in reader without a class": ("spec.data.reader", "my_readers.avro", "spec.data.reader: must be a built-in"),
    "plug-in reader with a bad module path": ("spec.data.reader", "my-readers:Avro", "spec.data.reader: must be a built-in"),
    "plug-in reader with a trailing newline": ("spec.data.reader", "m:C\n", "spec.data.reader: must be a built-in"),
    "reader not a string": ("spec.data.reader", 3, "spec.data.reader: must be a string"),
    "delimiter of two characters": ("spec.data.delimiter", ";;", "spec.data.delimiter: must be one character"),
    "delimiter a quote": ("spec.data.delimiter", '"', "spec.data.delimiter: cannot be a quote or a line break"),
    "delimiter a line break": ("spec.data.delimiter", "\n", "spec.data.delimiter: cannot be a quote or a line break"),
    "an imagePullPolicy Kubernetes does not know": ("spec.imagePullPolicy", "Sometimes",
                                                    "spec.imagePullPolicy: must be one of Always, IfNotPresent, Never"),
    "header not a boolean": ("spec.data.header", "yes", "spec.data.header: must be true or false"),
    "labelColumn a number": ("spec.data.labelColumn", 3, "spec.data.labelColumn: must be a string"),
    "unknown cleanPodPolicy": ("spec.runPolicy.cleanPodPolicy", "Some", "spec.runPolicy.cleanPodPolicy: must be one of"),
    "resource as a list": ("spec.worker.resources.limits", {"cpu": [1]}, "spec.worker.resources.limits.cpu: must be a string or number"),
    "missing modelDef": ("spec.model.modelDef", DELETE, "spec.model.modelDef: required"),
    "blank modelDef": ("spec.model.modelDef", "  ", "spec.model.modelDef: must not be empty"),
    "missing model": ("spec.model", DELETE, "spec.model: required"),
    "missing training data": ("spec.data.training", DELETE, "spec.data.training: must not be empty"),
    "blank training data": ("spec.data.training", "", "spec.data.training: must not be empty"),
    "missing spec": ("spec", DELETE, "spec: required"),
    "spec not a mapping": ("spec", "x", "spec: must be a mapping"),
    "missing metadata": ("metadata", DELETE, "metadata: required"),
    "missing name": ("metadata.name", DELETE, "metadata.name: must be a DNS label"),
    "upper-case name": ("metadata.name", "MNIST", "metadata.name: must be a DNS label"),
    "underscore in name": ("metadata.name", "my_job", "metadata.name: must be a DNS label"),
    "name starting with a dash": ("metadata.name", "-job", "metadata.name: must be a DNS label"),
    "name ending with a dash": ("metadata.name", "job-", "metadata.name: must be a DNS label"),
    "name too long": ("metadata.name", "a" * 41, "metadata.name: must be a DNS label"),
    "name not a string": ("metadata.name", 7, "metadata.name: must be a DNS label"),
    "bad namespace": ("metadata.namespace", "Team A", "metadata.namespace: must be a DNS label"),
    "wrong apiVersion": ("apiVersion", "elasticps.io/v1", "apiVersion: must be elasticps.io/v1alpha1, got 'elasticps.io/v1'"),
    "missing apiVersion": ("apiVersion", DELETE, "apiVersion: must be elasticps.io/v1alpha1, got None"),
    "wrong kind": ("kind", "TFJob", "kind: must be TrainingJob, got 'TFJob'"),
    "lrStalenessModulation without useAsync": (
        "spec.training.lrStalenessModulation",
        True,
        "spec.training.lrStalenessModulation: needs useAsync: true",
    ),
    "NaN learningRate": ("spec.training.learningRate", NAN, "spec.training.learningRate: must be a finite number"),
    "infinite learningRate": ("spec.training.learningRate", INF, "spec.training.learningRate: must be a finite number"),
    "NaN taskTimeoutSeconds": ("spec.training.taskTimeoutSeconds", NAN, "spec.training.taskTimeoutSeconds: must be a finite number"),
}


@pytest.mark.parametrize("case", list(ERRORS))
def test_errors_name_the_field(case: str) -> None:
    path, value, message = ERRORS[case]
    doc = set_path(minimal(), path, value)
    with pytest.raises(SpecError) as raised:
        parse_job(doc)
    text = str(raised.value)
    assert text.startswith(message), text
    assert "\n" not in text


def test_name_of_40_characters_is_fine() -> None:
    assert parse_job(set_path(minimal(), "metadata.name", "a" * 40)).name == "a" * 40


def test_lr_staleness_modulation_with_use_async() -> None:
    doc = set_path(minimal(), "spec.training", {"useAsync": True, "lrStalenessModulation": True})
    assert parse_job(doc).spec.training.lr_staleness_modulation is True


@pytest.mark.parametrize("document", [None, [], "TrainingJob", 3])
def test_document_must_be_a_mapping(document: Any) -> None:
    with pytest.raises(SpecError, match="must be a mapping"):
        parse_job(document)


def test_template_is_opaque() -> None:
    doc = set_path(minimal(), "spec.worker.template", {"anything": [{"goes": True}], "n": 1})
    assert parse_job(doc).spec.worker.template == {"anything": [{"goes": True}], "n": 1}


# ---- files -------------------------------------------------------------------------------------------


def test_load_job_file(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(FULL_YAML)
    assert load_job_file(path) == parse_job(yaml.safe_load(FULL_YAML))


def test_load_job_file_with_leading_document_marker(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("---\n" + yaml.safe_dump(minimal()) + "---\n")
    assert load_job_file(path).name == "mnist"


def test_invalid_yaml(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("apiVersion: elasticps.io/v1alpha1\nspec:\n  model: [unclosed\n  data: {}\n")
    with pytest.raises(SpecError) as raised:
        load_job_file(path)
    text = str(raised.value)
    assert text.startswith(f"{path}: ")
    assert "(line " in text
    assert "\n" not in text


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.yaml"
    with pytest.raises(SpecError, match="cannot read") as raised:
        load_job_file(path)
    assert str(raised.value).startswith(str(path))


def test_two_documents(tmp_path: Path) -> None:
    path = tmp_path / "two.yaml"
    path.write_text(yaml.safe_dump(minimal()) + "---\n" + yaml.safe_dump(minimal()))
    with pytest.raises(SpecError, match="expected one TrainingJob document, found 2"):
        load_job_file(path)


def test_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "empty.yaml"
    path.write_text("# nothing here\n")
    with pytest.raises(SpecError, match="found 0"):
        load_job_file(path)


def test_file_errors_are_prefixed_with_the_path(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(set_path(minimal(), "spec.training.getModelFrequency", 0)))
    with pytest.raises(SpecError) as raised:
        load_job_file(path)
    assert str(raised.value) == f"{path}: spec.training.getModelFrequency: must be >= 1, got 0"
