"""The evaluator with a fake generator: pass rates, distinct answers, a task's own metrics,
a stop request."""
import threading
import time

import jax
import numpy as np
import pytest

from tba_jax.evaluation import Evaluator
from tba_jax.sampler import Rollouts
from tba_jax.tasks import Problem

EOS = 2


class FakeGenerate:
  """Completion of prompt [i]: token 10 + i, then EOS, except problem 2's sampled ones,
  which alternate between two answers and are cut off (no EOS)."""

  def __init__(self, greedy: bool):
    self.greedy, self.calls = greedy, 0

  def __call__(self, params, prompts, key):
    rows = []
    for prompt in prompts:
      i = prompt[0]
      if not self.greedy and i == 2:
        self.calls += 1
        rows.append([20 + self.calls % 2, 7])
      else:
        rows.append([10 + i, EOS])
    tokens = np.array(rows, np.int32)
    zeros = np.zeros(tokens.shape, np.float32)
    return Rollouts(tokens=tokens, logprobs=zeros, tempered_logprobs=zeros,
                    lengths=np.full(len(rows), 2, np.int32), num_decode_steps=2)


def _evaluator(**kw):
  problems = [Problem(i, {"question": f"q{i}"}, float(10 + i)) for i in range(3)]
  # Reward 1 when the first token is the problem's gold: every greedy answer is right; the
  # sampled answers of problem 2 are wrong.
  reward = lambda batch: np.array([float(c[0] == p.target) for c, p in
                                   zip(batch.completions, batch.problems)])
  kw = {"greedy": FakeGenerate(True), "sampled": FakeGenerate(False), "num_samples": 2,
        "batch_size": 4, **kw}
  return Evaluator(problems=problems, prompt_tokens=[[i] for i in range(3)],
                   decode=lambda ids: " ".join(map(str, ids)), reward=reward, eos_ids=(EOS,),
                   answer=lambda text: text.split()[0], progress=False, **kw)


def test_pass_rates_and_distinct_answers_per_problem():
  out = _evaluator()(params=None, key=jax.random.key(0))
  assert out["eval/greedy_pass@1"] == 1.0
  assert out["eval/sampled_pass@1"] == pytest.approx(2 / 3)
  assert out["eval/pass@2"] == pytest.approx(2 / 3)
  assert out["eval/distinct_answers"] == pytest.approx(4 / 3)  # problem 2: two answers


def test_a_tasks_own_metrics_see_every_completion_of_a_pass_at_once():
  seen = []

  def metrics(batch, policy):
    seen.append((len(batch), policy.params, policy.reference))
    return {"ended": batch.ended_with_eos.astype(float),  # per row: averaged
            "rows": float(len(batch))}                     # one figure for the whole pass

  out = _evaluator(metrics=metrics)(params="pi", key=jax.random.key(0), reference="ref")
  # greedy: 3 problems; sampled: 3 x 2 rows, across two chunks of 4; each with the policy
  assert seen == [(3, "pi", "ref"), (6, "pi", "ref")]
  assert out["eval/greedy_ended"] == 1.0 and out["eval/sampled_ended"] == pytest.approx(4 / 6)
  assert out["eval/greedy_rows"] == 3.0 and out["eval/sampled_rows"] == 6.0


def test_with_one_pass_the_tasks_metrics_keep_their_own_names():
  metrics = lambda batch, policy: {"ended": batch.ended_with_eos.astype(float)}
  out = _evaluator(metrics=metrics, greedy=None)(params=None, key=jax.random.key(0))
  assert out["eval/ended"] == pytest.approx(4 / 6) and "eval/sampled_ended" not in out
  assert out["eval/sampled_pass@1"] == pytest.approx(2 / 3)  # the built-in names stay


def test_the_samples_keep_each_rows_task_metrics_and_annotations_but_not_batch_figures():
  metrics = lambda batch, policy: {"ended": batch.ended_with_eos.astype(float),
                                   "said": [f"row {t}" for t in batch.texts],  # annotations
                                   "rows": float(len(batch))}
  ev = _evaluator(metrics=metrics, greedy=None)
  out = ev(params=None, key=jax.random.key(0))
  assert "eval/said" not in out and out["eval/ended"] == pytest.approx(4 / 6)
  assert [(s["ended"], s["said"]) for s in ev.samples] == [
      (1.0, f"row 10 {EOS}"), (1.0, f"row 10 {EOS}"), (1.0, f"row 11 {EOS}"),
      (1.0, f"row 11 {EOS}"), (0.0, "row 21 7"), (0.0, "row 20 7")]
  assert all("rows" not in s for s in ev.samples)


