"""``bench.peer_tf``'s pure parts: the job it takes from a TrainingJob YAML, the cluster it lays
out, and the CPU seconds it reads from /proc (the training itself is ``python -m bench.peer_tf``)."""

from __future__ import annotations

import os
from pathlib import Path

from bench.peer_tf import REPO, cluster_spec, cpu_seconds, own_cpu_seconds, peer_job


def test_the_async_example_gives_its_model_data_minibatch_lr_and_epochs() -> None:
    job = peer_job(REPO / "examples" / "mnist-async.yaml", None)
    assert job.model_def == "elasticps.backends.keras.zoo.mnist_cnn"
    assert (job.reader, job.training, job.validation) == ("idx", "../shared/data/mnist/train", "../shared/data/mnist/t10k")
    assert (job.minibatch, job.epochs, job.learning_rate) == (64, 2, 0.0)  # the module's own, 0.05


def test_epochs_flag_overrides_and_the_sync_example_keeps_the_modules_lr() -> None:
    job = peer_job(REPO / "examples" / "mnist.yaml", 1)
    assert (job.epochs, job.learning_rate) == (1, 0.0)


def test_cluster_has_one_ps_then_the_workers() -> None:
    assert cluster_spec([5000, 5001, 5002]) == {
        "ps": ["127.0.0.1:5000"],
        "worker": ["127.0.0.1:5001", "127.0.0.1:5002"],
    }


def test_cpu_seconds_of_a_live_process_from_proc() -> None:
    sum(i * i for i in range(200_000))  # some CPU time to read back
    assert cpu_seconds(os.getpid()) > 0
    assert own_cpu_seconds() > 0
    assert Path(f"/proc/{os.getpid()}/stat").is_file()
