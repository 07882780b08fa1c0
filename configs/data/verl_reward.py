"""A reward function in verl's signature, for configs/data/arithmetic_verl.parquet:
`--config.task.reward=configs/data/verl_reward.py:compute_score`.

verl calls it once per completion; a dict's "score" is the reward, and its other numeric
keys are logged with every evaluation (eval/reward_acc, eval/reward_answered).
"""
import re

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
  """1.0 where the completion's last number is the ground truth, else 0.0."""
  del data_source, extra_info  # one source, nothing extra
  numbers = _NUMBER.findall(solution_str.replace(",", ""))
  correct = bool(numbers) and float(numbers[-1]) == float(ground_truth)
  return {"score": float(correct), "acc": correct, "answered": bool(numbers)}
