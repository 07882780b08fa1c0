"""A searcher that never waits for a batch's longest row: continuous batching.

  searcher = StreamingSearcher(id, sampler=Sampler(..., num_slots=N), ...,
                               in_flight_updates=True)   # the rest as searcher.Searcher
  searcher.search_once()   # until num_prompts more prompt groups are committed

The static `Searcher` samples P prompts x S at a time and waits for the longest
row. This one keeps the sampler's pool of N row slots (`continuous.Stream`)
full from its prompt stream: it queues whole prompts (S rows each, one
temperature per prompt group from `Exploration`), and as soon as all S samples
of a prompt have ended it scores the group with the reward stage, computes the
reference log-probs and commits the group's entries to the local buffer (the
static searcher's `_score` and `_record`; groups that end in the same decode
chunk are scored together, at most P groups per reward batch).

Determinism: the stream is one endless static batch. Its key is the static
searcher's batch-0 key, fold_in(key, 0), and the g-th group taken samples rows
g*S .. g*S+S-1 (prompt-major, as a static batch numbers its rows) at the
temperature drawn from (seed, searcher id, g). With unchanged weights a row's
tokens depend on its row id only (continuous.py), so at the sampler's own
temperature (no exploration) the first P groups equal the static searcher's
first batch. Groups dropped by a restart or a snapshot
are re-queued as prompts and sample again under new group indices.

Weights. With `in_flight_updates` (sync.in_flight_updates) the searcher takes
newly published weights between decode chunks without draining its slots: a
row then spans versions, and its entry records the oldest (`Entry.version`, its
prompt's prefill; staleness is measured from it) and the newest
(`Entry.last_version`). TB uses no behaviour log-probs, so such samples are
ordinary off-policy data; RLOO / GRPO keep the per-token log-probs the sampler
recorded. Without it, new weights wait until the slots are empty (no prompt is
queued meanwhile), so every entry's versions are exact, as the static searcher's.

The SearcherPool contract (searcher.py's docstring) holds: a prompt is in
flight from when it is queued until its group is committed; `snapshot` and
`restart` drop the unfinished groups and re-queue their prompts at the front of
the prompt stream, in the order they were taken.
"""
from __future__ import annotations

import dataclasses
import time

import jax
import numpy as np

from tba_jax import continuous
from tba_jax.searcher import Searcher


@dataclasses.dataclass
class _Group:
  """A prompt's S rows while they are in the slots (or queued for them)."""
  prompt_id: int
  temperature: float
  ended: dict[int, continuous.Completion] = dataclasses.field(default_factory=dict)  # by sample


class StreamingSearcher(Searcher):
  """`Searcher` over a continuous-batching pool of `sampler.num_slots` rows (module doc)."""

  def __init__(self, *args, in_flight_updates: bool = True, **kwargs):
    super().__init__(*args, **kwargs)
    if not self.sampler.num_slots:
      raise ValueError("a StreamingSearcher needs a sampler with num_slots > 0")
    self.in_flight_updates = in_flight_updates
    self.num_groups = 0  # prompt groups taken; group g samples rows g*S .. g*S+S-1
    self._groups: dict[int, _Group] = {}  # taken and not committed, in taking order
    self._slots: continuous.Stream | None = None  # built at the next search (after a restart)

  def search_once(self) -> int:
    """Decode chunks until at least `num_prompts` more groups were committed (a static
    batch's worth: the pool's rounds, stop checks and restarts keep their granularity);
    returns how many samples were committed."""
    start, committed = time.perf_counter(), 0
    while committed < self.num_prompts * self.num_samples:
      self._take_weights()
      self._top_up()
      committed += self._commit_ended(self._slots.step())
    with self._commit:
      self.stats.num_batches += 1
      self.stats.busy_seconds += time.perf_counter() - start
    return committed

  def _take_weights(self) -> None:
    """The mailbox's newest weights, between two decode chunks (module doc, Weights)."""
    version, params = self.mailbox.get()
    if self._slots is None:
      self._slots = self.sampler.stream(params, jax.random.fold_in(self.key, 0),
                                        max_prompt_len=self.max_prompt_len, version=version)
    elif version != self._slots.version and (self.in_flight_updates or not self._slots.busy()):
      self._slots.set_params(params, version)

  def _top_up(self) -> None:
    """Queues whole prompts until more rows wait than the slots hold, so a decode chunk
    stops to refill as soon as a row ends. Without in-flight updates nothing is queued
    while newer weights wait: the slots drain, then take them."""
    slots, s = self._slots, self.num_samples
    if not self.in_flight_updates and self.mailbox.version != slots.version:
      return
    while slots.num_queued + slots.num_in_flight < slots.num_slots + s:
      with self._commit:  # a snapshot sees the prompt taken and in flight together
        (prompt_id,) = self.stream.take(1)
        g, self.num_groups = self.num_groups, self.num_groups + 1
        rng = np.random.default_rng([self.seed, self.id, g])
        temperature = self.explore.temperature(rng, self.sampler.options.temperature)
        self._groups[g] = _Group(prompt_id, temperature)
        self._in_flight.append(prompt_id)
      slots.add([self.prompt_tokens[prompt_id]] * s, range(g * s, g * s + s), temperature)

  def _commit_ended(self, completions: list[continuous.Completion]) -> int:
    """Files `completions` under their groups; scores and commits every group whose S
    rows have all ended (in taking order, at most num_prompts groups per reward batch);
    returns how many samples were committed."""
    s = self.num_samples
    for c in completions:
      g, sample = divmod(c.row_id, s)
      self._groups[g].ended[sample] = c
    ready = [g for g, group in self._groups.items() if len(group.ended) == s]
    for at in range(0, len(ready), self.num_prompts):
      piece = ready[at:at + self.num_prompts]
      rows = [(self._groups[g], self._groups[g].ended[k]) for g in piece for k in range(s)]
      entries = self._score([group.prompt_id for group, _ in rows],
                            [c.tokens for _, c in rows], [c.tempered_logprobs for _, c in rows],
                            [group.temperature for group, _ in rows],
                            [(c.first_version, c.last_version) for _, c in rows])
      with self._commit:  # a snapshot sees a group's entries, or its prompt in flight
        self._record(entries)
        for g in piece:
          del self._groups[g]
        self._in_flight = [group.prompt_id for group in self._groups.values()]
    return len(ready) * s

  # --- Restarts and checkpoints (SearcherPool) -----------------------------------------------
  def restart(self) -> None:
    """After a failed `search_once`: every unfinished group is dropped and its prompt
    re-queued; the next search builds fresh slots with the newest weights."""
    super().restart()
    self._groups, self._slots = {}, None

  def _cursor(self) -> dict:
    return {**super()._cursor(), "num_groups": self.num_groups}

  def load_snapshot(self, entries, state: dict) -> None:
    super().load_snapshot(entries, state)
    self.num_groups = int(state.get("num_groups", 0))  # absent in a static searcher's state
    self._groups, self._slots = {}, None
