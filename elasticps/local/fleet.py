"""The job's replicas on this machine: one slot per replica the planner created, a process in each.

Callers: the local runner's ``executing`` (create and delete replicas, as the planner asks) and
``runner`` (``tick`` each pass, ``observe`` for the planner, ``stop_all`` at exit). This is where
replicas become command lines (``elasticps.api.replicas`` renders the arguments) and where a
process is read back as the planner's ``ObservedPod``:

- a slot whose process cannot start yet is Pending: a worker waits until every PS has reported the
  port it bound (through ``--port_file``), since its ``--ps_addrs`` must name them; so does PS 0 of
  a job with several shards, until PS 1..N-1 have reported theirs (it coordinates every shard and
  refuses to start without all their addresses);
- a live process is Running (a PS is ready once its port is known); exit 0 is Succeeded, any
  other exit Failed with that exit code (negative for a signal: ``kill -9`` is -9);
- a deleted slot gets SIGTERM and reads as ``deleted`` until its process is gone (SIGKILL after
  ``grace_s``); then the slot goes, and the planner may create the replica again.

Each run makes its own job key (``identity.py``): a replica's process gets its token, and the PS,
the coordinator and a decentralized job's workers the key, in their environment; a process on this
machine that is not one of the run's is refused by every one of them. The run's folder holds a token
that may read the job's status and model (``observer.token``, its owner's only), for tools and tests
that watch the run.

A PS keeps its port for the whole run: the first start binds port 0 and reports it, every later
start (a replacement, a resume after suspend) binds that port again, so the workers' addresses
stay valid. Each start gets a fresh uid, so the planner tells a replacement from the old one.

The workers share this machine's CPUs: each gets ``--num_threads`` of :func:`worker_threads` (its
share of the CPUs, at least 1), since TensorFlow would otherwise size every worker's thread pools to
the whole machine and the workers' threads would contend for the same cores.

PS 0's ``--ps_addrs`` lists every shard in order, its own at index 0. PS 0 never dials its own
entry (its shard is in the same process), and on its first start its port is not known before it
binds: that entry is then ``127.0.0.1:0``, a placeholder; every later start names the real port.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from elasticps import identity
from elasticps.api.replicas import (
    Replica, Role, coordinator_replica, holds_job_key, peer_worker_replica, ps_replica, worker_replica,
)
from elasticps.api.spec import TrainingJob
from elasticps.local import processes
from elasticps.local.ports import HOST, free_ports
from elasticps.local.processes import Process
from elasticps.planning.observed import ObservedPod, PodPhase
from elasticps.planning.roles import coordinating, desired

STOP_GRACE_S = 5.0
OBSERVER_TOKEN = "observer.token"  # in the run's folder: a token that may read the job's status and model
OBSERVER = identity.member_name(identity.OBSERVER, "local")


def worker_threads(cpus: int, workers: int) -> int:
    """TensorFlow threads for each of ``workers`` workers sharing ``cpus`` CPUs: an equal share, at least 1."""
    return max(1, cpus // max(1, workers))


@dataclass
class Slot:
    """One replica the planner created: its process once started (None while it waits)."""

    name: str
    role: Role
    index: int
    uid: str
    process: Process | None = None
    stopping_since: float | None = None  # monotonic time of the SIGTERM
    exited_at: float | None = None  # monotonic time its exit was first seen


@dataclass
class Fleet:
    run_dir: Path
    grace_s: float = STOP_GRACE_S
    slots: dict[str, Slot] = field(default_factory=dict)
    ports: dict[int, int] = field(default_factory=dict)  # PS index -> the port it bound
    coordinator_port: int | None = None  # a decentralized job's coordinator: the port it bound
    peer_ports: dict[int, int] = field(default_factory=dict)  # decentralized: worker -> its Peer port
    starts: dict[str, int] = field(default_factory=dict)  # replica name -> processes started so far
    key: bytes = field(default_factory=identity.new_key)  # the run's job key (identity.py)

    def __post_init__(self) -> None:
        """Writes the run's observer token (:data:`OBSERVER_TOKEN`), readable by its owner only."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        path = self.run_dir / OBSERVER_TOKEN
        path.unlink(missing_ok=True)
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w") as file:
            file.write(self.observer() + "\n")

    def observer(self) -> str:
        """A token of the run that may read the job's status and model (the runner's, tools')."""
        return identity.token_for(self.key, OBSERVER)

    # ---- what the planner asks ---------------------------------------------------------------
    def create(self, job: TrainingJob, name: str, role: Role, index: int) -> None:
        """A slot for the replica, started at once when it can be (idempotent)."""
        if name in self.slots:
            return
        count = self.starts.get(name, 0)
        self.slots[name] = Slot(name, role, index, uid=f"{name}#{count}")
        self._start_waiting(job)

    def delete(self, name: str) -> None:
        """SIGTERM to the replica's process; a slot with no live process goes at once (idempotent)."""
        slot = self.slots.get(name)
        if slot is None or slot.stopping_since is not None:
            return
        if slot.process is None or slot.process.exit_code is not None:
            del self.slots[name]
            return
        slot.stopping_since = time.monotonic()
        processes.terminate(slot.process)

    # ---- each pass -----------------------------------------------------------------------------
    def tick(self, job: TrainingJob) -> None:
        """Reads the ports PS replicas reported, reaps stopped processes (SIGKILL past the grace
        time), notes exits, and starts the slots that were waiting."""
        now = time.monotonic()
        for slot in list(self.slots.values()):
            process = slot.process
            if process is None:
                continue
            if slot.role is Role.PS and slot.index not in self.ports:
                self._read_port(slot.index)
            if slot.role is Role.COORDINATOR and self.coordinator_port is None:
                self.coordinator_port = _port_in(self._coordinator_port_file())
            if process.exit_code is not None and slot.exited_at is None:
                slot.exited_at = now
            if slot.stopping_since is None:
                continue
            if process.exit_code is not None:
                del self.slots[slot.name]
            elif now - slot.stopping_since >= self.grace_s:
                processes.kill(process)
        self._start_waiting(job)

    def observe(self) -> tuple[ObservedPod, ...]:
        return tuple(self._observe(slot) for slot in self.slots.values())

    def coordinator_address(self, job: TrainingJob) -> str | None:
        """Where the job's coordinator answers (PS 0's, or a decentralized job's own), once it is
        running and has reported its port."""
        role = coordinating(job)
        slot = next((s for s in self.slots.values() if s.role is role and s.index == 0), None)
        port = self.ports.get(0) if role is Role.PS else self.coordinator_port
        if slot is None or slot.process is None or slot.process.exit_code is not None or port is None:
            return None
        return f"{HOST}:{port}"

    def last_failure(self) -> Slot | None:
        """The replica whose process most recently exited with a non-zero code (not one we stopped)."""
        failed = [
            s for s in self.slots.values()
            if s.process is not None and s.stopping_since is None and s.process.exit_code not in (None, 0)
        ]
        return max(failed, key=lambda s: s.exited_at or 0.0, default=None)

    def stop_all(self) -> None:
        processes.stop_all([s.process for s in self.slots.values() if s.process is not None], self.grace_s)

    # ---- internals -----------------------------------------------------------------------------
    def _observe(self, slot: Slot) -> ObservedPod:
        process = slot.process
        deleted = slot.stopping_since is not None
        if process is None:
            return ObservedPod(slot.name, slot.role, slot.index, PodPhase.PENDING, uid=slot.uid, deleted=deleted)
        code = process.exit_code
        if code is None:
            ready = (slot.role is Role.WORKER or (slot.role is Role.PS and slot.index in self.ports)
                     or (slot.role is Role.COORDINATOR and self.coordinator_port is not None))
            return ObservedPod(slot.name, slot.role, slot.index, PodPhase.RUNNING, ready=ready, uid=slot.uid, deleted=deleted)
        if code == 0:
            return ObservedPod(slot.name, slot.role, slot.index, PodPhase.SUCCEEDED, exit_code=code, uid=slot.uid,
                               deleted=deleted)
        return ObservedPod(slot.name, slot.role, slot.index, PodPhase.FAILED, exit_code=code, uid=slot.uid,
                           deleted=deleted, message=processes.termination_message(process))

    def _start_waiting(self, job: TrainingJob) -> None:
        # PS (or the coordinator) first: a worker created in the same pass may then find every address known.
        for slot in sorted(self.slots.values(), key=lambda s: (s.role is Role.WORKER, s.index)):
            if slot.process is None and slot.stopping_since is None:
                replica = self._replica(job, slot)
                if replica is not None:
                    count = self.starts.get(slot.name, 0)
                    member = identity.member_name(slot.role.value, slot.index)
                    env = identity.member_env(self.key, member, serves=holds_job_key(job, slot.role))
                    slot.process = processes.start(replica, self.run_dir, restarts=count, env=env)
                    slot.uid = f"{slot.name}#{count}"
                    self.starts[slot.name] = count + 1

    def _replica(self, job: TrainingJob, slot: Slot) -> Replica | None:
        """The command line of the slot's replica, or None while a worker's PS addresses are unknown."""
        if slot.role is Role.PS:
            return self._ps_replica(job, slot.index)
        if slot.role is Role.COORDINATOR:
            return self._coordinator_replica(job)
        if not job.uses_ps:
            return self._peer_worker_replica(job, slot.index)
        wanted = range(desired(job, Role.PS))
        if any(i not in self.ports for i in wanted):
            return None
        threads = worker_threads(len(os.sched_getaffinity(0)), desired(job, Role.WORKER))
        return worker_replica(
            job, slot.index, [f"{HOST}:{self.ports[i]}" for i in wanted], extra=[f"--num_threads={threads}"]
        )

    def _ps_replica(self, job: TrainingJob, index: int) -> Replica | None:
        """PS ``index``'s command line, or None while PS 0 waits for the other shards' ports."""
        addresses: list[str] = []
        if index == 0:
            others = range(1, desired(job, Role.PS))
            if any(i not in self.ports for i in others):
                return None
            addresses = [f"{HOST}:{self.ports.get(i, 0)}" for i in range(desired(job, Role.PS))]
        checkpoints = str(self.run_dir / "checkpoints")
        port = self.ports.get(index)
        if port is not None:
            return ps_replica(job, index, host=HOST, port=port, ps_addresses=addresses, checkpoint_dir=checkpoints)
        port_file = self._port_file(index)
        port_file.unlink(missing_ok=True)
        return ps_replica(
            job, index, host=HOST, port=0, ps_addresses=addresses, checkpoint_dir=checkpoints,
            extra=[f"--port_file={port_file}"],
        )

    def _coordinator_replica(self, job: TrainingJob) -> Replica:
        checkpoints = str(self.run_dir / "checkpoints")
        if self.coordinator_port is not None:  # restarted: the workers know this port
            return coordinator_replica(job, host=HOST, port=self.coordinator_port, checkpoint_dir=checkpoints)
        port_file = self._coordinator_port_file()
        port_file.unlink(missing_ok=True)
        return coordinator_replica(job, host=HOST, port=0, checkpoint_dir=checkpoints, extra=[f"--port_file={port_file}"])

    def _peer_worker_replica(self, job: TrainingJob, index: int) -> Replica | None:
        """A decentralized worker, once the coordinator's port is known. Every worker must know every
        other's Peer address before it starts, so the ports are chosen here, all at once, and kept for
        the run (a restarted worker listens where its neighbours look for it)."""
        if self.coordinator_port is None:
            return None
        workers = desired(job, Role.WORKER)
        if any(i not in self.peer_ports for i in range(workers)):
            self.peer_ports.update(zip((i for i in range(workers) if i not in self.peer_ports), free_ports(workers)))
        threads = worker_threads(len(os.sched_getaffinity(0)), workers)
        peers = [f"{HOST}:{self.peer_ports[i]}" for i in range(workers)]
        return peer_worker_replica(job, index, f"{HOST}:{self.coordinator_port}", peers, extra=[f"--num_threads={threads}"])

    def _coordinator_port_file(self) -> Path:
        return self.run_dir / "coordinator.port"

    def _port_file(self, index: int) -> Path:
        return self.run_dir / f"ps-{index}.port"

    def _read_port(self, index: int) -> None:
        port = _port_in(self._port_file(index))
        if port is not None:
            self.ports[index] = port


def observer_token(run_dir: Path) -> str:
    """The token a run wrote for its observers (a tool or a test watching the job; "" before it did)."""
    try:
        return (run_dir / OBSERVER_TOKEN).read_text().strip()
    except FileNotFoundError:
        return ""


def _port_in(path: Path) -> int | None:
    """The port a replica wrote to its ``--port_file``, or None before it did."""
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None
