"""Sync rounds (``coordinator/rounds.py``), pure: admission, quorum, short rounds, drops, aborts."""

from __future__ import annotations

import pytest

from elasticps.coordinator.rounds import Admission, Closed, Rounds

ADMITTED, REFUSED, BUSY = Admission.ADMITTED, Admission.REFUSED, Admission.BUSY
FOUR = {"a", "b", "c", "d"}


def closed_after(rounds: Rounds, workers: list[str], can_join: set[str], live: int = 4) -> Closed | None:
    for worker in workers:
        assert rounds.join(worker, rounds.version, live) is ADMITTED
    return rounds.due(can_join)


# ---- quorum ------------------------------------------------------------------------------------


def test_a_round_closes_when_grads_to_wait_workers_joined() -> None:
    rounds = Rounds(grads_to_wait=2)
    assert rounds.join("b", 0, live=4) is ADMITTED
    assert rounds.due(FOUR) is None
    assert rounds.join("a", 0, live=4) is ADMITTED
    closed = rounds.due(FOUR)
    assert closed == Closed(round=0, members=("a", "b"), target=2)
    assert rounds.version == 0  # not before every shard applied it
    rounds.committed(closed)
    assert rounds.version == 1
    assert rounds.short_rounds == 0


def test_grads_to_wait_zero_waits_for_the_workers_live_when_the_round_opened() -> None:
    rounds = Rounds(grads_to_wait=0)
    assert rounds.join("a", 0, live=3) is ADMITTED  # the target is fixed now: 3
    assert rounds.join("b", 0, live=5) is ADMITTED  # more workers since: still 3
    five = {"a", "b", "c", "d", "e"}
    assert rounds.due(five) is None
    assert rounds.join("c", 0, live=5) is ADMITTED
    closed = rounds.due(five)
    assert closed is not None
    assert (closed.members, closed.target) == (("a", "b", "c"), 3)
    rounds.committed(closed)
    # The next round opens with the workers live then.
    assert rounds.join("d", 1, live=5) is ADMITTED
    assert closed_after(rounds, ["a", "b", "c"], five) is None
    assert rounds.join("e", 1, live=5) is ADMITTED
    next_round = rounds.due(five)
    assert next_round is not None and next_round.target == 5


def test_the_target_is_at_least_one() -> None:
    assert Rounds(grads_to_wait=0).target(live=0) == 1
    assert Rounds(grads_to_wait=3).target(live=0) == 3


def test_a_round_closes_short_when_the_others_cannot_join() -> None:
    """c is dead or has no training work left: a round of three closes with the two that can."""
    rounds = Rounds(grads_to_wait=3)
    closed = closed_after(rounds, ["a", "b"], {"a", "b", "c"})
    assert closed is None  # c could still join
    closed = rounds.due({"a", "b"})
    assert closed is not None
    assert (closed.members, closed.target) == (("a", "b"), 3)
    rounds.committed(closed)
    assert rounds.short_rounds == 1


def test_the_last_partial_round_of_a_job_is_closed() -> None:
    rounds = Rounds(grads_to_wait=4)
    assert rounds.join("a", 0, live=4) is ADMITTED
    closed = rounds.due(set())  # nobody has work left (a's own task was its last)
    assert closed is not None and closed.members == ("a",)


def test_a_member_that_cannot_join_again_still_counts() -> None:
    """A member whose task is done counts in the round it joined: the round does not wait for it again."""
    rounds = Rounds(grads_to_wait=2)
    assert rounds.join("a", 0, live=2) is ADMITTED
    assert rounds.due({"b"}) is None  # b can still join
    assert rounds.join("b", 0, live=2) is ADMITTED
    closed = rounds.due(set())
    assert closed is not None and closed.members == ("a", "b")


def test_no_round_closes_without_members() -> None:
    rounds = Rounds(grads_to_wait=1)
    assert rounds.due(set()) is None
    assert rounds.due(FOUR) is None


# ---- membership --------------------------------------------------------------------------------


def test_a_worker_is_in_a_round_once() -> None:
    rounds = Rounds(grads_to_wait=2)
    assert rounds.join("a", 0, live=2) is ADMITTED
    assert rounds.join("a", 0, live=2) is ADMITTED  # asked again: still one member
    assert rounds.due({"a", "b"}) is None
    closed = rounds.due({"a"})
    assert closed is not None and closed.members == ("a",)


def test_a_dropped_member_no_longer_counts() -> None:
    rounds = Rounds(grads_to_wait=2)
    assert rounds.join("a", 0, live=3) is ADMITTED
    assert rounds.join("b", 0, live=3) is ADMITTED
    rounds.drop("a")  # dropped before the quorum was checked
    assert not rounds.is_member("a")
    assert rounds.round_of("a") is None
    assert rounds.due({"a", "b", "c"}) is None  # a (again) or c may still join
    rounds.drop("nobody")  # not a member: nothing happens
    closed = rounds.due({"b"})
    assert closed is not None and closed.members == ("b",)
    rounds.committed(closed)
    assert rounds.counted("a", 0) is False
    assert rounds.counted("b", 0) is True


