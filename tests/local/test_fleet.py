"""The local runner's replicas as processes and back as the planner's observations, with the
processes played by fakes (the real ones run in tests/e2e): phases, exit codes, stops, PS ports,
PS 0 and the workers waiting for the PS ports they need, and the executor carrying out the planner's actions."""

from __future__ import annotations

import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import job_builders

from elasticps import identity
from elasticps.api.replicas import Replica, Role
from elasticps.api.spec import TrainingJob
from elasticps.local import fleet as fleet_module
from elasticps.local.executing import execute
from elasticps.local.fleet import Fleet, observer_token
from elasticps.local.processes import Process
from elasticps.planning.actions import (
    CreateIngressPolicy,
    CreateReplica,
    CreateReplicaService,
    DeleteJob,
    DeleteReplica,
    Event,
    Recheck,
    SetStatus,
)
from elasticps.planning.observed import PodPhase


@dataclass
class FakePopen:
    pid: int
    code: int | None = None
    signals: list[str] = field(default_factory=list)

    def poll(self) -> int | None:
        return self.code


class Launcher:
    """Stands in for ``processes``: records what was started and signalled."""

    def __init__(self) -> None:
        self.started: list[Replica] = []
        self.popens: dict[str, FakePopen] = {}
        self.envs: dict[str, Mapping[str, str]] = {}

    def start(self, replica: Replica, log_dir: Path, restarts: int = 0, env: Mapping[str, str] | None = None) -> Process:
        self.started.append(replica)
        self.envs[replica.name] = dict(env or {})
        popen = FakePopen(pid=1000 + len(self.started))
        self.popens[replica.name] = popen
        log, termination = log_dir / f"{replica.name}.log", log_dir / f"{replica.name}.termination"
        return Process(replica, log, popen, termination, restarts)  # type: ignore[arg-type]

    def terminate(self, process: Process) -> None:
        process.popen.signals.append("TERM")  # type: ignore[attr-defined]

    def kill(self, process: Process) -> None:
        process.popen.signals.append("KILL")  # type: ignore[attr-defined]
        process.popen.code = -9  # type: ignore[attr-defined]


@pytest.fixture
def launcher(monkeypatch: pytest.MonkeyPatch) -> Launcher:
    fake = Launcher()
    for name in ("start", "terminate", "kill"):
        monkeypatch.setattr(fleet_module.processes, name, getattr(fake, name))
    return fake


def make_job(ps: int = 1, workers: int = 2) -> TrainingJob:
    return job_builders.make_job({"ps": {"replicas": ps}, "worker": {"replicas": workers}}, name="tj")


def arg(replica: Replica, flag: str) -> str | None:
    return next((a.split("=", 1)[1] for a in replica.args if a.startswith(f"--{flag}=")), None)


def phases(fleet: Fleet) -> dict[str, Any]:
    return {p.name: (p.phase.value, p.exit_code, p.deleted) for p in fleet.observe()}


def serve(fleet: Fleet, job: TrainingJob, index: int, port: int) -> None:
    (fleet.run_dir / f"ps-{index}.port").write_text(f"{port}\n")
    fleet.tick(job)


def test_ps_0_waits_for_the_other_shards_ports_and_workers_for_every_port(tmp_path: Path, launcher: Launcher) -> None:
    job, fleet = make_job(ps=3), Fleet(tmp_path)
    for role, index in ((Role.PS, 0), (Role.PS, 1), (Role.PS, 2), (Role.WORKER, 0)):
        fleet.create(job, f"tj-{role.value}-{index}", role, index)
    assert [r.name for r in launcher.started] == ["tj-ps-1", "tj-ps-2"]
    assert arg(launcher.started[0], "port") == "0" and arg(launcher.started[0], "port_file") == str(tmp_path / "ps-1.port")
    assert arg(launcher.started[0], "ps_addrs") is None  # only PS 0 is told every shard
    assert phases(fleet)["tj-ps-0"] == ("Pending", None, False)
    serve(fleet, job, 1, 4101)
    assert len(launcher.started) == 2 and phases(fleet)["tj-ps-0"] == ("Pending", None, False)
    serve(fleet, job, 2, 4102)
    ps0 = launcher.started[-1]
    assert ps0.name == "tj-ps-0" and arg(ps0, "port") == "0"
    # Its own port is not known before it binds: a placeholder it never dials.
    assert arg(ps0, "ps_addrs") == "127.0.0.1:0,127.0.0.1:4101,127.0.0.1:4102"
    assert phases(fleet)["tj-worker-0"] == ("Pending", None, False)
    serve(fleet, job, 0, 4100)
    worker = launcher.started[-1]
    assert fleet.coordinator_address(job) == "127.0.0.1:4100"
    assert worker.name == "tj-worker-0" and arg(worker, "ps_addrs") == "127.0.0.1:4100,127.0.0.1:4101,127.0.0.1:4102"


