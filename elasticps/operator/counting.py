"""Counts the Kubernetes API requests the operator makes: ours (the ``kubernetes`` client) and kopf's.

Callers: ``cluster_api`` records each request of the passes (the job under way is known, so each
one is also counted for its job); ``handlers`` hands kopf an ``aiohttp`` session whose trace hook
records kopf's requests (watches, its annotations on the TrainingJob: those name the job in
their path). ``snapshot()`` is what is logged and written to ``--stats_file``: the counts, the requests of each
wall-clock second (the last ``SECONDS_KEPT`` of them) and the busiest second so far (``peak_qps``),
and for each job when its first and last request of each kind was sent (``first_at``/``last_at``,
Unix time: how long after ``kubectl apply`` the operator sent its last create).

A request is described as ``VERB resource`` the way the API server's audit log would: ``list pods``,
``create pods``, ``patch trainingjobs/status``, ``watch pods``.
"""

from __future__ import annotations

import contextvars
import json
import threading
import time
import urllib.parse
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from elasticps.files import write_atomically

# The job whose pass is running in this thread/task, as "namespace/name" (set by ``reconciling``).
current_job: contextvars.ContextVar[str | None] = contextvars.ContextVar("elasticps_current_job", default=None)

OURS = "elasticps"
KOPF = "kopf"
SECONDS_KEPT = 900
V = TypeVar("V")


def describe(method: str, url: str) -> tuple[str, str, str | None]:
    """``(verb, resource, job)`` of one request; ``job`` when the path names a TrainingJob."""
    parts = urllib.parse.urlsplit(url)
    segments = [s for s in parts.path.split("/") if s]
    query = urllib.parse.parse_qs(parts.query)
    # /api/v1/... or /apis/GROUP/VERSION/...
    rest = segments[2:] if segments[:1] == ["api"] else segments[3:]
    namespace = None
    if len(rest) >= 2 and rest[0] == "namespaces" and len(rest) > 2:
        namespace, rest = rest[1], rest[2:]
    resource = rest[0] if rest else "/" + "/".join(segments)  # no resource: API discovery
    name = rest[1] if len(rest) > 1 else (resource if not rest else None)
    if len(rest) > 2:
        resource += "/" + rest[2]
    method = method.upper()
    verb = {
        "POST": "create",
        "PUT": "update",
        "PATCH": "patch",
        "DELETE": "delete" if name else "deletecollection",
    }.get(method, "get" if name else ("watch" if query.get("watch", [""])[0] in ("true", "1") else "list"))
    if query.get("dryRun"):
        verb = f"dry-run {verb}"  # checked, not carried out (``validating``): counted apart
    job = f"{namespace}/{name}" if namespace and name and rest and rest[0] == "trainingjobs" else None
    return verb, resource, job


class RequestCounter:
    """Thread-safe counts of requests, by source (ours / kopf's), by kind of request and by job."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._by_kind: Counter[tuple[str, str]] = Counter()
        self._by_job: dict[str, Counter[tuple[str, str]]] = {}
        self._first_at: dict[str, dict[tuple[str, str], float]] = {}
        self._last_at: dict[str, dict[tuple[str, str], float]] = {}
        self._seconds: dict[int, int] = {}  # wall-clock second -> requests sent in it
        self._peak = 0
        self._changes = 0

    def record(self, source: str, method: str, url: str, job: str | None = None) -> None:
        verb, resource, named_job = describe(method, url)
        key = (source, f"{verb} {resource}")
        job = job or named_job
        with self._lock:
            now = self._clock()
            self._by_kind[key] += 1
            if job is not None:
                self._by_job.setdefault(job, Counter())[key] += 1
                self._first_at.setdefault(job, {}).setdefault(key, now)
                self._last_at.setdefault(job, {})[key] = now
            second = int(now)
            self._seconds[second] = count = self._seconds.get(second, 0) + 1
            self._peak = max(self._peak, count)
            if len(self._seconds) > SECONDS_KEPT:
                del self._seconds[min(self._seconds)]
            self._changes += 1

    @property
    def changes(self) -> int:
        with self._lock:
            return self._changes

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            by_kind = dict(self._by_kind)
            by_job = {job: dict(c) for job, c in self._by_job.items()}
            first_at = {job: dict(t) for job, t in self._first_at.items()}
            last_at = {job: dict(t) for job, t in self._last_at.items()}
            seconds, peak = dict(self._seconds), self._peak
        return {
            "total": sum(by_kind.values()),
            "by_source": _by_source(by_kind),
            "requests": _flat(by_kind),
            "peak_qps": peak,
            "per_second": {str(s): n for s, n in sorted(seconds.items())},
            "jobs": {
                job: {
                    "total": sum(c.values()),
                    "by_source": _by_source(c),
                    "requests": _flat(c),
                    "first_at": _flat(first_at.get(job, {})),
                    "last_at": _flat(last_at.get(job, {})),
                }
                for job, c in sorted(by_job.items())
            },
        }

    def summary(self) -> str:
        snap = self.snapshot()
        top = sorted(snap["requests"].items(), key=lambda kv: -kv[1])[:8]
        return f"API requests: {snap['total']} ({', '.join(f'{k}: {v}' for k, v in top)})"

    def write(self, path: Path) -> None:
        """Writes the snapshot atomically (a reader never sees half a file)."""
        write_atomically(path, json.dumps(self.snapshot(), indent=1, sort_keys=True) + "\n")


def _by_source(counts: dict[tuple[str, str], int]) -> dict[str, int]:
    out: Counter[str] = Counter()
    for (source, _), n in counts.items():
        out[source] += n
    return dict(out)


def _flat(values: Mapping[tuple[str, str], V]) -> dict[str, V]:
    return {f"{source} {kind}": v for (source, kind), v in sorted(values.items())}
