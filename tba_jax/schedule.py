"""When the periodic things of a run happen: one predicate, and the searchers' schedule.

  due(done, every, total)   # after `done` steps: every `every` steps (0: never), and at `total`
  Schedule(mode, sync_every, prefill_prompts, window_prompts, paced)   # fixed for the run

Every periodic action of the trainer's loop (log, sync, reference reset,
evaluation, checkpoint) asks `due`, as big_vision's `u.itstime`. `Schedule` is how
the searchers run relative to the trainer, decided once when the pool is built
(searcher_pool.SearcherPool's prefill / before_step / sync read it; the loop
never asks which mode it is in):
  async      one thread per searcher samples while the trainer trains; every k
             steps the weights are published and the new entries merged (`paced`: a
             searcher samples a window's prompts, then waits for that merge);
  alternate  the searchers run a round in the trainer's thread, then the trainer
             takes k steps: a round at the pre-fill and at the first step of every
             window of k steps (what one device does; with k=1, m=1 and no reuse,
             exactly synchronous on-policy training).
"""
from __future__ import annotations

import dataclasses
import math

MODES = ("async", "alternate")


def due(done: int, every: int, total: int | None = None) -> bool:
  """Whether a periodic action runs after `done` steps: every `every` steps (0: never)
  and, when `total` is given, at the last step."""
  return (every > 0 and done % every == 0) or (total is not None and done == total)


@dataclasses.dataclass(frozen=True)
class Schedule:
  """How the searchers run relative to the trainer (module doc)."""
  mode: str = "async"
  sync_every: int = 1       # k: trainer steps between weight syncs (sync.every)
  prefill_prompts: int = 1  # alternate: prompts of one pre-fill round (buffer.num_prompts)
  window_prompts: int = 1   # alternate: prompts of the round before each window of k steps
  # async: a searcher that holds its share of window_prompts not yet merged waits for the
  # next merge (sync.paced: where searchers and trainer share cores, samples the trainer
  # never takes cost it compute)
  paced: bool = False

  def __post_init__(self):
    if self.mode not in MODES or self.sync_every < 1:
      raise ValueError(f"mode={self.mode!r} (one of {MODES}), sync_every={self.sync_every} >= 1")

  @classmethod
  def of(cls, mode: str, sync_every: int, num_prompts: int, m: float,
         paced: bool = False) -> Schedule:
    """A window's round searches what k steps want from the latest sync: k x B x m prompts,
    at least B (the pre-fill's rounds search B)."""
    return cls(mode, sync_every, num_prompts,
               max(num_prompts, math.ceil(sync_every * num_prompts * m)), paced)
