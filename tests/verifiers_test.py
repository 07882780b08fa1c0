"""task.verifier: paper_regex and math_verify on the same cases (where they agree and
where they do not), math_verify from searcher threads, the reward stage, bad names; the
math_verify worker's deadline, restarts and one worker per consumer; unparseable golds."""
import os
import signal
import threading
import time

import numpy as np
import pytest

from tba_jax import verifiers
from tba_jax.tasks import RewardBatch
from tba_jax.tasks import Problem

# (completion, gold, paper_regex's verdict, math_verify's verdict)
CASES = [
    # Both accept: a GSM8K solution, a plain final number, thousands separators.
    ("Natalia sold 24 + 48 = 72 clips.\n#### 72", 72.0, 1, 1),
    ("The answer is 72.", 72.0, 1, 1),
    ("She has $1,200 left.", 1200.0, 1, 1),
    ("\\boxed{0.5}", 0.5, 1, 1),
    ("\\boxed{1024}", "1024", 1, 1),
    # Both reject: the final number is not the answer, or the answer is in words.
    ("It costs 18 dollars, 3 more than 15.", 18.0, 0, 0),
    ("The answer is seventy-two.", 72.0, 0, 0),
    # math_verify accepts what the last-number rule cannot read: LaTeX values, a boxed
    # answer followed by a check, equivalent forms, percentages, intervals, choices.
    ("So x = \\boxed{\\frac{1}{2}}", 0.5, 0, 1),
    ("The answer is \\boxed{72}. Check: 72 - 3 = 69", 72.0, 0, 1),
    ("The answer is 72/1", 72.0, 0, 1),
    ("The answer is 50%.", 0.5, 0, 1),
    ("So the answer is 0.75.", "\\frac{3}{4}", 0, 1),
    ("$\\boxed{(-2,2)}$", "(-2, 2)", 0, 1),
    ("The answer is \\boxed{C}", "\\text{(C)}", 0, 1),
    ("\\boxed{2^{10}}", "1024", 0, 1),
    ("\\boxed{(x-1)(x+1)}", "x^2-1", 0, 1),
    # The last-number rule accepts by coincidence (the gold's last number is there) or
    # reads scientific notation that math_verify does not take as the answer.
    ("$-2 < x < 2$, so (-2, 2)", "(-2, 2)", 1, 0),
    ("1e3 apples", 1000.0, 1, 0),
    # A reasoning model's final answer follows its thinking.
    ("<think>maybe 10? or 7</think> The answer is \\boxed{7}.", 7.0, 1, 1),
]
TEXTS, GOLDS = [c[0] for c in CASES], [c[1] for c in CASES]


@pytest.mark.parametrize("name,column", [("paper_regex", 2), ("math_verify", 3)])
def test_verdicts_on_shared_cases_including_disagreements(name, column):
  got = verifiers.CHECKERS[name]()(TEXTS, GOLDS)
  assert got.dtype == np.float32
  want = np.array([c[column] for c in CASES], np.float32)
  wrong = [CASES[i][:2] for i in np.flatnonzero(got != want)]
  assert not wrong, f"{name} differs on {wrong}"


def test_the_cases_hold_disagreements_both_ways():
  disagree = {(c[2], c[3]) for c in CASES if c[2] != c[3]}
  assert disagree == {(0, 1), (1, 0)}


def test_paper_regex_is_the_gsm8k_reward():
  from tba_jax.tasks import gsm8k
  floats = [(t, g) for t, g in zip(TEXTS, GOLDS) if isinstance(g, float)]
  got = verifiers.paper_regex([t for t, _ in floats], [g for _, g in floats])
  np.testing.assert_array_equal(got, [gsm8k.reward(t, g) for t, g in floats])


def test_math_verify_from_threads_gives_the_main_threads_verdicts():
  """math-verify's signal-based timeouts refuse to run off the main thread (its parse
  raises there); the worker process keeps them working for searcher threads."""
  want = verifiers.math_verify(TEXTS, GOLDS)
  results = [None] * 3

  def run(i):
    results[i] = verifiers.math_verify(TEXTS, GOLDS)

  threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
  for t in threads:
    t.start()
  for t in threads:
    t.join(timeout=120)
  for r in results:
    np.testing.assert_array_equal(r, want)
  assert want.sum() > 10


def test_gold_text_writes_numbers_as_math_verify_reads_them():
  assert [verifiers.gold_text(g) for g in (72.0, 0.5, -3.0, "\\frac{1}{2}")] == [
      "72", "0.5", "-3", "\\frac{1}{2}"]


def test_reward_stage_scores_a_batch_by_its_problems_golds():
  problems = [Problem(0, {"question": "q"}, 0.5), Problem(1, {"question": "q"}, "\\frac{3}{4}")]
  batch = RewardBatch(problems=problems, prompts=[[1], [1]],
                      completions=[np.array([1]), np.array([1])],
                      ended_with_eos=np.array([True, True]),
                      texts=["\\boxed{\\frac{1}{2}}", "so 0.75"])
  np.testing.assert_array_equal(verifiers.VerifierReward("math_verify").build(None)(batch), [1, 1])
  np.testing.assert_array_equal(verifiers.VerifierReward("paper_regex").build(None)(batch), [0, 0])
  with pytest.raises(ValueError, match="unknown verifier 'sympy'"):
    verifiers.VerifierReward("sympy")


