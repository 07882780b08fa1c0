"""This process's searchers, as the trainer's loop drives them.

  pool = SearcherPool(searchers, publish=..., layout=batch.Layout(Tp, Tc, pad),
                      max_restarts=R, schedule=schedule.Schedule(mode, k, ...))
  # The trainer's loop, the same in both modes (schedule.py says what each does):
  pool.begin()                      # before the pre-fill of a run that trains
  pool.prefill(global_buffer)       # one pre-fill round, merged; True: a searcher gave up
  pool.before_step(step, buffer)    # at each step (alternate: a window's round)
  pool.sync(done, params, buffer)   # after each update (every k: weights, async: merge)
  # The pieces they are made of:
  pool.start()                      # async mode: one thread per searcher
  pool.search_round(num_prompts)    # alternate mode: the searchers run in the caller's thread
  pool.publish(version, params)     # new weights; a searcher takes them at its next batch
  pool.merge(global_buffer)         # every host's new entries, in the same order everywhere
  if pool.failed(): ...             # collective: True on every host when any searcher gave up
  entries, states = pool.snapshot() # collective: every host's unmerged entries and cursors
  pool.stop()

Restarts. A searcher whose batch raises is restarted in place (`Searcher.restart`:
its prompts in flight are re-queued; the retry reads the newest published weights),
at most `max_restarts` times per searcher and per run (the count is checkpointed).
Each restart is printed with its traceback and counted (`searcher_restarts`). A
searcher gives up, and the run stops after a checkpoint, when its budget is spent
or when a retried prompt fails again: a failure that follows the prompt is
deterministic, and retrying it would loop.

Every method that talks to other hosts (`merge`, `failed`, `error`, `snapshot`)
is a collective: all processes call it at the same step, in the same order. The
searcher threads themselves only use their host's devices.

What the pool relies on of a searcher is `PoolSearcher` below (searcher.Searcher
is one; the tests drive the pool with a fake that is another).
"""
from __future__ import annotations

import math
import sys
import threading
import time
import traceback
from typing import Callable, Protocol, Sequence

import jax

from tba_jax import distributed
from tba_jax.schedule import Schedule, due
from tba_jax.batch import Layout
from tba_jax.entries import Entry
from tba_jax.model import ModelConfig, Params
from tba_jax.replay_buffer import ReplayBuffer
from tba_jax.searcher import SearchStats
from tba_jax.weight_sync import Mailbox


class Staging(Protocol):
  """A searcher's committed entries until a merge (searcher.Staged)."""
  def add_many(self, entries: Sequence[Entry]) -> None: ...
  def drain_new(self) -> list[Entry]: ...
  def peek_new(self) -> list[Entry]: ...


class PoolSearcher(Protocol):
  """The contract between the pool and each of its searchers.

  `search_once` commits at least `num_prompts` prompts' entries to `buffer` and may
  raise; a prompt is in flight (`in_flight`) from when it is taken until its entries
  are committed. `restart` after a raise puts the prompts in flight back at the front
  of the stream; `snapshot` returns, without waiting for a search, the undrained
  entries and a JSON-able state whose stream cursor does the same, and
  `load_snapshot(entries, state)` takes both back. `mailbox` holds the newest weights
  (read at the start of every search); `set_reference` swaps the reference policy.
  """
  id: int
  num_prompts: int                  # prompts a search takes
  num_samples: int                  # entries per prompt
  mailbox: Mailbox
  buffer: Staging
  stats: SearchStats
  ref_params: Params                # the reference policy, on its devices
  ref_model_config: ModelConfig     # its config (with LoRA: the base's)

  def search_once(self) -> int: ...
  def in_flight(self) -> list[int]: ...
  def restart(self) -> None: ...
  def set_reference(self, params: Params) -> None: ...
  def snapshot(self) -> tuple[list[Entry], dict]: ...
  def load_snapshot(self, entries: Sequence[Entry], state: dict) -> None: ...


class SearcherError(RuntimeError):
  """A searcher gave up; the message holds every failed searcher's reason and traceback."""


