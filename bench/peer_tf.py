"""The peer: TensorFlow's own ParameterServerStrategy trained on an elasticps job's model and data.

    python -m bench.peer_tf --job examples/mnist-async.yaml [--epochs N] [--out FILE]

Reads the TrainingJob YAML (``elasticps.api.parsing``) and trains what it names, with TensorFlow's
tools instead of elasticps: the model module's ``custom_model``, ``loss``, ``optimizer`` (its
learning rate replaced by ``spec.training.learningRate`` when that is > 0, as an elasticps worker
does) and ``feed``; the training and validation records through elasticps's own readers
(``elasticps.data.readers``); ``minibatchSize`` and ``numEpochs`` (or ``--epochs``).

The cluster: 1 PS and 2 workers, each a ``tf.distribute.Server`` in its own process on 127.0.0.1
(this module again, ``serve`` sub-command, on ports picked free at start), and the coordinator in
this process: ``tf.distribute.ParameterServerStrategy`` with a
``tf.distribute.coordinator.ClusterCoordinator``. Training is asynchronous, as the strategy's is.

Which loop. TensorFlow's parameter-server tutorial supports ``Model.fit`` (recommended for Keras,
with ``steps_per_execution``) and a custom loop of ``coordinator.schedule``. ``Model.fit`` with this
strategy exists only in Keras 2 (``tf_keras``); Keras 3, which the project and its model modules
use, has no ParameterServerStrategy support in ``fit``. So this is the custom loop, the one the
tutorial gives for it: a ``tf.function`` scheduled on the workers through per-worker datasets, which
runs several steps per scheduled call, as ``steps_per_execution`` does in ``fit`` (the tutorial's
``fit`` example uses 10): ``STEPS_PER_EXECUTION`` below. The model and optimizer variables live on
the PS; each step reads them, computes the gradient on a worker and applies it on the PS.

An epoch is ``records // minibatch`` steps over both workers together (each worker reads its own
shuffled, repeated copy of the training records). The very first step is scheduled alone and waited
for, which gives the time to first step; each epoch ends with ``coordinator.join()``
(its seconds and the CPU seconds of all processes during it are recorded).

Prints one JSON object (and writes it to ``--out``): wall time, time to first step (from this
process's start, TensorFlow's import included), examples/s in epoch 2 (and each epoch), final test
accuracy on the validation records (a local copy of the trained weights), and CPU seconds of all
processes (the servers' from ``/proc/<pid>/stat``, this process's from ``getrusage``) per 1,000
training examples. TensorFlow's thread pools are left at their defaults in every process.
"""

from __future__ import annotations

import time

STARTED = time.monotonic()  # before TensorFlow's import: the time to first step includes it

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import resource  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import traceback  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402
from collections.abc import Callable  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

REPO = Path(__file__).resolve().parents[1]
STEPS_PER_EXECUTION = 10
WORKERS = 2
SERVER_START_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class PeerJob:
    """What the peer trains, from a TrainingJob YAML."""

    model_def: str
    params: dict[str, Any]
    reader: str
    training: str
    validation: str
    minibatch: int
    epochs: int
    learning_rate: float  # 0: the model module's optimizer's own


def peer_job(path: Path, epochs: int | None) -> PeerJob:
    from elasticps.api.parsing import load_job_file

    spec = load_job_file(path).spec
    return PeerJob(
        model_def=spec.model.model_def,
        params=dict(spec.model.params),
        reader=str(getattr(spec.data.reader, "value", spec.data.reader)),
        training=spec.data.training,
        validation=spec.data.validation,
        minibatch=spec.training.minibatch_size,
        epochs=epochs if epochs is not None else spec.training.num_epochs,
        learning_rate=spec.training.learning_rate,
    )


def cluster_spec(ports: list[int]) -> dict[str, list[str]]:
    return {"ps": [f"127.0.0.1:{ports[0]}"], "worker": [f"127.0.0.1:{p}" for p in ports[1:]]}


def serve(cluster: dict[str, list[str]], job: str, index: int) -> None:
    """One task of the cluster: a TensorFlow server, until killed."""
    import tensorflow as tf

    server = tf.distribute.Server(
        tf.train.ClusterSpec(cluster), job_name=job, task_index=index, protocol="grpc", start=True
    )
    server.join()


