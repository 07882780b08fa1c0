"""Host-side replay buffer: per-prompt entries, the m rule, save/restore, merging.

  buf = ReplayBuffer(max_per_prompt=100, max_entries=None, eviction="oldest", seed=0)
  buf.add(entry) / buf.add_many(entries)       # searchers or merges; thread-safe
  buf.mark_sync()                               # trainer, once per weight sync
  batch, info = buf.sample(P, K, m, layout=batch.Layout(Tp, Tc, pad))
  arrays = entries.pack(local.drain_new(), max_prompt_len=Tp, max_completion_len=Tc)
  global_buf.add_many(entries.unpack(arrays))   # same entries, same order -> same buffer
  global_buf.load_state_dict(old.state_dict())  # exact, including the RNG (buffer_state.py)

Sync windows. `mark_sync()` closes a window: the prompts that received at least
one entry since the previous `mark_sync()` (or since construction) become the
"latest" prompts, replacing the previous set, and every latest prompt becomes
available again to the m branch; a window in which no prompt was refreshed
leaves the latest prompts as they were (the authors' trainer buffer keeps its
online set until new data arrives). The trainer calls it right after merging the
searchers' new entries at each weight sync (and once after pre-filling), so
"latest" means "refreshed at the latest sync". Between syncs the m branch takes
latest prompts without replacement, across slots AND across `sample` calls. Once
every latest prompt was taken, `reuse_latest=True` starts another pass over them
(the authors' buffer_utils.sample_cid refills its online set with the ones already
drawn), so the slots that picked the m branch keep training on the freshest data
when the searchers fall behind; `reuse_latest=False` sends those slots to the
any-prompt branch instead (counted in info["num_latest_fallback"]). A batch never
holds a latest prompt twice (distinct prompts carry more information; a prompt
in two slots would be two groups of K, batch.py); a slot with none left for it
falls back too.

The m branch draws its K entries uniformly from the prompt's newest generation:
the entries it received in the sync window of its newest entry (the authors'
CommentBuffer.get_batch draws from its n_online items, those merged since the
trainer iteration last changed: buffer_utils.py L26-31, L46-48, L76-83), never
from older ones, without replacement when there are at least K. A window holds
whole search batches (a searcher commits a prompt's S samples together, and a
merge ships what was committed), so a streaming searcher's group whose rows
started under two policy versions is one generation, and a red-teaming prompt's
generation is every attack merged at its latest sync.

Staleness enters here: every entry keeps the policy version that sampled it,
and `sample` returns those versions per row; the loop turns them into metrics.

Priorities. The any-prompt branch's reward softmax and the near-duplicate filter
rank entries by `priority`: "reward" (the entry's reward; red-teaming's c, Lee et
al.'s default `c_reward`) or "log_target" (log pi_ref(y) + reward / beta, the TB
target's log-density at the loss's beta: Lee et al.'s `reward`, lm + c / beta).

Red-teaming's buffer (TBA B.3, Lee et al. GFNOrg/red-teaming utils.py L289-480):
`freeze_size()` caps the buffer at its current size (TBA: from step 4000 on,
oldest out first); `near_duplicate=tol > 0` keeps, of two completions of a prompt
whose token edit distance (EOS left out) is below tol x (len_a + len_b), the one
of higher priority (Lee's edit metric, tol 0.25; near_duplicates.py). The filter compares
a new entry with every entry of its prompt (O(entries) per insert): meant for buffers of
thousands, as Lee's (1k-5k), not TBA's 100k.
"""
from __future__ import annotations

import bisect
import collections
import dataclasses
import heapq
import itertools
import threading
from typing import Iterable

import numpy as np

from tba_jax import batch as batch_lib
from tba_jax import buffer_state, near_duplicates
from tba_jax.batch import TrainBatch
from tba_jax.choices import EVICTION_POLICIES, PRIORITIES
from tba_jax.entries import Entry, check_fits, normalized


def entry_probs(rewards: np.ndarray, tau: float, reward_weight: float) -> np.ndarray:
  """reward_weight * softmax(rewards / tau) + (1 - reward_weight) * uniform."""
  z = np.asarray(rewards, np.float64) / tau
  soft = np.exp(z - z.max())
  return reward_weight * soft / soft.sum() + (1.0 - reward_weight) / len(z)