def test_each_process_of_a_run_gets_its_own_token_and_only_servers_the_key(tmp_path: Path, launcher: Launcher) -> None:
    job, fleet = make_job(ps=1), Fleet(tmp_path)
    fleet.create(job, "tj-ps-0", Role.PS, 0)
    serve(fleet, job, 0, 4100)
    for index in (0, 1):
        fleet.create(job, f"tj-worker-{index}", Role.WORKER, index)
    verifier = identity.Verifier(fleet.key)
    envs = launcher.envs
    assert {name: verifier.member(env[identity.TOKEN_ENV]) for name, env in envs.items()} == {
        "tj-ps-0": "ps-0", "tj-worker-0": "worker-0", "tj-worker-1": "worker-1"}
    assert identity.parse_key(envs["tj-ps-0"][identity.KEY_ENV]) == fleet.key
    assert identity.KEY_ENV not in envs["tj-worker-0"] and identity.KEY_ENV not in envs["tj-worker-1"]
    assert verifier.member(observer_token(tmp_path)) == "observer-local"
    assert stat.S_IMODE((tmp_path / "observer.token").stat().st_mode) == 0o600
    assert Fleet(tmp_path / "another").key != fleet.key  # a key per run


def test_a_restarted_ps_0_gets_every_real_address(tmp_path: Path, launcher: Launcher) -> None:
    job, fleet = make_job(ps=2), Fleet(tmp_path)
    for index in (0, 1):
        fleet.create(job, f"tj-ps-{index}", Role.PS, index)
    serve(fleet, job, 1, 4101)
    serve(fleet, job, 0, 4100)
    launcher.popens["tj-ps-0"].code = -9
    fleet.tick(job)
    fleet.delete("tj-ps-0")
    fleet.create(job, "tj-ps-0", Role.PS, 0)
    again = launcher.started[-1]
    assert again.name == "tj-ps-0" and arg(again, "port") == "4100" and arg(again, "port_file") is None
    assert arg(again, "ps_addrs") == "127.0.0.1:4100,127.0.0.1:4101"


def test_a_single_ps_starts_at_once_without_addresses(tmp_path: Path, launcher: Launcher) -> None:
    job, fleet = make_job(ps=1), Fleet(tmp_path)
    fleet.create(job, "tj-ps-0", Role.PS, 0)
    [ps0] = launcher.started
    assert arg(ps0, "ps_addrs") is None and arg(ps0, "port") == "0"


def test_processes_read_as_the_planners_phases(tmp_path: Path, launcher: Launcher) -> None:
    job, fleet = make_job(), Fleet(tmp_path)
    fleet.create(job, "tj-ps-0", Role.PS, 0)
    assert [p.ready for p in fleet.observe()] == [False]  # running, port not reported yet
    serve(fleet, job, 0, 4100)
    for index in (0, 1):
        fleet.create(job, f"tj-worker-{index}", Role.WORKER, index)
    launcher.popens["tj-worker-0"].code = 0
    launcher.popens["tj-worker-1"].code = -9  # kill -9
    fleet.tick(job)
    assert phases(fleet) == {"tj-ps-0": ("Running", None, False), "tj-worker-0": ("Succeeded", 0, False),
                             "tj-worker-1": ("Failed", -9, False)}
    assert [p.ready for p in fleet.observe()] == [True, False, False]
    last = fleet.last_failure()
    assert last is not None and last.name == "tj-worker-1"