WANT = np.array([c[3] for c in CASES], np.float32)  # math_verify's verdicts


def _wait_dead(pid: int, check) -> None:
  """Until the checker's worker `pid` has exited (its exit seen by poll, as the checker sees it)."""
  for _ in range(200):
    if check._worker.proc.poll() is not None:
      return
    time.sleep(0.05)
  raise AssertionError(f"worker {pid} still running")


def test_a_request_past_its_deadline_returns_and_the_worker_is_restarted(capsys):
  check = verifiers.MathVerify(deadline_s=1.0)
  np.testing.assert_array_equal(check(TEXTS, GOLDS), WANT)
  hung = check.worker_pid
  os.kill(hung, signal.SIGSTOP)  # alive, never answering: a hung worker
  t0 = time.perf_counter()
  try:
    got = check(TEXTS, GOLDS)
  finally:
    if check.worker_pid == hung:
      os.kill(hung, signal.SIGKILL)
  assert time.perf_counter() - t0 < 60
  # The first completion waited its deadline and scored 0; the rest went to a new worker.
  assert got[0] == 0 and WANT[0] == 1
  np.testing.assert_array_equal(got[1:], WANT[1:])
  assert (check.failures, check.restarts) == (1, 1)
  assert check.worker_pid not in (None, hung)
  with pytest.raises(ProcessLookupError):
    os.kill(hung, 0)  # killed and reaped
  err = capsys.readouterr().err
  assert "WARNING: math_verify: the worker did not answer within 1 s on the completion ending " \
      f"{TEXTS[0][-80:]!r} against the gold '72': scored 0 (1 so far by this checker)" in err
  check.close()


def test_a_worker_that_dies_during_a_request_costs_one_completion_not_the_request(capsys):
  check = verifiers.MathVerify(deadline_s=120.0)
  check(TEXTS[:1], GOLDS[:1])
  pid = check.worker_pid
  os.kill(pid, signal.SIGSTOP)  # the request waits in its pipe ...
  out = []
  asking = threading.Thread(target=lambda: out.append(check(TEXTS, GOLDS)))
  asking.start()
  time.sleep(1.0)
  os.kill(pid, signal.SIGKILL)  # ... until the worker crashes
  asking.join(timeout=60)
  got, = out
  assert got[0] == 0
  np.testing.assert_array_equal(got[1:], WANT[1:])
  assert (check.failures, check.restarts) == (1, 1) and check.worker_pid != pid
  assert "the worker exited (code -9) on the completion ending" in capsys.readouterr().err
  check.close()


def test_a_crashed_worker_is_restarted_and_the_next_request_is_scored(capsys):
  check = verifiers.MathVerify()
  check(TEXTS[:1], GOLDS[:1])
  pid = check.worker_pid
  os.kill(pid, signal.SIGKILL)
  _wait_dead(pid, check)
  np.testing.assert_array_equal(check(TEXTS, GOLDS), WANT)
  assert (check.failures, check.restarts) == (0, 1) and check.worker_pid != pid
  assert "the worker exited (code -9) after its last answer; restarted" in \
      capsys.readouterr().err
  check.close()


def test_each_consumer_builds_its_own_worker_and_one_ending_stops_no_other():
  problems = [Problem(0, {"question": "q"}, 0.5)]
  batch = RewardBatch(problems=problems, prompts=[[1]], completions=[np.array([1])],
                      ended_with_eos=np.array([True]), texts=["\\boxed{\\frac{1}{2}}"])
  stage = verifiers.VerifierReward("math_verify")
  searcher, evaluator = stage.build(None), stage.build(None)
  assert searcher(batch) == 1 and evaluator(batch) == 1
  a, b = searcher.check.worker_pid, evaluator.check.worker_pid
  assert a is not None and b is not None and a != b
  searcher.check.close()  # gone: the other scores on with the same worker
  assert evaluator(batch) == 1 and evaluator.check.worker_pid == b
  assert evaluator.check.restarts == 0
  evaluator.check.close()


def test_unparseable_golds_are_counted_and_said_at_load(capsys):
  golds = {"train": ["72", "}{", "\\frac{1}{2}", "", 3.0], "test": ["(-2, 2)", "\\frac{"]}
  splits = {k: [Problem(i, {}, g) for i, g in enumerate(v)] for k, v in golds.items()}
  counts = verifiers.check_golds(verifiers.VerifierReward("math_verify"), splits)
  assert counts == {"train": 2, "test": 1}
  assert ("WARNING: task.verifier='math_verify' can never match the gold answer of 2 of 5 "
          "train, 1 of 2 test problems (e.g. '}{')") in capsys.readouterr().err
  # paper_regex: a text gold without a number ("}{", "", "\\frac{"); a float gold has one.
  assert verifiers.check_golds(verifiers.VerifierReward("paper_regex"), splits) == {
      "train": 2, "test": 1}
  assert "task.verifier='paper_regex' can never match" in capsys.readouterr().err
  assert verifiers.check_golds(lambda text, gold: 1.0, splits) == {}  # no verifier: no check
  clean = {"train": [Problem(0, {}, 72.0)], "test": [Problem(1, {}, "5")]}
  assert verifiers.check_golds(verifiers.VerifierReward("math_verify"), clean) == {
      "train": 0, "test": 0}
  assert "WARNING" not in capsys.readouterr().err
