"""Reward stages: how a searcher scores its completions.

A task's `reward` is a RewardStage. Each searcher builds it once, on its own
devices, and calls what it gets on every batch it samples; the evaluator does
the same on the evaluation devices:

    score = task.reward.build(mesh)   # loads any models onto `mesh`, jits their programs
    rewards = score(batch)            # RewardBatch (N completions) -> float32 [N]

Anything with that shape fits the slot: a rule in Python (`TextReward`, GSM8K's
answer check), a reward model's score (`ModelReward`), or a victim model's
replies scored by a classifier (tasks/redteam.py). A stage sees whole batches,
so model calls are batched and jitted; the searcher never knows which kind it
holds.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Protocol, Sequence

import numpy as np

from tba_jax.tasks import Problem


@dataclasses.dataclass(frozen=True)
class RewardBatch:
  """N completions, one row each (a searcher batch is prompt-major: S rows per prompt)."""
  problems: Sequence[Problem]        # [N] the task data of each row's prompt
  prompts: Sequence[Sequence[int]]   # [N] prompt token ids, as sampled (BOS included)
  completions: Sequence[np.ndarray]  # [N] completion token ids, the EOS token included
  ended_with_eos: np.ndarray         # [N] bool; False = cut off at the length limit
  texts: Sequence[str]               # [N] decoded completions (special tokens skipped)

  def __len__(self) -> int:
    return len(self.problems)


RewardFn = Callable[[RewardBatch], np.ndarray]  # -> float32 [N]


class RewardStage(Protocol):
  def build(self, mesh) -> RewardFn:
    """The scorer for one searcher (or the evaluator) on `mesh`, a searcher mesh."""


@dataclasses.dataclass(frozen=True)
class TextReward:
  """fn(completion text, gold) -> reward, in Python, per completion (GSM8K's 0/1 check)."""
  fn: Callable[[str, float], float]

  def build(self, mesh) -> RewardFn:
    del mesh  # no devices involved
    return lambda batch: np.array([self.fn(text, problem.gold) for text, problem
                                   in zip(batch.texts, batch.problems)], np.float32)


def as_stage(reward: RewardStage | Callable[[str, float], float]) -> RewardStage:
  """A RewardStage as it is; a plain (text, gold) -> float function as a TextReward."""
  return reward if hasattr(reward, "build") else TextReward(reward)
