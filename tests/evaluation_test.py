"""The evaluator with a fake generator: pass rates, distinct answers, a task's own metrics,
a stop request; with a tiny random model: the distance to TB's target."""
import dataclasses
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


def test_distinct_correct_counts_each_problems_distinct_passing_texts():
  from tba_jax.evaluation import distinct_correct
  texts = ["a b", "a  b\n", "c", "x",   # problem 0: "a b" twice (whitespace), "c"; "x" failed
           "x", "y", "z", "w"]          # problem 1: nothing passed
  rewards = np.array([[1, 1, 1, 0], [0, 0, 0, 0]], float)
  assert distinct_correct(texts, rewards) == 2.0
  out = _evaluator()(params=None, key=jax.random.key(0))
  assert out["eval/distinct_correct"] == pytest.approx(2 / 3)  # 1, 1, 0 (problem 2 failed)


# ----- The distance to TB's target, on a tiny random model -----------------------------------
PROMPTS = [[5, 6, 7], [8, 9], [10]]
TF_EOS, TEMPERATURE, MAX_NEW = 3, 0.8, 5


def _tiny_evaluator(cfg, mesh, num_samples=4, reference_cfg=None, **kw):
  from tba_jax.batch import Layout
  from tba_jax.sampler import Sampler, SamplingOptions
  from tba_jax.target_distance import TargetDistance
  options = SamplingOptions(max_new_tokens=MAX_NEW, temperature=TEMPERATURE, eos_ids=(TF_EOS,))
  sampler = lambda c: Sampler(c, options, mesh=mesh)
  target = TargetDistance(Layout(4, MAX_NEW, 0), TEMPERATURE, include_eos=True, mesh=mesh,
                          reference_sampled=sampler(reference_cfg) if reference_cfg else None)
  # Right when the first token is even: about half the samples of a random model.
  reward = lambda batch: np.array([float(c[0] % 2 == 0) for c in batch.completions])
  return Evaluator(problems=[Problem(i, {}, None) for i in range(len(PROMPTS))],
                   prompt_tokens=PROMPTS, decode=lambda ids: " ".join(map(str, ids)),
                   reward=reward, eos_ids=(TF_EOS,), batch_size=8, sampled=sampler(cfg),
                   num_samples=num_samples, model_config=cfg, progress=False, target=target,
                   greedy=None, **kw)


def _direct_logprob(cfg, params, prompt, completion) -> float:
  """log pi(completion | prompt) at the temperature from one unpadded forward pass."""
  from tba_jax import model
  tokens = np.array([list(prompt) + list(completion)], np.int32)
  logits = np.asarray(model.logits(cfg, params, tokens), np.float64)[0] / TEMPERATURE
  top = logits.max(-1, keepdims=True)
  logp = logits - top - np.log(np.exp(logits - top).sum(-1, keepdims=True))  # log softmax
  return float(sum(logp[len(prompt) - 1 + t, tok] for t, tok in enumerate(completion)))


def _tiny_policies(cfg, mesh):
  from tba_jax import sharding, weight_sync
  from tba_jax.model import init_params
  place = lambda p: weight_sync.publish(p, sharding.param_shardings(cfg, "searcher", mesh))
  return place(init_params(cfg, 1)), place(init_params(cfg, 0))


def _at(beta, **kw):
  from tba_jax.target_distance import StepTarget
  return StepTarget(beta, reference_key=jax.random.key(9), **kw)


def test_the_target_distance_equals_direct_forward_passes_of_policy_and_reference(tiny_cfg):
  """Every figure from the policy's and the reference's log-probs of the pass's own samples
  and of the reference's samples, recomputed one unpadded sequence at a time; the
  teacher-forced passes run sharded over 2 devices."""
  from tba_jax import sharding, target_distance
  mesh = sharding.make_mesh("searcher", jax.local_devices()[:2])
  policy, reference = _tiny_policies(tiny_cfg, mesh)
  ev = _tiny_evaluator(tiny_cfg, mesh)
  beta, w = 0.5, 0.8
  out = ev(policy, jax.random.key(0), reference=reference, step_target=_at(beta, ref_weight=w))
  n = 4
  tokens = lambda text: [int(t) for t in text.split()]
  rows = [(PROMPTS[s["problem_id"]], tokens(s["completion"]), s["reward"]) for s in ev.samples]
  lp = lambda params, rs: np.array([_direct_logprob(tiny_cfg, params, p, c) for p, c, *_ in rs])
  ref_rows, ref_r, _ = ev._reference[1]
  ref_rows = list(zip(ref_rows.prompts, ref_rows.completions))
  shape = (3, n)
  want = target_distance.estimate(
      lp(policy, rows).reshape(shape), lp(reference, rows).reshape(shape),
      np.array([r for *_, r in rows]).reshape(shape), lp(policy, ref_rows).reshape(shape),
      lp(reference, ref_rows).reshape(shape), ref_r, beta, w)
  for k in ("policy_kl", "kl_to_target", "target_kl", "reference_no_pass"):
    assert out[f"eval/{k}"] == pytest.approx(want[k].mean(), abs=2e-4), k
  assert out["eval/tb_residual_std"] == pytest.approx(np.sqrt(want["tb_residual_var"].mean()),
                                                      abs=2e-4)
  assert out["eval/policy_kl"] != 0.0 and 0 < np.mean(ref_r) < 1  # not a trivial case


