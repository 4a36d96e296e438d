"""glibc malloc's arenas for a process whose many threads pass large buffers around (the PS).

glibc gives threads their own arenas (up to 8 per core) and keeps what is freed in each for that
arena's next allocations. A PS receives a model-sized gradient on one thread, sums it on another
and encodes the pull on a third; each arena ends up holding its own copy of the shard's peak, which
the replicas' allocator settings (no trimming, no mmap: ``local/processes.py``, the Dockerfile)
never give back. Measured on the 23M-parameter sync job (``bench/large_model.py``, 44 MiB shards):
peak resident 470-580 MiB per PS with glibc's arenas, 307 MiB with one. The PS's hot path
allocates almost nothing (buffers are kept and reused), so one arena costs it no lock contention
that matters. Those settings also keep a one-off burst resident for good (a model received whole at
install, with the transport's frames): :func:`give_back_free_memory` returns its pages after it.
"""

from __future__ import annotations

import argparse
import ctypes
from collections.abc import Sequence

M_ARENA_MAX = -8  # glibc's mallopt parameter
PS_ARENAS = 1  # the PS's default (its --malloc_arenas)
FLAG = "--malloc_arenas"


def add_flag(parser: argparse.ArgumentParser) -> None:
    """The PS's ``--malloc_arenas``; the command line applies it before it imports anything that
    starts threads (:func:`arenas_of`)."""
    parser.add_argument(
        FLAG, type=int, default=PS_ARENAS,
        help=f"glibc malloc arenas of the PS process: each arena keeps what its threads freed, so more arenas hold "
        f"more copies of the shard's peak (0: glibc's default, 8 per core; default: {PS_ARENAS})",
    )  # fmt: skip


def arenas_of(argv: Sequence[str]) -> int | None:
    """The ``--malloc_arenas`` of an ``elasticps ps`` command line (its default when not given),
    or None for any other command, read before the full parser exists: that parser imports
    numpy and gRPC, whose threads would each get an arena of their own first. A value that does
    not parse is left to the full parser's error."""
    early = argparse.ArgumentParser(add_help=False)
    early.add_argument("--log_level")
    early.add_argument("command", nargs="?")
    early.add_argument(FLAG, type=str, default=str(PS_ARENAS))
    known, _ = early.parse_known_args(argv)
    if known.command != "ps":
        return None
    try:
        return int(known.malloc_arenas)
    except ValueError:
        return None


def limit_malloc_arenas(count: int) -> bool:
    """Caps this process's malloc arenas at ``count``; effective for threads that allocate from
    now on, so called before any is started. False where the C library has no ``mallopt``
    (musl, macOS) or refuses the value."""
    if count < 1:
        raise ValueError(f"malloc arenas: at least 1, got {count}")
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_ARENA_MAX, count))


def give_back_free_memory() -> bool:
    """Returns the free pages of malloc's heap to the system (glibc's ``malloc_trim(0)``): after a
    burst that will not come again (a model received whole at install, with the transport's
    buffers), which the replicas' allocator settings would otherwise keep resident for good. False
    where the C library has no ``malloc_trim`` or nothing was given back."""
    try:
        malloc_trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return False
    malloc_trim.argtypes = [ctypes.c_size_t]
    malloc_trim.restype = ctypes.c_int
    return bool(malloc_trim(0))