def test_a_stopped_process_reads_deleted_until_gone_then_killed_past_grace(tmp_path: Path, launcher: Launcher) -> None:
    job, fleet = make_job(), Fleet(tmp_path, grace_s=0.0)
    fleet.create(job, "tj-ps-0", Role.PS, 0)
    fleet.delete("tj-ps-0")
    fleet.delete("tj-ps-0")  # idempotent: one SIGTERM
    assert launcher.popens["tj-ps-0"].signals == ["TERM"]
    assert phases(fleet) == {"tj-ps-0": ("Running", None, True)}
    fleet.tick(job)  # grace over: SIGKILL
    assert launcher.popens["tj-ps-0"].signals == ["TERM", "KILL"]
    fleet.tick(job)
    assert phases(fleet) == {}
    assert fleet.last_failure() is None  # killed by us, not failed


def test_a_replacement_gets_a_fresh_uid_and_a_ps_its_old_port(tmp_path: Path, launcher: Launcher) -> None:
    job, fleet = make_job(), Fleet(tmp_path)
    fleet.create(job, "tj-ps-0", Role.PS, 0)
    serve(fleet, job, 0, 4100)
    [first] = fleet.observe()
    launcher.popens["tj-ps-0"].code = 1
    fleet.tick(job)
    fleet.delete("tj-ps-0")  # exited already: gone at once
    assert phases(fleet) == {}
    fleet.create(job, "tj-ps-0", Role.PS, 0)
    [second] = fleet.observe()
    assert second.uid != first.uid
    assert arg(launcher.started[-1], "port") == "4100" and arg(launcher.started[-1], "port_file") is None


def test_the_executor_starts_stops_and_keeps_the_status(tmp_path: Path, launcher: Launcher) -> None:
    job, fleet = make_job(workers=1), Fleet(tmp_path)
    actions = [
        CreateIngressPolicy("tj-ps"), CreateReplicaService("tj-ps-0", Role.PS, 0),  # skipped by design
        CreateReplica("tj-ps-0", Role.PS, 0), CreateReplica("tj-worker-0", Role.WORKER, 0),
        Event("Created", "TrainingJob default/tj is created."), SetStatus({"phase": "Created", "restarts": 0}),
        DeleteJob(), Recheck(3.0),  # no TTL locally; the runner polls anyway
    ]  # fmt: skip
    status, lines = execute(actions, job, fleet, {"kept": 1})
    assert status == {"kept": 1, "phase": "Created", "restarts": 0}
    assert lines == []  # "created" is what the run's first line says already
    assert set(phases(fleet)) == {"tj-ps-0", "tj-worker-0"}
    status, _ = execute([DeleteReplica("tj-worker-0", "the job is suspended"), SetStatus({"kept": None})], job, fleet, status)
    assert "tj-worker-0" not in phases(fleet)  # never started (no PS port yet): gone at once
    assert status == {"phase": "Created", "restarts": 0}


