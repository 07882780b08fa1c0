"""Jitted, sharded VarGrad-TB update on the trainer mesh (see losses.py)."""
from __future__ import annotations

import dataclasses

import jax
import numpy as np


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class TrainBatch:
  """N = P prompts x R samples, flat; prompt left-padded, completion right-padded.

  Columns [0, Tp) hold the prompt (left padding), columns [Tp, Tp + Tc) the
  completion, so the completion starts at the same column in every row.
  """
  tokens: np.ndarray             # [N, Tp + Tc] int32, pad id where absent
  attention_mask: np.ndarray     # [N, Tp + Tc] int32, 1 = real prompt/completion token
  completion_mask: np.ndarray    # [N, Tc] float32, 1 = completion token counted in log pi
  ref_logprobs: np.ndarray       # [N, Tc] float32, per-token reference log-probs (tempered)
  behaviour_logprobs: np.ndarray  # [N, Tc] float32, per-token log-probs of the sampling policy
  rewards: np.ndarray            # [N] float32
  group_ids: np.ndarray          # [N] int32, prompt id (any integers, any order)
  versions: np.ndarray           # [N] int32, policy version that generated each sample

  @property
  def prompt_len(self) -> int:
    return self.tokens.shape[1] - self.completion_mask.shape[1]
