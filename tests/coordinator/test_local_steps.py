"""LocalSGD's period (coordinator/local_steps.py): seed 003's warm-up counted in steps, AdaComm's K
against hand-computed values, and the rounds handing their members' periods to the schedule."""

from __future__ import annotations

import math

import pytest

from elasticps.api.modes import LocalSGD
from elasticps.coordinator.local_steps import LocalSteps, adaptive_period, warmup_period
from elasticps.coordinator.rounds import Admission, Period, Rounds


# ---- the fixed schedule ----------------------------------------------------------------------------
def test_without_a_warm_up_the_period_is_k_from_the_start() -> None:
    assert [warmup_period(done, 4, 0) for done in (0, 1, 100)] == [4, 4, 4]


def test_the_warm_up_is_one_step_periods_then_powers_of_two_up_to_k_each_as_long() -> None:
    # Seed 003's get_local_sgd_steps with a pass of 10 steps: K = 1 while warming up (10 steps),
    # then 1, 2, 4, 8 for 10 steps each, then K.
    periods = [warmup_period(done, 8, 10) for done in range(0, 70, 5)]
    assert periods == [1, 1, 1, 1, 2, 2, 4, 4, 8, 8, 8, 8, 8, 8]


def test_a_k_that_is_not_a_power_of_two_is_reached_after_the_powers_below_it() -> None:
    assert [warmup_period(done, 6, 2) for done in range(0, 12, 2)] == [1, 1, 2, 4, 6, 6]


def test_the_schedule_counts_the_steps_of_committed_rounds() -> None:
    schedule = LocalSteps(LocalSGD(steps=4, warmup_steps=3))
    decided = [schedule.committed(r, schedule.current, 2.0, 0.1) for r in range(8)]
    # done after each round: 1 2 3 4 5 6 8 10 -> warm-up until 3, then 1 (3..5), 2 (6..8), 4
    assert decided == [1, 1, 1, 1, 1, 2, 2, 4]
    assert schedule.done == 1 + 1 + 1 + 1 + 1 + 1 + 2 + 2


def test_a_round_of_short_periods_counts_its_longest() -> None:
    schedule = LocalSteps(LocalSGD(steps=4))
    schedule.committed(0, 3, 1.0, 0.1)
    assert schedule.done == 3


def test_each_round_keeps_its_decision_for_joins_that_ask_late() -> None:
    schedule = LocalSteps(LocalSGD(steps=8, warmup_steps=1))
    schedule.committed(0, 1, 1.0, 0.1)
    schedule.committed(1, 1, 1.0, 0.1)
    schedule.committed(2, 1, 1.0, 0.1)
    assert (schedule.after(0), schedule.after(1), schedule.after(2)) == (1, 2, 4)
    assert schedule.after(99) == schedule.current


def test_localsgd_needs_at_least_one_step() -> None:
    with pytest.raises(ValueError, match="localSGDSteps"):
        LocalSteps(LocalSGD(steps=0))


# ---- adaptive K ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("first_loss", "first_lr", "loss", "lr", "inf_loss", "previous", "expected"),
    [
        (2.0, 0.1, 2.0, 0.1, 0.0, 8, 8),  # K0 at the start: int(8 * sqrt(1))
        (2.0, 0.1, 0.5, 0.1, 0.0, 8, 4),  # int(8 * sqrt(0.25)) = 4
        (2.0, 0.1, 0.3, 0.1, 0.0, 8, 3),  # int(8 * sqrt(0.15)) = int(3.098) = 3
        (2.0, 0.1, 0.5, 0.05, 0.0, 8, 5),  # int(8 * sqrt(0.1 * 0.5 / (0.05 * 2))) = int(5.657) = 5
        (2.0, 0.1, 1.1, 0.1, 0.6, 8, 4),  # the seed's inf_loss 0.6: int(8 * sqrt(0.5 / 1.4)) = int(4.78) = 4
        (2.0, 0.1, 0.4, 0.1, 0.6, 8, 1),  # below inf_loss: the ratio clamps at 0, K = 1
        (2.0, 0.1, 0.0001, 0.1, 0.0, 8, 1),  # at least 1
        (0.5, 0.1, 2.0, 0.1, 0.0, 8, 16),  # the loss went up: int(8 * sqrt(4)) = 16
        (0.01, 0.1, 2.0, 0.1, 0.0, 8, 8),  # int(8 * sqrt(200)) = 113, more than 20 above 8: keeps 8
        (0.6, 0.1, 2.0, 0.1, 0.6, 8, 8),  # F0 = Finf: the 1e-12 floor makes K huge, the guard keeps 8
    ],
)
def test_adaptive_k_matches_the_seeds_formula(
    first_loss: float, first_lr: float, loss: float, lr: float, inf_loss: float, previous: int, expected: int
) -> None:
    assert adaptive_period(8, first_loss, first_lr, loss, lr, inf_loss, previous) == expected