def test_a_replacement_is_told_as_elasticps_run_always_said_it(tmp_path: Path, launcher: Launcher) -> None:
    job, fleet = make_job(), Fleet(tmp_path)
    fleet.create(job, "tj-ps-0", Role.PS, 0)
    serve(fleet, job, 0, 4100)
    for index in (0, 1):
        fleet.create(job, f"tj-worker-{index}", Role.WORKER, index)
    launcher.popens["tj-worker-0"].code = -9
    launcher.popens["tj-worker-1"].code = 137
    fleet.tick(job)
    before = {"restarts": 1, "replacing": []}
    actions = [
        DeleteReplica("tj-worker-0", "replacing it: exit code -9 (restartPolicy OnFailure)"),
        DeleteReplica("tj-worker-1", "replacing it: exit code 137 (restartPolicy OnFailure)"),
        Event("Restarting", "tj-worker-0 exited (exit code -9): replacing it (restart 2 of at most 3).", "Warning"),
        Event("Restarting", "tj-worker-1 exited (exit code 137): replacing it (restart 3 of at most 3).", "Warning"),
        Event("ScaledDown", "Workers scaled down to 2: deleting tj-worker-2."),
        SetStatus({"restarts": 3, "replacing": [{"name": "tj-worker-0"}, {"name": "tj-worker-1"}]}),
    ]
    _, lines = execute(actions, job, fleet, before)
    assert lines == [
        "tj-worker-0 exited with code -9: replacing it (replacement 2 of at most 3)",
        "tj-worker-1 exited with code 137: replacing it (replacement 3 of at most 3)",
        "Workers scaled down to 2: deleting tj-worker-2.",
    ]
    assert phases(fleet) == {"tj-ps-0": ("Running", None, False)}  # exited: gone at once, to be created again


@pytest.mark.parametrize(("cpus", "workers", "threads"), [(2, 2, 1), (2, 1, 2), (16, 4, 4), (2, 8, 1), (7, 2, 3), (4, 0, 4)])
def test_each_local_worker_gets_its_share_of_the_cpus(cpus: int, workers: int, threads: int) -> None:
    assert fleet_module.worker_threads(cpus, workers) == threads


def test_workers_are_started_with_their_share_of_the_cpus(
    tmp_path: Path, launcher: Launcher, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fleet_module.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 4, 5})
    job, fleet = make_job(ps=1, workers=3), Fleet(tmp_path)
    fleet.create(job, "tj-ps-0", Role.PS, 0)
    serve(fleet, job, 0, 4100)
    fleet.create(job, "tj-worker-0", Role.WORKER, 0)
    [ps0, worker] = launcher.started
    assert arg(ps0, "num_threads") is None  # the PS runs no TensorFlow
    assert arg(worker, "num_threads") == "2"


def test_a_failed_replica_is_observed_with_its_own_line(tmp_path: Path, launcher: Launcher) -> None:
    """The reason a replica wrote before exiting (exits.user_error) is the observed pod's message;
    without one, its log's last line."""
    job, fleet = make_job(workers=2), Fleet(tmp_path)
    fleet.create(job, "tj-ps-0", Role.PS, 0)
    for index in (0, 1):
        fleet.create(job, f"tj-worker-{index}", Role.WORKER, index)
    serve(fleet, job, 0, 4100)  # the workers start once the PS's port is known
    (tmp_path / "tj-worker-0.termination").write_text("worker-0: error: model module 'x.y' cannot be imported\n")
    (tmp_path / "tj-worker-1.log").write_text("--- start 0\nusage: elasticps worker\nelasticps worker: error: bad flag\n\n")
    launcher.popens["tj-worker-0"].code = 2
    launcher.popens["tj-worker-1"].code = 2
    fleet.tick(job)
    observed = {p.name: (p.phase, p.exit_code, p.message) for p in fleet.observe() if p.role is Role.WORKER}
    assert observed == {
        "tj-worker-0": (PodPhase.FAILED, 2, "worker-0: error: model module 'x.y' cannot be imported"),
        "tj-worker-1": (PodPhase.FAILED, 2, "elasticps worker: error: bad flag"),
    }


def test_warnings_are_said_as_such_and_the_failure_that_ends_the_run_is_left_to_its_last_line(
    tmp_path: Path, launcher: Launcher
) -> None:
    job, fleet = make_job(), Fleet(tmp_path)
    actions = [
        Event("Diverged", "the training loss was not finite in a task after 400 records", "Warning"),
        Event("UserError", "worker-0: error: model module 'm' cannot be imported", "Warning"),
        SetStatus({"phase": "Failed", "conditions": [{"type": "Failed", "status": "True", "reason": "UserError"}]}),
    ]
    _, lines = execute(actions, job, fleet, {"phase": "Running"})
    assert lines == ["warning: Diverged: the training loss was not finite in a task after 400 records"]

