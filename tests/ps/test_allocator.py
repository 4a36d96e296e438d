"""The PS caps glibc's malloc arenas (``elasticps/allocator.py``): counted from glibc's own report
(``malloc_stats`` prints one "Arena N:" block per arena) in a fresh process whose threads allocate."""

from __future__ import annotations

import subprocess
import sys

import pytest

from elasticps.allocator import arenas_of, limit_malloc_arenas

# Four threads each call malloc: glibc gives each new thread an arena of its own while the count is
# under the limit (8 per core by default).
THREADS_ALLOCATING = """
import ctypes, sys, threading
from elasticps.allocator import arenas_of, limit_malloc_arenas
if sys.argv[1] != "0":
    assert limit_malloc_arenas(int(sys.argv[1]))
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
hold = []
def allocate():
    hold.append(libc.malloc(1 << 20))
threads = [threading.Thread(target=allocate) for _ in range(4)]
for t in threads: t.start()
for t in threads: t.join()
libc.malloc_stats()
"""


def arenas(limit: int) -> int:
    done = subprocess.run([sys.executable, "-c", THREADS_ALLOCATING, str(limit)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return sum(1 for line in done.stderr.splitlines() if line.startswith("Arena "))


def test_threads_of_a_limited_process_share_one_arena() -> None:
    assert arenas(0) > 1  # glibc's default: the threads got arenas of their own
    assert arenas(1) == 1
    assert arenas(2) == 2


def test_a_limit_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        limit_malloc_arenas(0)


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["ps", "--ps_id", "0"], 1),  # the default
        (["ps", "--malloc_arenas", "4"], 4),
        (["ps", "--malloc_arenas=0"], 0),
        (["--log_level", "WARNING", "ps", "--port", "0"], 1),
        (["worker", "--malloc_arenas", "4"], None),  # only the PS's
        (["run", "job.yaml"], None),
        ([], None),
        (["ps", "--malloc_arenas", "many"], None),  # the full parser says what is wrong
    ],
)
def test_the_command_line_reads_the_ps_s_arenas_before_its_parser(argv: list[str], expected: int | None) -> None:
    assert arenas_of(argv) == expected


def test_a_ps_started_by_the_command_line_has_one_arena_before_any_import_starts_a_thread() -> None:
    """``elasticps ps --help`` goes through cli.main's early step, then the full parser (numpy, gRPC)."""
    script = (
        "import ctypes, sys, threading\n"
        "from elasticps import cli\n"
        "try:\n"
        "    cli.main(['ps', '--help'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "libc = ctypes.CDLL(None); libc.malloc.restype = ctypes.c_void_p; libc.malloc.argtypes = [ctypes.c_size_t]\n"
        "threads = [threading.Thread(target=lambda: libc.malloc(1 << 20)) for _ in range(4)]\n"
        "[t.start() for t in threads]; [t.join() for t in threads]\n"
        "libc.malloc_stats()\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert sum(1 for line in done.stderr.splitlines() if line.startswith("Arena ")) == 1


def test_a_negative_arena_count_is_a_clear_error_not_a_traceback() -> None:
    done = subprocess.run([sys.executable, "-m", "elasticps", "ps", "--malloc_arenas=-1"],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode != 0
    assert done.stderr.strip().splitlines()[-1] == "error: --malloc_arenas must be >= 0, got -1"
    assert "Traceback" not in done.stderr


# Under the replicas' settings (local/processes.py: no mmap below 1 GiB, no trimming below 2 GiB) a
# burst of freed memory stays resident until malloc_trim gives its pages back.
BURST_THEN_GIVE_BACK = """
import ctypes, sys
from elasticps.allocator import give_back_free_memory
def rss_mib():
    return int(next(l for l in open("/proc/self/status") if l.startswith("VmRSS")).split()[1]) // 1024
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
blocks = [libc.malloc(1 << 20) for _ in range(96)]
for block in blocks:
    ctypes.memset(block, 1, 1 << 20)
keep = libc.malloc(4096)  # above the burst: the heap's top cannot shrink past it
for block in blocks:
    libc.free(block)
before = rss_mib()
gave = give_back_free_memory()
print(before, rss_mib(), gave)
"""


def test_giving_back_free_memory_lowers_the_resident_size_the_replicas_settings_keep() -> None:
    env = {"MALLOC_MMAP_THRESHOLD_": "1073741824", "MALLOC_TRIM_THRESHOLD_": "2147483648", "PATH": ""}
    done = subprocess.run([sys.executable, "-c", BURST_THEN_GIVE_BACK], capture_output=True, text=True, timeout=60,
                          env={**env, "PYTHONPATH": ":".join(sys.path)})  # fmt: skip
    assert done.returncode == 0, done.stderr
    before, after, gave = done.stdout.split()
    assert gave == "True"
    assert int(before) - int(after) >= 64, done.stdout  # of the 96 MiB freed
