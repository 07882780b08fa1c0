"""Reward stages: the Python-rule stage and the plain-function form."""
import numpy as np

from tba_jax import rewards
from tba_jax.tasks import Problem


def _batch(texts, golds):
  n = len(texts)
  return rewards.RewardBatch(
      problems=[Problem(i, "q", "a", g) for i, g in enumerate(golds)], prompts=[[1]] * n,
      completions=[np.array([2])] * n, ended_with_eos=np.ones(n, bool), texts=texts)


def test_text_reward_scores_every_row_with_its_own_gold():
  stage = rewards.TextReward(lambda text, gold: float(text == str(int(gold))))
  score = stage.build(mesh=None)
  out = score(_batch(["3", "4", "4"], [3.0, 5.0, 4.0]))
  assert out.dtype == np.float32 and out.tolist() == [1.0, 0.0, 1.0]


def test_as_stage_keeps_a_stage_and_wraps_a_plain_function():
  stage = rewards.TextReward(lambda text, gold: 0.0)
  assert rewards.as_stage(stage) is stage
  wrapped = rewards.as_stage(lambda text, gold: len(text) + gold)
  assert isinstance(wrapped, rewards.TextReward)
  assert wrapped.build(None)(_batch(["ab", "c"], [1.0, 2.0])).tolist() == [3.0, 3.0]
