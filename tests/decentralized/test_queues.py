"""Hop's update and token queues and its rules, one worker at a time (no TensorFlow, no gRPC).

Hand-made arrivals: which models a worker reduces in an iteration under the standard rule, backup
workers and bounded staleness; what is dropped (late, superseded, duplicated, too far ahead); excused
senders (skipped iterations, a worker that left); tokens; when a straggler jumps, and how far.
"""

from __future__ import annotations

import pytest

from elasticps.decentralized.queues import FOREVER, TokenQueues, Update, UpdateQueue
from elasticps.decentralized.rules import Backup, Skipping, Standard, Staleness, reduce_weights, rule_for


def _u(tag: int, sender: int) -> Update[str]:
    return Update(tag, sender, f"x{sender}@{tag}")


def test_standard_waits_for_every_in_neighbour_of_the_iteration() -> None:
    q: UpdateQueue[str] = UpdateQueue([1, 2, 3], max_ig=2, rule=Standard())
    assert q.put(_u(0, 1)) and q.put(_u(1, 2)) and q.put(_u(0, 3))
    assert q.collect(0) is None  # 2's model of iteration 0 is missing (its iteration 1 does not count)
    assert q.put(_u(0, 2))
    got = q.collect(0)
    assert got is not None and sorted(u.sender for u in got) == [1, 2, 3] and {u.tag for u in got} == {0}
    q.advance(1)
    assert q.tags() == [(1, 2)]  # iteration 1's model of worker 2 stays for iteration 1


def test_late_duplicate_and_too_far_ahead_updates_are_dropped() -> None:
    q: UpdateQueue[str] = UpdateQueue([1, 2], max_ig=2, rule=Standard())
    q.advance(5)
    assert not q.put(_u(4, 1))  # late: iteration 4 is over
    assert not q.put(_u(8, 1))  # beyond 5 + max_ig: tokens forbid it, it would take a slot in use
    assert not q.put(_u(6, 9))  # not an in-neighbour
    assert q.put(_u(7, 1)) and not q.put(_u(7, 1))  # the first copy stands
    assert q.dropped == 4 and len(q) == 1


def test_update_queue_stays_within_one_plus_max_ig_per_in_neighbour() -> None:
    q: UpdateQueue[str] = UpdateQueue([1, 2, 3], max_ig=3, rule=Backup(3, 1))
    for tag in range(0, 4):
        for sender in (1, 2, 3):
            assert q.put(_u(tag, sender))
    assert len(q) == (1 + 3) * 3
    assert not q.put(_u(4, 1))
    # Backup workers leave updates behind; advancing drops them instead of letting them pile up.
    for k in range(4):
        got = q.collect(k)
        assert got is not None and len(got) == 3
    q.advance(4)
    assert len(q) == 0


def test_backup_takes_n_minus_b_plus_whatever_else_is_in() -> None:
    q: UpdateQueue[str] = UpdateQueue([1, 2, 3], max_ig=2, rule=Backup(in_degree=3, backups=1))
    q.put(_u(0, 1))
    assert q.collect(0) is None
    q.put(_u(0, 3))
    got = q.collect(0)
    assert got is not None and sorted(u.sender for u in got) == [1, 3]
    q.advance(1)
    assert not q.put(_u(0, 2))  # 2's model of iteration 0 came late: dropped by its tag
    q.put(_u(1, 1)); q.put(_u(1, 2)); q.put(_u(1, 3))
    got = q.collect(1)
    assert got is not None and len(got) == 3  # extras already in are used too


def test_staleness_takes_each_neighbours_newest_within_the_bound_and_reuses_none() -> None:
    q: UpdateQueue[str] = UpdateQueue([1, 2], max_ig=4, rule=Staleness(2))
    q.put(_u(0, 1)); q.put(_u(1, 1)); q.put(_u(0, 2))
    assert q.tags() == [(0, 2), (1, 1)]  # 1's older model is superseded
    got = q.collect(0)
    assert got is not None and sorted((u.sender, u.tag) for u in got) == [(1, 1), (2, 0)]
    q.advance(1)
    # Nothing new arrived: both models reduced before are within 2 iterations of 2, so iteration 2
    # goes on without waiting, and reduces nothing again.
    q.advance(2)
    assert q.collect(2) == []
    q.advance(3)
    assert q.collect(3) is None  # 2's newest (iteration 0) is 3 iterations old: wait for a newer one
    assert not q.put(_u(0, 2))  # an old one again: dropped
    q.put(_u(2, 2))
    got = q.collect(3)
    assert got is not None and [(u.sender, u.tag) for u in got] == [(2, 2)]


