"""Users' reward functions by name (tba_jax/tasks/reward_functions.py): TRL's batched
signature and verl's per-completion one, called with what those projects pass; a failure
named with its row; a verl dict's extra keys as evaluation metrics."""
import os

import numpy as np
import pytest

from tba_jax.errors import ConfigError
from tba_jax.tasks import Problem, RewardBatch, reward_functions
from tba_jax.tasks.reward_functions import RewardFunctionError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MESSAGES = [{"role": "user", "content": "What is 2 + 3?"}]


def _batch(texts, rows=None, ids=None) -> RewardBatch:
  ids = ids or list(range(len(texts)))
  rows = rows or [{"prompt": MESSAGES, "solution": str(i), "level": i % 2} for i in ids]
  return RewardBatch(problems=[Problem(i, r, r.get("solution")) for i, r in zip(ids, rows)],
                     prompts=[[1, 2]] * len(texts),
                     completions=[np.array([5, 6, 1]) for _ in texts],
                     ended_with_eos=np.ones(len(texts), bool), texts=list(texts))


def _stage(tmp_path, source: str, name: str, chat=True, columns=("prompt", "solution", "level")):
  path = tmp_path / "rewards.py"
  path.write_text(source)
  return reward_functions.load(f"{path}:{name}", prompt_column="prompt", chat=chat,
                               columns=set(columns))


TRL = """
calls = []

def reward_func(prompts, completions, **kwargs):
  calls.append(dict(prompts=prompts, completions=completions, **kwargs))
  return [float(len(c[-1]["content"] if isinstance(c, list) else c)) for c in completions]

def named_only(prompts, completions, solution):
  return [float(s) for s in solution]
"""


def test_a_trl_function_gets_the_batch_as_trl_passes_it(tmp_path):
  stage = _stage(tmp_path, TRL, "reward_func")
  assert stage.kind == "trl"
  rewards = stage.build(None)(_batch(["ab", "abcd", ""]))
  assert rewards.dtype == np.float32 and rewards.tolist() == [2.0, 4.0, 0.0]
  call, = stage.fn.__globals__["calls"]
  assert call["prompts"] == [MESSAGES] * 3
  assert call["completions"] == [[{"role": "assistant", "content": t}] for t in ("ab", "abcd", "")]
  assert call["solution"] == ["0", "1", "2"] and call["level"] == [0, 1, 0]
  assert call["completion_ids"] == [[5, 6, 1]] * 3
  # Text prompts: completions as text; a function without **kwargs gets only its parameters.
  text = _stage(tmp_path, TRL, "reward_func", chat=False)
  assert text.score(_batch(["abc"])).tolist() == [3.0]
  assert text.fn.__globals__["calls"][0]["completions"] == ["abc"]
  assert _stage(tmp_path, TRL, "named_only").score(_batch(["x", "y"])).tolist() == [0.0, 1.0]


@pytest.mark.parametrize("body, message", [
    ("return [1.0] * (len(completions) - 1)",
     "returned 2 rewards for a batch of 3 completions (rows 0, 1, 2); expected one float per "
     "completion"),
    ("return [None if c == 'bad' else 1.0 for c in completions]",
     "returned None on row 1 of the data set (its completion: 'bad'); a reward must be a "
     "finite number"),
    ("return [float('nan') if c == 'bad' else 1.0 for c in completions]",
     "returned nan on row 1 of the data set"),
    ("return [1.0 / (c != 'bad') for c in completions]",
     "raised ZeroDivisionError: float division by zero on row 1 of the data set (its "
     "completion: 'bad')"),
])
def test_a_trl_function_that_fails_is_named_with_the_row(tmp_path, body, message):
  stage = _stage(tmp_path, f"def f(prompts, completions, **kw):\n  {body}\n", "f", chat=False)
  with pytest.raises(RewardFunctionError) as e:
    stage.score(_batch(["good", "bad", "fine"]))
  assert f"the reward function {tmp_path / 'rewards.py'}:f (TRL's signature) " in str(e.value)
  assert message in str(e.value)


def test_a_trl_function_failing_only_on_a_whole_batch_says_so(tmp_path):
  stage = _stage(tmp_path, "def f(prompts, completions, **kw):\n"
                           "  assert len(completions) < 2, 'too many'\n  return [0.0]\n", "f")
  with pytest.raises(RewardFunctionError, match=r"raised AssertionError: too many on a batch of "
                                                r"2 completions \(rows 0, 1\); on each row alone "
                                                r"it did not"):
    stage.score(_batch(["a", "b"]))


