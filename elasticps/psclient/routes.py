"""How one shard's pushes and pulls travel: over its bulk channel when it has one that connects
(``rpc/bulk.py``), else as gRPC frames.

Used by the PS client (``psclient/client.py``), one route per shard. The bulk port is asked of the shard
(``DescribeShard``) on first use; a shard without one, or whose port does not connect (a
NetworkPolicy that does not open it, a firewall, an older PS), is served by gRPC frames and asked
again :data:`RETRY_AFTER_S` later, twice as late after each failure in a row up to
:data:`MAX_RETRY_AFTER_S` (a port whose packets are dropped costs a call ``CONNECT_TIMEOUT_S``). A connection that breaks is dropped, and the port asked again
(a restarted PS may listen on another). Up to :data:`POOL` idle connections are kept per shard
(a push and a pull may overlap), each for at most :data:`IDLE_REUSE_S`. A port that turns a
connection away (RESOURCE_EXHAUSTED: the PS's connection limit) is treated as one that does not
connect: gRPC frames for a while (:meth:`BulkRoute.full`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from elasticps.rpc.bulk import BulkConnection

log = logging.getLogger(__name__)

RETRY_AFTER_S = 30.0
# An idle connection is not reused after this long: the server closes connections idle for its
# --stream_idle_seconds (30 s by default), and a call on a closed one would go as gRPC frames.
IDLE_REUSE_S = 20.0
MAX_RETRY_AFTER_S = 960.0
CONNECT_TIMEOUT_S = 2.0
POOL = 4


def host_of(address: str) -> str:
    host = address.rsplit(":", 1)[0]
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


class BulkRoute:
    def __init__(
        self,
        address: str,
        describe: Callable[[], int],
        timeout_s: float,
        clock: Callable[[], float] = time.monotonic,
        token: str | None = None,
    ) -> None:
        """``describe()``: the shard's bulk port (0: none), asked over gRPC. ``token``: sent in each
        connection's hello (None: this process's)."""
        self._host = host_of(address)
        self._token = token
        self._describe = describe
        self._timeout_s = timeout_s
        self._clock = clock
        self._lock = threading.Lock()
        self._idle: list[tuple[BulkConnection, float]] = []  # with when each was given back
        self._port: int | None = None
        self._retry_at = 0.0
        self._failures = 0  # in a row: how long until the next attempt
        self.fallbacks = 0  # calls that went as gRPC frames because the channel was not there

    def take(self) -> BulkConnection | None:
        """A connection to the shard's bulk channel, or None: send this call as gRPC frames."""
        idle = self._idle_one()
        if idle is not None:
            return idle
        with self._lock:
            if self._clock() < self._retry_at:
                self.fallbacks += 1
                return None
            port = self._port
        if port is None:
            try:
                port = self._describe()
            except Exception as err:  # the gRPC call's own failure shows on the call that follows
                log.debug("bulk: cannot ask %s for its port: %s", self._host, err)
                return self._unavailable()
            if port == 0:  # none now: asked again later (a restarted PS may have one)
                return self._unavailable()
            with self._lock:
                self._port = port
        try:
            connection = BulkConnection(self._host, port, CONNECT_TIMEOUT_S, self._timeout_s, self._token)
        except OSError as err:
            log.info("bulk: %s:%d does not connect (%s): gRPC frames for a while", self._host, port, err)
            with self._lock:
                self._port = None
            return self._unavailable()
        with self._lock:
            self._failures = 0
        return connection

    def _idle_one(self) -> BulkConnection | None:
        """The newest idle connection that is not stale (older ones than IDLE_REUSE_S are closed)."""
        stale: list[BulkConnection] = []
        found: BulkConnection | None = None
        with self._lock:
            now = self._clock()
            while self._idle and found is None:
                connection, since = self._idle.pop()
                if now - since > IDLE_REUSE_S:
                    stale.append(connection)
                else:
                    found = connection
        for connection in stale:
            connection.close()
        return found

    def full(self) -> None:
        """The shard's bulk port turned a connection away (its connection limit): gRPC frames for a
        while, as for a port that does not connect."""
        log.info("bulk: %s is full (RESOURCE_EXHAUSTED): gRPC frames for a while", self._host)
        self._unavailable()

    def _unavailable(self) -> BulkConnection | None:
        """None, and no bulk channel asked for until a while from now (longer after each failure)."""
        with self._lock:
            wait = min(RETRY_AFTER_S * 2**self._failures, MAX_RETRY_AFTER_S)
            self._failures += 1
            self._retry_at = self._clock() + wait
            self.fallbacks += 1
        return None

    def give_back(self, connection: BulkConnection) -> None:
        if connection.broken:
            connection.close()
            return
        with self._lock:
            if len(self._idle) < POOL:
                self._idle.append((connection, self._clock()))
                return
        connection.close()

    def lost(self) -> None:
        """A connection broke mid-call: ask the port again next time."""
        with self._lock:
            self._port = None

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for connection, _ in idle:
            connection.close()
