"""Offline arithmetic problems in GSM8K's format, generated from a seed.

The embedded CPU default trains SmolLM2-135M-Instruct on these: it answers
single-digit products about half the time greedily and much less often when
sampling at T = 0.7 (../cpu_default_facts in the design notes), a base rate
with signal that RL can sharpen. Every (a, op, b) pair of the configured ranges
is enumerated, shuffled with the seed and split into train / test, so the
held-out problems are never trained on.
"""
from __future__ import annotations

import operator

import numpy as np

from tba_jax.tasks import Problem

_OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul}


def make_problems(ops: str, low: int, high: int, *, seed: int, test_fraction: float,
                  template: str = "What is {a} {op} {b}?") -> tuple[list[Problem], list[Problem]]:
  """(train, test) problems for every a, b in [low, high] and op in `ops`."""
  unknown = set(ops) - set(_OPS)
  if unknown or not ops:
    raise ValueError(f"arithmetic ops must be drawn from {''.join(_OPS)!r}, got {ops!r}")
  if not low <= high:
    raise ValueError(f"arithmetic range is empty: low={low} > high={high}")
  triples = [(a, op, b) for op in ops for a in range(low, high + 1) for b in range(low, high + 1)]
  order = np.random.default_rng(seed).permutation(len(triples))
  num_test = int(round(test_fraction * len(triples)))
  if not 0 < num_test < len(triples):
    raise ValueError(f"test_fraction={test_fraction} leaves an empty split of {len(triples)}")

  def problem(i, k):
    a, op, b = triples[k]
    result = _OPS[op](a, b)
    return Problem(i, {"question": template.format(a=a, op=op, b=b),
                       "answer": f"{a} {op} {b} = {result}\n#### {result}"}, float(result))

  test = [problem(i, k) for i, k in enumerate(order[:num_test])]
  train = [problem(i, k) for i, k in enumerate(order[num_test:])]
  return train, test
