"""Offline arithmetic problems in GSM8K's format, generated from a seed: the CPU default's
data and the tasks of the suite (configs/suite.py).

The embedded CPU default trains SmolLM2-135M-Instruct on these: it answers
single-digit products about half the time greedily and much less often when
sampling at T = 0.7 (../cpu_default_facts in the design notes), a base rate
with signal that RL can sharpen. Three forms (task.arithmetic.form):

  one_op   "What is 7 * 8?"            every (a, op, b) with a, b in [low, high]
  two_op   "What is 3 + 4 * 2?"        every (a, op, b, op, c); * binds before + and -
  word     "Mia has 3 bags with 7 marbles in each bag. How many marbles does Mia have?"
           every (template, a, b), one operation each (WORD_TEMPLATES); the name and
           the objects are drawn with the seed

Every problem of the form (or `num_problems` of them) is shuffled with the seed and cut
in that order into test (the first test_fraction), validation (the next
validation_fraction) and train (the rest), so no held-out problem is trained on. The
test split is the one the code had before there was a validation split (validation
was carved from the former train split): with the default settings (+ and *, 2..9,
seed 0) 128 problems are 32 test (the same 32 as before), 32 validation and 64 train
(96 before).
"""
from __future__ import annotations

import itertools
import operator

import numpy as np

from tba_jax.choices import ARITHMETIC_FORMS
from tba_jax.tasks import Problem

_OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul}

NAMES = ("Mia", "Leo", "Sam", "Ava", "Noah", "Zoe", "Ben", "Lily", "Omar", "Emma", "Ravi", "Nina")
THINGS = ("apples", "pencils", "stickers", "marbles", "books", "cookies", "shells", "cards",
          "toy cars", "flowers")
# op -> sentences with {name}, {a}, {b}, {things}; "-" only where a > b (no negative counts).
WORD_TEMPLATES = {
    "+": ("{name} has {a} {things}. {name} gets {b} more {things}. How many {things} does "
          "{name} have now?",
          "There are {a} {things} on the table and {b} {things} in the box. How many {things} "
          "are there in all?"),
    "-": ("{name} had {a} {things} and gave {b} of them to a friend. How many {things} does "
          "{name} have left?",
          "A shop had {a} {things}. It sold {b} of them. How many {things} does the shop have "
          "left?"),
    "*": ("{name} has {a} bags with {b} {things} in each bag. How many {things} does {name} "
          "have?",
          "There are {a} rows of {things} with {b} {things} in each row. How many {things} are "
          "there in all?"),
}


def evaluate(a: int, op1: str, b: int, op2: str | None = None, c: int | None = None) -> int:
  """a op1 b (op2 c) with the usual precedence: * before + and -, else left to right."""
  if op2 is None:
    return _OPS[op1](a, b)
  if op2 == "*" and op1 != "*":
    return _OPS[op1](a, b * c)
  return _OPS[op2](_OPS[op1](a, b), c)


def _one_op(ops, numbers, rng):
  del rng  # nothing drawn: the order is the split's
  for op, a, b in itertools.product(ops, numbers, numbers):
    yield f"What is {a} {op} {b}?", f"{a} {op} {b}", evaluate(a, op, b)


def _two_op(ops, numbers, rng):
  del rng
  for op1, op2 in itertools.product(ops, ops):
    for a, b, c in itertools.product(numbers, numbers, numbers):
      yield f"What is {a} {op1} {b} {op2} {c}?", f"{a} {op1} {b} {op2} {c}", evaluate(
          a, op1, b, op2, c)


def _word(ops, numbers, rng):
  for op in ops:
    for template, a, b in itertools.product(WORD_TEMPLATES[op], numbers, numbers):
      if op == "-" and a <= b:
        continue
      # Drawn per problem in the enumeration's order: the same seed, the same wording.
      name, things = NAMES[rng.integers(len(NAMES))], THINGS[rng.integers(len(THINGS))]
      yield template.format(name=name, a=a, b=b, things=things), f"{a} {op} {b}", evaluate(
          a, op, b)


# task.arithmetic.form -> fn(ops, numbers, rng) -> (question, expression, result) per problem.
FORMS = {"one_op": _one_op, "two_op": _two_op, "word": _word}
assert tuple(FORMS) == ARITHMETIC_FORMS  # the config's choices


def make_problems(ops: str, low: int, high: int, *, seed: int, test_fraction: float,
                  validation_fraction: float = 0.0, form: str = "one_op", num_problems: int = 0
                  ) -> tuple[list[Problem], list[Problem], list[Problem]]:
  """(train, validation, test) of every problem of `form` with operations `ops` and
  operands in [low, high] (module docstring); `num_problems` > 0: that many of them,
  drawn with the seed. Ids are numbered within each split."""
  unknown = set(ops) - set(_OPS)
  if unknown or not ops:
    raise ValueError(f"arithmetic ops must be drawn from {''.join(_OPS)!r}, got {ops!r}")
  if form not in FORMS:
    raise ValueError(f"arithmetic form {form!r}: must be one of {', '.join(FORMS)}")
  if not low <= high:
    raise ValueError(f"arithmetic range is empty: low={low} > high={high}")
  items = list(FORMS[form](ops, range(low, high + 1), np.random.default_rng(seed)))
  order = np.random.default_rng(seed).permutation(len(items))
  if num_problems:
    if num_problems > len(items):
      raise ValueError(f"num_problems={num_problems}: the form has only {len(items)} problems")
    order = order[:num_problems]
  num_test = int(round(test_fraction * len(order)))
  num_validation = int(round(validation_fraction * len(order)))
  if not (0 < num_test and num_test + num_validation < len(order)
          and (num_validation or not validation_fraction)):
    raise ValueError(f"test_fraction={test_fraction}, validation_fraction="
                     f"{validation_fraction} leave an empty split of {len(order)} problems")

  def split(indices):
    problems = []
    for i, k in enumerate(indices):
      question, expression, result = items[k]
      problems.append(Problem(i, {"question": question,
                                  "answer": f"{expression} = {result}\n#### {result}"},
                              float(result)))
    return problems

  end = num_test + num_validation
  return split(order[end:]), split(order[num_test:end]), split(order[:num_test])
