"""Evaluation: greedy pass@1, sampled pass@1 / pass@k, distinct answers, distance to TB's target.

Problems are batched through the same sampler the searchers use and scored by
the task's reward stage (built on the evaluation devices); "pass" means a
reward > 0, and pass@1 is the mean reward (0/1 for GSM8K). With n samples per
problem, pass@k for k = 2, 4, 8, ... < n is the unbiased estimator of Chen et al.
(2021), 1 - C(n - c, k) / C(n, k) for c passing samples, averaged over problems;
pass@n is whether any passed; distinct_correct counts a problem's distinct passing
completions (whitespace normalised), beside its distinct final answers. With a `target`
(TargetDistance), the sampled pass also says how far the policy is from trajectory
balance's target at the evaluated step's beta (target_distance.py: policy_kl, target_kl,
kl_to_target, tb_residual_std, reference_no_pass), from teacher-forced passes of the policy
and the reference over its samples and of the policy over the reference's: the sampled pass
of the evaluation where the policy was the reference (step 0, a reset), kept, or drawn again
with that evaluation's key by a run that did not make it (resumed: one more sampled pass).
A task's own
metrics (Task.evaluation) see every completion of a pass at once, with the
evaluated policy (`Policy`: its architecture, its params and the run's
reference, e.g. for a KL); they carry their pass's name ("greedy_win_rate")
when the evaluation runs both passes, and their own ("win_rate") when it runs
one. With several processes, each evaluates its own stride of the problems and
the counts are summed across processes.

A stop request (`should_stop`, the run's SIGTERM / Ctrl-C) abandons an evaluation: it
holds no state (the reference's samples are kept only once all were drawn), so nothing is
lost but its scores. The batch in flight is left at once
(`_generate`), and the decision is collective: after each batch every process exchanges
its flag (distributed.broadcast_flags; a process with fewer problems takes part in the
other's remaining rounds), and all leave at the same round, so none is left waiting in a
collective that another no longer calls. A process that was asked waits at that exchange
for the others' batches in flight (none, when every host received the signal).
"""
from __future__ import annotations

import dataclasses
import math
import threading
from typing import Any, Callable, Sequence

import jax
import numpy as np
import tqdm

from tba_jax import distributed, target_distance
from tba_jax.target_distance import StepTarget, TargetDistance
from tba_jax.tasks import Problem, RewardBatch, RewardFn, reward_texts

# generate(params, prompts, key) -> Rollouts (a sampler.Sampler)
GenerateFn = Callable
# How often a batch in flight looks at the stop request (`_generate`).
_POLL_S = 0.05


def pass_at_k(n: int, c: int, k: int) -> float:
  """The chance that k of n samples (c of them passing) drawn without replacement hold a
  passing one: 1 - C(n - c, k) / C(n, k) (Chen et al. 2021's unbiased pass@k)."""
  return 1.0 - math.comb(n - c, k) / math.comb(n, k)


@dataclasses.dataclass(frozen=True)
class Policy:
  """The evaluated policy as a task's metrics see it (params on the evaluation devices)."""
  model_config: Any  # model.ModelConfig of the policy
  params: Any
  reference: Any = None  # the run's reference policy's params (None: not given)
  # The reference's ModelConfig (None: model_config's). A LoRA policy's config carries its
  # adapters; its reference is the base model, adapters off.
  reference_config: Any = None

  def __post_init__(self):
    if self.reference_config is None:
      object.__setattr__(self, "reference_config", self.model_config)


# A task's own evaluation metrics (Task.evaluation, built on the evaluation devices like a
# reward stage), called once with every completion one evaluation pass generated and the
# policy that generated them: {name: per-row values [N] (averaged over rows, and kept with
# each row's sample) or one float for the whole batch, or a list of N per-row annotations
# (JSON values, e.g. texts: kept with the samples, not a metric)}.
MetricsFn = Callable[[RewardBatch, Policy], dict[str, Any]]