def _draw(p: np.ndarray, k: int, rng: np.random.Generator) -> tuple[np.ndarray, bool]:
  """k indices by weights p; with replacement only when there are fewer than k."""
  n = len(p)
  if n >= k:
    # Gumbel top-k: the k largest log p_i + Gumbel_i are a draw without replacement in which
    # each pick is proportional to p among the entries not yet picked (the law of
    # rng.choice(replace=False, p=p)); unlike rng.choice it tolerates weights that underflowed.
    with np.errstate(divide="ignore"):
      keys = np.log(p) + rng.gumbel(size=n)
    return np.argsort(-keys, kind="stable")[:k], False
  # Every unique entry once, the shortfall with replacement, so a small group stays diverse
  # (the authors draw all K with replacement here: rng.choice(n, K, replace=True)).
  return np.concatenate([np.arange(n), rng.choice(n, size=k - n, p=p)]), True


class ReplayBuffer:
  """Thread-safe per-prompt buffer (one lock around every public method).

  Entries carry an insertion counter (`seq`, strictly increasing, never reused):
  "newest" and "oldest" always mean by seq. A re-added completion (same prompt,
  same tokens) replaces the old entry and gets a new seq; with dedup=False it is
  kept as one more entry (with max_per_prompt = K = S, each prompt then holds
  exactly its latest S samples: synchronous on-policy training reuses nothing).
  `eviction` applies when `max_entries` is set: "oldest" evicts the smallest
  seq; "lowest_reward" the smallest reward, ties broken by the smallest seq (the
  oldest goes first).
  A prompt whose last entry is evicted is forgotten (tokens, latest status).
  """

  def __init__(self, max_per_prompt: int = 100, max_entries: int | None = None,
               eviction: str = "oldest", seed: int = 0, dedup: bool = True,
               priority: str = "reward", priority_beta: float = 1.0,
               near_duplicate: float = 0.0):
    if max_per_prompt < 1 or (max_entries is not None and max_entries < 1):
      raise ValueError(f"caps must be >= 1: max_per_prompt={max_per_prompt}, "
                       f"max_entries={max_entries}")
    if eviction not in EVICTION_POLICIES:
      raise ValueError(f"eviction={eviction!r}, expected one of {EVICTION_POLICIES}")
    if priority not in PRIORITIES or not priority_beta > 0 or near_duplicate < 0:
      raise ValueError(f"priority={priority!r} (one of {PRIORITIES}), priority_beta="
                       f"{priority_beta} (> 0), near_duplicate={near_duplicate} (>= 0)")
    self.max_per_prompt, self.max_entries, self.eviction = max_per_prompt, max_entries, eviction
    self.dedup, self.near_duplicate = dedup, near_duplicate
    self.priority, self.priority_beta = priority, priority_beta
    self._lock = threading.Lock()
    # The buffer owns its RNG so a checkpoint of the buffer alone reproduces future batches,
    # and hosts holding identical buffers sample identical global batches.
    self._rng = np.random.default_rng(seed)
    self._clear()

  def _clear(self):
    self._prompts: dict[int, np.ndarray] = {}
    # prompt id -> key (_key) -> (seq, entry), in seq order (a replace moves to the end).
    self._entries: dict[int, collections.OrderedDict[bytes, tuple[int, Entry]]] = {}
    # seq -> (prompt id, key) for every live entry, in seq order: oldest first
    # for eviction, newest last for drain_new.
    self._by_seq: collections.OrderedDict[int, tuple[int, bytes]] = collections.OrderedDict()
    self._heap: list[tuple[float, int, int, bytes]] = []  # lowest_reward only; lazily pruned
    self._next_seq = 0
    self._drain_from = 0            # drain_new returns live entries with seq >= this
    self._pending: set[int] = set()  # prompts refreshed since the last mark_sync
    self._latest: list[int] = []     # prompts refreshed at the latest sync (sorted)
    self._latest_left: list[int] = []  # those not yet taken by the m branch (sorted)
    # The first seq of each sync window after the first (one per mark_sync that closed a
    # window with new entries): window j holds seqs [windows[j - 1], windows[j]).
    self._windows: list[int] = []
    self._num_syncs = self._num_added = self._num_replaced = self._num_evicted = 0
    self._num_near_duplicates = 0  # entries not added: a near duplicate ranked as high
    self._reward_sum, self._length_sum, self._version_sum = 0.0, 0, 0

  # --- Insertion and eviction -------------------------------------------------------------
  def add(self, entry: Entry) -> None:
    self.add_many([entry])

  def add_many(self, entries: Iterable[Entry]) -> None:
    """Adds in order, atomically with respect to sample/drain/state_dict."""
    entries = [normalized(e) for e in entries]  # validate and copy outside the lock
    with self._lock:
      for e in entries:
        self._add_locked(e)

  def _add_locked(self, e: Entry) -> None:
    pid, key = e.prompt_id, self._key(e, self._next_seq)
    stored = self._prompts.get(pid)
    if stored is not None and not np.array_equal(stored, e.prompt):
      raise ValueError(f"prompt id {pid}: prompt tokens differ from the ones already stored")
    per = self._entries.get(pid)
    if per is not None and key in per:  # same completion again: the newer sample wins
      self._forget_entry(*per.pop(key))
      self._num_replaced += 1
    elif per and self.near_duplicate > 0:
      close = self._first_near_duplicate(e, per)
      if close is not None:
        if self._score(per[close][1]) >= self._score(e):
          self._num_near_duplicates += 1
          return
        self._forget_entry(*per.pop(close))
        self._num_replaced += 1
    self._insert(e, self._next_seq)
    self._next_seq += 1
    self._pending.add(pid)
    self._num_added += 1
    per = self._entries[pid]
    while len(per) > self.max_per_prompt:
      self._evict(pid, next(iter(per)))
    if self.max_entries is not None:
      while len(self._by_seq) > self.max_entries:
        self._evict(*self._global_victim())

  def _score(self, e: Entry) -> float:
    """The entry's priority (module docstring)."""
    if self.priority == "reward":
      return e.reward
    return e.ref_logprob_sum + e.reward / self.priority_beta

  def _first_near_duplicate(self, e: Entry, per) -> bytes | None:
    """The key of the oldest entry in `per` within the edit-distance tolerance of `e`."""
    tokens = lambda x: x.completion[:x.length - x.ended_with_eos]  # EOS left out
    i = near_duplicates.first_within(tokens(e), [tokens(item[1]) for item in per.values()],
                                     self.near_duplicate)
    return None if i is None else list(per)[i]

  def freeze_size(self) -> int:
    """Caps the buffer at its current size (or its cap, if smaller); returns the cap.

    Later entries evict per `eviction`; the cap is saved with the state."""
    with self._lock:
      size = max(len(self._by_seq), 1)
      self.max_entries = size if self.max_entries is None else min(self.max_entries, size)
      return self.max_entries

  def _key(self, e: Entry, seq: int) -> bytes:
    """Entries of a prompt are keyed by their tokens (de-dup) or by their seq."""
    return e.completion.tobytes() if self.dedup else seq.to_bytes(8, "little")

  def _insert(self, e: Entry, seq: int) -> None:
    """Indexes one entry as the newest (no checks, de-dup or caps)."""
    e = dataclasses.replace(e, prompt=self._prompts.setdefault(e.prompt_id, e.prompt))
    key = self._key(e, seq)
    self._entries.setdefault(e.prompt_id, collections.OrderedDict())[key] = (seq, e)
    self._by_seq[seq] = (e.prompt_id, key)
    self._reward_sum += e.reward
    self._length_sum += e.length
    self._version_sum += e.version
    if self.eviction == "lowest_reward":  # also uncapped: freeze_size may cap it later
      heapq.heappush(self._heap, (e.reward, seq, e.prompt_id, key))

  def _forget_entry(self, seq: int, e: Entry) -> None:
    del self._by_seq[seq]
    self._reward_sum -= e.reward
    self._length_sum -= e.length
    self._version_sum -= e.version

  def _evict(self, pid: int, key: bytes) -> None:
    per = self._entries[pid]
    self._forget_entry(*per.pop(key))
    self._num_evicted += 1
    if not per:
      del self._entries[pid], self._prompts[pid]
      self._pending.discard(pid)
      if pid in self._latest_left:
        self._latest_left.remove(pid)

  def _global_victim(self) -> tuple[int, bytes]:
    if self.eviction == "oldest":
      return self._by_seq[next(iter(self._by_seq))]
    if len(self._heap) > 2 * len(self._by_seq) + 1024:  # drop stale items now and then
      self._heap = [h for h in self._heap if h[1] in self._by_seq]
      heapq.heapify(self._heap)
    while True:  # (reward, seq) keys are unique, so the pop order is deterministic
      _, seq, pid, key = heapq.heappop(self._heap)
      if seq in self._by_seq:  # not replaced or evicted since it was pushed
        return pid, key

  # --- Sync windows and merging -----------------------------------------------------------
  def mark_sync(self) -> int:
    """Closes the sync window (module docstring); returns the number of latest prompts."""
    with self._lock:
      if self._pending:  # else the latest prompts stay those of the previous window
        self._latest = sorted(self._pending)
        self._latest_left = list(self._latest)
        self._pending.clear()
        self._windows.append(self._next_seq)
      self._num_syncs += 1
      return len(self._latest)

  def _window_start(self, seq: int) -> int:
    """The first seq of the sync window that holds `seq`."""
    i = bisect.bisect_right(self._windows, seq)
    return self._windows[i - 1] if i else 0

  def drain_new(self) -> list[Entry]:
    """Entries added since the previous drain that are still held, oldest first.

    For a searcher's local buffer feeding the global one; an entry replaced or
    evicted locally before the drain is not shipped (its successor is).
    """
    with self._lock:
      new = self._new_locked()
      self._drain_from = self._next_seq
      return new

  def peek_new(self) -> list[Entry]:
    """What `drain_new` would return, without draining (a checkpoint of a local buffer)."""
    with self._lock:
      return self._new_locked()

  def _new_locked(self) -> list[Entry]:
    new = []
    for seq in reversed(self._by_seq):
      if seq < self._drain_from:
        break
      pid, key = self._by_seq[seq]
      new.append(self._entries[pid][key][1])
    return new[::-1]

  def entries(self, prompt_id: int | None = None) -> list[Entry]:
    """Live entries (of one prompt, or all), oldest first."""
    with self._lock:
      if prompt_id is not None:
        return [e for _, e in self._entries.get(prompt_id, {}).values()]
      return [self._entries[p][k][1] for p, k in self._by_seq.values()]

  def __len__(self) -> int:
    with self._lock:
      return len(self._by_seq)

  def stats(self) -> dict[str, float]:
    """Scalars for metrics; O(1)."""
    with self._lock:
      n = len(self._by_seq)
      mean = lambda s: s / n if n else float("nan")
      return {"num_prompts": len(self._entries), "num_entries": n,
              "mean_reward": mean(self._reward_sum), "mean_length": mean(self._length_sum),
              "mean_version": mean(self._version_sum), "num_latest": len(self._latest),
              "num_latest_left": len(self._latest_left), "num_pending": len(self._pending),
              "num_syncs": self._num_syncs, "num_added": self._num_added,
              "num_replaced": self._num_replaced, "num_evicted": self._num_evicted,
              "num_near_duplicates": self._num_near_duplicates}

  # --- Sampling: the m rule ---------------------------------------------------------------
  def sample(self, num_prompts: int, samples_per_prompt: int, m: float,
             rng: np.random.Generator | None = None, *, layout: batch_lib.Layout,
             include_eos: bool = True,
             reward_tau: float = 1.0, reward_weight: float = 0.0,
             reuse_latest: bool = True) -> tuple[TrainBatch, dict]:
    """A [P x K] TrainBatch (P = num_prompts slots, K = samples_per_prompt) and info.

    Each slot independently takes the m branch with probability m: a latest
    prompt not yet taken in this sync window (once all were taken: another pass
    with `reuse_latest`, else the any-prompt branch) and K entries drawn
    uniformly from its newest generation (module docstring). Otherwise the
    any-prompt branch: a uniformly chosen prompt not already in this batch (any prompt once all are
    in it) and K entries drawn by `entry_probs(rewards, reward_tau,
    reward_weight)`. Either branch draws without replacement unless there are
    fewer than K entries to draw from.
    `rng` defaults to the buffer's own generator (saved with the buffer). A
    failed call (e.g. an entry too long) leaves the buffer and the RNG untouched.

    info: prompt_ids [P], from_latest [P] bool, with_replacement [P] bool,
    entry_seqs / versions / searcher_ids [N], num_from_latest,
    num_latest_fallback (m-branch slots served by the any-prompt branch),
    num_latest_left (after this call), sync_index (mark_sync calls so far).
    """
    if not 0.0 <= m <= 1.0 or not 0.0 <= reward_weight <= 1.0 or reward_tau <= 0:
      raise ValueError(f"need 0 <= m <= 1, 0 <= reward_weight <= 1, reward_tau > 0; got "
                       f"m={m}, reward_weight={reward_weight}, reward_tau={reward_tau}")
    if num_prompts < 1 or samples_per_prompt < 1:
      raise ValueError(f"num_prompts={num_prompts}, samples_per_prompt={samples_per_prompt}")
    k = samples_per_prompt
    with self._lock:
      if not self._by_seq:
        raise ValueError("cannot sample from an empty replay buffer (pre-fill it first)")
      rng = self._rng if rng is None else rng
      rng_state = rng.bit_generator.state
      latest_left = list(self._latest_left)
      try:
        slots, fallback = self._select(num_prompts, k, m, rng, latest_left, reward_tau,
                                       reward_weight, reuse_latest)
        check_fits((e for s in slots for _, e in s[3]), layout.prompt_len, layout.completion_len)
      except BaseException:
        rng.bit_generator.state = rng_state
        raise
      self._latest_left = latest_left
      info = {"num_latest_left": len(latest_left), "sync_index": self._num_syncs}
    # Entries are immutable, so the arrays are built outside the lock.
    rows = [item for s in slots for item in s[3]]
    # One group per slot (batch.py): a prompt drawn into two slots is two groups of K.
    batch = batch_lib.from_entries([e for _, e in rows], layout, include_eos,
                                   np.repeat(np.arange(num_prompts), k))
    from_latest = np.array([s[1] for s in slots], bool)
    info.update(prompt_ids=np.array([s[0] for s in slots], np.int64), from_latest=from_latest,
                with_replacement=np.array([s[2] for s in slots], bool),
                entry_seqs=np.array([seq for seq, _ in rows], np.int64),
                versions=batch.versions.copy(),
                searcher_ids=np.array([e.searcher_id for _, e in rows], np.int32),
                num_from_latest=int(from_latest.sum()), num_latest_fallback=fallback)
    return batch, info

  def _select(self, num_prompts, k, m, rng, latest_left, tau, weight, reuse_latest):
    """Per slot (prompt id, from_latest, with_replacement, [(seq, entry)] * K)."""
    slots: list = [None] * num_prompts
    wants_latest = rng.random(num_prompts) < m  # one Bernoulli(m) per slot
    fallback, in_batch = 0, set()
    for i in np.flatnonzero(wants_latest):
      free = [j for j, p in enumerate(latest_left) if p not in in_batch]
      if not free and reuse_latest:  # the taken latest prompts become available again
        latest_left.extend(p for p in self._latest if p in self._entries and p not in latest_left)
        free = [j for j, p in enumerate(latest_left) if p not in in_batch]
      if not free:
        fallback += 1
        continue
      pid = latest_left.pop(free[int(rng.integers(len(free)))])
      per = self._entries[pid]  # in seq order: the newest last
      start = self._window_start(next(reversed(per.values()))[0])
      generation = list(itertools.takewhile(lambda item: item[0] >= start,
                                            reversed(per.values())))[::-1]
      idx, replaced = _draw(np.full(len(generation), 1.0 / len(generation)), k, rng)
      # Buffer order within the slot (a uniform draw's order carries no information).
      slots[i] = (pid, True, replaced, [generation[j] for j in np.sort(idx)])
      in_batch.add(pid)
    everyone = sorted(self._entries)
    # Distinct prompts per batch while possible (a repeat is a second group of K: batch.py).
    others = [p for p in everyone if p not in in_batch]
    for i in range(num_prompts):
      if slots[i] is not None:
        continue
      if others:
        pid = others.pop(int(rng.integers(len(others))))
      else:
        pid = everyone[int(rng.integers(len(everyone)))]
      items = list(self._entries[pid].values())
      p = entry_probs(np.array([self._score(e) for _, e in items]), tau, weight)
      idx, replaced = _draw(p, k, rng)
      slots[i] = (pid, False, replaced, [items[j] for j in idx])
    return slots, fallback

  # --- Save / restore (the arrays' format: buffer_state.py) ----------------------------------
  def state_dict(self) -> dict[str, np.ndarray]:
    """The full state; `load_state_dict` on a buffer with the same caps restores it exactly."""
    with self._lock:
      return buffer_state.to_arrays(buffer_state.Snapshot(
          seqs=list(self._by_seq),
          entries=[self._entries[p][k][1] for p, k in self._by_seq.values()],
          prompts=dict(self._prompts), pending=sorted(self._pending), latest=list(self._latest),
          latest_left=list(self._latest_left), windows=list(self._windows),
          counters={n: getattr(self, "_" + n) for n in buffer_state.COUNTERS},
          max_entries=self.max_entries,  # which freeze_size may have lowered
          rng_state=self._rng.bit_generator.state))

  def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
    s = buffer_state.from_arrays(state)
    with self._lock:
      self._clear()
      self._prompts.update(s.prompts)
      for seq, e in zip(s.seqs, s.entries):  # in seq order, so every dict order holds
        self._insert(e, seq)
      self._pending, self._latest, self._latest_left = set(s.pending), s.latest, s.latest_left
      self._windows = s.windows
      for name in buffer_state.COUNTERS:  # self._next_seq, ...
        setattr(self, "_" + name, s.counters[name])
      if s.max_entries is not None:  # None: a state saved before freeze_size existed
        self.max_entries = s.max_entries or None
      self._rng.bit_generator.state = s.rng_state
