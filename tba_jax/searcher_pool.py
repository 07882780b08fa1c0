"""This process's searchers, as the trainer's loop drives them.

  pool = SearcherPool(searchers, publish=..., max_prompt_len=Tp, max_completion_len=Tc)
  pool.start()                      # async mode: one thread per searcher
  pool.search_round(num_prompts)    # alternate mode: the searchers run in the caller's thread
  pool.publish(version, params)     # new weights; a searcher takes them at its next batch
  pool.merge(global_buffer)         # every host's new entries, in the same order everywhere
  if pool.failed(): ...             # collective: True on every host when any searcher failed
  pool.stop()

Every method that talks to other hosts (`merge`, `failed`, `state_dict`) is a
collective: all processes call it at the same step, in the same order. The
searcher threads themselves only use their host's devices.
"""
from __future__ import annotations

import math
import threading
import time
import traceback
from typing import Callable

import jax

from tba_jax import distributed
from tba_jax.model import Params
from tba_jax.replay_buffer import ReplayBuffer
from tba_jax.searcher import Searcher


class SearcherError(RuntimeError):
  """A searcher raised; the message holds every failed searcher's traceback."""


class SearcherPool:
  """The searchers of one process: threads, weights, merges, failures, state, metrics.

  `publish(params, i)` copies trainer params onto searcher i's devices (in the
  searchers' dtype), e.g. a bound weight_sync.publish.
  """

  def __init__(self, searchers: list[Searcher], *, publish: Callable[[Params, int], Params],
               max_prompt_len: int, max_completion_len: int):
    self.searchers, self._publish = searchers, publish
    self.max_prompt_len, self.max_completion_len = max_prompt_len, max_completion_len
    self._stop = threading.Event()
    self._threads: list[threading.Thread] = []
    self._start_time: float | None = None

  # --- Running -------------------------------------------------------------------------------
  def start(self) -> None:
    """Async mode: every searcher samples in its own thread until `stop`."""
    self._started()
    self._threads = [threading.Thread(target=sr.run, args=(self._stop,), name=f"searcher-{sr.id}",
                                      daemon=True) for sr in self.searchers]
    for t in self._threads:
      t.start()

  def stop(self, timeout: float = 60.0) -> None:
    self._stop.set()
    for t in self._threads:
      t.join(timeout=timeout)

  def search_round(self, num_prompts: int) -> None:
    """Alternate mode: at least `num_prompts` prompts over all searchers of all hosts.

    A searcher that raises is recorded as a thread's failure would be (`failed`).
    """
    self._started()
    s = self.searchers[0]
    per = math.ceil(num_prompts / (len(self.searchers) * jax.process_count() * s.num_prompts))
    for sr in self.searchers:
      for _ in range(per):
        try:
          sr.search_once()
        except Exception:
          sr.error = traceback.format_exc()
          break

  def _started(self) -> None:
    if self._start_time is None:
      self._start_time = time.perf_counter()

  # --- Weights -------------------------------------------------------------------------------
  def publish(self, version: int, params: Params) -> None:
    """The trainer's params (version = its step) to every searcher's mailbox."""
    for i, sr in enumerate(self.searchers):
      sr.mailbox.put(version, self._publish(params, i))

  def set_reference(self, params: Params) -> None:
    """Reference reset: later samples are scored against `params`."""
    for i, sr in enumerate(self.searchers):
      sr.set_reference(self._publish(params, i))

  # --- Collectives ---------------------------------------------------------------------------
  def merge(self, buffer: ReplayBuffer) -> int:
    """Every host's new searcher entries into `buffer`, in process order; returns how many."""
    new = [entry for sr in self.searchers for entry in sr.buffer.drain_new()]
    new = distributed.all_gather_entries(new, max_prompt_len=self.max_prompt_len,
                                         max_completion_len=self.max_completion_len)
    buffer.add_many(new)
    return len(new)

  def failed(self) -> bool:
    """True on every host when a searcher of any host failed."""
    return distributed.broadcast_flags(any(sr.error is not None for sr in self.searchers))[0]

  def error(self, step: int) -> SearcherError:
    failed = [sr for sr in self.searchers if sr.error is not None]
    return SearcherError(
        f"a searcher failed; the run stopped after saving a checkpoint at step {step}.\n" +
        "\n".join(f"searcher {sr.id}:\n{sr.error}" for sr in failed))

  def state_dict(self) -> list[list[dict]]:
    """Every process's searcher states, [process][searcher] (for a checkpoint)."""
    states = [sr.state_dict() for sr in self.searchers]
    return distributed.all_gather_json(states)

  def load_state_dict(self, states: list[list[dict]]) -> None:
    for sr, st in zip(self.searchers, states[jax.process_index()]):
      sr.load_state_dict(st)

  # --- Metrics -------------------------------------------------------------------------------
  def metrics(self) -> dict:
    """This process's searchers: busy fraction since they started, samples, mean reward."""
    elapsed = time.perf_counter() - (self._start_time or time.perf_counter())
    busy = sum(sr.stats.busy_seconds for sr in self.searchers) / len(self.searchers)
    samples = sum(sr.stats.num_samples for sr in self.searchers)
    return {"searcher_busy_fraction": min(busy / max(elapsed, 1e-9), 1.0),
            "searcher_samples": samples,
            "searcher_reward_mean": sum(sr.stats.reward_sum for sr in self.searchers) /
                                    max(samples, 1)}
