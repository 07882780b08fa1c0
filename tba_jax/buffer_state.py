"""The replay buffer's checkpoint format: a buffer's state (its entries in seq order, the
prompt table, the sync windows, counters, cap and RNG) as named numpy arrays, and back.

  arrays = to_arrays(snapshot)     # ReplayBuffer.state_dict, under the buffer's lock
  snapshot = from_arrays(arrays)   # ReplayBuffer.load_state_dict, then set under its lock

Every value is a non-empty numpy array, as orbax needs: each variable-length array carries
one trailing dummy element and its true size is recorded in `sizes`, by name in
STATE_ARRAYS' order. States saved by older versions load: an array that did not exist yet
(a field added to Entry later, the sync windows, the cap) gets its default.
"""
from __future__ import annotations

import dataclasses
import json
from typing import Sequence

import numpy as np

from tba_jax.entries import PER_TOKEN_FIELDS, SCALAR_FIELDS, Entry, frozen, normalized

# The variable-length arrays of a state, in the order of its `sizes` array.
STATE_ARRAYS = (("seq", "length") + tuple(n for n, _ in SCALAR_FIELDS + PER_TOKEN_FIELDS) +
                ("prompt_table_ids", "prompt_table_lens", "prompt_table_tokens", "pending",
                 "latest", "latest_left", "windows"))
# The buffer's counters, in the order of the state's `counters` array.
COUNTERS = ("next_seq", "drain_from", "num_syncs", "num_added", "num_replaced", "num_evicted")


@dataclasses.dataclass
class Snapshot:
  """A buffer's state as plain values (replay_buffer.py's docstring says what each means)."""
  seqs: list[int]                 # the live entries' insertion counters, oldest first
  entries: list[Entry]            # those entries, in the same order
  prompts: dict[int, np.ndarray]  # prompt id -> its tokens
  pending: list[int]              # prompts refreshed since the last mark_sync
  latest: list[int]               # prompts refreshed at the latest sync (sorted)
  latest_left: list[int]          # those the m branch has not taken yet
  windows: list[int]              # the first seq of each sync window after the first
  counters: dict[str, int]        # COUNTERS by name
  max_entries: int | None         # the cap (0: none; None: a state saved before it was kept)
  rng_state: dict                 # the buffer's numpy bit generator's state


def to_arrays(s: Snapshot) -> dict[str, np.ndarray]:
  """The state as named non-empty numpy arrays (module docstring)."""
  pids = sorted(s.prompts)
  arrays = {"seq": (s.seqs, np.int64), "length": ([e.length for e in s.entries], np.int64)}
  arrays.update({n: ([getattr(e, n) for e in s.entries], dt) for n, dt in SCALAR_FIELDS})
  arrays.update({n: (_cat([getattr(e, n) for e in s.entries]), dt)
                 for n, dt in PER_TOKEN_FIELDS})
  arrays.update(
      prompt_table_ids=(pids, np.int64),
      prompt_table_lens=([s.prompts[p].size for p in pids], np.int64),
      prompt_table_tokens=(_cat([s.prompts[p] for p in pids]), np.int32),
      pending=(sorted(s.pending), np.int64), latest=(s.latest, np.int64),
      latest_left=(s.latest_left, np.int64), windows=(s.windows, np.int64))
  state = {"sizes": np.array([len(arrays[n][0]) for n in STATE_ARRAYS], np.int64)}
  state.update({n: np.append(np.asarray(v, dt), np.zeros(1, dt)) for n, (v, dt) in arrays.items()})
  state["counters"] = np.array([s.counters[n] for n in COUNTERS], np.int64)
  state["max_entries"] = np.array([s.max_entries or 0], np.int64)
  state["rng_state"] = np.frombuffer(json.dumps(s.rng_state).encode(), np.uint8).copy()
  return state


def from_arrays(state: dict[str, np.ndarray]) -> Snapshot:
  """The Snapshot `to_arrays` made (or an older version's state, module docstring)."""
  # By name, in STATE_ARRAYS' order: a restored dict may come back with its keys sorted.
  # A state saved before a field existed lacks its array (and its size): such entries get
  # the field's default.
  names = [n for n in STATE_ARRAYS if n in state]
  s = {n: np.asarray(state[n])[:int(size)] for n, size in zip(names, state["sizes"])}
  prompts = {}
  off = np.concatenate([[0], np.cumsum(s["prompt_table_lens"])])
  for i, pid in enumerate(s["prompt_table_ids"].tolist()):
    prompts[pid] = frozen(s["prompt_table_tokens"][off[i]:off[i + 1]], np.int32)
  entries = []
  off = np.concatenate([[0], np.cumsum(s["length"])])
  for i in range(len(s["seq"])):
    fields = {n: s[n][i].item() for n, _ in SCALAR_FIELDS if n in s}
    fields.update({n: s[n][off[i]:off[i + 1]] for n, _ in PER_TOKEN_FIELDS if n in s})
    entries.append(normalized(Entry(prompt=prompts[fields["prompt_id"]], **fields)))
  counters = dict(zip(COUNTERS, np.asarray(state["counters"]).tolist()))
  # States saved before windows were kept: what they hold is one window (the m branch
  # then draws from all of a latest prompt's entries until its next refresh).
  windows = (s["windows"].tolist() if "windows" in s else
             [counters["next_seq"]] if counters["next_seq"] else [])
  return Snapshot(
      seqs=s["seq"].tolist(), entries=entries, prompts=prompts, pending=s["pending"].tolist(),
      latest=s["latest"].tolist(), latest_left=s["latest_left"].tolist(), windows=windows,
      counters=counters,
      max_entries=int(np.asarray(state["max_entries"])[0]) if "max_entries" in state else None,
      rng_state=json.loads(np.asarray(state["rng_state"]).tobytes()))


def _cat(arrays: Sequence[np.ndarray]) -> np.ndarray:
  return np.concatenate(arrays) if arrays else np.zeros(0)
