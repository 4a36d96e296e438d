"""bench.large_model: issue 14's job, what it reads from the replicas' logs, its figures and verdicts."""

from __future__ import annotations

import argparse
from pathlib import Path

from bench import large_model as lm
from elasticps.api.parsing import parse_job


def _args(**kw: int) -> argparse.Namespace:
    return argparse.Namespace(**{"records": 6400, "minibatch": 64, "ps": 2, "workers": 2, **kw})


def test_the_job_is_sync_with_every_worker_in_every_round_and_one_task_per_worker(tmp_path: Path) -> None:
    document = lm.job_document(tmp_path / "train.npz", tmp_path / "valid.npz", _args())
    job = parse_job(document)
    training = job.spec.training
    assert training.grads_to_wait == 2 and not training.use_async
    assert training.records_per_task == 3200 and training.minibatch_size == 64 and training.num_epochs == 1
    assert job.spec.model.params == {"features": 784, "hidden": [8192, 2048], "classes": 10}
    assert (job.spec.ps.replicas, job.spec.worker.replicas) == (2, 2)


def _write_logs(run: Path) -> None:
    run.mkdir()
    (run / "large-ps-0.log").write_text(
        "2026-11-24 08:20:16,000 INFO elasticps.ps.store: shard 0 initialised at version 0: 3 variables, "
        "0 state tensors, 60000000 parameter bytes, sgd\n"
    )
    (run / "large-ps-1.log").write_text(
        "2026-11-24 08:20:17,500 INFO elasticps.ps.store: shard 1 initialised at version 0: 3 variables, "
        "0 state tensors, 40000000 parameter bytes, sgd\n"
    )
    for i, (stamp, rejected) in enumerate([("08:20:40,000", 1), ("08:20:46,000", 3)]):
        (run / f"large-worker-{i}.log").write_text(
            f"2026-11-24 {stamp} INFO elasticps.worker.training: job finished: "
            f"Counters(steps=50, examples=3200, pulls=51, rejected={rejected}, reinitialised=0)\n"
        )


def test_counters_window_and_shard_bytes_come_from_the_logs(tmp_path: Path) -> None:
    _write_logs(tmp_path / "run")
    found = lm._from_logs(tmp_path / "run", 2)
    assert (found["steps"], found["rejected"]) == (100, 4)
    assert found["training_s"] == 30.0  # first shard's model to the last worker's end
    assert found["shard_bytes"] == [60_000_000, 40_000_000]


def test_figures_and_verdicts(tmp_path: Path) -> None:
    _write_logs(tmp_path / "run")
    found = lm._from_logs(tmp_path / "run", 2)
    memory = [lm.Memory(peak_kib=300_000, idle_kib=100_000), lm.Memory(peak_kib=120_000, idle_kib=100_000)]
    job = {**found, "memory": memory, "elapsed_s": 60.0, "model_version": 50, "metrics": {"accuracy": 0.8}}
    run = lm.summarize(job, {"train_seconds": 20.0, "metrics": {"accuracy": 0.9}})
    assert run["rejected_fraction"] == round(4 / 104, 4)
    assert (run["training_ratio"], run["end_to_end_ratio"]) == (1.5, 3.0)
    assert run["shard_spread"] == 0.2  # 60 MB against a mean of 50
    assert run["ps"][0]["idle_rss_mib"] == round(100_000 / 1024, 1)
    assert run["ps"][0]["rss_over_parameters"] == round(300_000 * 1024 / 60_000_000, 2)
    assert run["ps"][1]["above_idle_over_parameters"] == round(20_000 * 1024 / 40_000_000, 2)
    verdict = lm.verdicts(run)
    assert verdict == {"rejected": True, "training_ratio": True, "end_to_end_ratio": False,
                       "shard_spread": False, "rss": False}  # fmt: skip
    assert "MISS" in lm.report({
        "date": "d", "parameters": 1, "parameter_bytes": 4, "records": 6400, "minibatch": 64, "ps": 2,
        "workers": 2, "cpus": 2, "load_before": 1.0, "load_after": 1.0, "runs": [run],
    })  # fmt: skip