def test_adaptive_k_falls_with_the_loss_from_k0() -> None:
    schedule = LocalSteps(LocalSGD(steps=16, adaptive=True))
    assert schedule.current == 16
    losses = [2.3, 1.2, 0.6, 0.3, 0.15]
    decided = [schedule.committed(r, schedule.current, loss, 0.05) for r, loss in enumerate(losses)]
    assert decided == [int(16 * math.sqrt(loss / 2.3)) for loss in losses] == [16, 11, 8, 5, 4]


def test_adaptive_k_waits_for_the_warm_up_and_takes_f0_from_the_first_round() -> None:
    schedule = LocalSteps(LocalSGD(steps=8, warmup_steps=2, adaptive=True))
    assert schedule.current == 1
    assert schedule.committed(0, 1, 2.0, 0.1) == 1  # F0 = 2.0; 1 step done, still warming up
    # Past the warm-up: K0 * sqrt(F/F0) = int(8 * sqrt(0.5)) = 5; the warm-up's 1 does not make
    # the jump from it look like more than 20.
    assert schedule.committed(1, 1, 1.0, 0.1) == 5


def test_a_non_finite_or_zero_learning_rate_keeps_the_previous_k() -> None:
    assert adaptive_period(8, 2.0, 0.1, 1.0, 0.0, 0.0, 3) == 3
    assert adaptive_period(8, 2.0, 0.1, math.nan, 0.1, 0.0, 3) == 3


@pytest.mark.parametrize(("loss", "lr"), [(1.0, 5e-324), (1e200, 1e-300), (1e308, 1e-308), (1.0, 1e-320)])
def test_a_learning_rate_or_loss_at_the_edge_of_the_floats_keeps_the_previous_k(loss: float, lr: float) -> None:
    # Issue 35, Found 3: 5e-324 raised ZeroDivisionError, 1e200 at 1e-300 OverflowError (UNKNOWN on the wire).
    assert adaptive_period(8, 2.0, 0.1, loss, lr, 0.0, 3) == 3


# ---- the rounds hand the members' periods to the schedule -------------------------------------------
def test_a_committed_round_decides_the_next_period_from_its_members_mean_loss() -> None:
    rounds = Rounds(periods=LocalSteps(LocalSGD(steps=8, adaptive=True)))
    assert rounds.join("w0", 0, 2, Period(8, 2.0, 0.1)) is Admission.ADMITTED
    assert rounds.join("w1", 0, 2, Period(8, 2.0, 0.1)) is Admission.ADMITTED
    closed = rounds.due({"w0", "w1"})
    assert closed is not None
    rounds.committed(closed)
    assert rounds.period_after(0) == 8  # F0 = 2.0
    rounds.join("w0", 1, 2, Period(8, 0.25, 0.1))
    rounds.join("w1", 1, 2, Period(6, 0.75, 0.1))  # its task ended two steps early
    closed = rounds.due({"w0", "w1"})
    assert closed is not None
    rounds.committed(closed)
    assert rounds.period_after(1) == int(8 * math.sqrt(0.5 / 2.0)) == 4  # the mean loss, 0.5
    assert rounds.periods is not None and rounds.periods.done == 16  # the longest period counts


def test_a_member_taken_out_of_the_round_takes_its_report_with_it() -> None:
    rounds = Rounds(periods=LocalSteps(LocalSGD(steps=8, adaptive=True)))
    rounds.join("w0", 0, 2, Period(8, 2.0, 0.1))
    rounds.join("w1", 0, 2, Period(8, 100.0, 0.1))
    rounds.drop("w1")  # its task went back to the queue
    closed = rounds.due({"w0"})
    assert closed is not None and closed.members == ("w0",)
    rounds.committed(closed)
    assert rounds.periods is not None and rounds.periods.first == (2.0, 0.1)


def test_sync_rounds_have_no_period() -> None:
    rounds = Rounds()
    rounds.join("w0", 0, 1)
    closed = rounds.due({"w0"})
    assert closed is not None
    rounds.committed(closed)
    assert rounds.period_after(0) == 0
