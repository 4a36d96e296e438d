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

Keys rotate (``operator/rotation.py``): a server may accept several keys at once (the one tokens
are made under and the next or the previous one), and a process given its keys or token as files
(``ELASTICPS_KEY_FILE``, ``ELASTICPS_TOKEN_FILE``: a mounted Secret, which the kubelet rewrites in
place) reads them again when they change, within :data:`RELOAD_S`; a token the accepted keys no
longer make is refused from then on. Environment values (the local runner's) never change.

Pure but for :func:`key_from_env`, :func:`own_token` and :class:`WatchedFile`, which read the
process's environment and files.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

KEY_ENV = "ELASTICPS_JOB_KEY"  # hex: the servers' and the job owner's
TOKEN_ENV = "ELASTICPS_TOKEN"  # the member's own token
KEY_FILE_ENV = "ELASTICPS_KEY_FILE"  # a file of the keys a server accepts, hex, one a line
TOKEN_FILE_ENV = "ELASTICPS_TOKEN_FILE"  # a file holding the member's own token
RELOAD_S = 1.0  # a changed key or token file is read again within this long
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


def parse_key(text: str, where: str = KEY_ENV) -> bytes:
    try:
        key = bytes.fromhex(text.strip())
    except ValueError:
        raise IdentityError(f"{where}: not hexadecimal") from None
    if len(key) < 16:
        raise IdentityError(f"{where}: {len(key)} bytes, at least 16 are needed")
    return key


def parse_keys(text: str, where: str = KEY_FILE_ENV) -> tuple[bytes, ...]:
    """The keys of a key file: one a line, blank lines skipped; at least one."""
    keys = tuple(parse_key(line, where) for line in text.splitlines() if line.strip())
    if not keys:
        raise IdentityError(f"{where}: no key")
    return keys


def format_keys(keys: tuple[bytes, ...]) -> str:
    return "".join(f"{key.hex()}\n" for key in keys)


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


KeySource = Callable[[], tuple[bytes, ...]]


class Verifier:
    """The servers' side: a token's member, or None for a token none of the accepted keys made.
    ``keys``: the one key, or a source of the keys accepted now (asked on every call: cheap, see
    :class:`WatchedFile`). A token found valid is remembered (a dict lookup instead of an HMAC on
    the next call) until the keys change; only valid ones are, so a stranger's guesses fill
    nothing, and finding a token there takes knowing it whole."""

    def __init__(self, keys: bytes | KeySource) -> None:
        if isinstance(keys, bytes):
            fixed = (keys,)
            self._source: KeySource = lambda: fixed
        else:
            self._source = keys
        # The keys the remembered tokens were checked under, with them: one value, so a thread
        # that read the keys before a rotation never files a token where the new keys' are kept.
        self._known: tuple[tuple[bytes, ...], dict[str, str]] = ((), {})

    @property
    def keys(self) -> tuple[bytes, ...]:
        return self._source()

    def member(self, token: str | bytes | None) -> str | None:
        if token is None:
            return None
        keys = self._source()
        checked_under, known_tokens = self._known
        if checked_under is not keys:  # rotated: tokens of a key no longer accepted must not pass
            known_tokens = {}
            self._known = (keys, known_tokens)
        if isinstance(token, str) and (known := known_tokens.get(token)) is not None:
            return known
        found = _verify(keys, token)
        if found is not None and isinstance(token, str) and len(known_tokens) < MAX_KNOWN:
            known_tokens[token] = found
        return found


def _verify(keys: tuple[bytes, ...], token: str | bytes) -> str | None:
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
    # Every accepted key is tried, so the time does not tell which one made the token.
    matched = [hmac.compare_digest(mac.encode(), _mac(key, member).encode()) for key in keys]
    return member if any(matched) else None


T = TypeVar("T")


class WatchedFile(Generic[T]):
    """A small file read again when it changes (its inode, size or mtime: the kubelet swaps a
    mounted Secret's files for new ones), looked at no more than once per ``every`` seconds; its
    text goes through ``parse``. A file that cannot be read or parsed any more keeps the last good
    value (logged once per change): a rotation half-written must not lock the process out."""

    def __init__(self, path: str, parse: Callable[[str], T], every: float = RELOAD_S) -> None:
        self.path, self._parse, self._every = path, parse, every
        self._lock = threading.Lock()
        self._checked = time.monotonic()
        try:  # the first read must succeed
            self._stamp = self._stat()
            self.value: T = parse(self._read())
        except (OSError, UnicodeDecodeError) as err:
            raise IdentityError(f"{path}: {getattr(err, 'strerror', None) or err}") from None

    def current(self) -> T:
        now = time.monotonic()
        if now - self._checked < self._every:
            return self.value
        with self._lock:
            if now - self._checked < self._every:
                return self.value
            self._checked = now
            try:
                stamp = self._stat()
                if stamp != self._stamp:
                    self._stamp = stamp
                    self.value = self._parse(self._read())
                    log.info("%s changed: read again", self.path)
            except (OSError, UnicodeDecodeError, IdentityError) as err:
                log.warning("%s: %s (the last good value stays)", self.path, err)
        return self.value

    def _stat(self) -> tuple[int, int, int]:
        st = os.stat(self.path)
        return st.st_ino, st.st_size, st.st_mtime_ns

    def _read(self) -> str:
        with open(self.path, encoding="ascii") as f:
            return f.read(64 * 1024)


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
    """The process's verifier when ``ELASTICPS_KEY_FILE`` or ``ELASTICPS_JOB_KEY`` is set
    (IdentityError when it does not hold keys or the file cannot be read). Reads the process's
    token too (:func:`own_token`), so a token file that cannot be read stops the process at its
    start, not at its first call."""
    own_token()
    path = os.environ.get(KEY_FILE_ENV, "")
    if path:
        watched = WatchedFile(path, lambda text: parse_keys(text, path))
        return Verifier(watched.current)
    text = os.environ.get(KEY_ENV, "")
    return Verifier(parse_key(text)) if text else None


_token_file: WatchedFile[str] | None = None
_token_lock = threading.Lock()


def own_token() -> str:
    """This process's token now (``ELASTICPS_TOKEN_FILE``'s, else ``ELASTICPS_TOKEN``), or "" when
    it has none. Cheap enough to ask on every call. IdentityError when the file cannot be read the
    first time."""
    global _token_file
    path = os.environ.get(TOKEN_FILE_ENV, "")
    if not path:
        return os.environ.get(TOKEN_ENV, "")
    watched = _token_file
    if watched is None or watched.path != path:
        with _token_lock:
            if _token_file is None or _token_file.path != path:
                _token_file = WatchedFile(path, str.strip)
            watched = _token_file
    return watched.current()


def token_source() -> str | Callable[[], str]:
    """What a client puts on its calls: the fixed token of the environment ("" for none), or
    :func:`own_token` itself, asked per call, when the token is a file that may be rotated."""
    return own_token if os.environ.get(TOKEN_FILE_ENV) else os.environ.get(TOKEN_ENV, "")


def member_env(key: bytes, member: str, serves: bool) -> dict[str, str]:
    """The environment of a job's process: its token, and the key when it serves calls."""
    env = {TOKEN_ENV: token_for(key, member)}
    if serves:
        env[KEY_ENV] = key.hex()
    return env
