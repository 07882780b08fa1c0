"""What a searcher's row source hands back (`Sample`, `Group`, `Sampled`), what it may ask of
its searcher (`Feed`), the protocol itself (`RowSource`) and the static one (`StaticRows`).

  rows = StaticRows(sampler)   # P prompts x S rows through the static sampler per `sample`
  sampled = rows.sample(feed)  # the groups that ended, and the weights they ended under

The other sources (streaming.StreamingRows, turns.TurnRows) build on these types; the
searcher (tba_jax/searcher.py) scores and commits what they hand back.
"""
from __future__ import annotations

import dataclasses
import threading
from typing import Protocol, Sequence

import jax
import numpy as np

from tba_jax.model import Params
from tba_jax.sampler import Sampler
from tba_jax.tasks import Problem
from tba_jax.weight_sync import Mailbox


# ---------------------------------------------------------------------------
# What a row source hands back, and what it may ask of its searcher.
# ---------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Sample:
  """One ended row: a completion and the versions it was decoded under."""
  tokens: np.ndarray              # [n] int32, the EOS included when it ended on one
  behaviour_logprobs: np.ndarray  # [n] float32: the sampler's tempered per-token log-probs
  first_version: int              # the version its prompt was prefilled under (staleness)
  last_version: int               # the version of its last decode step
  # Multi-turn rows (turns.TurnRows): 1 = a token the model generated, 0 = an environment's
  # reply (None: all the model's); 1 = a token whose text the reward reads (None: all; the
  # environment's score, tasks.environment.SCORES); what the row's environment did
  # (SearchStats).
  model_mask: np.ndarray | None = None
  reward_mask: np.ndarray | None = None
  turns: int = 1
  tool_calls: int = 0
  tool_errors: int = 0
  reply_failures: int = 0
  tool_seconds: float = 0.0
  replies_dropped: int = 0


@dataclasses.dataclass(frozen=True)
class Group:
  """A prompt's S samples, all ended, in sample order (one temperature for the group)."""
  prompt_id: int
  temperature: float
  samples: tuple[Sample, ...]


@dataclasses.dataclass(frozen=True)
class Sampled:
  """A row source's output: the groups that ended, and the (version, params) it sampled
  with at the end (rows wholly of that version are what the mismatch check recomputes)."""
  groups: list[Group]
  policy: tuple[int, Params]


class Feed(Protocol):
  """What a row source may use of its searcher. `take` and any change of the source's
  cursor happen with `lock` held, so a snapshot sees a prompt taken and its cursor
  together; everything else runs in the searcher's thread, unlocked."""
  lock: threading.Lock
  key: jax.Array            # the searcher's key: its sources' random streams fold into it
  mailbox: Mailbox          # the newest published weights
  prompt_tokens: dict[int, list[int]]
  problems: dict[int, Problem]  # the task data of each prompt id (an environment's rows)
  num_prompts: int          # P: groups per reward batch (a static batch's prompts)
  num_samples: int          # S: rows per prompt
  max_prompt_len: int

  def take(self, n: int) -> list[int]:
    """The next n prompt ids of the stream, in flight until committed (lock held)."""

  def temperature(self, index: int) -> float:
    """The sampling temperature of choice `index` (Exploration; a pure function of it)."""


class RowSource(Protocol):
  """How a searcher's completions are sampled (module doc): `StaticRows`, or
  streaming.StreamingRows. Its cursor (where its random choices continue) is saved and
  restored with the searcher's state."""
  sampler: Sampler  # the model, its devices and the decoding settings (the searcher scores
                    # on the same mesh, at the same temperature and with the same EOS ids)

  def sample(self, feed: Feed) -> Sampled:
    """Takes prompts from `feed` as it needs them and decodes until it has something to
    hand back: StaticRows one batch of feed.num_prompts groups, StreamingRows one decode
    chunk (maybe no group ended in it)."""

  def committed(self, groups: Sequence[Group]) -> None:
    """The searcher committed `groups` (called with feed.lock held)."""

  def drop(self) -> None:
    """Forgets the unfinished work (a restart or a loaded snapshot; the searcher re-queues
    its prompts)."""

  def cursor(self) -> dict:
    """Where this source's random choices continue (JSON-able; saved by snapshots)."""

  def load_cursor(self, state: dict) -> None:
    """Continues from a `cursor()` (and drops any unfinished work)."""


class StaticRows:
  """A RowSource of static batches: num_prompts prompts x S rows through the sampler,
  one batch per `sample`, waiting for its longest row.

  Batch b (the cursor: batches committed) samples with fold_in(feed.key, b) at the
  temperature of choice b; a batch retried after a restart is the batch it replaces
  (same key, same temperature), with the newest weights the mailbox holds."""

  def __init__(self, sampler: Sampler):
    self.sampler = sampler
    self.num_batches = 0

  def sample(self, feed: Feed) -> Sampled:
    version, params = feed.mailbox.get()  # newest weights; the old ones stay valid
    with feed.lock:
      ids, b = feed.take(feed.num_prompts), self.num_batches
    temperature = feed.temperature(b)
    # [P] prompts -> [P * S] rows, prompt-major: row r is prompt ids[r // S].
    s = feed.num_samples
    rows = [i for i in ids for _ in range(s)]
    out = self.sampler(params, [feed.prompt_tokens[i] for i in rows],
                       jax.random.fold_in(feed.key, b), temperature=temperature)
    row = lambda r: Sample(out.tokens[r, :out.lengths[r]], out.tempered_logprobs[r, :out.lengths[r]],
                           version, version)
    groups = [Group(i, temperature, tuple(row(k * s + j) for j in range(s)))
              for k, i in enumerate(ids)]
    return Sampled(groups, (version, params))

  def committed(self, groups: Sequence[Group]) -> None:
    self.num_batches += 1  # one batch per sample, committed whole

  def drop(self) -> None:
    pass  # nothing outlives a batch

  def cursor(self) -> dict:
    return {"num_batches": self.num_batches}

  def load_cursor(self, state: dict) -> None:
    self.num_batches = int(state["num_batches"])
