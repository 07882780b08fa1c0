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

import jax
import numpy as np

from tba_jax import hf_checkpoints, model, sharding
from tba_jax.model_config import EncoderConfig
from tba_jax.batch import bucket, left_pad, right_pad
from tba_jax.sampler import DEFAULT_BATCH_BUCKETS, DEFAULT_PROMPT_BUCKETS
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


# ---------------------------------------------------------------------------
# Model-scored rewards.
# ---------------------------------------------------------------------------
class Scorer:
  """A sequence-classification model on a searcher mesh: token lists -> scores.

  Rows are padded to a (batch, length) bucket so the jitted forward compiles
  once per bucket: decoders on the left (their score is read at the last real
  token), encoders on the right. Rows are split over the mesh's "data" axis,
  the weights placed as sharding.py places a searcher's. `fn(cfg, params,
  tokens, mask) -> [B, ...]` is what is computed: `model.scores` (the default),
  or e.g. `model.embed` (sentence embeddings: no head needed).
  """

  def __init__(self, model_config, params, mesh, *, pad_id: int = 0,
               length_buckets: Sequence[int] = DEFAULT_PROMPT_BUCKETS,
               batch_buckets: Sequence[int] = DEFAULT_BATCH_BUCKETS, fn=model.scores):
    if fn is model.scores and not model_config.num_labels:
      raise ValueError(f"a reward stage needs a sequence-classification checkpoint; this "
                       f"{model_config.model_type} checkpoint has no classification head")
    self.model_config, self.params, self.mesh, self.pad_id = model_config, params, mesh, pad_id
    self.fn = fn
    data = sharding.batch_size_multiple("searcher", mesh)
    self.length_buckets = tuple(sorted(length_buckets))
    self.batch_buckets = tuple(sorted({-(-b // data) * data for b in batch_buckets}))
    self.left = not isinstance(model_config, EncoderConfig)

  def __call__(self, sequences: Sequence[Sequence[int]]) -> np.ndarray:
    """float32 [N, ...] (scores: [N, num_labels]) for N token lists (each non-empty)."""
    n = len(sequences)
    b = bucket(n, self.batch_buckets, "batch size")
    t = bucket(max(len(s) for s in sequences), self.length_buckets, "sequence length")
    tokens, mask = (left_pad if self.left else right_pad)(sequences, t, self.pad_id, num_rows=b)
    mask[n:, -1 if self.left else 0] = 1  # bucket padding rows: one (pad) token each
    rows = lambda x: jax.device_put(x, sharding.batch_sharding("searcher", self.mesh, 2))
    out = self.fn(self.model_config, self.params, rows(tokens), rows(mask))
    return np.asarray(out, np.float32)[:n]


@dataclasses.dataclass(frozen=True)
class ModelReward:
  """A reward model's score of prompt + completion, on the searcher's devices.

  The rows are the policy's own token ids (prompt, then completion), so the
  reward model must share the policy's vocabulary (Pythia reward models share
  their policy's). The score is read at the last completion token: the EOS
  token when the completion ended (TRL's get_reward reads it there).
  `no_eos_reward`: the reward of a completion cut off without EOS (TL;DR: -1).
  """
  path: str               # HF directory / hub id of a ...ForSequenceClassification checkpoint
  label: int = 0          # which of its logits is the reward
  dtype: str = "float32"
  no_eos_reward: float | None = None
  pad_id: int = 0

  def load(self, mesh):
    """(config, params) of the reward model on `mesh` (a subclass may build them otherwise)."""
    return hf_checkpoints.load(self.path, self.dtype, mesh=mesh, role="searcher")

  def build(self, mesh) -> RewardFn:
    cfg, params = self.load(mesh)
    scorer = Scorer(cfg, params, mesh, pad_id=self.pad_id)  # refuses a model without a head
    if not 0 <= self.label < cfg.num_labels:
      raise ValueError(f"{self.path}: reward label {self.label} out of range: the checkpoint "
                       f"has {cfg.num_labels} labels")

    def score(batch: RewardBatch) -> np.ndarray:
      seqs = [list(p) + [int(t) for t in c] for p, c in zip(batch.prompts, batch.completions)]
      out = scorer(seqs)[:, self.label]
      if self.no_eos_reward is not None:
        out = np.where(batch.ended_with_eos, out, np.float32(self.no_eos_reward))
      return out.astype(np.float32)

    return score
