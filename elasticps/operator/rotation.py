"""When the operator rotates a job's key, and what each step of a rotation changes. Pure.

A job's key signs every member's token (``identity.py``); the servers check tokens against the keys
they accept, read from the job's Secret, mounted in their pods (the kubelet rewrites it there
within about a minute of a change; the processes read it again within a second). One rotation is
three steps, each taken once every pod has had ``grace_s`` to see the previous one, so no member is
ever refused on the way:

1. ``adding``: a new key is accepted too; tokens are still made under the old one;
2. ``switched``: every token is made again under the new key; the old one is still accepted, for
   the members whose files have not changed yet;
3. stable: the old key is accepted no more; a token made under it is refused from then on.

A rotation starts when the job's ``elasticps.io/rotate-identity`` annotation takes a value not
carried out yet (``kubectl annotate tj J elasticps.io/rotate-identity=$(date +%s) --overwrite``), or
when the key is ``period_s`` old (0: never on a timer). It waits while a pod of the job reads its
identity from the environment (a pod made by an operator before rotation existed: a rotation would
lock it out), and never starts for a finished job.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

ROTATE_ANNOTATION = "elasticps.io/rotate-identity"  # on the TrainingJob: a new value asks for a rotation

STABLE = "stable"
ADDING = "adding"
SWITCHED = "switched"
PHASES = (STABLE, ADDING, SWITCHED)

DEFAULT_PERIOD_S = 24 * 3600.0
DEFAULT_GRACE_S = 120.0  # the kubelet's sync period (1 min by default) and its Secret cache, with room


@dataclass(frozen=True)
class Policy:
    period_s: float = DEFAULT_PERIOD_S  # rotate keys this old; 0: only when asked
    grace_s: float = DEFAULT_GRACE_S  # between the steps


@dataclass(frozen=True)
class KeyState:
    """What a job's identity Secret says of its keys."""

    signing: bytes  # tokens are made under it
    accepted: tuple[bytes, ...]  # the servers take tokens of these
    phase: str = STABLE
    since: float = 0.0  # when the phase began (epoch seconds)
    honored: str = ""  # the last rotate-identity value carried out

    @property
    def next_key(self) -> bytes | None:
        """The key tokens will be made under once ``adding`` ends."""
        return next((k for k in self.accepted if k != self.signing), None) if self.phase == ADDING else None


def fresh(key: bytes, now: float) -> KeyState:
    return KeyState(signing=key, accepted=(key,), since=now)


def step(state: KeyState, now: float, requested: str, policy: Policy, new_key: bytes, ready: bool) -> KeyState | None:
    """The state after the rotation step due now, or None when none is. ``requested``: the job's
    annotation ("" when absent); ``new_key``: taken if a rotation starts; ``ready``: every pod of
    the job reads its identity from files, so a rotation may start."""
    if state.phase == ADDING:
        following = state.next_key
        if now - state.since < policy.grace_s or following is None:
            return None
        return replace(state, signing=following, phase=SWITCHED, since=now)
    if state.phase == SWITCHED:
        if now - state.since < policy.grace_s:
            return None
        return replace(state, accepted=(state.signing,), phase=STABLE, since=now)
    asked = bool(requested) and requested != state.honored
    aged = policy.period_s > 0 and now - state.since >= policy.period_s
    if not (asked or aged) or not ready:
        return None
    return replace(state, accepted=(state.signing, new_key), phase=ADDING, since=now, honored=requested)


def describe(after: KeyState, grace_s: float) -> str:
    """The Event's message of the step that led to ``after``."""
    if after.phase == ADDING:
        return f"identity key rotation: the servers accept a new key too; tokens move to it in {grace_s:.0f} s"
    if after.phase == SWITCHED:
        return f"identity key rotation: every token is made under the new key; the old key is dropped in {grace_s:.0f} s"
    return "identity key rotation: done, tokens of the old key are refused"
