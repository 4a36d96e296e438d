"""Issue 14: with gradsToWait = the workers, every worker's gradient makes every round, slow pushes included.

Two PS processes and two fake-worker processes of one worker each (``elasticps.tools.fake_workers``:
the real worker loop and clients, a numpy model): one pushes at once, the other holds every push
``SLOW_PUSH_S`` first, as a large model's gradients spend time on the wire. A round waits for the
slow worker's gradient: the fast worker never trains alone and no gradient is refused, apart from
the start (the slow process may still be starting while the fast one trains its first rounds) and
the end of the data (one worker's task done before the other's). Counted from both sides: the
workers' rejections and the shards' round logs (whose gradients each round averaged).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from elasticps.api.spec import TrainingSpec
from elasticps.tools.scale_job import NotFinished, ScaleJob, summarize

pytestmark = pytest.mark.slow

MINIBATCH = 4
RECORDS = 320  # 80 minibatches, one task of 40 per worker
SLOW_PUSH_S = 0.25
JOB_TIMEOUT_S = 180.0
MAX_REJECTED = 0.05  # issue 14's target


def wait_for_a_round(job: ScaleJob, timeout_s: float = 60.0) -> None:
    assert job.rounds is not None
    log = job.rounds / "ps-0.jsonl"
    give_up_at = time.monotonic() + timeout_s
    while not (log.exists() and log.stat().st_size > 0):
        assert time.monotonic() < give_up_at, f"no round in {timeout_s:.0f} s: {job.log('w1')[-2000:]}"
        time.sleep(0.05)


def test_a_slow_pusher_is_in_every_round_and_no_gradient_is_refused(tmp_path: Path) -> None:
    spec = TrainingSpec(
        minibatch_size=MINIBATCH, records_per_task=RECORDS // 2, grads_to_wait=2, learning_rate=1.0
    )
    with ScaleJob(tmp_path, spec, RECORDS, round_log=True) as job:
        job.start_ps()
        # The slow worker first, the fast one once a round is committed: while the fast process
        # starts, the slow one trains alone at one round per push delay, so the start costs few
        # rounds however slowly this machine starts processes.
        job.start_workers(1, 1, push_delay_s=SLOW_PUSH_S, first=1)  # w1: every push held
        wait_for_a_round(job)
        job.start_workers(1, 1)  # w0: pushes at once
        try:
            summary = summarize(job.wait(JOB_TIMEOUT_S))
        except NotFinished as stalled:
            pytest.fail(f"{stalled}: {summarize(stalled.reports).line()}")
        log0 = job.round_log(0)
    assert summary.errors == []
    assert summary.steps == RECORDS // MINIBATCH
    computed = summary.steps + summary.rejected
    assert summary.rejected / computed < MAX_REJECTED, f"{summary.rejected} of {computed} gradients refused"
    rounds = [sorted(m.split("-", 1)[0] for m in entry["minibatches"]) for entry in log0]
    both = [i for i, members in enumerate(rounds) if members == ["w0", "w1"]]
    assert both, f"no round had both workers: {rounds}"
    # Rounds of one worker only before the other's first gradient and after one's data ran out;
    # from the first round of two to the last, every round waited for both.
    start, end = both[0], both[-1]
    assert 0 < start and all(members == ["w1"] for members in rounds[:start]), f"the start: {rounds[:start]}"
    assert rounds[start : end + 1] == [["w0", "w1"]] * (end + 1 - start), f"a round without both: {rounds}"
    assert all(members == ["w0"] for members in rounds[end + 1 :]), f"the end: {rounds[end + 1:]}"
    assert len(both) >= 0.25 * RECORDS // MINIBATCH // 2, f"{len(both)} rounds of two: {rounds}"
