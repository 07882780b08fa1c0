"""Tasks: problems, prompt formats and rewards (pure Python)."""

import dataclasses
from typing import Callable, Sequence


@dataclasses.dataclass(frozen=True)
class Problem:
  """One training or test problem of a task."""
  id: int  # stable within a split: the replay buffer's prompt id
  question: str
  answer: str  # full reference solution, "... #### 42"
  gold: float


@dataclasses.dataclass(frozen=True)
class Task:
  """What the runtime needs of a task: problems, a prompt for each, a reward."""
  train: Sequence[Problem]
  test: Sequence[Problem]
  prompt: Callable[[Problem], str]  # the text the model continues
  reward: Callable[[str, float], float]  # (completion text, gold answer) -> reward
  # True: prompt texts are rendered by the tokenizer's chat template and carry its special
  # tokens, so tokenizing them adds none (Tokenizer.encode_prompt).
  templated_prompts: bool = False