VERL = """
seen = []

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
  seen.append((data_source, solution_str, ground_truth, extra_info))
  correct = solution_str.strip() == ground_truth
  return {"score": float(correct), "acc": correct, "length": len(solution_str), "pred": "x"}

def plain(solution_str, ground_truth):
  return int(solution_str == ground_truth)

def no_score(data_source, solution_str, ground_truth, extra_info):
  return {"acc": 1.0}
"""


def test_a_verl_function_scores_each_completion_and_its_extra_keys_are_metrics(tmp_path):
  stage = _stage(tmp_path, VERL, "compute_score", columns=("prompt", "reward_model"))
  assert stage.kind == "verl"
  rows = [{"data_source": "toy", "prompt": MESSAGES, "extra_info": {"index": i},
           "solution": str(i)} for i in range(3)]
  batch = _batch(["0", "7", " 2 "], rows=rows)
  assert stage.build(None)(batch).tolist() == [1.0, 0.0, 1.0]
  assert stage.fn.__globals__["seen"] == [("toy", "0", "0", {"index": 0}),
                                         ("toy", "7", "1", {"index": 1}),
                                         ("toy", " 2 ", "2", {"index": 2})]
  metrics = reward_functions.ScoreDetails(stage).build(None)(batch, None)
  assert sorted(metrics) == ["reward_acc", "reward_length"]  # numbers (bools too), not "pred"
  assert metrics["reward_acc"].tolist() == [1.0, 0.0, 1.0]
  assert metrics["reward_length"].tolist() == [1.0, 1.0, 3.0]
  # Only the parameters it names; ints are rewards.
  assert _stage(tmp_path, VERL, "plain").score(batch).tolist() == [1.0, 0.0, 0.0]
  with pytest.raises(RewardFunctionError, match=r"returned a dict without 'score' \(keys: acc\) "
                                                r"on row 0 of the data set"):
    _stage(tmp_path, VERL, "no_score").score(batch)


def test_a_verl_function_that_raises_is_named_with_the_row(tmp_path):
  stage = _stage(tmp_path, "def compute_score(data_source, solution_str, ground_truth, "
                           "extra_info):\n  return float(solution_str)\n", "compute_score")
  with pytest.raises(RewardFunctionError, match=r"\(verl's signature\) raised ValueError: could "
                                                r"not convert string to float: 'x' on row 7 of "
                                                r"the data set \(its completion: 'x'\)"):
    stage.score(_batch(["1", "x"], ids=[3, 7]))


def test_functions_are_found_by_file_or_module_and_bad_names_are_config_errors(tmp_path):
  module = reward_functions.load_function("configs.data.trl_reward:reward_func")
  assert module.__name__ == "reward_func"
  verl = os.path.join(ROOT, "configs", "data", "verl_reward.py")
  stage = reward_functions.load(f"{verl}:compute_score", prompt_column="prompt", chat=True,
                                columns={"prompt"})
  assert stage.kind == "verl"
  path = tmp_path / "r.py"
  path.write_text("import re\n\ndef score(x):\n  return 1.0\n\ndef other(prompts, completions, "
                  "answer):\n  return [1.0]\n")
  cases = {
      "rewards.py": "expected PATH.py:FUNCTION or module.path:FUNCTION",
      f"{tmp_path}/nothere.py:f": "the file",
      f"{path}:missing": "has no function 'missing' (its functions: other, score)",
      f"{path}:score": "its parameters (x) are neither TRL's reward_func(prompts, completions, "
                       "**kwargs) nor verl's compute_score",
      f"{path}:other": "(TRL's signature) needs 'answer', which no column of the data set "
                       "holds (columns: prompt, solution)",
      "no_such_module_here:f": "cannot import the module 'no_such_module_here'",
  }
  for spec, message in cases.items():
    with pytest.raises(ConfigError) as e:
      reward_functions.load(spec, prompt_column="prompt", chat=False,
                            columns={"prompt", "solution"})
    assert message in str(e.value) and str(e.value).startswith(f"task.reward={spec!r}"), spec
  path.write_text("raise RuntimeError('broken')\n")
  with pytest.raises(ConfigError, match=r"importing .*r\.py raised RuntimeError: broken"):
    reward_functions.load_function(f"{path}:f")