def test_members_of_the_round_being_committed_are_members_and_new_joins_wait() -> None:
    rounds = Rounds(grads_to_wait=1)
    closed = closed_after(rounds, ["a"], FOUR)
    assert closed is not None
    assert rounds.closing == closed
    assert rounds.is_member("a") and rounds.round_of("a") == 0
    assert rounds.join("b", 0, live=4) is BUSY
    assert rounds.due(FOUR) is None  # one round at a time
    assert rounds.counted("a", 0) is None  # not committed yet
    rounds.committed(closed)
    assert not rounds.is_member("a")
    assert rounds.join("b", 1, live=4) is ADMITTED
    assert rounds.round_of("b") == 1


# ---- admission ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tolerance", "computed_on", "admission"),
    [(0, 5, ADMITTED), (0, 4, REFUSED), (1, 4, ADMITTED), (1, 3, REFUSED), (2, 3, ADMITTED), (3, 6, REFUSED)],
)
def test_a_gradient_joins_when_at_most_tolerance_rounds_behind(
    tolerance: int, computed_on: int, admission: Admission
) -> None:
    rounds = Rounds(grads_to_wait=2, tolerance=tolerance, version=5)
    assert rounds.join("a", computed_on, live=2) is admission
    assert rounds.is_member("a") is (admission is ADMITTED)


def test_a_refused_join_does_not_open_the_round() -> None:
    rounds = Rounds(grads_to_wait=0, version=2)
    assert rounds.join("old", 1, live=1) is REFUSED
    assert rounds.join("a", 2, live=3) is ADMITTED  # the round opens here, with 3 live
    assert rounds.due({"a", "b", "c"}) is None
    assert rounds.effective_grads_to_wait(live=3) == 3


# ---- aborts, commits, counting --------------------------------------------------------------------


def test_an_aborted_round_is_dropped_and_its_version_opens_again() -> None:
    rounds = Rounds(grads_to_wait=2)
    closed = closed_after(rounds, ["a", "b"], FOUR)
    assert closed is not None
    rounds.abort(closed)
    assert (rounds.version, rounds.aborted_rounds, rounds.closing) == (0, 1, None)
    assert not rounds.is_member("a")
    assert rounds.counted("a", 0) is None
    again = closed_after(rounds, ["c", "a"], FOUR)
    assert again == Closed(0, ("a", "c"), 2)
    rounds.committed(again)
    assert (rounds.counted("a", 0), rounds.counted("b", 0), rounds.counted("c", 0)) == (True, False, True)


def test_only_the_round_being_committed_can_be_committed_or_aborted() -> None:
    rounds = Rounds(grads_to_wait=1)
    stranger = Closed(0, ("z",), 1)
    with pytest.raises(ValueError):
        rounds.committed(stranger)
    closed = closed_after(rounds, ["a"], FOUR)
    assert closed is not None
    with pytest.raises(ValueError):
        rounds.abort(stranger)
    rounds.committed(closed)
    with pytest.raises(ValueError):
        rounds.committed(closed)  # not twice
    assert rounds.version == 1


def test_counted_answers_per_round_and_none_until_committed() -> None:
    rounds = Rounds(grads_to_wait=1)
    for round_, worker in enumerate(["a", "b", "a"]):
        closed = closed_after(rounds, [worker], FOUR)
        assert closed is not None
        rounds.committed(closed)
    assert [rounds.counted("a", r) for r in range(4)] == [True, False, True, None]
    assert [rounds.counted("b", r) for r in range(4)] == [False, True, False, None]


def test_reset_goes_on_from_a_restored_version() -> None:
    rounds = Rounds(grads_to_wait=2)
    assert rounds.join("a", 0, live=2) is ADMITTED
    rounds.reset(7)
    assert (rounds.version, rounds.closing, rounds.is_member("a")) == (7, None, False)
    assert rounds.join("a", 0, live=2) is REFUSED
    assert rounds.join("a", 7, live=2) is ADMITTED


# ---- what the status shows --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("grads_to_wait", "live", "shown"),
    [(4, 2, 2), (4, 6, 4), (4, 0, 4), (0, 3, 3), (0, 0, 1), (1, 5, 1)],
)
def test_effective_grads_to_wait_is_clamped_to_the_live_workers(grads_to_wait: int, live: int, shown: int) -> None:
    assert Rounds(grads_to_wait=grads_to_wait).effective_grads_to_wait(live) == shown


def test_effective_grads_to_wait_shows_the_open_rounds_target() -> None:
    rounds = Rounds(grads_to_wait=0)
    assert rounds.join("a", 0, live=3) is ADMITTED  # target 3
    assert rounds.effective_grads_to_wait(live=5) == 3
    assert rounds.effective_grads_to_wait(live=2) == 2  # two left: at most two can come
