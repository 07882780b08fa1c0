"""Multi-host (multi-controller) runs: start-up and the replay-buffer exchange.

One process per host. Every process holds the same global replay buffer: every
k steps each host's new entries reach every host through an all-gather, and
each host adds them in process order, so all buffers stay identical and every
host samples the same global batch with the same seed (feeding its own slice
to the trainer mesh). Every process must call these collectives in the same
order; searcher threads never call them.
"""
from __future__ import annotations

import json
import os

import jax
import numpy as np

from tba_jax import entries as entries_lib
from tba_jax.entries import Entry


def initialize(coordinator_address: str = "", num_processes: int = 0, process_id: int = -1) -> bool:
  """`jax.distributed.initialize` from arguments or the environment; False if single-process.

  Environment fallbacks: TBA_COORDINATOR_ADDRESS, TBA_NUM_PROCESSES, TBA_PROCESS_ID.
  On TPU pods and SLURM clusters JAX discovers all three by itself: pass
  coordinator_address="auto".
  """
  address = coordinator_address or os.environ.get("TBA_COORDINATOR_ADDRESS", "")
  if not address:
    return False
  if address == "auto":
    jax.distributed.initialize()
    return True
  num = num_processes or int(os.environ.get("TBA_NUM_PROCESSES", "0"))
  pid = process_id if process_id >= 0 else int(os.environ.get("TBA_PROCESS_ID", "-1"))
  if num < 1 or pid < 0:
    raise ValueError(f"multi-host start needs num_processes and process_id with the coordinator "
                     f"address {address!r} (got num_processes={num}, process_id={pid})")
  jax.distributed.initialize(address, num_processes=num, process_id=pid)
  return True


def all_gather_entries(entries: list[Entry], *, max_prompt_len: int,
                       max_completion_len: int) -> list[Entry]:
  """Every process's `entries`, concatenated in process order, on every process.

  Size first: the counts are gathered, then each host packs its entries into
  fixed-width arrays padded to the largest count, so the all-gather has one
  shape on every host.
  """
  if jax.process_count() == 1:
    return list(entries)
  from jax.experimental import multihost_utils
  counts = np.asarray(multihost_utils.process_allgather(np.int32(len(entries))))
  rows = max(int(counts.max()), 1)
  packed = entries_lib.pack(entries, max_prompt_len=max_prompt_len,
                              max_completion_len=max_completion_len, num_rows=rows)
  gathered = multihost_utils.process_allgather(packed)  # each leaf gains a leading [hosts] axis
  out = []
  for host in range(jax.process_count()):
    out.extend(entries_lib.unpack({k: np.asarray(v[host]) for k, v in gathered.items()}))
  return out


def broadcast_flags(*flags: bool) -> tuple[bool, ...]:
  """Each flag True on every process when any process raised it (SIGTERM, a failure)."""
  if jax.process_count() == 1:
    return tuple(bool(f) for f in flags)
  from jax.experimental import multihost_utils
  raised = np.asarray(multihost_utils.process_allgather(np.array(flags, np.int32))).max(axis=0)
  return tuple(bool(f) for f in raised)


def all_gather_json(value) -> list:
  """Every process's JSON-serialisable `value`, in process order, on every process."""
  if jax.process_count() == 1:
    return [value]
  from jax.experimental import multihost_utils
  raw = np.frombuffer(json.dumps(value).encode(), np.uint8)
  sizes = np.asarray(multihost_utils.process_allgather(np.int32(raw.size)))
  padded = np.zeros(int(sizes.max()), np.uint8)  # size first: one shape on every host
  padded[:raw.size] = raw
  gathered = np.asarray(multihost_utils.process_allgather(padded))
  return [json.loads(bytes(gathered[i, :sizes[i]]).decode()) for i in range(len(sizes))]
