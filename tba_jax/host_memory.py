"""Host memory on CPU runs: keep what malloc frees for the next call instead of returning it.

XLA:CPU allocates each call's temporaries with malloc and frees them when the call ends.
Its worker threads allocate from glibc's per-thread arenas, which hand a freed heap top
back to the kernel, so the next call faults those pages in again: the `cpu` recipe's
update (4 x 8 rows) took 1.06 million page faults (4 GB) and 3.7 s of kernel time a step
on a 2-core VM, 8 s a step in all. Turning off trimming and mapped blocks alone left the
faults; every thread in the main arena as well removed them (LAB_LOG.md, "Host memory, shared
prefills and paced searchers").

The price: the heap stays at its peak for the life of the process, which a run's peak
memory counts anyway.
"""
from __future__ import annotations

import ctypes
import sys

# mallopt parameters (glibc's malloc.h).
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_MAX, _M_ARENA_MAX = -1, -2, -4, -8


def keep_freed_memory() -> bool:
  """One malloc arena, no mmap'd blocks, no trimming (glibc's mallopt); False elsewhere.

  Call it before JAX starts its CPU backend: a thread that already has an arena keeps it.
  """
  if not sys.platform.startswith("linux"):
    return False
  libc = ctypes.CDLL(None)
  if not hasattr(libc, "gnu_get_libc_version"):  # musl and others: their own malloc
    return False
  settings = ((_M_ARENA_MAX, 1), (_M_MMAP_MAX, 0),
              (_M_TRIM_THRESHOLD, -1),  # -1: never trim (mallopt(3))
              (_M_TOP_PAD, 256 << 20))  # grow the heap 256 MB at a time
  return all(libc.mallopt(param, value) == 1 for param, value in settings)
