"""How far the evaluated policy is from trajectory balance's target (eval.target_distance).

TB's target for a prompt x is  target(y) = pi_ref(y)^w exp(r(y) / beta) / Z(x)  (w = 1, or
with a tempered target 1 / (gamma tau) and beta tau in place of beta: losses.py), so with
a(y) = w log pi_ref(y) + r(y) / beta, the log of its unnormalised density:

    policy_kl      = E_pi[log pi - log pi_ref]                      KL(pi || pi_ref)
    kl_to_target   = E_pi[log pi - a] + log Z                        KL(pi || target), 0 there
    target_kl      = E_target[a - log pi_ref] - log Z                KL(target || pi_ref)
    tb_residual    = log pi - a   (its spread over a prompt's samples: VarGrad's residual)

All per sequence (nats), log-probs summed over the completion tokens the loss counts, of the
policy tempered as in training (sampler.temperature). For 0/1 rewards and w = 1 the target
is about pi_ref given a right answer: target_kl ~ -log P_ref(right), and a policy far above
it (policy_kl >> target_kl) has overshot, one collapsed onto a few of the target's answers
has a large kl_to_target. At step 0 (pi = pi_ref) policy_kl is 0 and kl_to_target is
KL(pi_ref || target), > 0 wherever the reward varies.

log Z(x) = log sum_y pi_ref(y)^w exp(r(y) / beta) = log E_ref[exp(g)], g = a - log pi_ref,
is estimated per prompt from two sample sets: n_r completions of the REFERENCE (the sampled
pass of the evaluation where the policy was the reference, evaluation.py) and the evaluation's n_p completions of the policy, pooled by
multiple importance sampling (Veach's balance heuristic: the mixture q = (n_r pi_ref + n_p
pi) / (n_r + n_p)), self-normalised:

    u_k = v_k / sum_j v_j,  v_k = pi_ref(y_k) / q(y_k)     (k over both sets: pi_ref's weights)
    log Z_hat = log sum_k u_k exp(g_k)
    target_kl = sum_k p_k g_k - log Z_hat,  p_k = u_k exp(g_k) / Z_hat   (= KL(p || u) >= 0)

Where the policy is the reference, u is uniform and log Z_hat is the plain log mean exp(g)
over all n_r + n_p samples (w = 1: log mean exp(r / beta)); where g is the same for every
sample (a flat reward, w = 1) both KLs to the target are exactly those of pi_ref. Why both
sets: the reference's samples alone miss every answer the reference never sampled; a prompt
where no reference sample was right (0/1 rewards) would get log Z_hat = 0 where the truth is
near 1 / beta + log P_ref(right), and kl_to_target would read about -1 / beta. The policy's
samples cover that mass, weighted by pi_ref / q.

Bias: consistent, but with few samples (n of 2-8) log Z_hat is biased low (a log of a mean,
Jensen; self-normalising adds O(1 / n)), most where few samples earn the reward. target_kl is
a KL between two distributions on the pooled samples: 0/1 rewards give about -log of the
pooled estimate of P_ref(right), at most log(n_r + n_p) while the policy is the reference.
Where neither set holds a right answer the target's mass is unseen and both KLs to the
target are lower bounds; `reference_no_pass` (the share of prompts where no reference
sample scored > 0) says how much of the estimate leans on the policy's samples (a reward
that is never > 0, red-teaming's mean log p_toxic, reads 1 there: it says nothing).

Cost: three teacher-forced passes over the evaluation's samples (one where the policy is the
reference), each about the FLOPs of sampling them: on an accelerator a small part of a pass
that decodes token by token, on a CPU about its time again. Measured on a shared 2-core
Xeon: the `cpu` recipe's evaluations (SmolLM2-135M, 32 problems x 2 samples x 32 tokens)
10.8 s at step 0 either way and 10.6 -> 22.5 s at step 8 (its 8-step run: 154 s); the gsm8k
`tiny` one 0.01 -> 0.03 s; the red-teaming `tiny` one (32 samples) 0.24 -> 0.41 s.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Sequence

import jax
import numpy as np

from tba_jax import batch as batch_lib
from tba_jax import logprobs, sharding
from tba_jax import model as model_lib
from tba_jax.tasks import Metric

# The metrics as the plot draws them (experiments/plot.py --metrics), with the evaluation's
# distinct_correct beside them.
METRICS = {m.key: m for m in (
    Metric("eval/policy_kl", "KL(pi || pi_ref) per completion (held-out, sampled)", "nats"),
    Metric("eval/target_kl", "KL(target || pi_ref) of TB's target at the step's beta", "nats"),
    Metric("eval/kl_to_target", "KL(pi || TB's target) per completion", "nats"),
    Metric("eval/tb_residual_std", "spread of log pi - log pi_ref - r / beta per problem",
           "nats"),
    Metric("eval/reference_no_pass", "problems none of the reference's samples passed",
           "fraction"),
    Metric("eval/distinct_correct", "distinct passing completions per problem", "completions"))}

# Rows per teacher-forced call (rounded up to the mesh's batch multiple): its logits are
# [ROWS, completion columns, vocab] float32, 4 GB at 64 x 512 x 32K, hence fewer than a
# sampling batch.
ROWS = 16


@dataclasses.dataclass(frozen=True)
class TargetDistance:
  """What the evaluator needs for these metrics besides the policy and its reference."""
  layout: batch_lib.Layout  # prompt columns (task.max_prompt_len), completion columns
                            # (eval.max_new_tokens; longer multi-turn rows widen it)
  temperature: float        # of the log-probs: the trained policy's (sampler.temperature)
  include_eos: bool         # whether the EOS token's log-prob counts (loss.include_eos)
  mesh: Any                 # the evaluation's devices
  # A sampler of the reference's config where it is not the policy's (LoRA: the base
  # model, adapters off); None: the evaluation's sampled pass draws them.
  reference_sampled: Callable | None = None


@dataclasses.dataclass(frozen=True)
class StepTarget:
  """TB's target at the evaluated step, and which policy its reference is."""
  beta: float               # of the update that made the params (0: none, policy_kl only)
  ref_weight: float = 1.0   # w, the weight of log pi_ref (a tempered target: 1 / (gamma tau))
  reference_step: int = 0   # the step whose policy the reference is: 0, or the latest reset
  # That step's evaluation key: the reference's samples are that evaluation's sampled pass
  # (drawn again, the same, by a run that did not evaluate there, e.g. a resumed one).
  reference_key: Any = None
  at_reference: bool = False  # the evaluated step is that one: the params are the reference


