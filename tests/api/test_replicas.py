"""Restart rules per policy and exit code (Kubeflow's), and the replicas' names and addresses."""

from __future__ import annotations

import pytest

from elasticps.api.parsing import parse_job
from job_builders import make_job

from elasticps.api.replicas import Role, cluster_ps_addresses, parse_replica_name, replica_name, should_restart
from elasticps.api.spec import RestartPolicy

CODES = (0, 1, 2, 127, 128, 137, -9)

# policy -> restart? for each of CODES
TABLE = {
    # 2: the replica's word for a user's mistake (USER_ERROR), the same again on any restart
    RestartPolicy.ALWAYS: (True, True, False, True, True, True, True),
    RestartPolicy.ON_FAILURE: (False, True, False, True, True, True, True),
    RestartPolicy.NEVER: (False, False, False, False, False, False, False),
    # 1-127: the program's own error (permanent); 128+: killed by a signal (137 = kill -9, OOM); a
    # negative code is how Python reports a signal death: retried too.
    RestartPolicy.EXIT_CODE: (False, False, False, False, True, True, True),
}


def test_table_covers_every_policy() -> None:
    assert set(TABLE) == set(RestartPolicy)


@pytest.mark.parametrize("policy", list(TABLE), ids=lambda p: p.value)
@pytest.mark.parametrize("code", CODES)
def test_should_restart(policy: RestartPolicy, code: int) -> None:
    assert should_restart(policy, code) is TABLE[policy][CODES.index(code)]


def test_names_and_cluster_addresses() -> None:
    job = parse_job(
        {
            "apiVersion": "elasticps.io/v1alpha1",
            "kind": "TrainingJob",
            "metadata": {"name": "mnist", "namespace": "team"},
            "spec": {"model": {"modelDef": "m"}, "data": {"training": "t"}, "ps": {"replicas": 2}},
        }
    )
    assert replica_name(job, Role.WORKER, 3) == "mnist-worker-3"
    assert cluster_ps_addresses(job) == ["mnist-ps-0.team.svc:2222", "mnist-ps-1.team.svc:2222"]


@pytest.mark.parametrize(
    "name, expected",
    [
        ("mnist-ps-0", (Role.PS, 0)),
        ("mnist-worker-12", (Role.WORKER, 12)),
        ("mnist-worker-", None),
        ("mnist-worker-01", None),  # not a name replica_name makes
        ("mnist-worker-x", None),
        ("mnist-chief-0", None),
        ("other-ps-0", None),
        ("mnist-ps-٣", None),  # a non-ASCII digit
    ],
)
def test_parse_replica_name(name: str, expected: tuple[Role, int] | None) -> None:
    assert parse_replica_name("mnist", name) == expected


@pytest.mark.parametrize("role, index", [(Role.PS, 0), (Role.WORKER, 7)])
def test_parse_replica_name_inverts_replica_name(role: Role, index: int) -> None:
    job = make_job(name="mnist")
    assert parse_replica_name("mnist", replica_name(job, role, index)) == (role, index)
