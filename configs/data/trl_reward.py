"""A reward function in TRL's signature, for configs/data/arithmetic_verl.parquet (README,
"Your dataset and reward"): `--config.task.reward=configs/data/trl_reward.py:reward_func`.

TRL calls it once per batch: `completions` are texts, or message lists when the prompts are
chat messages; every other column of the data set comes as a keyword argument, one value
per completion (here verl's `reward_model`, or a TRL data set's `solution`).
"""
import re

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def _last_number(text: str) -> float | None:
  numbers = _NUMBER.findall(text.replace(",", ""))
  return float(numbers[-1]) if numbers else None


def reward_func(prompts, completions, reward_model=None, solution=None, **kwargs):
  """1.0 where a completion's last number is the row's answer, else 0.0."""
  answers = solution if solution is not None else [r["ground_truth"] for r in reward_model]
  texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
  return [float(_last_number(t) is not None and _last_number(t) == float(a))
          for t, a in zip(texts, answers)]