def start_servers(cluster: dict[str, list[str]]) -> list[subprocess.Popen[bytes]]:
    env = dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="2")
    return [
        subprocess.Popen(
            [sys.executable, "-m", "bench.peer_tf", "serve", "--cluster", json.dumps(cluster),
             "--task_type", job, "--task_index", str(index)],
            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        for job, addresses in cluster.items()
        for index in range(len(addresses))
    ]


def wait_listening(addresses: list[str], servers: list[subprocess.Popen[bytes]]) -> None:
    deadline = time.monotonic() + SERVER_START_TIMEOUT_S
    for address in addresses:
        host, port = address.rsplit(":", 1)
        while True:
            if any(s.poll() is not None for s in servers):
                raise SystemExit("a TensorFlow server exited before the cluster was up")
            try:
                with socket.create_connection((host, int(port)), timeout=1.0):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise SystemExit(f"{address}: no TensorFlow server listening after {SERVER_START_TIMEOUT_S:.0f} s") from None
                time.sleep(0.1)


def cpu_seconds(pid: int) -> float:
    """utime + stime of a live process (its threads included), from /proc/<pid>/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def own_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def read_records(reader: str, path: str) -> tuple[np.ndarray, np.ndarray]:
    from elasticps.data.readers import open_reader

    opened = open_reader(reader, path)  # relative to the working directory, as for `elasticps run`
    features, labels = opened.read(0, opened.num_records)
    if labels is None:
        raise SystemExit(f"{path}: records without labels")
    return np.asarray(features), np.asarray(labels)


def train(job: PeerJob, cluster: dict[str, list[str]], cpu: Callable[[], float]) -> tuple[dict[str, Any], list[Any]]:
    """Trains on the running cluster: the figures of the run, and the TensorFlow objects to hold
    until the process exits. ``cpu()``: CPU seconds of all its processes so far.

    Dropping the coordinator's per-worker iterators and functions makes TensorFlow delete them on
    the workers, which took 17 s after a 2-epoch run (not after 1 epoch): the caller keeps them,
    and the process exits without that teardown (``main``), so the wall time ends with the test
    accuracy known."""
    import tensorflow as tf

    from elasticps.backends.keras.model_loading import load_model_module

    module = load_model_module(job.model_def)
    feed = module.feed if module.feed is not None else (lambda dataset, mode: dataset)
    features, labels = read_records(job.reader, job.training)
    test_features, test_labels = read_records(job.reader, job.validation)
    steps_per_epoch = len(features) // job.minibatch

    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(tf.train.ClusterSpec(cluster), rpc_layer="grpc")
    strategy: Any = tf.distribute.ParameterServerStrategy(resolver)
    coordinator: Any = tf.distribute.coordinator.ClusterCoordinator(strategy)
    with strategy.scope():
        model = module.custom_model(**job.params)
        optimizer = module.optimizer()
        if job.learning_rate > 0:
            optimizer.learning_rate = job.learning_rate
        optimizer.build(model.trainable_variables)

    def dataset_fn(context: Any) -> Any:
        dataset = tf.data.Dataset.from_tensor_slices((features, labels)).shuffle(len(features)).repeat()
        return feed(dataset, "training").batch(job.minibatch, drop_remainder=True).prefetch(tf.data.AUTOTUNE)

    def per_worker_dataset() -> Any:
        return strategy.distribute_datasets_from_function(dataset_fn)

    iterator = iter(coordinator.create_per_worker_dataset(tf.function(per_worker_dataset)))

    def step(x: Any, y: Any) -> Any:
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(module.loss(y, model(x, training=True)))
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        return loss

    def run_steps(iterator: Any, count: Any) -> Any:
        loss = tf.constant(0.0)
        for _ in tf.range(count):
            loss = strategy.run(step, args=next(iterator))
        return loss

    steps: Any = tf.function(run_steps)
    coordinator.schedule(steps, args=(iterator, tf.constant(1))).fetch()
    first_step_s = time.monotonic() - STARTED
    cpu_at_first_step = cpu()
    epochs: list[dict[str, float]] = []
    for epoch in range(job.epochs):
        began = time.monotonic()
        cpu_began = cpu()
        remaining = steps_per_epoch - (1 if epoch == 0 else 0)
        while remaining > 0:
            count = min(STEPS_PER_EXECUTION, remaining)
            coordinator.schedule(steps, args=(iterator, tf.constant(count)))
            remaining -= count
        coordinator.join()
        seconds = time.monotonic() - began
        epoch_cpu_s = cpu() - cpu_began
        epochs.append(
            {
                "seconds": seconds,
                "examples_per_s": steps_per_epoch * job.minibatch / seconds,
                "cpu_s": epoch_cpu_s,
                "cpu_s_per_1000_examples": epoch_cpu_s / (steps_per_epoch * job.minibatch / 1000),
            }
        )
        print(f"epoch {epoch + 1}: {seconds:.1f} s, {epochs[-1]['examples_per_s']:,.0f} examples/s", file=sys.stderr, flush=True)

    training_cpu_s = cpu() - cpu_at_first_step
    trained = time.monotonic()
    local = module.custom_model(**job.params)
    local.set_weights([np.asarray(v.numpy()) for v in model.weights])
    test = feed(tf.data.Dataset.from_tensor_slices((test_features, test_labels)), "evaluation").batch(1000)
    correct = sum(int(np.sum(np.argmax(local(x, training=False).numpy(), axis=-1) == y.numpy())) for x, y in test)
    figures: dict[str, Any] = {
        "wall_s": time.monotonic() - STARTED,
        "first_step_s": first_step_s,
        "epochs": epochs,
        "examples": steps_per_epoch * job.minibatch * job.epochs,
        "test_accuracy": correct / len(test_labels),
        "training_cpu_s": training_cpu_s,
        "evaluation_s": time.monotonic() - trained,
    }
    return figures, [coordinator, strategy, iterator, steps, model, optimizer]


def all_cpu_seconds(servers: list[subprocess.Popen[bytes]]) -> float:
    return sum(cpu_seconds(s.pid) for s in servers) + own_cpu_seconds()


def run(
    job: PeerJob, cluster: dict[str, list[str]], servers: list[subprocess.Popen[bytes]], held: list[Any]
) -> dict[str, Any]:
    """The figures of a run on the cluster of ``servers``; what TensorFlow must keep goes into ``held``."""
    wait_listening(cluster["ps"] + cluster["worker"], servers)
    figures, kept = train(job, cluster, lambda: all_cpu_seconds(servers))
    held.extend(kept)
    cpu = all_cpu_seconds(servers)
    epochs = figures["epochs"]
    return {
        "system": "TensorFlow ParameterServerStrategy + ClusterCoordinator",
        "model_def": job.model_def,
        "ps": len(cluster["ps"]),
        "workers": len(cluster["worker"]),
        "minibatch": job.minibatch,
        "learning_rate": job.learning_rate,
        "num_epochs": job.epochs,
        "steps_per_execution": STEPS_PER_EXECUTION,
        "wall_s": figures["wall_s"],
        "first_step_s": figures["first_step_s"],
        # time.monotonic() when this process started timing (before TensorFlow's import): a parent that
        # timed the start of this process on the same clock adds the interpreter's start-up.
        "started_monotonic": STARTED,
        "examples_per_s_epoch2": epochs[1]["examples_per_s"] if len(epochs) > 1 else None,
        "epochs": epochs,
        "test_accuracy": figures["test_accuracy"],
        "evaluation_s": figures["evaluation_s"],
        "examples": figures["examples"],
        "cpu_s": cpu,
        "cpu_s_per_1000_examples": cpu / (figures["examples"] / 1000),
        # From the first step to the end of the last epoch: start-up and evaluation left out.
        "training_cpu_s_per_1000_examples": figures["training_cpu_s"] / (figures["examples"] / 1000),
        "tensorflow": __import__("tensorflow").__version__,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    sub = parser.add_subparsers(dest="command")
    server = sub.add_parser("serve", help="one TensorFlow server of the cluster (started by this module)")
    server.add_argument("--cluster", required=True)
    server.add_argument("--task_type", required=True)
    server.add_argument("--task_index", type=int, required=True)
    parser.add_argument("--job", type=Path, default=REPO / "examples" / "mnist-async.yaml")
    parser.add_argument("--epochs", type=int, default=None, help="default: the job's numEpochs")
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    args = parser.parse_args(argv)
    if args.command == "serve":
        serve(json.loads(args.cluster), args.task_type, args.task_index)
        return 0
    if args.epochs is not None and args.epochs < 1:
        parser.error("--epochs: at least 1")
    from elasticps.api.parsing import SpecError
    from elasticps.data.api import DataError

    try:
        job = peer_job(args.job, args.epochs)
    except SpecError as err:
        parser.error(str(err))
    from elasticps.local.ports import free_ports  # nothing else of elasticps

    cluster = cluster_spec(free_ports(1 + WORKERS))
    servers = start_servers(cluster)
    code = 1
    try:
        held: list[Any] = []
        result = run(job, cluster, servers, held)
        text = json.dumps(result, indent=2)
        print(text, flush=True)
        if args.out is not None:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(text + "\n")
        code = 0
    except (SystemExit, DataError) as err:
        print(f"peer_tf: {err}", file=sys.stderr)
    except BaseException:
        traceback.print_exc()
    finally:
        for s in servers:
            s.kill()
        for s in servers:
            s.wait()
        sys.stdout.flush()
        sys.stderr.flush()
        # TensorFlow's eager context, torn down at interpreter exit, would try to reach the
        # servers just killed and log an error per remote function: leave without that teardown.
        os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
