"""Tasks: problems, prompt formats and rewards (pure Python)."""

import dataclasses
import json
import os
from typing import Any, Callable, Sequence


@dataclasses.dataclass(frozen=True)
class Problem:
  """One training or test problem of a task."""
  id: int  # stable within a split: the replay buffer's prompt id
  question: str
  answer: str  # full reference solution, "... #### 42"
  gold: float | str  # the gold answer: GSM8K's number; MATH's LaTeX string ("\\frac{1}{2}")


@dataclasses.dataclass(frozen=True)
class Task:
  """What the runtime needs of a task: problems, a prompt for each, a reward."""
  train: Sequence[Problem]
  test: Sequence[Problem]
  prompt: Callable[[Problem], str]  # the text the model continues
  # A reward stage (tba_jax.rewards: built on each searcher's devices, scores whole batches),
  # or a plain (completion text, gold answer) -> float function (a rewards.TextReward).
  reward: Any
  # True: prompt texts are rendered by the tokenizer's chat template and carry its special
  # tokens, so tokenizing them adds none (Tokenizer.encode_prompt).
  templated_prompts: bool = False
  # A completion's final answer (evaluation counts the distinct ones); None: not reported.
  answer: Callable[[str], Any] | None = None
  # The task's own evaluation metrics: an object with build(mesh) -> fn(RewardBatch,
  # evaluation.Policy) -> {name: per-row values or one float} (evaluation.MetricsFn), called
  # on every completion of an evaluation pass; None: only the reward-based metrics.
  evaluation: Any = None


def split_file(path: str, split: str, what: str) -> str:
  """The file holding `split` ("train" / "test") of a local data path: the path itself
  when it is a file; in a directory `{split}.jsonl` or `.parquet`, else the one file
  below it whose name starts with the split (a hub snapshot's
  data/test-00000-of-00001.parquet). `what` names the data set in errors."""
  if os.path.isfile(path):
    return path
  if not os.path.isdir(path):
    raise FileNotFoundError(f"{what} path {path!r} does not exist")
  for ext in (".jsonl", ".parquet"):
    if os.path.exists(os.path.join(path, split + ext)):
      return os.path.join(path, split + ext)
  found = sorted(os.path.join(d, f) for d, _, files in os.walk(path) for f in files
                 if f.startswith(split) and f.endswith((".jsonl", ".parquet")))
  if len(found) != 1:
    raise FileNotFoundError(f"{path}: no {split}.jsonl or {split}.parquet" +
                            (f" (several candidates: {found})" if found else ""))
  return found[0]


def read_records(path: str) -> list[dict]:
  """The rows of a .jsonl file (one JSON object a line) or a .parquet file, as dicts."""
  if path.endswith(".parquet"):
    try:
      import pyarrow.parquet as pq
    except ImportError:
      raise ImportError(f"reading {path} needs pyarrow: pip install pyarrow") from None
    return pq.read_table(path).to_pylist()
  rows = []
  with open(path) as f:
    for number, line in enumerate(f, 1):
      if not line.strip():
        continue
      try:
        row = json.loads(line)
      except json.JSONDecodeError as e:
        raise ValueError(f"{path}, line {number}: not valid JSON ({e.msg} at column {e.colno})") \
            from None
      if not isinstance(row, dict):
        raise ValueError(f"{path}, line {number}: expected a JSON object, got {type(row).__name__}")
      rows.append(row)
  return rows
