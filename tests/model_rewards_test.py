"""Reward stages: the Python-rule stage and the plain-function form."""
import jax
import numpy as np
import pytest

from tba_jax import sharding
from tba_jax import tasks
from tba_jax.tasks import model_rewards
from tba_jax.tasks import Problem


def _batch(texts, golds):
  n = len(texts)
  return tasks.RewardBatch(
      problems=[Problem(i, {"question": "q"}, g) for i, g in enumerate(golds)], prompts=[[1]] * n,
      completions=[np.array([2])] * n, ended_with_eos=np.ones(n, bool), texts=texts)


def test_text_reward_scores_every_row_with_its_own_gold():
  stage = tasks.TextReward(lambda text, gold: float(text == str(int(gold))))
  score = stage.build(mesh=None)
  out = score(_batch(["3", "4", "4"], [3.0, 5.0, 4.0]))
  assert out.dtype == np.float32 and out.tolist() == [1.0, 0.0, 1.0]


def test_as_stage_keeps_a_stage_and_wraps_a_plain_function():
  stage = tasks.TextReward(lambda text, gold: 0.0)
  assert tasks.as_stage(stage) is stage
  wrapped = tasks.as_stage(lambda text, gold: len(text) + gold)
  assert isinstance(wrapped, tasks.TextReward)
  assert wrapped.build(None)(_batch(["ab", "c"], [1.0, 2.0])).tolist() == [3.0, 3.0]


# ---------------------------------------------------------------------------
# Model-scored rewards.
# ---------------------------------------------------------------------------
def _reward_model_dir(tmp_path, vocab_size=128, num_labels=1, name="gpt_neox"):
  from hf_models import make_model
  path = str(tmp_path / f"{name}_rm")
  make_model(name, head="classifier", num_labels=num_labels, vocab_size=vocab_size,
             seed=3).save_pretrained(path)
  return path


def test_model_reward_is_the_reward_models_score_of_prompt_and_completion(tmp_path):
  from hf_models import hf_scores, make_model
  path = _reward_model_dir(tmp_path, num_labels=2)
  mesh = sharding.make_mesh("searcher", jax.local_devices()[:2])  # rows split over 2 devices
  score = model_rewards.ModelReward(path, label=1, no_eos_reward=-1.0).build(mesh)
  rng = np.random.default_rng(0)
  prompts = [list(rng.integers(3, 128, n)) for n in (3, 5, 2)]
  completions = [rng.integers(3, 128, n) for n in (4, 1, 6)]
  ended = np.array([True, True, False])
  got = score(tasks.RewardBatch(problems=[Problem(i, {"question": ""}) for i in range(3)],
                                  prompts=prompts, completions=completions,
                                  ended_with_eos=ended, texts=["", "", ""]))
  seqs = [p + list(c) for p, c in zip(prompts, completions)]
  t = max(map(len, seqs))
  tokens, mask = np.zeros((3, t), np.int64), np.zeros((3, t), np.int64)
  for r, s in enumerate(seqs):
    tokens[r, t - len(s):], mask[r, t - len(s):] = s, 1
  want = hf_scores(make_model("gpt_neox", head="classifier", num_labels=2, seed=3), tokens, mask)
  np.testing.assert_allclose(got[:2], want[:2, 1], atol=1e-4)
  assert got[2] == -1.0 and got.dtype == np.float32  # cut off without EOS


def test_model_reward_refuses_a_checkpoint_without_a_classification_head(tmp_path):
  from hf_models import make_model
  path = str(tmp_path / "lm")
  make_model("gpt_neox", head="lm").save_pretrained(path)
  mesh = sharding.make_mesh("searcher", jax.local_devices()[:1])
  with pytest.raises(ValueError, match="no classification head|num_labels"):
    model_rewards.ModelReward(path).build(mesh)
  with pytest.raises(ValueError, match="label 2 out of range"):
    model_rewards.ModelReward(_reward_model_dir(tmp_path, num_labels=2), label=2).build(mesh)