@dataclasses.dataclass(frozen=True)
class Rows:
  """Completions to score, in the evaluation's problem-major order (n per problem)."""
  prompts: Sequence[Sequence[int]]
  completions: Sequence[np.ndarray]
  counted: Sequence[np.ndarray]  # per row, 1 where a completion token counts in log pi

  @staticmethod
  def of(prompts, completions, ended: np.ndarray, model_masks, include_eos: bool) -> "Rows":
    """The loss's counting (batch.from_entries): every completion token, less the EOS token
    with include_eos=False, and of a multi-turn row only the model's own tokens."""
    counted = []
    for c, e, m in zip(completions, ended, model_masks):
      k = np.zeros(len(c), np.float32)
      k[:len(c) - int(bool(e) and not include_eos)] = 1.0
      counted.append(k if m is None else k * (np.asarray(m[:len(c)]) > 0))
    return Rows(list(prompts), list(completions), counted)


@functools.partial(jax.jit, static_argnames=("model_config", "completion_len", "temperature",
                                             "prompt_group"))
def _sequence_logprobs(params, tokens, attention, counted, *, model_config, completion_len,
                       temperature, prompt_group):
  """[N] summed tempered log-probs of the counted completion tokens (the trainer's function)."""
  lp = model_lib.completion_token_logprobs(model_config, params, tokens, attention,
                                           completion_len, temperature,
                                           prompt_group=prompt_group)
  return logprobs.masked_sum(lp, counted)


