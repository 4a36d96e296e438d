"""The worker's SIGTERM watchdog ends the process after its grace period even when the main thread
never returns to the interpreter, so that Python's own handler never runs (seen in CI: a worker
alive 60 s after SIGTERM, its PS gone)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from elasticps.worker.main import EXIT_STOPPED, STOP_GRACE_S

# The main thread locks a mutex it holds already (glibc's default mutex waits for ever): native code
# that a signal does not interrupt, so the Python-level handler (which would raise) never gets to run.
BLOCKED_MAIN_THREAD = """
import ctypes, signal
from elasticps.worker.main import arm_stop_watchdog

def handler(signum, frame):
    raise SystemExit("the Python handler ran")

signal.signal(signal.SIGTERM, handler)
arm_stop_watchdog()
libc = ctypes.CDLL(None)
mutex = ctypes.create_string_buffer(64)  # zeroed: PTHREAD_MUTEX_INITIALIZER
libc.pthread_mutex_lock(mutex)
print("blocked", flush=True)
libc.pthread_mutex_lock(mutex)
"""


def test_sigterm_ends_a_worker_whose_main_thread_is_stuck_in_native_code() -> None:
    process = subprocess.Popen([sys.executable, "-c", BLOCKED_MAIN_THREAD], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None and process.stdout.readline().strip() == "blocked"
        time.sleep(0.2)  # inside the second lock by now
        signalled = time.monotonic()
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=STOP_GRACE_S + 30)
        took = time.monotonic() - signalled
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert code == EXIT_STOPPED
    assert took >= STOP_GRACE_S  # the grace period is given in full before the exit


def test_other_signals_do_not_arm_it() -> None:
    """SIGINT's handler (Python's default, KeyboardInterrupt) writes to the same descriptor; only
    SIGTERM starts the grace period."""
    process = subprocess.Popen([sys.executable, "-c", BLOCKED_MAIN_THREAD], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None and process.stdout.readline().strip() == "blocked"
        time.sleep(0.2)
        process.send_signal(signal.SIGINT)
        time.sleep(STOP_GRACE_S + 2)
        assert process.poll() is None  # still blocked: SIGINT armed nothing
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=STOP_GRACE_S + 30) == EXIT_STOPPED
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