def test_the_reference_samples_are_its_own_evaluations_drawn_again_the_same(tiny_cfg):
  """The evaluation at the reference's step keeps its sampled pass as the reference's samples
  (no extra pass); a run that did not evaluate there (a resumed one) draws the same ones."""
  from tba_jax import sharding
  mesh = sharding.make_mesh("searcher", jax.local_devices()[:1])
  policy, reference = _tiny_policies(tiny_cfg, mesh)
  first = _tiny_evaluator(tiny_cfg, mesh)
  first.sampled = Counting(first.sampled)
  first(reference, jax.random.key(9), reference=reference, step_target=_at(0.5, at_reference=True))
  assert first.sampled.batches == 2  # 12 rows, 8 a batch: the pass alone
  resumed = _tiny_evaluator(tiny_cfg, mesh)
  resumed(policy, jax.random.key(3), reference=reference, step_target=_at(0.5))
  (rows, r, lp), (again, r_again, lp_again) = first._reference[1], resumed._reference[1]
  assert [c.tolist() for c in rows.completions] == [c.tolist() for c in again.completions]
  np.testing.assert_array_equal(r, r_again)
  np.testing.assert_allclose(lp, lp_again, atol=1e-5)


def test_at_the_reference_policy_kl_is_exactly_zero_and_the_samples_are_drawn_once(tiny_cfg):
  """The same params as policy and reference: the same numbers, so log pi - log pi_ref is 0
  exactly; with a constant reward the target is the reference itself. The reference's
  samples are drawn once per reference, and the log-prob function compiles once."""
  from tba_jax import sharding, target_distance
  mesh = sharding.make_mesh("searcher", jax.local_devices()[:1])
  policy, _ = _tiny_policies(tiny_cfg, mesh)
  ev = _tiny_evaluator(tiny_cfg, mesh)
  ev.reward = lambda batch: np.full(len(batch), 0.3)
  drawn = Counting(ev.sampled)
  ev.sampled = drawn
  out = ev(policy, jax.random.key(0), reference=policy, step_target=_at(0.1))
  assert out["eval/policy_kl"] == 0.0
  assert out["eval/kl_to_target"] == pytest.approx(0.0, abs=1e-6)
  assert out["eval/target_kl"] == pytest.approx(0.0, abs=1e-6)
  assert out["eval/reference_no_pass"] == 0.0
  batches = drawn.batches  # the pass's 12 rows and the reference's, 8 a batch
  assert batches == 4
  compiles = target_distance._sequence_logprobs._cache_size()
  out = ev(policy, jax.random.key(1), reference=policy, step_target=_at(0.2))  # another beta
  assert out["eval/policy_kl"] == 0.0 and drawn.batches == batches + 2  # the pass alone
  assert target_distance._sequence_logprobs._cache_size() == compiles
  ev(policy, jax.random.key(1), reference=policy, step_target=_at(0.2, reference_step=5))
  assert drawn.batches == batches + 2 + 4  # a reset: the reference's samples drawn again
  # Without a target (a baseline's beta 0) only the KL to the reference.
  out = ev(policy, jax.random.key(1), reference=policy, step_target=_at(0.0))
  assert out["eval/policy_kl"] == 0.0 and "eval/kl_to_target" not in out


def test_a_lora_policys_reference_is_the_base_sampled_with_its_own_config(tiny_cfg):
  """Fresh adapters (B = 0) leave the base model: the KL to it is 0 up to rounding, and the
  reference's samples come from the base's sampler."""
  from tba_jax import lora, sharding, weight_sync
  from tba_jax.model import LoRAConfig, init_params
  mesh = sharding.make_mesh("searcher", jax.local_devices()[:1])
  cfg = tiny_cfg.replace(lora=LoRAConfig(4, 8.0, tiny_cfg.projections))
  params = weight_sync.publish(init_params(cfg, 1), sharding.param_shardings(cfg, "searcher", mesh))
  base_cfg = lora.base_config(cfg)
  ev = _tiny_evaluator(cfg, mesh, reference_cfg=base_cfg)
  drawn = Counting(ev.target.reference_sampled)
  ev.target = dataclasses.replace(ev.target, reference_sampled=drawn)
  out = ev(params, jax.random.key(0), reference=lora.split(params)[0], reference_config=base_cfg,
           step_target=_at(0.5))
  assert drawn.batches == 2 and out["eval/policy_kl"] == pytest.approx(0.0, abs=1e-5)


def test_a_stop_request_during_the_reference_pass_abandons_and_keeps_nothing(tiny_cfg):
  from tba_jax import sharding
  mesh = sharding.make_mesh("searcher", jax.local_devices()[:1])
  policy, reference = _tiny_policies(tiny_cfg, mesh)
  ev = _tiny_evaluator(tiny_cfg, mesh)
  ev.sampled = Counting(ev.sampled, stop_after=3)  # the pass takes 2 batches, then the reference's
  assert ev(policy, jax.random.key(0), reference=reference, step_target=_at(0.5),
            should_stop=ev.sampled.should_stop) is None
  assert ev._reference is None
