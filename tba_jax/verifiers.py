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
(math-verify 0.9). Searchers score in threads, so math_verify runs in worker processes
(`MathVerify`), one per consumer: each reward stage built (`VerifierReward.build`: every
searcher's and the evaluator's) starts its own, so none waits for another's requests and
one worker's end stops no other. The worker answers each completion on a line of its own,
and each answer has a deadline (DEADLINE_S): a worker that misses it (hung) or exits
(crashed) is killed and restarted, that completion scores 0, counted (`MathVerify.failures`)
and named on stderr, and the rest of the request goes to the new worker. A pathological
answer ("\\boxed{9^{9^{9^9}}}") thus costs at most math-verify's own timeouts, a hung
worker one deadline; neither stops scoring.

A gold the verifier can never match (math_verify: one it parses to no expression;
paper_regex: a text gold without a number) scores every completion of its problem 0.
`check_golds` counts them when the task is loaded, and says so once, with an example.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os
import queue
import re
import subprocess
import sys
import threading
import weakref
from typing import Sequence

import numpy as np

from tba_jax.choices import VERIFIERS

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


# A completion's deadline in a worker: math-verify bounds each parse and comparison at 5 s (the
# gold's parse, the answer's, their comparison: 15 s at most), so a worker silent for 30 s hangs.
DEADLINE_S = 30.0
# A new worker's start (Python, sympy and math-verify imported), on a loaded host.
STARTUP_S = 300.0
# Golds math-verify parses whatever they are: no worker is asked about them (check_golds).
_PLAIN_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)")


@functools.lru_cache(maxsize=4096)  # a gold is parsed once for all its completions
def _parse_gold(gold: str) -> list:
  from math_verify import parse
  return parse(f"${gold}$")


def math_verify_one(text: str, gold: str) -> float:
  """math-verify's verdict on one completion, in the calling process (its main thread: a
  worker's)."""
  from math_verify import parse, verify
  want = _parse_gold(gold)
  return float(bool(want) and verify(want, parse(final_part(text))))


def math_verify_parses(gold: str) -> bool:
  """Whether math-verify parses `gold` to an expression (not to nothing, nor only to its own
  text, which only the identical text would match)."""
  return any(not isinstance(x, str) for x in _parse_gold(gold))


# What a worker answers, per request kind: fn(*item) for each item of a request.
_OPS = {"verify": math_verify_one, "parses": math_verify_parses}


