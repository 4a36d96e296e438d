"""Each job's identity Secret (``J-identity``): created with a fresh key before the job's first pod,
a member's token added before that member's pod, its keys rotated (``rotation.py``), and the
operator's own observer token for its status probe.

Callers: ``reconciling``, once per pass that creates pods (:meth:`JobIdentities.ensure`, before the
pods are created: a pod whose token is not in the Secret yet would not start) and before each
probe of PS 0 (:meth:`JobIdentities.observer`), and on every pass of an unfinished job
(:meth:`JobIdentities.rotate`). The Secret is owned by the job (garbage-collected
with it). One left by an earlier job of the same name (another uid, not collected yet) is taken
over: new key, new owner. Keys are kept in memory per job uid, so a pass whose members are all in
the Secret already makes no request.
"""

from __future__ import annotations

import base64
import binascii
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from elasticps import identity
from elasticps.api.spec import TrainingJob
from elasticps.operator import rotation
from elasticps.operator.cluster_api import ClusterApi
from elasticps.operator.manifests import (
    IDENTITY_ACCEPTED, IDENTITY_HONORED, IDENTITY_KEY, IDENTITY_PHASE, IDENTITY_SINCE, IDENTITY_VOLUME,
    identity_secret_annotations, identity_secret_data, identity_secret_manifest, identity_secret_name, owner_reference,
)  # fmt: skip

log = logging.getLogger(__name__)

OBSERVER = identity.member_name(identity.OBSERVER, "operator")


@dataclass
class _Known:
    keys: rotation.KeyState
    members: set[str] = field(default_factory=set)


class JobIdentities:
    def __init__(self, api: ClusterApi, clock: Callable[[], float] = time.time,
                 policy: rotation.Policy = rotation.Policy()) -> None:  # fmt: skip
        self._api = api
        self._clock = clock
        self.policy = policy
        self._lock = threading.Lock()
        self._known: dict[str, _Known] = {}  # job uid -> its keys and the members its Secret holds

    def ensure(self, job: TrainingJob, uid: str, members: Iterable[str]) -> None:
        """The job's Secret holds its keys and the tokens of ``members`` once this returns (ApiError
        when the API server would not say or take it: the pass retries)."""
        wanted = set(members)
        with self._lock:
            known = self._known.get(uid)
        if known is not None and wanted <= known.members:
            return
        name = identity_secret_name(job)
        secret = self._api.get_secret(job.namespace, name)
        if secret is None:
            keys = rotation.fresh(identity.new_key(), self._clock())
            if self._api.create(job.namespace, "secrets", identity_secret_manifest(job, uid, keys, wanted)):
                log.info("%s/%s: created Secret %s (the job's identity)", job.namespace, job.name, name)
                self._remember(uid, keys, wanted)
                return
            secret = self._api.get_secret(job.namespace, name)  # created meanwhile (another pass)
            if secret is None:
                raise identity.IdentityError(f"Secret {name} was created and is gone again")
        found, held = _read(secret)
        if found is None or not _owned_by(secret, uid):
            keys, held = rotation.fresh(identity.new_key(), self._clock()), set()
            patch: dict[str, Any] = {
                "metadata": {"ownerReferences": [owner_reference(job, uid)], "annotations": identity_secret_annotations(keys)},
                "data": identity_secret_data(keys, wanted),
            }
            log.info("%s/%s: took over Secret %s with a new key", job.namespace, job.name, name)
        else:
            keys = found
            patch = {"data": identity_secret_data(keys, wanted - held)} if wanted - held or not _complete(secret) else {}
        if patch:
            self._api.patch_secret(job.namespace, name, patch)
        self._remember(uid, keys, held | wanted)

    def rotate(self, job: TrainingJob, uid: str, requested: str, pods: Iterable[dict[str, Any]]) -> str | None:
        """Takes the rotation step due now (``rotation.step``) on the job's Secret: the Event's
        message of the step taken, or None. ``requested``: the job's rotate-identity annotation;
        ``pods``: the job's pods as listed (a rotation waits while one reads no identity file)."""
        known = self._state(job, uid)
        if known is None:
            return None
        listed = list(pods)
        ready = all(_mounts_identity(pod) for pod in listed)
        after = rotation.step(known.keys, self._clock(), requested, self.policy, identity.new_key(), ready)
        if after is None:
            if not ready and requested and requested != known.keys.honored:
                log.info("%s/%s: key rotation waits: a pod reads its token from the environment", job.namespace, job.name)
            return None
        patch = {
            "metadata": {"annotations": identity_secret_annotations(after)},
            "data": identity_secret_data(after, known.members if after.signing != known.keys.signing else ()),
        }
        self._api.patch_secret(job.namespace, identity_secret_name(job), patch)
        self._remember(uid, after, known.members)
        message = rotation.describe(after, self.policy.grace_s)
        log.info("%s/%s: %s", job.namespace, job.name, message)
        return message

    def observer(self, job: TrainingJob, uid: str) -> str:
        """The operator's token in the job ("" while the job has no Secret: its pods take any caller)."""
        known = self._state(job, uid)
        return "" if known is None else identity.token_for(known.keys.signing, OBSERVER)

    def forget(self, uid: str) -> None:
        with self._lock:
            self._known.pop(uid, None)

    def _state(self, job: TrainingJob, uid: str) -> _Known | None:
        """What the job's Secret holds: remembered, or read once (the operator is its only writer)."""
        with self._lock:
            known = self._known.get(uid)
        if known is not None:
            return known
        secret = self._api.get_secret(job.namespace, identity_secret_name(job))
        keys, held = _read(secret) if secret is not None and _owned_by(secret, uid) else (None, set())
        return None if keys is None else self._remember(uid, keys, held)

    def _remember(self, uid: str, keys: rotation.KeyState, members: set[str]) -> _Known:
        with self._lock:
            known = self._known[uid] = _Known(keys, set(members))
            return known