def test_an_excused_sender_is_not_waited_for() -> None:
    q: UpdateQueue[str] = UpdateQueue([1, 2], max_ig=4, rule=Standard())
    q.put(_u(0, 1))
    q.excuse(2, through=2)  # 2 jumped from 0 to 3
    q.advance(1)
    q.put(_u(1, 1))
    got = q.collect(1)
    assert got is not None and [u.sender for u in got] == [1]
    q.advance(3)
    assert q.collect(3) is None  # 2 is back from iteration 3 on
    q.excuse(2, FOREVER)  # 2 left
    q.put(_u(3, 1))
    assert q.collect(3) is not None
    q.excuse(7, FOREVER)  # not an in-neighbour: nothing to do


def test_backup_with_an_excused_neighbour_needs_the_rest() -> None:
    q: UpdateQueue[str] = UpdateQueue([1, 2, 3], max_ig=2, rule=Backup(in_degree=3, backups=1))
    q.excuse(3, FOREVER)
    q.put(_u(0, 1))
    assert q.collect(0) is None  # min(3 - 1, 2 waited) = 2
    q.put(_u(0, 2))
    assert q.collect(0) is not None
    q.excuse(1, FOREVER); q.excuse(2, FOREVER)
    q.advance(1)
    assert q.collect(1) == []  # everyone left: the worker trains on alone


def test_tokens_bound_how_far_a_neighbour_runs_ahead() -> None:
    tokens = TokenQueues([1, 2], max_ig=2)
    assert tokens.take(1, 1) and tokens.take(1, 1) and not tokens.take(1, 1)
    assert tokens.size(1) == 0 and tokens.size(2) == 2
    tokens.give(1)
    assert tokens.size(1) == 1 and tokens.size(2) == 3
    assert not tokens.take(2, 4)
    assert tokens.size(2) == 3  # a refused take takes nothing
    tokens.close()
    assert tokens.take(1, 100) and tokens.size(1) == FOREVER
    with pytest.raises(ValueError):
        tokens.take(1, -1)


def test_reduce_weights_share_a_missing_neighbours_weight_and_favour_fresh_models() -> None:
    own, others = reduce_weights(Standard(), 5, 1 / 3, [(5, 1 / 3), (5, 1 / 3)])
    assert own == pytest.approx(1 / 3) and others == pytest.approx([1 / 3, 1 / 3])
    own, others = reduce_weights(Backup(2, 1), 5, 1 / 3, [(5, 1 / 3)])  # one of two in-neighbours
    assert own == pytest.approx(0.5) and others == pytest.approx([0.5])
    # Staleness: a model 3 iterations old keeps 1/4 of its weight: raw 1/3, 1/3 * 1/4, 1/3 * 1 (ahead).
    own, others = reduce_weights(Staleness(5), 5, 1 / 3, [(2, 1 / 3), (6, 1 / 3)])
    assert own == pytest.approx(1 / 2.25) and others == pytest.approx([0.25 / 2.25, 1 / 2.25])
    assert own + sum(others) == pytest.approx(1.0)


def test_skipping_jumps_to_the_slowest_out_neighbour_at_most_max_jump_iterations() -> None:
    assert Skipping(0).target(10, [5, 5]) == 11  # off
    assert Skipping(10, trigger=2).target(10, [1, 5]) == 11  # one neighbour is only 1 ahead
    assert Skipping(10, trigger=2).target(10, [3, 5]) == 13  # to the slowest, skipping 11 and 12
    assert Skipping(2, trigger=2).target(10, [8, 9]) == 13  # skipping at most 2
    assert Skipping(10, trigger=4).target(10, [3, 5]) == 11  # not behind enough to jump
    assert Skipping(10).target(10, [FOREVER, 4]) == 14  # a neighbour that left does not count
    assert Skipping(10).target(10, [FOREVER]) == 11
    assert Skipping(10).target(10, []) == 11


def test_rule_for_picks_one_rule() -> None:
    assert rule_for(3, 0, 0) == Standard()
    assert rule_for(3, 1, 0) == Backup(3, 1)
    assert rule_for(3, 0, 5) == Staleness(5)
    with pytest.raises(ValueError, match="choose one"):
        rule_for(3, 1, 5)