class _Worker:
  """A `python -m tba_jax.verifiers` child process: a request is one JSON line [op, items],
  answered one JSON line per item. A plain subprocess, not multiprocessing: its spawn would
  re-run the parent's main script in the child. A thread reads its answers into a queue, so
  that a wait for one can time out."""

  def __init__(self):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (root, os.environ.get("PYTHONPATH")) if p))
    self.proc = subprocess.Popen([sys.executable, "-m", "tba_jax.verifiers"], env=env, text=True,
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    self.answers: queue.Queue = queue.Queue()  # answer lines; None once the process exited
    threading.Thread(target=_read_lines, args=(self.proc.stdout, self.answers), daemon=True,
                     name=f"math-verify-{self.proc.pid}").start()
    # Killed when dropped (its checker closed or collected), or at the latest at exit.
    self.kill = weakref.finalize(self, _kill, self.proc)

  def send(self, op: str, items: list) -> None:
    try:
      self.proc.stdin.write(json.dumps([op, items]) + "\n")
      self.proc.stdin.flush()
    except OSError:  # it exited: the wait for its answer says so
      pass

  def answer(self, timeout: float):
    """The next answer, or None when none came within `timeout` or the process exited (then
    `proc.poll()` has its exit code)."""
    try:
      line = self.answers.get(timeout=timeout)
    except queue.Empty:
      return None
    if line is None:  # its output closed: it is exiting
      try:
        self.proc.wait(timeout=5)
      except subprocess.TimeoutExpired:
        pass
      return None
    return json.loads(line)


def _read_lines(stream, lines: queue.Queue) -> None:
  for line in stream:
    lines.put(line)
  lines.put(None)


def _kill(proc: subprocess.Popen) -> None:
  proc.kill()
  proc.wait()
  for pipe in (proc.stdin, proc.stdout):
    try:
      pipe.close()
    except OSError:  # unflushed input to a dead process
      pass


class MathVerify:
  """math_verify's checker, (texts, golds) -> float32 [N], with a worker process of its own
  (module docstring): started by the first request, replaced when it hangs or dies."""

  def __init__(self, deadline_s: float = DEADLINE_S, startup_s: float = STARTUP_S):
    self.deadline_s, self.startup_s = deadline_s, startup_s
    self.failures = 0  # completions scored 0 because the worker hung or died on them
    self.restarts = 0  # workers replaced after they hung or died
    self._worker: _Worker | None = None
    self._lock = threading.Lock()  # one request at a time, should threads share a checker

  @property
  def worker_pid(self) -> int | None:
    """The current worker's process id (None before the first request, or after a loss)."""
    return None if self._worker is None else self._worker.proc.pid

  def __call__(self, texts: Sequence[str], golds: Sequence[float | str]) -> np.ndarray:
    items = [[text, gold_text(gold)] for text, gold in zip(texts, golds)]
    return np.asarray(self._ask("verify", items), np.float32)

  def parses(self, golds: Sequence[float | str]) -> list[bool]:
    """Whether math-verify parses each gold (math_verify_parses), each distinct one asked once."""
    texts = [gold_text(g) for g in golds]
    ask = sorted({t for t in texts if not _PLAIN_NUMBER.fullmatch(t)})
    parsed = dict(zip(ask, self._ask("parses", [[t] for t in ask])))
    return [bool(parsed.get(t, True)) for t in texts]

  def close(self) -> None:
    with self._lock:
      if self._worker is not None:
        self._worker.kill()
        self._worker = None

  def _ask(self, op: str, items: list) -> list:
    """The worker's answer to each item; 0 for an item it hung or died on (then the rest go to
    a new worker)."""
    out = []
    with self._lock:
      while len(out) < len(items):
        worker = self._ready()
        worker.send(op, items[len(out):])
        while len(out) < len(items):
          answer = worker.answer(self.deadline_s)
          if answer is None:
            self._lost(op, items[len(out)])
            out.append(0)
            break
          out.append(answer)
    return out

  def _ready(self) -> _Worker:
    """The worker, started (again, when it died since its last answer) and ready."""
    if self._worker is not None and self._worker.proc.poll() is None:
      return self._worker
    if self._worker is not None:
      self.restarts += 1
      _warn(f"the worker exited (code {self._worker.proc.poll()}) after its last answer; "
            "restarted")
    self._worker = _Worker()
    if self._worker.answer(self.startup_s) != "ready":
      code = self._worker.proc.poll()
      self._worker.kill()
      self._worker = None
      raise RuntimeError(
          f"the math_verify worker did not start within {self.startup_s:g} s (exit code "
          f"{code}); its error is on stderr above")
    return self._worker

  def _lost(self, op: str, item: list) -> None:
    """The worker hung (no answer within the deadline) or died on `item`: killed, counted,
    said; the next request starts another."""
    code = self._worker.proc.poll()
    self._worker.kill()
    self._worker = None
    self.failures += 1
    self.restarts += 1
    why = (f"did not answer within {self.deadline_s:g} s" if code is None else
           f"exited (code {code})")
    what = (f"the completion ending {item[0][-80:]!r} against the gold {item[1]!r}"
            if op == "verify" else f"the gold {item[0]!r}")
    _warn(f"the worker {why} on {what}: scored 0 ({self.failures} so far by this checker); "
          "restarted")


def _warn(message: str) -> None:
  print(f"WARNING: math_verify: {message}", file=sys.stderr, flush=True)


class PaperRegex:
  """paper_regex as a checker: a plain function, nothing to start."""

  def __call__(self, texts: Sequence[str], golds: Sequence[float | str]) -> np.ndarray:
    return paper_regex(texts, golds)

  def parses(self, golds: Sequence[float | str]) -> list[bool]:
    """Whether each gold holds a number (a float gold does)."""
    return [not isinstance(g, str) or extract_answer(g) is not None for g in golds]

  def close(self) -> None:
    pass


# name -> a new checker: (texts, golds) -> float32 [N], parses(golds), close(). Each consumer
# (each searcher's reward stage, the evaluator's) builds its own.
CHECKERS = {"paper_regex": PaperRegex, "math_verify": MathVerify}
assert tuple(CHECKERS) == VERIFIERS

_SHARED: MathVerify | None = None
_SHARED_LOCK = threading.Lock()


def math_verify(texts: Sequence[str], golds: Sequence[float | str]) -> np.ndarray:
  """math-verify's verdicts for a batch, by one checker shared by this function's callers
  (scripts and benchmarks; a run's consumers each build their own)."""
  global _SHARED
  with _SHARED_LOCK:
    if _SHARED is None:
      _SHARED = MathVerify()
  return _SHARED(texts, golds)


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
    if self.verifier not in CHECKERS:
      raise ValueError(f"unknown verifier {self.verifier!r}; choose from {VERIFIERS}")

  def build(self, mesh) -> "VerifierScorer":
    del mesh  # no devices involved
    check_installed(self.verifier)
    return VerifierScorer(CHECKERS[self.verifier]())  # this consumer's own (worker)


@dataclasses.dataclass
class VerifierScorer:
  """A built VerifierReward: a batch's completions checked against its problems' golds by
  a checker of its own (`check.failures`: math_verify's completions scored 0 by a lost
  worker)."""
  check: PaperRegex | MathVerify

  def __call__(self, batch) -> np.ndarray:
    return self.check(batch.texts, [p.target for p in batch.problems])


def check_golds(reward, splits: dict[str, Sequence]) -> dict[str, int]:
  """{split: how many of its problems have a gold that `reward`'s verifier can never match}
  (every completion of such a problem scores 0), said once on stderr with an example when
  any has; {} when `reward` is not a VerifierReward. `splits`: {name: problems}."""
  if not isinstance(reward, VerifierReward):
    return {}
  checker = CHECKERS[reward.verifier]()
  try:
    counts, examples = {}, []
    for name, problems in splits.items():
      golds = [p.target for p in problems]
      bad = [g for g, ok in zip(golds, checker.parses(golds)) if not ok]
      counts[name], examples = len(bad), examples + bad
  finally:
    checker.close()
  if examples:
    where = ", ".join(f"{n} of {len(splits[k])} {k}" for k, n in counts.items() if n)
    print(f"WARNING: task.verifier={reward.verifier!r} can never match the gold answer of "
          f"{where} problems (e.g. {gold_text(examples[0])!r}); each of their completions "
          "scores 0. Fix those answers in the data, or choose another verifier.",
          file=sys.stderr, flush=True)
  return counts


if __name__ == "__main__":  # a math_verify worker (_Worker): JSON lines on stdin / stdout
  out, sys.stdout = sys.stdout, sys.stderr  # anything the libraries print goes to stderr
  import math_verify as _  # noqa: F401  (before "ready": no answer's deadline pays for it)
  out.write(json.dumps("ready") + "\n")
  out.flush()
  for request in sys.stdin:
    op, items = json.loads(request)
    for args in items:
      out.write(json.dumps(_OPS[op](*args)) + "\n")
      out.flush()
