"""Scale (issue 13): a sync job of 128 workers and an async job of 32 against 2 real PS processes.

The workers are the real worker loop and clients with a numpy model (``elasticps.tools.fake_workers``),
32 or 16 threads to a process. Every round completes, no call attempt ends DEADLINE_EXCEEDED, and
every gradient is counted once: from the PS side (the shards' versions, their round logs, the
counter variable each shard holds, the coordinator's status) and from the workers' (their steps,
pushes and rejections). The push latencies are printed (``-s``, or in the summary line), not asserted.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from elasticps.api.spec import TrainingSpec
from elasticps.tools.fake_trainer import counters
from elasticps.tools.scale_job import NotFinished, ScaleJob, Summary, summarize

pytestmark = pytest.mark.slow

MINIBATCH = 4
JOB_TIMEOUT_S = 180.0  # far past a healthy run (under a minute here), within the 300 s test timeout


def run(job: ScaleJob, processes: int, per_process: int) -> Summary:
    job.start_ps()
    job.start_workers(processes, per_process)
    try:
        summary = summarize(job.wait(JOB_TIMEOUT_S))
    except NotFinished as stalled:
        summary = summarize(stalled.reports)
        status = job.status()
        pytest.fail(f"{stalled}: shard versions {list(status.shard_versions)}, records {status.records_done}/"
                    f"{status.records_total}; {summary.line()}; calls {summary.calls}")  # fmt: skip
    return summary


def show(capsys: pytest.CaptureFixture[str], title: str, summary: Summary, extra: str = "") -> None:
    with capsys.disabled():
        print(f"\n{title}: {summary.line()}{extra}\n  calls: {summary.calls}")


def test_a_sync_job_of_128_workers_completes_every_round_and_counts_every_gradient_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    records, per_task = 2048, 2 * MINIBATCH  # 256 tasks of 2 minibatches: about 4 rounds of ~128
    spec = TrainingSpec(minibatch_size=MINIBATCH, records_per_task=per_task, learning_rate=1.0)
    with ScaleJob(tmp_path, spec, records, round_log=True) as job:
        summary = run(job, processes=4, per_process=32)
        status = job.status()
        log0, log1 = job.round_log(0), job.round_log(1)
        model = job.model()
    rounds = len(log0)
    show(capsys, "sync, 128 workers", summary, f"; {rounds} rounds, {status.gradients_rejected} gradients retrained")

    assert summary.workers == 128
    assert summary.errors == []
    assert summary.codes("DEADLINE_EXCEEDED") == 0, f"past their deadline: {summary.methods_with('DEADLINE_EXCEEDED')}"
    # Every round completed on both shards, the same members in each, in order.
    assert [e["round"] for e in log0] == list(range(rounds))
    assert [(e["round"], e["minibatches"]) for e in log0] == [(e["round"], e["minibatches"]) for e in log1]
    assert list(status.shard_versions) == [rounds, rounds]
    assert [float(model[name]) for name in counters(2)] == [rounds, rounds]  # each round applied once per shard
    # Every minibatch a worker trained was counted in exactly one round; every other push was retrained.
    counted = [m for entry in log0 for m in entry["minibatches"]]
    assert len(counted) == len(set(counted)) == summary.steps == records // MINIBATCH
    assert summary.pushes == summary.steps + summary.rejected
    assert status.gradients_rejected == summary.rejected
    # Every task reported once, every record once.
    assert status.finished
    assert (status.records_done, status.records_total) == (records, records)
    assert summary.calls["ReportTask"] == {"OK": math.ceil(records / per_task)}
    assert rounds >= records // MINIBATCH // 128


def test_an_async_job_of_32_workers_applies_every_gradient_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    records, per_task = 32 * 10 * MINIBATCH, 5 * MINIBATCH  # 64 tasks: 10 pushes per worker
    spec = TrainingSpec(use_async=True, minibatch_size=MINIBATCH, records_per_task=per_task, learning_rate=1.0)
    with ScaleJob(tmp_path, spec, records) as job:
        summary = run(job, processes=2, per_process=16)
        status = job.status()
        model = job.model()
    show(capsys, "async, 32 workers", summary)

    assert summary.workers == 32
    assert summary.errors == []
    assert summary.codes("DEADLINE_EXCEEDED") == 0, f"past their deadline: {summary.methods_with('DEADLINE_EXCEEDED')}"
    steps = records // MINIBATCH
    assert summary.steps == summary.pushes == summary.pushes_accepted == steps
    # Each shard applied every push once: its version and its counter moved once per gradient.
    assert list(status.shard_versions) == [steps, steps]
    assert [float(model[name]) for name in counters(2)] == [steps, steps]
    assert status.gradients_rejected == 0
    assert status.finished
    assert (status.records_done, status.records_total) == (records, records)
    assert summary.calls["ReportTask"] == {"OK": records // per_task}
    assert status.model_version == steps
    assert math.isfinite(status.loss)
