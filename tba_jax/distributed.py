"""Multi-host (multi-controller) runs: start-up, the replay-buffer exchange, lost hosts.

One process per host. Every process holds the same global replay buffer: every
k steps each host's new entries reach every host through an all-gather, and
each host adds them in process order, so all buffers stay identical and every
host samples the same global batch with the same seed (feeding its own slice
to the trainer mesh). Every process must call these collectives in the same
order; searcher threads never call them.

A host that dies without notice (SIGKILL, a crash, a lost machine) stops the
others within the heartbeat timeout (`initialize`; JAX's 100 s unless set):
JAX's coordination service declares a process dead when its heartbeats have
been missing that long, and then terminates every other process with a message
naming the task that stopped sending them ("The following tasks are unhealthy
(stopped sending heartbeats): 1"). Nothing in this runtime waits longer: the
collective a survivor is in either fails when the dead host's connections close
(at once on CPU/gloo), or hangs until that termination. A failed collective
raises in the loop, which says so at once and waits for the service's verdict
(`lost_process_error`): whichever comes first, the loop's `ProcessLostError` or
JAX's termination, names the lost process, and the survivor exits non-zero.
When the lost process is 0 (it runs the coordination service), JAX ends the
others at once ("... the leader task was preempted/died ...").
"""
from __future__ import annotations

import json
import os
import threading

import jax
import numpy as np

from tba_jax import entries as entries_lib
from tba_jax.entries import Entry


# JAX's default: a process whose heartbeats stop this long is declared dead, and every
# other process is terminated (module docstring).
HEARTBEAT_TIMEOUT_S = 100
_heartbeat_timeout_s = HEARTBEAT_TIMEOUT_S  # this run's (initialize)


class ProcessLostError(RuntimeError):
  """Another process of the run stopped without notice; this one cannot go on alone."""


def initialize(coordinator_address: str = "", num_processes: int = 0, process_id: int = -1,
               heartbeat_timeout_s: int = HEARTBEAT_TIMEOUT_S) -> bool:
  """`jax.distributed.initialize` from arguments or the environment; False if single-process.

  Environment fallbacks: TBA_COORDINATOR_ADDRESS, TBA_NUM_PROCESSES, TBA_PROCESS_ID.
  On TPU pods and SLURM clusters JAX discovers all three by itself: pass
  coordinator_address="auto". `heartbeat_timeout_s`: how long a silent process
  may go before the others stop (module docstring).
  """
  global _heartbeat_timeout_s
  address = coordinator_address or os.environ.get("TBA_COORDINATOR_ADDRESS", "")
  if not address:
    return False
  _heartbeat_timeout_s = heartbeat_timeout_s
  if address == "auto":
    jax.distributed.initialize(heartbeat_timeout_seconds=heartbeat_timeout_s)
    return True
  num = num_processes or int(os.environ.get("TBA_NUM_PROCESSES", "0"))
  pid = process_id if process_id >= 0 else int(os.environ.get("TBA_PROCESS_ID", "-1"))
  if num < 1 or pid < 0:
    raise ValueError(f"multi-host start needs num_processes and process_id with the coordinator "
                     f"address {address!r} (got num_processes={num}, process_id={pid})")
  jax.distributed.initialize(address, num_processes=num, process_id=pid,
                             heartbeat_timeout_seconds=heartbeat_timeout_s)
  return True


def lost_process_error(error: Exception) -> ProcessLostError | None:
  """A ProcessLostError naming the processes gone, when `error` came from losing them.

  A collective whose peer's connection dropped raises whatever its runtime maps
  the failure to (a ValueError from a jitted gloo all-reduce, a JaxRuntimeError
  from an all-gather), so any error of a multi-process run is looked into. The
  liveness query answers once the coordination service has decided, within the
  heartbeat timeout (module docstring); it is a barrier among the live processes,
  so when the error was this host's own (the others wait in a collective) it
  does not answer, and the error is this host's own: None.
  """
  if jax.process_count() == 1:
    return None
  from jax.experimental import multihost_utils
  print(f"process {jax.process_index()}: {_first_line(error)}. If another process stopped, it "
        f"is named within the heartbeat timeout ({_heartbeat_timeout_s} s).", flush=True)
  alive: set[int] = set()

  def ask():
    try:
      with multihost_utils.live_devices(jax.devices()) as devices:
        alive.update(d.process_index for d in devices)
    except Exception:  # the coordinator itself is gone, or a process died meanwhile
      pass

  asker = threading.Thread(target=ask, daemon=True)  # abandoned if it never answers
  asker.start()
  asker.join(_heartbeat_timeout_s + 10)
  lost = sorted(set(range(jax.process_count())) - alive) if alive else []
  if not lost:
    return None
  return ProcessLostError(
      f"process(es) {lost} of {jax.process_count()} stopped without notice (killed, crashed or "
      f"their host lost) while process {jax.process_index()} waited for them: "
      f"{_first_line(error)}. Everything up to the newest checkpoint is kept; rerun the same "
      "command on every host to resume from it.")


def _first_line(error: Exception) -> str:
  lines = str(error).strip().splitlines()
  return f"{type(error).__name__}: {lines[0][:300] if lines else ''}"


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
  """Each flag True on every process when any process raised it (a failure, a deadline)."""
  return tuple(bool(f) for f in broadcast_max(*flags))


def broadcast_max(*values: int) -> tuple[int, ...]:
  """Each value's maximum over the processes, on every process (a stop signal's number)."""
  return tuple(int(v) for v in all_gather_ints(*values).max(axis=0))


def all_gather_ints(*values: int) -> np.ndarray:
  """[processes, len(values)] int32: every process's `values`, in process order."""
  mine = np.array([int(v) for v in values], np.int32)
  if jax.process_count() == 1:
    return mine[None]
  from jax.experimental import multihost_utils
  return np.asarray(multihost_utils.process_allgather(mine)).reshape(jax.process_count(), -1)


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
