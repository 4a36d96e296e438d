"""Job identity: who a caller of a PS, a coordinator or a decentralized peer is, and what it may do.

A job has one secret key, made by whoever starts the job (the operator keeps it in a Secret, the
local runner makes one per run). Every member of the job holds a token naming it:
``<member>.<mac>``, the mac an HMAC-SHA256 of the member's name under the key. Only the servers
(PS, coordinator, a decentralized worker's peer service) and the job's owner hold the key; a
worker holds its own token and nothing else, so it cannot pass for another worker.

Members: ``ps-<i>``, ``worker-<i>``, ``coordinator-0`` (a decentralized job's) and observers,
``observer-<what>`` (the operator's status probe, the local runner, tools), which may only read.
A call carries the token in the ``elasticps-token`` metadata (gRPC) or in the connection's hello
(the bulk channel, ``rpc/bulk.py``). With no key a server takes every caller, as before identity
existed (tests of one server, a job started by hand without ``ELASTICPS_JOB_KEY``).

Pure but for :func:`key_from_env` and :func:`own_token`, which read the process's environment.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from dataclasses import dataclass, field

KEY_ENV = "ELASTICPS_JOB_KEY"  # hex: the servers' and the job owner's
TOKEN_ENV = "ELASTICPS_TOKEN"  # the member's own token
METADATA_KEY = "elasticps-token"
MAX_TOKEN_BYTES = 512
KEY_BYTES = 32

PS = "ps"
WORKER = "worker"
COORDINATOR = "coordinator"
OBSERVER = "observer"
KINDS = (PS, WORKER, COORDINATOR, OBSERVER)

# What each kind of member may call; a method not named here (health checks) is open to anyone.
_SERVERS = frozenset({PS, COORDINATOR})
_EVERY_MEMBER = frozenset(KINDS)
_WORKERS = frozenset({WORKER})
ALLOWED: dict[str, frozenset[str]] = {
    # ParameterServer
    "PushModel": _WORKERS,
    "PushGradients": _WORKERS,
    "PullDense": frozenset({WORKER, OBSERVER}),
    "PullEmbeddings": frozenset({WORKER, OBSERVER}),
    "DescribeShard": _EVERY_MEMBER,
    "CommitRound": _SERVERS,
    "RestoreShard": _SERVERS,
    "ReadLedger": _SERVERS,
    # Coordinator
    "GetTask": _WORKERS,
    "ReportTask": _WORKERS,
    "Heartbeat": _WORKERS,
    "JoinRound": _WORKERS,
    "GetJobStatus": _EVERY_MEMBER,
    # Peer (decentralized)
    "SendModel": _WORKERS,
    "TakeTokens": _WORKERS,
    "Excuse": _WORKERS,
    "PullModel": _WORKERS,
}
GUARDED_SERVICES = ("elasticps.v1.ParameterServer", "elasticps.v1.Coordinator", "elasticps.v1.Peer")


class IdentityError(ValueError):
    """A key that is not one (wrong length, not hex)."""


def new_key() -> bytes:
    return secrets.token_bytes(KEY_BYTES)


def parse_key(text: str) -> bytes:
    try:
        key = bytes.fromhex(text.strip())
    except ValueError:
        raise IdentityError(f"{KEY_ENV}: not hexadecimal") from None
    if len(key) < 16:
        raise IdentityError(f"{KEY_ENV}: {len(key)} bytes, at least 16 are needed")
    return key


def member_name(kind: str, index: int | str) -> str:
    if kind not in KINDS:
        raise ValueError(f"not a kind of member: {kind!r}")
    return f"{kind}-{index}"


def kind_of(member: str) -> str:
    return member.split("-", 1)[0]


def _mac(key: bytes, member: str) -> str:
    return hmac.new(key, member.encode(), hashlib.sha256).hexdigest()


def token_for(key: bytes, member: str) -> str:
    if kind_of(member) not in KINDS or "." in member:
        raise ValueError(f"not a member's name: {member!r}")
    return f"{member}.{_mac(key, member)}"


MAX_KNOWN = 1 << 16  # valid tokens remembered per verifier: a job's members, with room to spare


@dataclass(frozen=True)
class Verifier:
    """The servers' side: a token's member, or None for a token the key did not make. A token found
    valid is remembered (a dict lookup instead of an HMAC on the next call); only valid ones are,
    so a stranger's guesses fill nothing, and finding a token there takes knowing it whole."""

    key: bytes
    _known: dict[str, str] = field(default_factory=dict, compare=False, repr=False)

    def member(self, token: str | bytes | None) -> str | None:
        if token is None:
            return None
        if isinstance(token, str) and (known := self._known.get(token)) is not None:
            return known
        found = self._verify(token)
        if found is not None and isinstance(token, str) and len(self._known) < MAX_KNOWN:
            self._known[token] = found
        return found

    def _verify(self, token: str | bytes) -> str | None:
        if isinstance(token, bytes):
            try:
                token = token.decode("ascii")
            except UnicodeDecodeError:
                return None
        if len(token) > MAX_TOKEN_BYTES or "." not in token:
            return None
        member, mac = token.rsplit(".", 1)
        if kind_of(member) not in KINDS:
            return None
        # compare_digest: as long whatever the first wrong character (a mac is not guessed byte by byte).
        return member if hmac.compare_digest(mac.encode(), _mac(self.key, member).encode()) else None


def refusal(member: str | None, method: str) -> str | None:
    """Why a caller (None: no valid token) may not call ``method`` (a bare name: ``PushGradients``),
    or None when it may."""
    allowed = ALLOWED.get(method)
    if allowed is None:
        return None
    if member is None:
        return f"{method}: the caller has no valid token of this job ({METADATA_KEY})"
    if kind_of(member) not in allowed:
        return f"{method}: {member} may not call it (only {', '.join(sorted(allowed))} members)"
    return None


def claim_refusal(member: str | None, claimed: str, field: str) -> str | None:
    """Why a caller may not speak for ``claimed`` (a request's worker name), or None. Without
    identity (``member`` None on a server with no key) anything goes; a worker speaks only for
    itself; the servers and observers name no worker."""
    if member is None or kind_of(member) != WORKER or claimed == member:
        return None
    return f"{field} {claimed!r}: the caller is {member}; a worker speaks only for itself"


def key_from_env() -> Verifier | None:
    """The process's verifier when ``ELASTICPS_JOB_KEY`` is set (IdentityError when it is not a key)."""
    text = os.environ.get(KEY_ENV, "")
    return Verifier(parse_key(text)) if text else None


def own_token() -> str:
    """This process's token (``ELASTICPS_TOKEN``), or "" when it has none."""
    return os.environ.get(TOKEN_ENV, "")


def member_env(key: bytes, member: str, serves: bool) -> dict[str, str]:
    """The environment of a job's process: its token, and the key when it serves calls."""
    env = {TOKEN_ENV: token_for(key, member)}
    if serves:
        env[KEY_ENV] = key.hex()
    return env