class SearcherPool:
  """The searchers of one process: threads, weights, merges, restarts, state, metrics.

  `publish(params, i)` copies trainer params onto searcher i's devices (in the
  searchers' dtype), e.g. a bound weight_sync.publish.
  """

  def __init__(self, searchers: list[PoolSearcher], *,
               publish: Callable[[Params, int], Params],
               layout: Layout, max_restarts: int = 0, schedule: Schedule = Schedule()):
    self.searchers, self._publish = searchers, publish
    self.layout = layout  # the widths every host's entries are packed to
    self.max_restarts, self.schedule = max_restarts, schedule
    self.async_mode = schedule.mode == "async"
    # The trainer's time spent waiting for the searchers (pre-fill, alternate rounds) and
    # on async syncs (publish and merge), for the idle fractions.
    self.waiting_seconds = self.sync_seconds = 0.0
    n = len(searchers)
    self._errors: list[str | None] = [None] * n    # why searcher i gave up
    self._restarts = [0] * n                       # restarts of searcher i in this run
    self._retrying: list[set[int]] = [set() for _ in range(n)]  # prompts of its last failure
    self._restarts_all = 0  # every host's restarts, as of the latest `failed` (or restore)
    self._stop = threading.Event()
    self._threads: list[threading.Thread] = []
    self._start_time: float | None = None

  # --- The trainer's schedule (schedule.py) -------------------------------------------------
  def begin(self) -> None:
    """Before the pre-fill of a run that trains: async searchers start their threads."""
    if self.async_mode:
      self.start()

  def prefill(self, buffer: ReplayBuffer) -> bool:
    """One pre-fill round into `buffer` (async: a wait of 0.1 s; alternate: a round of
    the schedule's prefill_prompts). True, nothing merged, when a searcher gave up."""
    start = time.perf_counter()
    if self.async_mode:
      time.sleep(0.1)
    else:
      self.search_round(self.schedule.prefill_prompts)
    failed = self.failed()
    if not failed:
      self.merge(buffer)
    self.waiting_seconds += time.perf_counter() - start
    return failed

  def before_step(self, step: int, buffer: ReplayBuffer) -> bool:
    """Before update `step` (0-based). Alternate mode, at the first step of each window of
    k (not step 0: its round was the pre-fill; a resumed run searches at its first step as
    the uninterrupted run did): a round of window_prompts, merged as the window's sync.
    True, nothing merged, when a searcher gave up."""
    if self.async_mode or step == 0 or not due(step, self.schedule.sync_every):
      return False
    start = time.perf_counter()
    self.search_round(self.schedule.window_prompts)
    failed = self.failed()
    self.waiting_seconds += time.perf_counter() - start
    if not failed:
      self.merge(buffer)
      buffer.mark_sync()
    return failed

  def sync(self, done: int, params: Params, buffer: ReplayBuffer) -> bool:
    """After `done` updates, every k: the weights to the searchers; async mode also merges
    their new entries into `buffer` (alternate mode merges at its next round). True when
    a searcher gave up."""
    if not due(done, self.schedule.sync_every):
      return False
    start = time.perf_counter()
    self.publish(done, params)
    if not self.async_mode:
      return False
    self.merge(buffer)
    buffer.mark_sync()
    self.sync_seconds += time.perf_counter() - start
    return self.failed()

  def reference(self) -> tuple[ModelConfig, Params]:
    """(config, params) of the reference policy, on searcher 0's devices."""
    return self.searchers[0].ref_model_config, self.searchers[0].ref_params

  # --- Running -------------------------------------------------------------------------------
  def start(self) -> None:
    """Async mode: every searcher samples in its own thread until `stop` (or it gives up)."""
    self._started()
    self._threads = [threading.Thread(target=self._run, args=(i,), name=f"searcher-{sr.id}",
                                      daemon=True) for i, sr in enumerate(self.searchers)]
    for t in self._threads:
      t.start()

  def stop(self, timeout: float = 60.0) -> None:
    self._stop.set()
    for t in self._threads:
      t.join(timeout=timeout)

  def search_round(self, num_prompts: int) -> None:
    """Alternate mode: at least `num_prompts` prompts over all searchers of all hosts.

    A failed batch is retried after a restart and does not count; a searcher
    that gives up ends its part of the round (`failed`).
    """
    self._started()
    s = self.searchers[0]
    per = math.ceil(num_prompts / (len(self.searchers) * jax.process_count() * s.num_prompts))
    for i in range(len(self.searchers)):
      done = 0
      while done < per and self._errors[i] is None:
        done += self._step(i)

  def _run(self, i: int) -> None:
    """Thread body: batches until stopped or given up (paced: while it holds its share of a
    window's prompts unmerged, it waits for the merge)."""
    sr = self.searchers[i]
    share = math.ceil(self.schedule.window_prompts / (len(self.searchers) * jax.process_count()))
    try:
      while not self._stop.is_set() and self._errors[i] is None:
        if self.schedule.paced and len(sr.buffer.peek_new()) >= share * sr.num_samples:
          self._stop.wait(0.02)
          continue
        self._step(i)
    except BaseException:  # not an Exception (e.g. SystemExit in the thread): no restart
      self._errors[i] = traceback.format_exc()

  def _step(self, i: int) -> bool:
    """One batch of searcher i; False when it raised (then restarted, or given up)."""
    sr = self.searchers[i]
    try:
      sr.search_once()
    except Exception:
      self._failed(i, traceback.format_exc())
      return False
    if self._retrying[i] and not self._retrying[i] & set(sr.in_flight()):
      self._retrying[i] = set()  # the prompts that failed before went through
    return True

  def _failed(self, i: int, trace: str) -> None:
    """Restarts searcher i, or records why it gives up."""
    sr = self.searchers[i]
    prompts = sorted(set(sr.in_flight()))
    again = sorted(self._retrying[i] & set(prompts))
    if again:
      self._errors[i] = (f"prompt id(s) {again} failed again after a restart (the failure "
                         f"follows the prompt, so it is not retried):\n{trace}")
    elif self._restarts[i] >= self.max_restarts:
      self._errors[i] = (f"failed after {self._restarts[i]} restart(s) "
                         f"(searcher.max_restarts={self.max_restarts}):\n{trace}")
    else:
      self._restarts[i] += 1
      self._retrying[i] = set(prompts)
      sr.restart()
      print(f"WARNING: searcher {sr.id} raised on prompt id(s) {prompts}; restarted "
            f"({self._restarts[i]} of searcher.max_restarts={self.max_restarts}) with the "
            f"latest published weights (version {sr.mailbox.version}), its prompts "
            f"re-queued:\n{trace}", file=sys.stderr, flush=True)

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
    new = distributed.all_gather_entries(new, max_prompt_len=self.layout.prompt_len,
                                         max_completion_len=self.layout.completion_len)
    buffer.add_many(new)
    return len(new)

  def failed(self) -> bool:
    """True on every host when a searcher of any host gave up (also counts the restarts)."""
    counts = distributed.all_gather_ints(
        any(e is not None for e in self._errors), sum(self._restarts))
    self._restarts_all = int(counts[:, 1].sum())
    return bool(counts[:, 0].any())

  def error(self, step: int) -> SearcherError:
    """Every host's failed searchers, for the run's final error (after `failed`)."""
    mine = [f"searcher {sr.id}: {e}" for sr, e in zip(self.searchers, self._errors) if e]
    reasons = [r for host in distributed.all_gather_json(mine) for r in host]
    return SearcherError(
        f"a searcher gave up; the run stopped after saving a checkpoint at step {step}.\n" +
        "\n".join(reasons))

  def snapshot(self) -> tuple[list[Entry], list[list[dict]]]:
    """Every host's entries not yet merged, and [process][searcher] states, for a checkpoint.

    Each searcher's pair is taken together (`Searcher.snapshot`), without waiting
    for a batch; with the global buffer saved at the same step, a resume has every
    entry committed before this call and re-samples only the prompts in flight.
    """
    snaps = [sr.snapshot() for sr in self.searchers]
    entries = distributed.all_gather_entries(
        [e for es, _ in snaps for e in es], max_prompt_len=self.layout.prompt_len,
        max_completion_len=self.layout.completion_len)
    states = [{"searcher": st, "restarts": n} for (_, st), n in zip(snaps, self._restarts)]
    return entries, distributed.all_gather_json(states)

  def load_snapshot(self, entries: Sequence[Entry], states: list[list[dict]]) -> None:
    """A `snapshot` (every host's): each searcher takes back its own entries and cursor."""
    if [len(s) for s in states] != [len(self.searchers)] * jax.process_count():
      raise ValueError(
          f"the checkpoint holds searchers {[len(s) for s in states]} per process; this run has "
          f"{len(self.searchers)} on each of {jax.process_count()} process(es). Resume with the "
          "process count of the run that saved it.")
    for i, (sr, st) in enumerate(zip(self.searchers, states[jax.process_index()])):
      # Checkpoints of older versions hold the searcher's state alone.
      sr.load_snapshot([e for e in entries if e.searcher_id == sr.id], st.get("searcher", st))
      self._restarts[i] = int(st.get("restarts", 0))
    self._restarts_all = sum(int(st.get("restarts", 0)) for host in states for st in host)

  # --- Metrics -------------------------------------------------------------------------------
  def metrics(self) -> dict:
    """This process's searchers: busy fraction since they started, samples, mean reward;
    every host's restarts so far (as of the latest sync)."""
    elapsed = time.perf_counter() - (self._start_time or time.perf_counter())
    busy = sum(sr.stats.busy_seconds for sr in self.searchers) / len(self.searchers)
    samples = sum(sr.stats.num_samples for sr in self.searchers)
    return {"searcher_busy_fraction": min(busy / max(elapsed, 1e-9), 1.0),
            "searcher_samples": samples,
            "searcher_reward_mean": sum(sr.stats.reward_sum for sr in self.searchers) /
                                    max(samples, 1),
            "searcher_restarts": self._restarts_all,
            # The latest sampler-vs-trainer check of this process's searchers (nan: none yet).
            "sampler_mismatch": max((sr.stats.mismatch for sr in self.searchers),
                                    key=lambda x: -1.0 if math.isnan(x) else x),
            **self._turn_metrics(samples)}

  def _turn_metrics(self, samples: int) -> dict:
    """Multi-turn searchers' figures since the run started (none for single-turn rows)."""
    total = lambda name: sum(getattr(sr.stats, name) for sr in self.searchers)
    if not total("turns"):
      return {}
    return {"tools/turns_per_sample": total("turns") / max(samples, 1),
            "tools/calls_per_sample": total("tool_calls") / max(samples, 1),
            "tools/error_fraction": total("tool_errors") / max(total("tool_calls"), 1),
            "tools/reply_failures": total("reply_failures"),
            "tools/replies_dropped_per_sample": total("replies_dropped") / max(samples, 1),
            "tools/seconds_per_call": total("tool_seconds") / max(total("tool_calls"), 1),
            "tools/correct_with_tool_fraction": total("correct_with_tool") /
                                                max(total("correct"), 1)}
