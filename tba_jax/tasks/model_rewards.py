"""Model-scored reward stages: a sequence-classification model on a searcher mesh.

  scorer = Scorer(cfg, params, mesh)         # token lists -> scores, bucketed and jitted
  stage = ModelReward("/path/to/reward_model", label=0, no_eos_reward=None)  # a RewardStage

TL;DR's reward models (tasks/tldr.py) and red-teaming's judges and embedder
(tasks/redteam.py) are built on these.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import jax
import numpy as np

from tba_jax import hf_checkpoints, model, sharding
from tba_jax.batch import bucket, left_pad, right_pad
from tba_jax.model_config import EncoderConfig
from tba_jax.sampler import DEFAULT_BATCH_BUCKETS, DEFAULT_PROMPT_BUCKETS
from tba_jax.tasks import RewardBatch, RewardFn


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
