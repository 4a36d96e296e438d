"""Each job's identity Secret (``J-identity``): created with a fresh key before the job's first pod,
a member's token added before that member's pod, and the operator's own observer token for its
status probe.

Callers: ``reconciling``, once per pass that creates pods (:meth:`JobIdentities.ensure`, before the
pods are created: a pod whose token is not in the Secret yet would not start) and before each
probe of PS 0 (:meth:`JobIdentities.observer`). The Secret is owned by the job (garbage-collected
with it). One left by an earlier job of the same name (another uid, not collected yet) is taken
over: new key, new owner. Keys are kept in memory per job uid, so a pass whose members are all in
the Secret already makes no request.
"""

from __future__ import annotations

import base64
import binascii
import logging
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from elasticps import identity
from elasticps.api.spec import TrainingJob
from elasticps.operator.cluster_api import ClusterApi
from elasticps.operator.manifests import (
    IDENTITY_KEY, identity_secret_data, identity_secret_manifest, identity_secret_name, owner_reference,
)  # fmt: skip

log = logging.getLogger(__name__)

OBSERVER = identity.member_name(identity.OBSERVER, "operator")


@dataclass
class _Known:
    key: bytes
    members: set[str] = field(default_factory=set)


class JobIdentities:
    def __init__(self, api: ClusterApi) -> None:
        self._api = api
        self._lock = threading.Lock()
        self._known: dict[str, _Known] = {}  # job uid -> its key and the members its Secret holds

    def ensure(self, job: TrainingJob, uid: str, members: Iterable[str]) -> None:
        """The job's Secret holds its key and the tokens of ``members`` once this returns (ApiError
        when the API server would not say or take it: the pass retries)."""
        wanted = set(members)
        with self._lock:
            known = self._known.get(uid)
        if known is not None and wanted <= known.members:
            return
        name = identity_secret_name(job)
        secret = self._api.get_secret(job.namespace, name)
        if secret is None:
            key = identity.new_key()
            if self._api.create(job.namespace, "secrets", identity_secret_manifest(job, uid, key, wanted)):
                log.info("%s/%s: created Secret %s (the job's identity)", job.namespace, job.name, name)
                self._remember(uid, key, wanted)
                return
            secret = self._api.get_secret(job.namespace, name)  # created meanwhile (another pass)
            if secret is None:
                raise identity.IdentityError(f"Secret {name} was created and is gone again")
        found, held = _read(secret)
        if found is None or not _owned_by(secret, uid):
            key, held = identity.new_key(), set()
            patch: dict[str, Any] = {
                "metadata": {"ownerReferences": [owner_reference(job, uid)]},
                "data": identity_secret_data(key, wanted),
            }
            log.info("%s/%s: took over Secret %s with a new key", job.namespace, job.name, name)
        else:
            key = found
            patch = {"data": identity_secret_data(key, wanted - held)} if wanted - held else {}
        if patch:
            self._api.patch_secret(job.namespace, name, patch)
        self._remember(uid, key, held | wanted)

    def observer(self, job: TrainingJob, uid: str) -> str:
        """The operator's token in the job ("" while the job has no Secret: its pods take any caller)."""
        with self._lock:
            known = self._known.get(uid)
        if known is None:
            secret = self._api.get_secret(job.namespace, identity_secret_name(job))
            key, held = _read(secret) if secret is not None and _owned_by(secret, uid) else (None, set())
            if key is None:
                return ""
            known = self._remember(uid, key, held)
        return identity.token_for(known.key, OBSERVER)

    def forget(self, uid: str) -> None:
        with self._lock:
            self._known.pop(uid, None)

    def _remember(self, uid: str, key: bytes, members: set[str]) -> _Known:
        with self._lock:
            known = self._known[uid] = _Known(key, set(members))
            return known


def _read(secret: dict[str, Any]) -> tuple[bytes | None, set[str]]:
    """The key a Secret holds (None: none, or not one) and the members it holds tokens of."""
    data = secret.get("data")
    if not isinstance(data, dict):
        return None, set()
    try:
        key = identity.parse_key(base64.b64decode(str(data.get(IDENTITY_KEY, ""))).decode())
    except (identity.IdentityError, binascii.Error, UnicodeDecodeError):
        return None, set()
    return key, {str(name) for name in data if name != IDENTITY_KEY}


def _owned_by(secret: dict[str, Any], uid: str) -> bool:
    owners = secret.get("metadata", {}).get("ownerReferences") or []
    return any(isinstance(o, dict) and o.get("uid") == uid for o in owners)
