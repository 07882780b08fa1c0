"""Answer checkers (config `task.verifier`): does a completion's final answer equal the gold?

  paper_regex  the TBA paper's rule (tasks/gsm8k.py, the authors' gsm8k_utils.py): the
               last number in the completion (commas removed) equals the gold's last
               number, both as floats. Golds without a number (a MATH answer such as
               "\\frac{\\pi}{2}") are never matched.
  math_verify  Hugging Face's math-verify (what open-r1 and TRL's math examples use): the
               answer extracted as LaTeX (\\boxed{...} preferred) or a plain expression,
               compared to the gold by value and symbolic equivalence (1/2 = 0.5 =
               \\frac{1}{2}, 1+x^2 = x^2+1, intervals, tuples). The gold is parsed as one
               LaTeX math expression ("$" + gold + "$").

math_verify reads only the part after the last "</think>" when a completion has one (a
reasoning model's final answer; TBA-prime's math reward does the same,
bbartoldson/tba-prime src/zeroband/inference/genesys/math.py L11-14). paper_regex
needs no such rule: the last number of a completion is after its thinking anyway.

math-verify bounds each parse and comparison with signal.alarm (5 s), which works only
in a process's main thread; called from another thread its parse raises ValueError
(math-verify 0.9). Searchers score in threads, so math_verify runs in one worker process of
its own (started once per process, shared by every searcher and the evaluator), where
the alarms work: a pathological answer ("\\boxed{9^{9^{9^9}}}") costs at most the
timeout, never a hung searcher.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import threading
from typing import Sequence

import numpy as np

VERIFIERS = ("paper_regex", "math_verify")
_THINK_END = "</think>"


def final_part(text: str) -> str:
  """The text after the last "</think>" (the whole text when there is none)."""
  return text.rsplit(_THINK_END, 1)[-1]


def gold_text(gold: float | str) -> str:
  """A gold answer as text: MATH's LaTeX string as it is, GSM8K's float as a number
  (72.0 -> "72", 0.5 -> "0.5")."""
  if isinstance(gold, str):
    return gold
  return str(int(gold)) if float(gold).is_integer() else repr(float(gold))


_NUMBER = re.compile(r"(?:[+-]?\d+\.\d*|[+-]?\.\d+|[+-]?\d+e[-+]?\d+|[+-]?\d+)")


def extract_answer(text: str) -> float | None:
  """The last number in `text` (commas removed), or None when there is none."""
  numbers = _NUMBER.findall(text.replace(",", ""))
  return float(numbers[-1]) if numbers else None  # every match parses as a float


def reward(completion: str, gold: float) -> float:
  """GSM8K's check: 1.0 when the completion's last number equals the gold answer, else 0.0."""
  value = extract_answer(completion)
  return float(value is not None and value == gold)


def paper_regex(texts: Sequence[str], golds: Sequence[float | str]) -> np.ndarray:
  wants = [extract_answer(g) if isinstance(g, str) else float(g) for g in golds]
  return np.array([0.0 if want is None else reward(text, want)
                   for text, want in zip(texts, wants)], np.float32)


def math_verify_batch(texts: Sequence[str], golds: Sequence[str]) -> list[float]:
  """math-verify's verdicts, in the calling process (its main thread: the worker's)."""
  from math_verify import parse, verify
  out = []
  for text, gold in zip(texts, golds):
    want = parse(f"${gold}$")
    out.append(float(bool(want) and verify(want, parse(final_part(text)))))
  return out


class _Worker:
  """A `python -m tba_jax.verifiers` child process answering math_verify_batch requests,
  one JSON line in, one out. A plain subprocess, not multiprocessing: its spawn would
  re-run the parent's main script in the child."""

  def __init__(self):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (root, os.environ.get("PYTHONPATH")) if p))
    self.proc = subprocess.Popen([sys.executable, "-m", "tba_jax.verifiers"], env=env, text=True,
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE)

  def __call__(self, texts: list[str], golds: list[str]) -> list[float]:
    self.proc.stdin.write(json.dumps([texts, golds]) + "\n")
    self.proc.stdin.flush()
    line = self.proc.stdout.readline()
    if not line:
      raise RuntimeError(f"the math_verify worker process exited (code {self.proc.poll()}); "
                         "its error is on stderr above")
    return json.loads(line)


_WORKER: _Worker | None = None
_WORKER_LOCK = threading.Lock()  # one request at a time (searcher threads share the worker)


def math_verify(texts: Sequence[str], golds: Sequence[float | str]) -> np.ndarray:
  """math-verify's verdicts for a batch, computed in the worker process (module docstring)."""
  global _WORKER
  if not texts:
    return np.zeros(0, np.float32)
  with _WORKER_LOCK:
    if _WORKER is None or _WORKER.proc.poll() is not None:  # first use, or it died: restart
      _WORKER = _Worker()
    out = _WORKER(list(texts), [gold_text(g) for g in golds])
  return np.asarray(out, np.float32)


CHECKS = {"paper_regex": paper_regex, "math_verify": math_verify}
assert tuple(CHECKS) == VERIFIERS


def check_installed(name: str) -> None:
  """Raises ImportError naming the package when `name`'s checker cannot run here."""
  if name == "math_verify":
    try:
      import math_verify  # noqa: F401
    except ImportError:
      raise ImportError("task.verifier='math_verify' needs Hugging Face's math-verify: "
                        "pip install 'math-verify[antlr4_13_2]'") from None


@dataclasses.dataclass(frozen=True)
class VerifierReward:
  """A reward stage (tasks.RewardStage): 1.0 where `verifier` accepts a completion's
  answer against its problem's target (the gold answer), else 0.0."""
  verifier: str = "paper_regex"

  def __post_init__(self):
    if self.verifier not in CHECKS:
      raise ValueError(f"unknown verifier {self.verifier!r}; choose from {VERIFIERS}")

  def build(self, mesh):
    del mesh  # no devices involved
    check_installed(self.verifier)
    check = CHECKS[self.verifier]
    return lambda batch: check(batch.texts, [p.target for p in batch.problems])


if __name__ == "__main__":  # the math_verify worker (_Worker): JSON lines on stdin / stdout
  out, sys.stdout = sys.stdout, sys.stderr  # anything the libraries print goes to stderr
  for request in sys.stdin:
    out.write(json.dumps(math_verify_batch(*json.loads(request))) + "\n")
    out.flush()
