"""Tasks: problems, prompt formats and rewards (pure Python)."""

import dataclasses
from typing import Callable, Sequence

from tba_jax.tasks.gsm8k import Problem


@dataclasses.dataclass(frozen=True)
class Task:
  """What the runtime needs of a task: problems, a prompt for each, a reward."""
  train: Sequence[Problem]
  test: Sequence[Problem]
  prompt: Callable[[Problem], str]  # the text the model continues
  reward: Callable[[str, float], float]  # (completion text, gold answer) -> reward
