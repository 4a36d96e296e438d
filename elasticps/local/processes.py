"""Replicas as local processes: start (each in its own session, logging to a file), poll, stop.

Used by the local runner's ``fleet`` (one process per started replica). Children get the allocator settings PERFORMANCE.md measured (big tensor
messages otherwise pay a fresh mmap and page faults on every call) and unbuffered output.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from elasticps.api.replicas import Replica
from elasticps.exits import TERMINATION_LOG_ENV, last_line
from elasticps.files import write_atomically

CHILD_ENV = {
    "PYTHONUNBUFFERED": "1",
    "TF_CPP_MIN_LOG_LEVEL": "2",
    "MALLOC_MMAP_THRESHOLD_": "1073741824",
    "MALLOC_TRIM_THRESHOLD_": "2147483648",
}


@dataclass
class Process:
    replica: Replica
    log_path: Path
    popen: subprocess.Popen[bytes]
    termination_path: Path
    restarts: int = 0
    started_at: float = field(default_factory=time.monotonic)

    @property
    def exit_code(self) -> int | None:
        return self.popen.poll()


def start(replica: Replica, log_dir: Path, restarts: int = 0, env: Mapping[str, str] | None = None) -> Process:
    """Starts the replica's process; ``env``: added to its environment (its identity)."""
    log_path = log_dir / f"{replica.name}.log"
    # Where the replica writes its one-line reason before exiting on a user's mistake (exits.py);
    # a replacement starts without its predecessor's.
    termination_path = log_dir / f"{replica.name}.termination"
    termination_path.unlink(missing_ok=True)
    with log_path.open("ab") as log:
        log.write(f"--- start {restarts}: elasticps {' '.join(replica.args)}\n".encode())
        log.flush()
        popen = subprocess.Popen(
            [sys.executable, "-m", "elasticps", *replica.args],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **CHILD_ENV, **(env or {}), TERMINATION_LOG_ENV: str(termination_path)},
            start_new_session=True,  # Ctrl-C and SIGTERM reach the runner, which stops every child itself
        )
    # The pid file lets a person (or a fault-injection test) find a replica's process. Written
    # atomically: a reader polling for it never finds it empty (a replacement rewrites it).
    write_atomically(log_dir / f"{replica.name}.pid", f"{popen.pid}\n")
    return Process(replica, log_path, popen, termination_path, restarts)


def stop_all(processes: list[Process], grace_s: float = 5.0) -> None:
    """SIGTERM every live child, then SIGKILL what is left after ``grace_s``."""
    for process in processes:
        if process.exit_code is None:
            _signal(process, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for process in processes:
        try:
            process.popen.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal(process, signal.SIGKILL)
            process.popen.wait()


def terminate(process: Process) -> None:
    """SIGTERM to the replica's process group (a PS flushes its checkpoints and exits 0)."""
    _signal(process, signal.SIGTERM)


def kill(process: Process) -> None:
    _signal(process, signal.SIGKILL)


def _signal(process: Process, signum: int) -> None:
    try:
        os.killpg(process.popen.pid, signum)
    except ProcessLookupError:
        pass


def log_tail(process: Process, lines: int = 15) -> str:
    try:
        text = process.log_path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.rstrip().splitlines()[-lines:])


def termination_message(process: Process) -> str:
    """Why an exited replica ended, in one line: the message it wrote (``exits.user_error``), else its
    log's last line (a crash, argparse's usage error), as Kubernetes' FallbackToLogsOnError does."""
    for path in (process.termination_path, process.log_path):
        try:
            with path.open("rb") as file:
                file.seek(max(0, file.seek(0, os.SEEK_END) - TAIL_BYTES))
                line = last_line(file.read().decode(errors="replace"))
        except OSError:
            continue
        if line:
            return line
    return ""


TAIL_BYTES = 4096  # of a log, enough for its last line (a termination message is at most 1,000 characters)