def sequence_logprobs(model_config, params, rows: Rows, spec: TargetDistance,
                      num_samples: int) -> np.ndarray:
  """[N] float64 log pi(y | x) of every row under `params` (on spec.mesh, of
  `model_config`), in fixed-size calls: one compile per config and completion width."""
  n = len(rows.prompts)
  if n == 0:
    return np.zeros(0)
  multiple = sharding.batch_size_multiple("searcher", spec.mesh)
  b = -(-ROWS // multiple) * multiple
  width = max(spec.layout.completion_len, max(len(c) for c in rows.completions))
  layout = dataclasses.replace(spec.layout, completion_len=width)
  place = lambda x: jax.device_put(x, sharding.batch_sharding("searcher", spec.mesh, 2))
  out = []
  for start in range(0, n, b):
    stop = min(start + b, n)
    pad = b - (stop - start)  # padding rows: no tokens, nothing counted
    tokens, attention = batch_lib.token_rows(list(rows.prompts[start:stop]) + [[]] * pad,
                                             list(rows.completions[start:stop]) + [[]] * pad,
                                             layout)
    counted = np.zeros((b, width), np.float32)
    for i, k in enumerate(rows.counted[start:stop]):
      counted[i, :len(k)] = k
    # The evaluation's rows come in runs of n samples of one prompt: each run's prompt then
    # goes through the model once (model.completion_logits' prompt_group).
    group = num_samples if batch_lib.shares_prompts(tokens, attention, layout.prompt_len,
                                                    num_samples) else 1
    lp = _sequence_logprobs(params, place(tokens), place(attention), place(counted),
                            model_config=model_config, completion_len=width,
                            temperature=spec.temperature, prompt_group=group)
    out.append(np.asarray(lp, np.float64)[:stop - start])
  return np.concatenate(out)


def _logsumexp(x: np.ndarray, axis: int) -> np.ndarray:
  top = np.max(x, axis=axis, keepdims=True)
  return np.squeeze(top, axis) + np.log(np.sum(np.exp(x - top), axis=axis))


def estimate(policy_lp: np.ndarray, policy_ref_lp: np.ndarray, policy_r: np.ndarray,
             ref_policy_lp: np.ndarray, ref_lp: np.ndarray, ref_r: np.ndarray,
             beta: float, ref_weight: float = 1.0) -> dict[str, np.ndarray]:
  """Per prompt [P] (module docstring), from the policy's samples ([P, n_p]: log pi, log
  pi_ref, reward) and the reference's ([P, n_r]: log pi, log pi_ref, reward). beta > 0."""
  a = lambda lref, r: ref_weight * lref + r / beta  # log of the unnormalised target
  d = policy_lp - a(policy_ref_lp, policy_r)        # the TB residual before log Z
  n_r, n_p = ref_r.shape[1], policy_r.shape[1]
  lp = np.concatenate([ref_policy_lp, policy_lp], axis=1)  # [P, n_r + n_p], both sets pooled
  lref = np.concatenate([ref_lp, policy_ref_lp], axis=1)
  g = a(lref, np.concatenate([ref_r, policy_r], axis=1)) - lref
  # log u: pi_ref / (n_r pi_ref + n_p pi), normalised per prompt
  log_v = lref - np.logaddexp(np.log(n_r) + lref, np.log(n_p) + lp)
  log_u = log_v - _logsumexp(log_v, axis=1)[:, None]
  log_z = _logsumexp(log_u + g, axis=1)
  p = np.exp(log_u + g - log_z[:, None])  # the target's weights on the pooled samples
  return {"policy_kl": np.mean(policy_lp - policy_ref_lp, axis=1),
          "kl_to_target": np.mean(d, axis=1) + log_z,
          "target_kl": np.sum(p * g, axis=1) - log_z,
          "tb_residual_var": np.var(d, axis=1),
          "reference_no_pass": (np.max(ref_r, axis=1) <= 0).astype(np.float64)}
