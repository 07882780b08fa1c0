"""host_memory.keep_freed_memory: freed memory is reused without faulting it in again."""
import ctypes
import subprocess
import sys

import pytest

# A fresh process (mallopt cannot be undone): 64 MB allocated, touched and freed, then
# allocated again; prints the page faults of the second allocation.
_CHILD = """
import resource, sys
import numpy as np
from tba_jax import host_memory
if sys.argv[1] == "keep":
  assert host_memory.keep_freed_memory()
faults = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_minflt
block = np.ones(64 << 18, np.float32)
del block
before = faults()
block = np.ones(64 << 18, np.float32)
print(faults() - before)
"""


def _second_allocation_faults(mode: str) -> int:
  out = subprocess.run([sys.executable, "-c", _CHILD, mode], capture_output=True, text=True,
                       check=True)
  return int(out.stdout.split()[-1])


@pytest.mark.skipif(not (sys.platform.startswith("linux") and
                         hasattr(ctypes.CDLL(None), "gnu_get_libc_version")),
                    reason="glibc's mallopt")
def test_a_freed_block_is_reused_without_page_faults():
  assert _second_allocation_faults("default") > 100  # glibc maps it afresh: faulted in again
  assert _second_allocation_faults("keep") == 0
