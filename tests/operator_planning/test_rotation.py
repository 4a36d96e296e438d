"""When a job's identity key rotates, and what each step changes (``operator/rotation.py``): a table
of states and moments, and one whole rotation walked through, checking at every step that every
token made so far of a member that may still hold it is accepted."""

from __future__ import annotations

import pytest

from elasticps import identity
from elasticps.operator import rotation
from elasticps.operator.rotation import ADDING, STABLE, SWITCHED, KeyState, Policy

OLD, NEW, OTHER = bytes(range(32)), bytes(range(100, 132)), bytes(range(200, 232))
POLICY = Policy(period_s=3600.0, grace_s=60.0)
STABLE_AT_0 = rotation.fresh(OLD, 0.0)


@pytest.mark.parametrize(("state", "now", "requested", "ready", "after"), [
    # stable: nothing until asked or aged
    (STABLE_AT_0, 10.0, "", True, None),
    (STABLE_AT_0, 3599.0, "", True, None),
    (STABLE_AT_0, 3600.0, "", True, KeyState(OLD, (OLD, NEW), ADDING, 3600.0, "")),
    (STABLE_AT_0, 10.0, "monday", True, KeyState(OLD, (OLD, NEW), ADDING, 10.0, "monday")),
    (KeyState(OLD, (OLD,), STABLE, 0.0, "monday"), 10.0, "monday", True, None),  # carried out already
    (KeyState(OLD, (OLD,), STABLE, 0.0, "monday"), 10.0, "tuesday", True, KeyState(OLD, (OLD, NEW), ADDING, 10.0, "tuesday")),
    # a pod that reads its identity from the environment holds a rotation back
    (STABLE_AT_0, 10.0, "monday", False, None),
    (STABLE_AT_0, 7200.0, "", False, None),
    # adding: the tokens move once the grace is over
    (KeyState(OLD, (OLD, NEW), ADDING, 100.0, "m"), 159.0, "m", True, None),
    (KeyState(OLD, (OLD, NEW), ADDING, 100.0, "m"), 160.0, "m", True, KeyState(NEW, (OLD, NEW), SWITCHED, 160.0, "m")),
    (KeyState(OLD, (OLD, NEW), ADDING, 100.0, "m"), 160.0, "another", False, KeyState(NEW, (OLD, NEW), SWITCHED, 160.0, "m")),
    # switched: the old key goes once the grace is over
    (KeyState(NEW, (OLD, NEW), SWITCHED, 160.0, "m"), 219.0, "m", True, None),
    (KeyState(NEW, (OLD, NEW), SWITCHED, 160.0, "m"), 220.0, "m", True, KeyState(NEW, (NEW,), STABLE, 220.0, "m")),
    # a rotation is not asked again while one is under way: "another" waits for stable
    (KeyState(NEW, (OLD, NEW), SWITCHED, 160.0, "m"), 200.0, "another", True, None),
])  # fmt: skip
def test_the_step_due(state: KeyState, now: float, requested: str, ready: bool, after: KeyState | None) -> None:
    assert rotation.step(state, now, requested, POLICY, NEW, ready) == after


def test_no_timer_with_period_0() -> None:
    assert rotation.step(STABLE_AT_0, 1e9, "", Policy(period_s=0.0, grace_s=60.0), NEW, True) is None


def test_a_whole_rotation_never_refuses_a_token_a_member_may_still_hold() -> None:
    """Members' token files and the servers' key files change at any moment within a grace period
    of a step; at every moment, each token a member may hold is one the servers accept."""
    state, now, steps = STABLE_AT_0, 0.0, []
    while True:
        after = rotation.step(state, now, "rotate", POLICY, NEW, True)
        now += 1.0
        if after is None:
            if state.phase == STABLE and steps:
                break
            continue
        # Until the grace ends, a pod may still see the previous state: its accepted keys and its token.
        for server in (state, after):
            for member in (state, after):
                token = identity.token_for(member.signing, "worker-0")
                assert identity.Verifier(lambda s=server: s.accepted).member(token) == "worker-0", (server, member)
        steps.append(after.phase)
        state = after
    assert steps == [ADDING, SWITCHED, STABLE]
    assert state.accepted == (NEW,) and state.signing == NEW
    assert identity.Verifier(lambda: state.accepted).member(identity.token_for(OLD, "worker-0")) is None
    assert now == pytest.approx(2 * POLICY.grace_s + 2, abs=2)


def test_each_step_says_what_it_did() -> None:
    assert "accept a new key" in rotation.describe(KeyState(OLD, (OLD, NEW), ADDING), 120)
    assert "under the new key" in rotation.describe(KeyState(NEW, (OLD, NEW), SWITCHED), 120)
    assert "old key are refused" in rotation.describe(KeyState(NEW, (NEW,), STABLE), 120)
    assert KeyState(OLD, (OLD, NEW), ADDING).next_key == NEW and KeyState(OLD, (OLD,)).next_key is None