def _read(secret: dict[str, Any]) -> tuple[rotation.KeyState | None, set[str]]:
    """The keys a Secret holds (None: none, or not keys) and the members it holds tokens of. A
    Secret without ``accepted`` (an earlier operator's) accepts its one key."""
    data = secret.get("data")
    if not isinstance(data, dict):
        return None, set()
    notes = secret.get("metadata", {}).get("annotations") or {}
    try:
        signing = identity.parse_key(_decoded(data.get(IDENTITY_KEY)))
        accepted_text = _decoded(data.get(IDENTITY_ACCEPTED))
        accepted = identity.parse_keys(accepted_text) if accepted_text else (signing,)
        since = float(notes.get(IDENTITY_SINCE) or 0.0)
    except (identity.IdentityError, binascii.Error, UnicodeDecodeError, ValueError):
        return None, set()
    phase = str(notes.get(IDENTITY_PHASE) or rotation.STABLE)
    if signing not in accepted or phase not in rotation.PHASES:
        return None, set()
    keys = rotation.KeyState(signing, accepted, phase, since, str(notes.get(IDENTITY_HONORED) or ""))
    return keys, {str(name) for name in data if name not in (IDENTITY_KEY, IDENTITY_ACCEPTED)}


def _decoded(value: object) -> str:
    return base64.b64decode(str(value or "")).decode()


def _complete(secret: dict[str, Any]) -> bool:
    """Whether the Secret has every entry this operator's pods mount (an earlier one's lacks ``accepted``)."""
    return IDENTITY_ACCEPTED in (secret.get("data") or {})


def _mounts_identity(pod: dict[str, Any]) -> bool:
    volumes = (pod.get("spec") or {}).get("volumes") or []
    return any(isinstance(v, dict) and v.get("name") == IDENTITY_VOLUME for v in volumes)


def _owned_by(secret: dict[str, Any], uid: str) -> bool:
    owners = secret.get("metadata", {}).get("ownerReferences") or []
    return any(isinstance(o, dict) and o.get("uid") == uid for o in owners)
