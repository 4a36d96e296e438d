"""The replicas of a TrainingJob and their command lines: pure planning shared by every runner.

Callers: the local runner (replicas become processes) and the operator (replicas become pods). The
same function renders a job's settings into ``elasticps ps`` / ``elasticps worker`` arguments, so a
process and a pod of one job run with the same flags.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from enum import Enum

from elasticps.api.flags import data_args, decentralized_args, prediction_args, training_args
from elasticps.api.spec import Framework, RestartPolicy, Strategy, TrainingJob

PS_PORT = 2222


class Role(str, Enum):
    PS = "ps"
    WORKER = "worker"
    COORDINATOR = "coordinator"  # a decentralized job's (under the PS strategy PS 0 coordinates)


def holds_job_key(job: TrainingJob, role: Role) -> bool:
    """Whether the role's processes serve the job's calls and so check callers with the job's key
    (``identity.py``): PS and coordinator, and a decentralized job's workers (their peer service).
    Every other member holds only its own token."""
    return role is not Role.WORKER or not job.uses_ps


@dataclass(frozen=True)
class Replica:
    role: Role
    index: int
    name: str
    args: tuple[str, ...]  # arguments of the `elasticps` command
    restart_policy: RestartPolicy


def replica_name(job: TrainingJob, role: Role, index: int) -> str:
    return f"{job.name}-{role.value}-{index}"


def parse_replica_name(job_name: str, name: str) -> tuple[Role, int] | None:
    """The role and index of replica ``name`` of job ``job_name`` (the inverse of
    :func:`replica_name`), or None when ``name`` is not one of its replicas."""
    for role in Role:
        prefix = f"{job_name}-{role.value}-"
        digits = name[len(prefix):]
        if name.startswith(prefix) and digits.isascii() and digits.isdigit() and str(int(digits)) == digits:
            return role, int(digits)
    return None


def cluster_ps_addresses(job: TrainingJob) -> list[str]:
    """Stable DNS names of the PS Services in a cluster (they survive PS restarts)."""
    return [
        f"{replica_name(job, Role.PS, i)}.{job.namespace}.svc:{PS_PORT}" for i in range(job.spec.ps.replicas)
    ]


def _output_args(job: TrainingJob, worker: bool) -> list[str]:
    """``spec.output`` for PS 0 (its coordinator hands out the exports and reports where they went)
    and the workers (one of them writes each export, with the job's name in ``job.json``)."""
    if not job.spec.output:
        return []
    return [f"--output={job.spec.output}", *([f"--job_name={job.name}"] if worker else [])]


def _training_args(job: TrainingJob, checkpoint_dir: str) -> list[str]:
    training = job.spec.training
    if checkpoint_dir and not training.checkpoint_dir:
        training = replace(training, checkpoint_dir=checkpoint_dir)
    return training_args(training)


def ps_replica(
    job: TrainingJob,
    index: int,
    *,
    host: str,
    port: int,
    ps_addresses: Sequence[str] = (),
    checkpoint_dir: str = "",
    extra: Sequence[str] = (),
) -> Replica:
    """PS ``index``'s command. PS 0 coordinates sync rounds on every shard, so with more than one PS it
    needs ``ps_addresses`` (all of them, in order); no PS is told the number of workers: the
    coordinator counts the live ones."""
    args = [
        "ps",
        f"--ps_id={index}",
        f"--num_ps={job.spec.ps.replicas}",
        *([f"--ps_addrs={','.join(ps_addresses)}"] if index == 0 and len(ps_addresses) > 1 else []),
        f"--host={host}",
        f"--port={port}",
        *data_args(job.spec.data),
        *_training_args(job, checkpoint_dir),
        *(_output_args(job, worker=False) if index == 0 else []),
        *(prediction_args(job.spec.prediction) if index == 0 else []),
        *extra,
    ]
    return Replica(Role.PS, index, replica_name(job, Role.PS, index), tuple(args), job.spec.ps.restart_policy)


def worker_replica(job: TrainingJob, index: int, ps_addresses: Sequence[str], extra: Sequence[str] = ()) -> Replica:
    args = [
        "worker",
        f"--worker_id={index}",
        *([f"--ps_addrs={','.join(ps_addresses)}"] if ps_addresses else []),
        f"--model_def={job.spec.model.model_def}",
        *([f"--framework={job.spec.model.framework.value}"] if job.spec.model.framework is not Framework.KERAS else []),
        *([f"--model_params={json.dumps(job.spec.model.params, sort_keys=True)}"] if job.spec.model.params else []),
        *data_args(job.spec.data),
        *_training_args(job, ""),
        *_output_args(job, worker=True),
        *prediction_args(job.spec.prediction),
        *extra,
    ]
    return Replica(
        Role.WORKER, index, replica_name(job, Role.WORKER, index), tuple(args), job.spec.worker.restart_policy
    )


def coordinator_replica(
    job: TrainingJob, *, host: str, port: int, checkpoint_dir: str = "", extra: Sequence[str] = ()
) -> Replica:
    """A decentralized job's coordinator (``elasticps coordinator``): it opens the data to cut tasks
    and hands out the exports and predictions, as PS 0 does for a PS job."""
    args = [
        "coordinator",
        f"--host={host}",
        f"--port={port}",
        *data_args(job.spec.data),
        *_training_args(job, checkpoint_dir),
        *_output_args(job, worker=False),
        *prediction_args(job.spec.prediction),
        *extra,
    ]
    return Replica(Role.COORDINATOR, 0, replica_name(job, Role.COORDINATOR, 0), tuple(args), RestartPolicy.ALWAYS)


def peer_worker_replica(
    job: TrainingJob, index: int, coordinator: str, peers: Sequence[str], extra: Sequence[str] = ()
) -> Replica:
    """Worker ``index`` of a decentralized job: its coordinator, every worker's Peer address (in
    worker order; its own is where it listens) and the job's graph and rules."""
    if job.spec.strategy is not Strategy.DECENTRALIZED:
        raise ValueError(f"job {job.name} is not decentralized")
    return worker_replica(job, index, (), extra=[
        "--strategy=decentralized",
        f"--coordinator_addr={coordinator}",
        f"--peer_addrs={','.join(peers)}",
        *decentralized_args(job.spec.decentralized),
        *extra,
    ])


# A replica's exit code for a mistake in what it was given (a model module that cannot be imported,
# data that is not there, an output it cannot write, a model the mode cannot train; argparse's too):
# the same input fails the same way, so no policy replaces it (``elasticps/exits.py`` says it).
USER_ERROR = 2


def should_restart(policy: RestartPolicy, exit_code: int) -> bool:
    """Whether a replica that exited with ``exit_code`` is started again (Kubeflow's rules, and
    :data:`USER_ERROR` permanent under every policy).

    ExitCode: 1-127 are permanent errors (the program said no), 128 and above are signals
    (kill -9 is 137, an OOM kill too) and are retried. A clean exit (0) is never restarted except
    under Always.
    """
    if exit_code == USER_ERROR:
        return False
    if policy is RestartPolicy.ALWAYS:
        return True
    if exit_code == 0 or policy is RestartPolicy.NEVER:
        return False
    if policy is RestartPolicy.ON_FAILURE:
        return True
    return exit_code >= 128 or exit_code < 0
