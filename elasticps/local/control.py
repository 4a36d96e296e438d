"""Changes to a running local job, asked from outside its process: ``elasticps scale``.

Callers: ``elasticps scale`` (``cli``) writes a request; the local runner (``runner``) owns the run
directory's ``runner.json`` and reads requests once a pass. The channel is two small files in the run
directory:

- ``runner.json``: ``{"pid": P, "job": NAME}`` of the ``elasticps run`` driving the job, written
  when the run starts and removed when it ends (not a ``*.pid`` file: those are the replicas').
  ``scale`` refuses a directory without one, or whose pid is gone (the run ended, or was killed
  before it could remove it), so a request never waits for a run that is not there.
- ``control.json``: ``{"worker_replicas": N}``, written atomically (a reader sees the old request
  or the whole new one). The runner stats it each pass and parses it only when its inode or mtime
  changed; the last request wins. A run removes a leftover one when it starts, so a new run in an
  old directory does not take an old request.

The number of workers is checked against the spec's own bounds for ``worker.replicas`` (one place
per fact). 0 is allowed, as in a cluster: the workers stop and the job waits for a new request.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path

from elasticps.api.fields import check_bounds, field_info
from elasticps.api.spec import ReplicaSpec
from elasticps.files import write_atomically

CONTROL_FILE = "control.json"
RUNNER_FILE = "runner.json"


class ControlError(Exception):
    """A request that cannot be made or read; the message says why."""


@dataclass(frozen=True)
class Request:
    worker_replicas: int


@dataclass(frozen=True)
class Runner:
    """The ``elasticps run`` driving a run directory."""

    pid: int
    job: str


def check_workers(value: object, where: str = "--workers") -> int:
    """``value`` as a worker count within ``worker.replicas``' bounds, or ControlError naming them."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ControlError(f"{where}: must be an integer, got {value!r}")
    info = field_info(next(f for f in dataclasses.fields(ReplicaSpec) if f.name == "replicas"))
    try:
        check_bounds(value, info, where)
    except ValueError as err:
        raise ControlError(str(err)) from None
    return value


# ---- the runner's side ---------------------------------------------------------------------------
def claim(run_dir: Path, job: str) -> None:
    """Marks ``run_dir`` as driven by this process; drops a request a previous run left."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / CONTROL_FILE).unlink(missing_ok=True)
    write_atomically(run_dir / RUNNER_FILE, json.dumps({"pid": os.getpid(), "job": job}) + "\n")


def release(run_dir: Path) -> None:
    (run_dir / RUNNER_FILE).unlink(missing_ok=True)


class Watcher:
    """Reads ``control.json`` when it changed since the last look: a stat per call, no more."""

    def __init__(self, run_dir: Path) -> None:
        self._path = run_dir / CONTROL_FILE
        self._seen: tuple[int, int] | None = None

    def poll(self) -> Request | None:
        """The new request, None when there is none or it did not change; ControlError when the
        new file is not a valid request (reported once, until the file changes again)."""
        try:
            stat = self._path.stat()
        except OSError:
            return None
        key = (stat.st_ino, stat.st_mtime_ns)
        if key == self._seen:
            return None
        self._seen = key
        return read_request(self._path)


def read_request(path: Path) -> Request:
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ControlError(f"{path.name}: not a readable JSON request ({err})") from None
    if not isinstance(data, dict) or "worker_replicas" not in data:
        raise ControlError(f'{path.name}: expected {{"worker_replicas": N}}, got {data!r}')
    return Request(worker_replicas=check_workers(data["worker_replicas"], f"{path.name}: worker_replicas"))


# ---- the requester's side ------------------------------------------------------------------------
def active_runner(run_dir: Path) -> Runner:
    """The run driving ``run_dir``, or ControlError saying why there is none."""
    if not run_dir.is_dir():
        raise ControlError(f"{run_dir}: no such run directory")
    try:
        data = json.loads((run_dir / RUNNER_FILE).read_text())
    except OSError:
        raise ControlError(f"no run is active in {run_dir} (no {RUNNER_FILE}: the run ended or never started)") from None
    except (UnicodeDecodeError, json.JSONDecodeError):
        data = None
    pid, job = (data.get("pid"), data.get("job")) if isinstance(data, dict) else (None, None)
    if not isinstance(pid, int) or not isinstance(job, str):
        raise ControlError(f"no run is active in {run_dir} ({RUNNER_FILE} is not a runner's: {data!r})")
    if not _alive(pid):
        raise ControlError(f"no run is active in {run_dir} (its runner, pid {pid}, is gone)")
    return Runner(pid, job)


def request(run_dir: Path, workers: int) -> Runner:
    """Asks the run in ``run_dir`` for ``workers`` workers; returns the run asked."""
    workers = check_workers(workers)
    runner = active_runner(run_dir)
    write_atomically(run_dir / CONTROL_FILE, json.dumps({"worker_replicas": workers}) + "\n")
    return runner


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: alive, though hardly ours
    try:
        return "zombie" not in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return True  # no /proc: the signal said it exists
