"""One OpenMP pool for the decoding thread.

torch's Linux CPU wheels run intra-op parallelism on GNU OpenMP (libgomp), which keeps a pool of worker
threads for every application thread that ever ran a parallel op, and which, once the threads of all pools
outnumber the CPUs, makes every pool's workers sleep right after each parallel region instead of spinning
(its "throttled" spin count). A decode step is thousands of small parallel regions, so each then pays a wake-up:
on the 2-core Xeon a SmolLM2 forward of 4 x 2 tokens took 81-86 ms in a second thread once the main thread had
run any parallel op, against 61-63 ms when it had not (BENCHMARKS.md, 2026-12-08); the server's batch loop is
such a second thread (``autolade serve``'s own main thread runs no parallel op before it: there this is a
guard). ``omp_pause_resource_all(omp_pause_hard)`` makes libgomp free the calling thread's pool (its workers
exit), so a thread that is done computing calls ``release_thread_pool`` and the decoding thread's pool is the only
one left. Other OpenMP runtimes (LLVM's libomp, Intel's) pause the whole
runtime instead, so they are left alone.
"""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path

OMP_PAUSE_HARD = 2  # omp_pause_resource_t: free the resources (libgomp: the calling thread's pool)


def loaded_libgomp(maps: str | None = None) -> str | None:
    """The path of the libgomp this process has loaded, from ``/proc/self/maps`` (``maps``: its text, for
    tests), or None (not Linux, or no libgomp loaded: torch built on another OpenMP, or none)."""
    if maps is None:
        if not sys.platform.startswith("linux"):
            return None
        try:
            maps = Path("/proc/self/maps").read_text()
        except OSError:
            return None
    for line in maps.splitlines():
        fields = line.split()  # address, perms, offset, device, inode[, path]
        name = Path(fields[-1]).name if fields else ""
        if name.startswith("libgomp") and ".so" in name:
            return fields[-1]
    return None


def release_thread_pool() -> bool:
    """Free the calling thread's OpenMP worker pool (libgomp only; the next parallel op in this thread makes
    a new one). Call it from a thread that is done with torch work while another thread decodes. Returns
    whether a libgomp was found and said yes; never raises."""
    path = loaded_libgomp()
    if path is None:
        return False
    try:
        lib = ctypes.CDLL(path)
        pause = lib.omp_pause_resource_all
    except (OSError, AttributeError):  # an old libgomp without OpenMP 5.0's pause
        return False
    pause.argtypes, pause.restype = [ctypes.c_int], ctypes.c_int
    return pause(OMP_PAUSE_HARD) == 0
