"""A row source that never waits for a batch's longest row: continuous batching.

  rows = StreamingRows(sampler, num_slots=N, in_flight_updates=True)
  searcher = Searcher(id, rows=rows, ...)   # searcher.py
  searcher.search_once()   # until num_prompts more prompt groups are committed

`rows.StaticRows` samples P prompts x S at a time and waits for the longest
row. This source keeps a pool of N row slots (`continuous.Stream`) full from
its searcher's prompt stream: it takes whole prompts (S rows each, one
temperature per prompt group from the searcher's `Exploration`), and each
`sample` runs one decode chunk and hands back the groups whose S samples have
all ended, in taking order; the searcher scores them (at most P groups per
reward batch) and commits their entries.

Determinism: the stream is one endless static batch. Its key is the static
source's batch-0 key, fold_in(key, 0), and the g-th group taken (the cursor:
groups taken) samples rows g*S .. g*S+S-1 (prompt-major, as a static batch
numbers its rows) at the temperature of choice g. With unchanged weights a
row's tokens depend on its row id only (continuous.py), so at the sampler's
own temperature (no exploration) the first P groups equal the static source's
first batch. Groups dropped by a restart or a snapshot are re-queued as
prompts by the searcher and sample again under new group indices.

Weights. With `in_flight_updates` (sync.in_flight_updates) the source takes
newly published weights between decode chunks without draining its slots: a
row then spans versions, and its entry records the oldest (`Entry.version`, its
prompt's prefill; staleness is measured from it) and the newest
(`Entry.last_version`). TB uses no behaviour log-probs, so such samples are
ordinary off-policy data; RLOO / GRPO keep the per-token log-probs the sampler
recorded. Without it, new weights wait until the slots are empty (no prompt is
taken meanwhile), so every entry's versions are exact, as the static source's.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import jax

from tba_jax import continuous, paged_kv
from tba_jax.replies import Replies
from tba_jax.sampler import Sampler
from tba_jax.rows import Feed, Group, Sample, Sampled


@dataclasses.dataclass
class _Group:
  """A prompt's S rows while they are in the slots (or queued for them)."""
  prompt_id: int
  temperature: float
  ended: dict[int, continuous.Completion] = dataclasses.field(default_factory=dict)  # by sample


class StreamingRows:
  """A RowSource (searcher.py) over a continuous-batching pool of `num_slots` rows (module
  doc); `chunk_steps`, `window_step`, `kv_pages` and `page_size` as continuous.Stream's.
  `turns`: (environment, encode, decode) of a multi-turn task: the pool's rows then take
  turns (replies between model turns: continuous.py, replies.py)."""

  def __init__(self, sampler: Sampler, *, num_slots: int, in_flight_updates: bool = True,
               chunk_steps: int = continuous.DEFAULT_CHUNK_STEPS,
               window_step: int = continuous.DEFAULT_WINDOW_STEP, kv_pages: int | None = 0,
               page_size: int = paged_kv.DEFAULT_PAGE_SIZE, turns: tuple | None = None):
    continuous.check_pool(sampler, num_slots, chunk_steps, window_step)
    self.kv_pages, self.page_size = kv_pages, page_size  # paged_kv.py (0: full rows)
    self.sampler, self.num_slots, self.in_flight_updates = sampler, num_slots, in_flight_updates
    self.turns = turns
    self._replies = None if turns is None else Replies(*turns)  # one thread pool
    self.chunk_steps, self.window_step = chunk_steps, window_step
    self.num_groups = 0  # prompt groups taken; group g samples rows g*S .. g*S+S-1
    self._groups: dict[int, _Group] = {}  # taken and not handed back, in taking order
    self._slots: continuous.Stream | None = None  # built at the next sample (after a drop)

  def sample(self, feed: Feed) -> Sampled:
    """One decode chunk: weights, top-up, decode; the groups that ended in it."""
    self._take_weights(feed)
    self._top_up(feed)
    s = feed.num_samples
    for c in self._slots.step():
      g, sample = divmod(c.row_id, s)
      self._groups[g].ended[sample] = c
    ready = [g for g, group in self._groups.items() if len(group.ended) == s]
    groups = []
    for g in ready:
      group = self._groups.pop(g)
      groups.append(Group(group.prompt_id, group.temperature, tuple(
          # A multi-turn row's masks and counters: TurnStats' fields are Sample's.
          Sample(c.tokens, c.tempered_logprobs, c.first_version, c.last_version,
                 **(vars(c.turn_stats) if c.turn_stats else {}))
          for c in (group.ended[k] for k in range(s)))))
    return Sampled(groups, (self._slots.version, self._slots.params))

  def _take_weights(self, feed: Feed) -> None:
    """The mailbox's newest weights, between two decode chunks (module doc, Weights)."""
    version, params = feed.mailbox.get()
    if self._slots is None:
      self._slots = continuous.Stream(
          self.sampler, params, jax.random.fold_in(feed.key, 0), num_slots=self.num_slots,
          max_prompt_len=feed.max_prompt_len, chunk_steps=self.chunk_steps,
          window_step=self.window_step, kv_pages=self.kv_pages, page_size=self.page_size,
          replies=self._replies)
      self._slots.set_params(params, version)
    elif version != self._slots.version and (self.in_flight_updates or not self._slots.busy()):
      self._slots.set_params(params, version)

  def _top_up(self, feed: Feed) -> None:
    """Takes whole prompts until more rows wait than the slots hold, so a decode chunk
    stops to refill as soon as a row ends. Without in-flight updates nothing is taken
    while newer weights wait: the slots drain, then take them."""
    slots, s = self._slots, feed.num_samples
    if not self.in_flight_updates and feed.mailbox.version != slots.version:
      return
    while slots.num_queued + slots.num_in_flight < slots.num_slots + s:
      with feed.lock:  # a snapshot sees the prompt taken and the cursor together
        (prompt_id,) = feed.take(1)
        g, self.num_groups = self.num_groups, self.num_groups + 1
        temperature = feed.temperature(g)
        self._groups[g] = _Group(prompt_id, temperature)
      slots.add([feed.prompt_tokens[prompt_id]] * s, range(g * s, g * s + s), temperature,
                # (an environment's replies see the row's problem)
                problems=[feed.problems[prompt_id]] * s if self.turns else None)

  def committed(self, groups: Sequence[Group]) -> None:
    pass  # handed-back groups left the pool already

  def drop(self) -> None:
    """Every unfinished group is dropped; the next sample builds fresh slots with the
    newest weights."""
    self._groups, self._slots = {}, None

  def cursor(self) -> dict:
    return {"num_groups": self.num_groups}

  def load_cursor(self, state: dict) -> None:
    self.num_groups = int(state.get("num_groups", 0))  # absent in a static searcher's state
    self.drop()
