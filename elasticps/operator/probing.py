"""Asks a job's coordinator (PS 0's, or a decentralized job's own) how the job is doing (``GetJobStatus``), briefly, and never fails a pass.

Callers: ``reconciling``, once per pass and only while PS 0 runs. Any gRPC error or a timeout is
"no answer" (None): the planner then keeps the last progress it wrote and never declares success.
A channel that answered is kept for the job's next passes; one that did not is closed, so the next
pass dials afresh instead of waiting out gRPC's reconnect backoff (up to two minutes) after PS 0
comes back.
"""

from __future__ import annotations

import logging
import threading

import grpc

from elasticps.coordinator.client import CoordinatorClient
from elasticps.planning.progress import job_progress
from elasticps.planning.observed import JobProgress

log = logging.getLogger(__name__)


class CoordinatorProbe:
    def __init__(self, address_template: str, timeout_s: float) -> None:
        self._template = address_template
        self._timeout_s = timeout_s
        self._lock = threading.Lock()
        self._clients: dict[tuple[str, str], CoordinatorClient] = {}

    def progress(self, namespace: str, job: str, replica: str = "", token: str = "") -> JobProgress | None:
        """``replica``: the name of the replica that coordinates the job (PS 0's by default);
        ``token``: the operator's in the job (``identities``), "" for a job without identity."""
        key = (namespace, job)
        with self._lock:
            coordinator = self._clients.pop(key, None)
        if coordinator is not None and coordinator.token != token:  # the job was replaced: a new key
            coordinator.close()
            coordinator = None
        if coordinator is None:
            address = self._template.format(job=job, namespace=namespace, coordinator=replica or f"{job}-ps-0")
            coordinator = CoordinatorClient(address, deadline_s=self._timeout_s, timeout_s=self._timeout_s, token=token)
        try:
            reply = coordinator.status(timeout_s=self._timeout_s)
        except grpc.RpcError as err:
            code = err.code() if isinstance(err, grpc.Call) else None
            log.debug("%s/%s: coordinator did not answer (%s)", namespace, job, code)
            coordinator.close()
            return None
        with self._lock:
            stale = self._clients.pop(key, None)
            self._clients[key] = coordinator
        if stale is not None:
            stale.close()
        return job_progress(reply)

    def forget(self, namespace: str, job: str) -> None:
        with self._lock:
            coordinator = self._clients.pop((namespace, job), None)
        if coordinator is not None:
            coordinator.close()

    def close(self) -> None:
        with self._lock:
            clients, self._clients = list(self._clients.values()), {}
        for coordinator in clients:
            coordinator.close()
