"""How a replica ends on a user's mistake: one line, said once, and exit code 2.

A replica that finds a mistake in what it was given (a model module that cannot be imported, data
that is not there, an output it cannot write, a model the mode cannot train) calls
:func:`user_error`: it prints ``NAME: error: WHY`` on stderr, writes the same line as its
termination message and returns ``USER_ERROR`` for the process to exit with. The planner treats
that code as permanent (``api/replicas.should_restart``): the job fails once, with this line as its
reason, instead of replacing a replica that would fail the same way.

The termination message goes where the executor reads it: the file named by
``ELASTICPS_TERMINATION_LOG`` (the local runner names one per replica), else Kubernetes'
``/dev/termination-log`` when the container has one (the kubelet puts it in the container's
``state.terminated.message``). A replica that dies before it can write one (argparse's usage error,
a crash) leaves the executor its log's last line instead (:func:`last_line`; on a cluster the pod's
``terminationMessagePolicy: FallbackToLogsOnError``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from elasticps.api.replicas import USER_ERROR

TERMINATION_LOG_ENV = "ELASTICPS_TERMINATION_LOG"
KUBERNETES_TERMINATION_LOG = Path("/dev/termination-log")
# Kubernetes keeps at most 4 KiB of a termination message; a reason is read in one line.
MAX_MESSAGE_CHARS = 1000


def one_line(text: str) -> str:
    """``text`` as one line of at most MAX_MESSAGE_CHARS characters (its whitespace runs as single spaces)."""
    line = " ".join(text.split())
    return line if len(line) <= MAX_MESSAGE_CHARS else line[: MAX_MESSAGE_CHARS - 3] + "..."


def user_error(name: str, err: object) -> int:
    """Says ``NAME: error: ERR`` on stderr and as the termination message; returns the exit code."""
    line = one_line(f"{name}: error: {err}")
    print(line, file=sys.stderr, flush=True)
    write_termination_message(line)
    return USER_ERROR


def termination_log() -> Path | None:
    """Where this process's termination message goes, None where nobody reads one."""
    named = os.environ.get(TERMINATION_LOG_ENV)
    if named:
        return Path(named)
    return KUBERNETES_TERMINATION_LOG if KUBERNETES_TERMINATION_LOG.exists() else None


def write_termination_message(line: str) -> None:
    path = termination_log()
    if path is None:
        return
    try:
        path.write_text(line + "\n")
    except OSError:
        pass  # the line is on stderr already; a read-only or missing file must not hide the error


def last_line(text: str) -> str:
    """The last non-empty line of a log or termination message, as one line ("" if none)."""
    lines = [line for line in text.splitlines() if line.strip()]
    return one_line(lines[-1]) if lines else ""
