"""A finished worker's process ends even when a thread it started never returns: the interpreter's
exit joins non-daemon threads (and every pool's threads) for ever, and a worker left so stays Running
in its pod. The exit watchdog ends it with the worker's own exit code and prints every thread's stack."""

from __future__ import annotations

import subprocess
import sys

# A non-daemon thread blocked for ever, as a pool thread inside a call that never returns.
STUCK_THREAD = """
import threading, sys
from elasticps.worker.main import arm_exit_watchdog

def stuck_in_a_call():
    threading.Event().wait()

threading.Thread(target=stuck_in_a_call, name="stuck-sender").start()
arm_exit_watchdog({code}, grace_s={grace})
sys.exit({code})
"""


def run(code: int, grace_s: float) -> tuple[int, str]:
    """The script's exit code and stderr; without the watchdog it would hang (the timeout raises)."""
    done = subprocess.run([sys.executable, "-c", STUCK_THREAD.format(code=code, grace=grace_s)],
                          capture_output=True, text=True, timeout=60)
    return done.returncode, done.stderr


def test_a_thread_that_never_returns_does_not_keep_a_finished_worker_alive() -> None:
    code, stderr = run(0, 1.0)
    assert code == 0
    assert "had not exited 1 s after the worker finished" in stderr
    assert "stuck_in_a_call" in stderr  # the stuck thread's stack, to say which it was


def test_the_worker_s_exit_code_is_kept() -> None:
    code, _ = run(143, 0.5)
    assert code == 143


def test_a_process_that_exits_by_itself_exits_at_once_without_a_word() -> None:
    done = subprocess.run([sys.executable, "-c", "from elasticps.worker.main import arm_exit_watchdog; "
                           "arm_exit_watchdog(3, grace_s=30); raise SystemExit(3)"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 3
    assert "had not exited" not in done.stderr  # ended by itself, not by the watchdog 30 s later