def test_standard_errors_are_over_problems_and_the_completions_are_kept():
  ev = _evaluator()
  out = ev(params=None, key=jax.random.key(0))
  # Per-problem sampled pass rates 1, 1, 0: the standard error of their mean (n - 1).
  per_problem = np.array([1.0, 1.0, 0.0])
  assert out["eval/sampled_pass@1_se"] == pytest.approx(per_problem.std(ddof=1) / np.sqrt(3))
  assert out["eval/greedy_pass@1_se"] == 0.0  # every greedy answer right
  # Every completion of both passes, with its problem and reward, for eval.save_samples.
  assert [s["pass"] for s in ev.samples] == ["greedy"] * 3 + ["sampled"] * 6
  assert [s["problem_id"] for s in ev.samples[3:]] == [0, 0, 1, 1, 2, 2]
  assert [s["reward"] for s in ev.samples[3:]] == [1, 1, 1, 1, 0, 0]
  assert ev.samples[0] == {"pass": "greedy", "problem_id": 0, "question": "q0",
                           "completion": f"10 {EOS}", "reward": 1.0}


def test_pass_at_k_is_the_unbiased_estimator_for_powers_of_two():
  """8 samples: problems 0 and 1 pass all 8, problem 2 passes 1 of 8."""

  class OnePass(FakeGenerate):
    def __call__(self, params, prompts, key):
      out = super().__call__(params, prompts, key)
      if [p[0] for p in prompts] == [2] * 4 and self.calls == 4:  # its first chunk of 4
        out.tokens[0, 0] = 12  # one sample right
      return out

  out = _evaluator(sampled=OnePass(False), num_samples=8)(params=None, key=jax.random.key(0))
  from tba_jax.evaluation import pass_at_k
  assert pass_at_k(8, 1, 2) == pytest.approx(1 - 21 / 28)  # 1 - C(7,2)/C(8,2)
  for k in (2, 4):
    assert out[f"eval/pass@{k}"] == pytest.approx((2 + pass_at_k(8, 1, k)) / 3)
  assert out["eval/pass@8"] == 1.0 and "eval/pass@16" not in out
  assert out["eval/sampled_pass@1"] == pytest.approx((2 + 1 / 8) / 3)


class Counting:
  """A generator that counts its batches and can say stop after its n-th (`stop_after`)."""

  def __init__(self, generate, stop_after: int = 0):
    self.generate, self.stop_after, self.batches = generate, stop_after, 0

  def __call__(self, params, prompts, key):
    self.batches += 1
    return self.generate(params, prompts, key)

  def should_stop(self) -> bool:
    return 0 < self.stop_after <= self.batches


def test_a_stop_request_between_batches_abandons_the_evaluation():
  greedy = Counting(FakeGenerate(True), stop_after=1)
  ev = _evaluator(greedy=greedy, batch_size=1)  # 3 greedy batches planned, then sampled ones
  assert ev(params=None, key=jax.random.key(0), should_stop=greedy.should_stop) is None
  assert greedy.batches == 1
  assert ev(params=None, key=jax.random.key(0), should_stop=lambda: False) is not None
  assert greedy.batches == 1 + 3  # unasked, it runs every batch


def test_a_batch_in_flight_is_left_at_once_when_a_stop_is_asked():
  started, release, finished = threading.Event(), threading.Event(), []

  def slow(params, prompts, key):  # a batch that takes as long as the test lets it
    started.set()
    release.wait(timeout=60)
    finished.append(True)
    return FakeGenerate(True)(params, prompts, key)

  t0 = time.perf_counter()
  try:
    assert _evaluator(greedy=slow)(params=None, key=jax.random.key(0),
                                   should_stop=started.is_set) is None
    assert time.perf_counter() - t0 < 10 and not finished  # it did not wait for the batch
  finally:
    release.set()


def test_every_process_exchanges_the_stop_flag_at_the_same_rounds(monkeypatch):
  """3 problems over 2 processes: process 0 evaluates 2, process 1 one; with batches of one
  row both exchange the flag 2 + 4 times (greedy, then 2 samples each), and both leave at the
  round where any process asked (the exchange's answer, not their own flag)."""
  from jax.experimental import multihost_utils
  from tba_jax import distributed
  monkeypatch.setattr(jax, "process_count", lambda: 2)
  monkeypatch.setattr(multihost_utils, "process_allgather", lambda x: np.stack([x, x]))
  for process in (0, 1):
    monkeypatch.setattr(jax, "process_index", lambda: process)
    exchanges = []
    monkeypatch.setattr(distributed, "broadcast_flags",
                        lambda *flags: (exchanges.append(flags) or (False,)))
    greedy, sampled = Counting(FakeGenerate(True)), Counting(FakeGenerate(False))
    out = _evaluator(greedy=greedy, sampled=sampled, batch_size=1)(
        params=None, key=jax.random.key(0), should_stop=lambda: False)
    assert out is not None and len(exchanges) == 2 + 4
    assert (greedy.batches, sampled.batches) == ((2, 4) if process == 0 else (1, 2))
    # Another process asked: this one's 2nd exchange says stop, though it did not ask.
    monkeypatch.setattr(distributed, "broadcast_flags",
                        lambda *flags: (exchanges.append(flags) or (len(exchanges) > 7,)))
    greedy = Counting(FakeGenerate(True))
    assert _evaluator(greedy=greedy, batch_size=1)(
        params=None, key=jax.random.key(0), should_stop=lambda: False) is None
    assert len(exchanges) == 8 and greedy.batches == (2 if process == 0 else 1)
