"""Issue 14: with gradsToWait = the workers, every worker's gradient makes every round, slow pushes included.

Two PS processes and two fake-worker processes of one worker each (``elasticps.tools.fake_workers``:
the real worker loop and clients, a numpy model): one pushes at once, the other holds every push
``SLOW_PUSH_S`` first, as a large model's gradients spend time on the wire. A round waits for the
slow worker's gradient: the fast worker never trains alone and no gradient is refused, apart from
the start (the slow process may still be starting while the fast one trains its first rounds) and
the end of the data (one worker's task done before the other's). Counted from both sides: the
workers' rejections and the shards' round logs (members per round).
"""

from __future__ import annotations

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


def test_a_slow_pusher_is_in_every_round_and_no_gradient_is_refused(tmp_path: Path) -> None:
    spec = TrainingSpec(
        minibatch_size=MINIBATCH, records_per_task=RECORDS // 2, grads_to_wait=2, learning_rate=1.0
    )
    with ScaleJob(tmp_path, spec, RECORDS, round_log=True) as job:
        job.start_ps()
        job.start_workers(1, 1)  # w0: pushes at once
        job.start_workers(1, 1, push_delay_s=SLOW_PUSH_S, first=1)  # w1: every push held
        try:
            summary = summarize(job.wait(JOB_TIMEOUT_S))
        except NotFinished as stalled:
            pytest.fail(f"{stalled}: {summarize(stalled.reports).line()}")
        log0 = job.round_log(0)
    assert summary.errors == []
    assert summary.steps == RECORDS // MINIBATCH
    computed = summary.steps + summary.rejected
    assert summary.rejected / computed < MAX_REJECTED, f"{summary.rejected} of {computed} gradients refused"
    members = [len(entry["minibatches"]) for entry in log0]
    alone = members.count(1)
    # Rounds of one: the start and the end only; every other round has both workers' gradients.
    assert members.count(2) >= 0.8 * RECORDS // MINIBATCH // 2, f"round sizes {members}"
    assert alone <= 0.2 * len(members), f"{alone} of {len(members)} rounds had one member: {members}"