@dataclasses.dataclass
class Evaluator:
  problems: Sequence[Problem]
  prompt_tokens: Sequence[list[int]]  # one per problem
  decode: Callable[[Sequence[int]], str]
  reward: RewardFn  # the task's reward stage, built on the evaluation devices
  eos_ids: Sequence[int]
  batch_size: int
  greedy: GenerateFn | None = None  # greedy sampler, or None to skip greedy pass@1
  sampled: GenerateFn | None = None  # temperature sampler, or None to skip sampled metrics
  num_samples: int = 0
  answer: Callable[[str], Any] | None = None  # a completion's final answer: distinct_answers
  metrics: MetricsFn | None = None  # the task's own metrics, per pass (module docstring)
  model_config: Any = None  # the policy's, for the metrics (Policy)
  progress: bool = True
  # The sampled pass's distance to TB's target (target_distance.py); None: not computed.
  target: TargetDistance | None = None
  # The completions of the latest call, one dict each (pass, problem_id, question,
  # completion, reward), for WORKDIR/eval_samples/ (eval.save_samples).
  samples: list = dataclasses.field(default_factory=list)
  # The reference's samples for log Z: ((reference step, its config), (rows, rewards [P, n],
  # log pi_ref [P, n])) of this process's problems; drawn again when either changes.
  _reference: tuple | None = dataclasses.field(default=None, repr=False)

  def _run(self, generate, params, indices, repeats, key, desc, should_stop=None):
    """(rewards [len(indices), repeats], every completion as one RewardBatch, each row's
    model mask: 1 on the model's own tokens, None without turns) for the problems at
    `indices`, `repeats` completions each (problem-major); None when a stop request ended
    it (`__call__`)."""
    rows = [i for i in indices for _ in range(repeats)]
    rewards, batches, masks = np.zeros(len(rows)), [], []
    bar = tqdm.tqdm(total=len(rows), desc=desc, disable=not self.progress, leave=False)
    for start in range(0, len(rows), self.batch_size):
      chunk = rows[start:start + self.batch_size]
      key, sub = jax.random.split(key)
      prompts = [self.prompt_tokens[i] for i in chunk]
      out = _generate(generate, params, prompts, sub, should_stop)
      if out is None:  # a stop request cut this batch short
        bar.close()
        _stop_everywhere(should_stop)  # (True: this process asked) every process stops here
        return None
      completions = [out.tokens[j, :out.lengths[j]] for j in range(len(chunk))]
      batch = RewardBatch(
          problems=[self.problems[i] for i in chunk], prompts=prompts, completions=completions,
          ended_with_eos=np.array([c.size > 0 and int(c[-1]) in self.eos_ids
                                   for c in completions]),
          texts=reward_texts(self.decode, completions,  # TurnRollouts: what the reward reads
                             getattr(out, "reward_mask", None)))
      rewards[start:start + len(chunk)] = self.reward(batch)
      batches.append(batch)
      model_mask = getattr(out, "model_mask", None)  # TurnRollouts: replies are not the model's
      masks += [None if model_mask is None else model_mask[j] for j in range(len(chunk))]
      bar.update(len(chunk))
      if _stop_everywhere(should_stop):
        bar.close()
        return None
    bar.close()
    # A process with fewer rows than another (the problems do not split evenly) takes part
    # in that one's remaining rounds: every process exchanges the flag equally often.
    for _ in range(-(-len(rows) // self.batch_size), self._rounds(repeats)):
      if _stop_everywhere(should_stop):
        return None
    whole = RewardBatch(
        problems=[p for b in batches for p in b.problems],
        prompts=[p for b in batches for p in b.prompts],
        completions=[c for b in batches for c in b.completions],
        ended_with_eos=np.concatenate([b.ended_with_eos for b in batches]),
        texts=[t for b in batches for t in b.texts])
    return rewards.reshape(len(indices), repeats), whole, masks

  def _task_metrics(self, batch: RewardBatch, policy: Policy, prefix: str,
                    num_problems: int) -> tuple[dict, dict]:
    """The task's metrics as sums over this process's problems (the caller divides), and
    the per-row values to keep with the samples: every per-row metric, and every list
    (a per-row annotation, e.g. the victim's replies: kept, not averaged)."""
    if self.metrics is None:
      return {}, {}
    out, rows = {}, {}
    for name, value in self.metrics(batch, policy).items():
      if isinstance(value, list):
        rows[prefix + name] = value
        continue
      value = np.asarray(value, np.float64)
      if value.ndim == 1 and len(value) == len(batch):
        rows[prefix + name] = value.tolist()
      # A per-row mean (or a batch-wide figure) weighted by this process's problem count.
      out[prefix + name] = (value.mean() if value.ndim else float(value)) * num_problems
    return out, rows

  def __call__(self, params, key, reference=None, reference_config=None,
               should_stop: Callable[[], bool] | None = None,
               step_target: StepTarget | None = None) -> dict[str, float] | None:
    """Metrics under "eval/..." keys, averaged over the problems of every process; None
    when `should_stop` ended the evaluation (module docstring: on every process at once).

    `reference`: the run's reference policy's params, of `reference_config` (None: the
    policy's config), for the task's metrics (Policy) and the distance to TB's target.
    `should_stop`: this process's stop request (once True, it stays True); None: the
    evaluation runs to its end. `step_target`: TB's target at this step, for the distance
    to it (with `target`; None: not computed).
    """
    indices = list(range(jax.process_index(), len(self.problems), jax.process_count()))
    policy = Policy(self.model_config, params, reference, reference_config)
    sampled = self.sampled is not None and self.num_samples > 0
    both = self.greedy is not None and sampled  # the task's metrics then name their pass
    sums = {}
    self.samples = []
    if self.greedy is not None:
      ran = self._run(self.greedy, params, indices, 1, key, "eval greedy", should_stop)
      if ran is None:
        return None
      r, batch, _ = ran
      sums["greedy_pass@1"] = r.sum()
      sums["greedy_pass@1_se"] = self._se_term(r)
      task_sums, rows = self._task_metrics(batch, policy, "greedy_" if both else "",
                                           len(indices))
      sums.update(task_sums)
      self._keep("greedy", batch, r, rows)
    if sampled:
      n = self.num_samples
      # (fold_in 1: the key the reference's samples are drawn again with, _draw_reference_samples)
      ran = self._run(self.sampled, params, indices, n, jax.random.fold_in(key, 1),
                      "eval sampled", should_stop)
      if ran is None:
        return None
      r, batch, masks = ran
      sums["sampled_pass@1"] = r.mean(axis=1).sum()
      sums["sampled_pass@1_se"] = self._se_term(r)
      passed = (r > 0).sum(axis=1)
      for k in [2 ** i for i in range(1, n.bit_length()) if 2 ** i < n]:
        sums[f"pass@{k}"] = sum(pass_at_k(n, int(c), k) for c in passed)
      sums[f"pass@{n}"] = (passed > 0).sum()
      task_sums, rows = self._task_metrics(batch, policy, "sampled_" if both else "",
                                           len(indices))
      sums.update(task_sums)
      self._keep("sampled", batch, r, rows)
      if self.answer is not None:
        answers = [self.answer(t) for t in batch.texts]
        sums["distinct_answers"] = float(sum(len(set(answers[k * n:(k + 1) * n]))
                                             for k in range(len(indices))))
      sums["distinct_correct"] = distinct_correct(batch.texts, r)
      if self.target is not None and step_target is not None and reference is not None:
        rows = target_distance.Rows.of(batch.prompts, batch.completions, batch.ended_with_eos,
                                       masks, self.target.include_eos)
        target_sums = self._target_sums(policy, rows, r, indices, step_target, should_stop)
        if target_sums is None:
          return None
        sums.update(target_sums)
    names = sorted(sums)
    totals = np.array([sums[k] for k in names] + [len(indices)], np.float64)
    if jax.process_count() > 1:
      from jax.experimental import multihost_utils
      totals = np.asarray(multihost_utils.process_allgather(totals)).sum(axis=0)
    out = {f"eval/{k}": float(v / totals[-1]) for k, v in zip(names, totals[:-1])}
    if "eval/tb_residual_var" in out:  # a mean variance -> its root (a held-out TB loss's)
      out["eval/tb_residual_std"] = float(np.sqrt(max(out.pop("eval/tb_residual_var"), 0.0)))
    for k in [k for k in out if k.endswith("_se")]:
      # Summed squares (above) -> the standard error of the mean over problems:
      # sqrt((E[x^2] - E[x]^2) / (n - 1)) with x a problem's pass rate.
      mean, n = out[k[:-3]], totals[-1]
      out[k] = float(np.sqrt(max(out[k] - mean * mean, 0.0) / max(n - 1, 1)))
    return out

  def _target_sums(self, policy: Policy, rows, rewards: np.ndarray, indices,
                   at: StepTarget, should_stop) -> dict | None:
    """target_distance's metrics as sums over this process's problems (None: a stop request
    ended the reference's pass): teacher-forced passes of the policy and the reference over
    the pass's samples and of the policy over the reference's (drawn once per reference);
    one pass where the policy is the reference and its samples are the reference's."""
    n, spec = self.num_samples, self.target
    shape = (len(indices), n)
    lp = target_distance.sequence_logprobs(policy.model_config, policy.params, rows, spec, n)
    ref_lp = lp if at.at_reference else target_distance.sequence_logprobs(
        policy.reference_config, policy.reference, rows, spec, n)
    cache_key = (at.reference_step, policy.reference_config)
    if at.at_reference:  # keep them for the later evaluations of this reference
      self._reference = (cache_key, (rows, rewards, lp.reshape(shape)))
    if at.beta <= 0:  # no target (a baseline without a KL term): the KL to the reference alone
      return {"policy_kl": float(np.sum(lp - ref_lp)) / n}
    if self._reference is None or self._reference[0] != cache_key:
      if not self._draw_reference_samples(policy, indices, at, should_stop):
        return None
    ref_rows, ref_r, ref_ref_lp = self._reference[1]
    ref_pi_lp = ref_ref_lp if at.at_reference else target_distance.sequence_logprobs(
        policy.model_config, policy.params, ref_rows, spec, n).reshape(ref_r.shape)
    per_problem = target_distance.estimate(lp.reshape(shape), ref_lp.reshape(shape), rewards,
                                           ref_pi_lp, ref_ref_lp, ref_r, at.beta,
                                           at.ref_weight)
    return {k: float(v.sum()) for k, v in per_problem.items()}

  def _draw_reference_samples(self, policy: Policy, indices, at: StepTarget,
                              should_stop) -> bool:
    """Draws the reference's samples: the sampled pass of the evaluation at
    at.reference_step, with its key and the reference's params (the policy then), so a run
    that did not evaluate there gets the same ones; False: a stop request ended it."""
    spec = self.target
    generate = (self.sampled if policy.reference_config == policy.model_config
                else spec.reference_sampled)
    ran = self._run(generate, policy.reference, indices, self.num_samples,
                    jax.random.fold_in(at.reference_key, 1), "eval reference", should_stop)
    if ran is None:
      return False
    r, batch, masks = ran
    rows = target_distance.Rows.of(batch.prompts, batch.completions, batch.ended_with_eos,
                                   masks, spec.include_eos)
    ref_lp = target_distance.sequence_logprobs(policy.reference_config, policy.reference, rows,
                                               spec, self.num_samples)
    self._reference = ((at.reference_step, policy.reference_config),
                       (rows, r, ref_lp.reshape(r.shape)))
    return True

  def _rounds(self, repeats: int) -> int:
    """The batches of a pass on the process with the most problems (process 0)."""
    rows = -(-len(self.problems) // jax.process_count()) * repeats
    return -(-rows // self.batch_size)

  @staticmethod
  def _se_term(rewards: np.ndarray) -> float:
    """The sum over this process's problems of (a problem's mean reward)^2: with the
    mean, what the standard error over problems needs (summed across processes)."""
    return float(np.sum(rewards.mean(axis=1) ** 2))

  def _keep(self, name: str, batch: RewardBatch, rewards: np.ndarray,
            rows: dict | None = None) -> None:
    """The pass's completions as rows for `samples` (the loop may write them out), each
    with its values of the task's per-row metrics and annotations (`rows`)."""
    rows = rows or {}
    for i, (problem, text, reward) in enumerate(zip(batch.problems, batch.texts,
                                                    rewards.reshape(-1))):
      self.samples.append({"pass": name, "problem_id": problem.id, **problem.fields,
                           "completion": text, "reward": float(reward),
                           **{k: v[i] for k, v in rows.items()}})


def distinct_correct(texts: Sequence[str], rewards: np.ndarray) -> float:
  """The sum over problems (rows of `rewards` [P, n], texts problem-major) of the number of
  distinct passing (reward > 0) completions, compared with their whitespace normalised."""
  n = rewards.shape[1]
  return float(sum(len({" ".join(texts[k * n + j].split()) for j in range(n) if row[j] > 0})
                   for k, row in enumerate(rewards)))


# Batches left running by a stop request (`_generate`): a process that exits while one is
# inside an XLA call must leave with os._exit (interpreter shutdown aborts in it).
_abandoned: list[threading.Thread] = []


def batch_left_running() -> bool:
  """Whether an abandoned evaluation batch is still running in this process."""
  return any(t.is_alive() for t in _abandoned)


def _generate(generate: GenerateFn, params, prompts, key, should_stop):
  """generate(params, prompts, key); with `should_stop`, None as soon as it says stop.

  The batch then runs on to its end in a daemon thread, unobserved: its results are
  dropped, and the command-line run exits without waiting for it (batch_left_running). The stop waits for
  none of it (CPU: the abandoned batch only shares the cores with the save; an
  accelerator whose stream holds it finishes it before a later transfer from that device).
  """
  if should_stop is None:
    return generate(params, prompts, key)
  result = {}

  def work():
    try:
      result["out"] = generate(params, prompts, key)
    except BaseException as e:  # raised again below, in the caller's thread
      result["error"] = e

  thread = threading.Thread(target=work, name="evaluation-batch", daemon=True)
  thread.start()
  while thread.is_alive():
    if should_stop():
      _abandoned.append(thread)
      return None
    thread.join(_POLL_S)
  if "error" in result:
    raise result["error"]
  return result["out"]


def _stop_everywhere(should_stop) -> bool:
  """Whether any process asked to stop (False without `should_stop`). A collective: every
  process calls it at the same rounds of a pass (`Evaluator._run`)."""
  return should_stop is not None and distributed.broadcast_flags(should_stop())[0]
