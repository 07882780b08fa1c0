"""Evaluation: greedy pass@1, sampled pass@1 / pass@n, distinct final answers.

Problems are batched through the same sampler the searchers use. With several
processes, each evaluates its own stride of the problems and the counts are
summed across processes.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import jax
import numpy as np
import tqdm

from tba_jax.tasks import Problem
from tba_jax.tasks.gsm8k import extract_answer

# generate(params, prompts, key) -> rollouts with .tokens [B, T] and .lengths [B]
GenerateFn = Callable


@dataclasses.dataclass
class Evaluator:
  problems: Sequence[Problem]
  prompt_tokens: Sequence[list[int]]  # one per problem
  decode: Callable[[Sequence[int]], str]
  reward: Callable[[str, float], float]
  batch_size: int
  greedy: GenerateFn | None = None  # greedy sampler, or None to skip greedy pass@1
  sampled: GenerateFn | None = None  # temperature sampler, or None to skip sampled metrics
  num_samples: int = 0
  progress: bool = True

  def _run(self, generate, params, indices, repeats, key, desc):
    """(rewards [len(indices), repeats], final answers) for the problems at `indices`."""
    rows = [i for i in indices for _ in range(repeats)]
    rewards, answers = np.zeros(len(rows)), []
    bar = tqdm.tqdm(total=len(rows), desc=desc, disable=not self.progress, leave=False)
    for start in range(0, len(rows), self.batch_size):
      chunk = rows[start:start + self.batch_size]
      key, sub = jax.random.split(key)
      out = generate(params, [self.prompt_tokens[i] for i in chunk], sub)
      for j, i in enumerate(chunk):
        text = self.decode(out.tokens[j, :out.lengths[j]])
        rewards[start + j] = self.reward(text, self.problems[i].gold)
        answers.append(extract_answer(text))
      bar.update(len(chunk))
    bar.close()
    return rewards.reshape(len(indices), repeats), answers

  def __call__(self, params, key) -> dict[str, float]:
    """Metrics under "eval/..." keys (this process's share, summed over processes)."""
    indices = list(range(jax.process_index(), len(self.problems), jax.process_count()))
    sums = {}
    if self.greedy is not None:
      r, _ = self._run(self.greedy, params, indices, 1, key, "eval greedy")
      sums["greedy_pass@1"] = r.sum()
    if self.sampled is not None and self.num_samples > 0:
      n = self.num_samples
      r, answers = self._run(self.sampled, params, indices, n, jax.random.fold_in(key, 1),
                             "eval sampled")
      sums["sampled_pass@1"] = r.mean(axis=1).sum()
      sums[f"pass@{n}"] = (r.max(axis=1) > 0).sum()
      distinct = [len({a for a in answers[k * n:(k + 1) * n]}) for k in range(len(indices))]
      sums["distinct_answers"] = float(np.sum(distinct))
    names = sorted(sums)
    totals = np.array([sums[k] for k in names] + [len(indices)], np.float64)
    if jax.process_count() > 1:
      from jax.experimental import multihost_utils
      totals = np.asarray(multihost_utils.process_allgather(totals)).sum(axis=0)
    return {f"eval/{k}": float(v / totals[-1]) for k, v in zip(names, totals[:-1])}
