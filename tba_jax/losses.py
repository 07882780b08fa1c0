"""Objectives: the VarGrad trajectory-balance loss, beta schedules, baselines.

Pure functions of arrays (no config objects), jit-safe with static shapes; the
log-probs they are written on come from logprobs.py.
Inputs are flat over the N = P prompts x R samples of a batch; which group (the
samples of one prompt whose log Z or baseline is shared: in the runtime, a batch
slot, tba_jax/batch.py) a sequence belongs to is given by `group_ids` (any
integers, any order, groups of any size >= 1), never by a reshape to [P, R], so
every layout is handled.

Trajectory balance (tba_spec.md section 2), per prompt x with completions y_j:

    d_j      = log pi_theta(y_j|x) - log pi_ref(y_j|x) - r_j / beta
    log Z(x) = -mean_j d_j                     (stop-gradient, VarGrad)
    L        = mean over all (x, j) of (log Z(x) + d_j)^2

Because log Z is detached, grad L = -(2 / (beta N)) sum_j A_j grad log pi(y_j)
with A_j = r_j - beta log(pi_theta / pi_ref)(y_j) minus its per-prompt mean:
mean-baseline REINFORCE on the KL-penalised reward (paper appendix A).

Switches (each defaults to the TBA paper's behaviour):
- EOS token counted in log pi: `logprobs.completion_mask(..., include_eos=True)`.
- Importance-weight cap: `TBSwitches(ratio_clip=c)` weights each
  squared residual by stopgrad(min(pi_theta / pi_behaviour, c)). Default None: TBA
  itself uses no importance weights, and neither does TBA-prime's TB (bbartoldson/
  tba-prime at 115573d: its cap of 8 is the per-token ratio loss's, `ratio` below).
  (For the RLOO and GRPO baselines `ratio_clip` is PPO's eps instead.)
- Residual cap: `TBSwitches(residual_clip=c)` takes the Huber loss of each
  residual (its square within +-c, linear beyond), so a sequence's gradient weight is
  2 clip(residual, -c, c): a wrong completion sampled where the policy is mostly right
  (residual about r / beta) pushes as hard as one c nats off, not 20. log Z is then the
  group's Huber M-estimate (`huber_location`; the mean is the squares' argmin), so the
  clipped weights still sum to zero per prompt; around the mean they would not (7 right, 1
  wrong, beta 0.05, c 4: -27 / N, a likelihood push on the majority). Default None.
- Per-token KL (train_step.tb_loss's `token_kl_coef` c): adds (2 / beta) c mean_j sum_t
  k3_t(y_j), so the gradient is REINFORCE on A_j minus c times each token's KL penalty,
  GRPO's shape in reward units. TB's own KL term lives in A_j, mean-baselined per prompt:
  in a group of identical completions it vanishes with the reward signal and nothing holds
  the policy near pi_ref there; this term does not. Its gradient is that of a forward,
  mass-covering KL(pi_ref || pi_theta) per token (token_k3), so the fixed point moves
  from pi* toward pi_ref by c against the rewards' 1. Default off.
- beta schedule: `linear_beta` (the authors' anneal, with its (u - 1)
  convention and optional abrupt switch) or `constant_beta`.
- Tempered target (red-teaming; Lee et al., GFNOrg/red-teaming gfn_trainer.py
  L484-514): log R_u(y) = [log pi_ref(y) / gamma(u) + r / beta] / tau(u), i.e.
  `ref_weight` = 1 / (gamma tau) on the reference term and beta tau in place of
  beta, both `linear_ramp`s of the step, applied when the batch is trained (so
  replayed samples get the current step's target, as Lee et al. recompute it).
- log Z from the behaviour policy (TBA-prime's TB, bbartoldson/tba-prime
  src/zeroband/train.py L273-281): `TBSwitches(log_z_from_behaviour=True)`
  takes VarGrad's estimate from the sampling policy's log-probs, -mean_j (log pi_b -
  log pi_ref - r / beta), fixed per sample, instead of the current policy's; the
  residuals then no longer sum to zero per prompt, which pulls log pi_theta toward
  log pi_b on average (an implicit trust region).
- Reference resetting (TBA-prime per tba_spec.md; not in its code at 115573d) is the
  loop's, not a loss option: later samples carry the new reference's log-probs.

Baselines for comparison on the same batches: `rloo` (with `ratio_clip`: the
paper's Proximal RLOO), `grpo`, and `ratio`, TBA-prime's per-token ratio loss (its
GRPO recipe's, tba-prime src/zeroband/training/loss.py L193-229).
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp

from tba_jax.logprobs import masked_sum

Array = jax.Array


# ---------------------------------------------------------------------------
# Grouping by group id.
# ---------------------------------------------------------------------------
def group_index(group_ids: Array) -> Array:
  """[N] int32 in [0, N): the row of each sequence's first group member.

  Remaps arbitrary ids to segment ids under jit with static N, without sort or
  unique: an [N, N] equality test (N is a batch of sequences, a few hundred to
  a few thousand, so this is small next to one forward pass).
  """
  same = group_ids[:, None] == group_ids[None, :]
  return jnp.argmax(same, axis=1).astype(jnp.int32)


def group_size(group_ids: Array) -> Array:
  """[N] float32: the number of sequences in each sequence's group."""
  seg = group_index(group_ids)
  n = group_ids.shape[0]
  return jax.ops.segment_sum(jnp.ones((n,), jnp.float32), seg, num_segments=n)[seg]


def group_mean(values: Array, group_ids: Array) -> Array:
  """[N]: the mean of `values` [N] over each sequence's group (segment sums)."""
  seg = group_index(group_ids)
  n = values.shape[0]
  sums = jax.ops.segment_sum(values, seg, num_segments=n)
  counts = jax.ops.segment_sum(jnp.ones_like(values), seg, num_segments=n)
  return (sums / jnp.maximum(counts, 1.0))[seg]


# ---------------------------------------------------------------------------
# Trajectory balance.
# ---------------------------------------------------------------------------
class TBAux(NamedTuple):
  log_z: Array      # [N] log Z of each sequence's prompt (VarGrad's, detached; or the learned)
  residuals: Array  # [N] log Z + d
  kl: Array         # scalar: mean of log pi_theta - log pi_ref (KL(pi||ref) estimate)
  weights: Array    # [N] importance weights (ones without ratio_clip)


@dataclasses.dataclass(frozen=True)
class TBSwitches:
  """How trajectory_balance departs from the TBA paper's VarGrad TB (module docstring);
  each is off by default.

  ratio_clip: each squared residual weighted by stopgrad(min(exp(policy - behaviour),
  ratio_clip)) (needs behaviour_logprobs, the sequence log-probs of the policy version
  that sampled each completion); log Z stays the plain group mean of d.
  residual_clip: the Huber loss at c, log Z minus the group's Huber M-estimate of d (or of
  the behaviour's) instead of its mean, detached: at that argmin d loss / d log Z = 0, so
  (envelope theorem) the detached gradient 2 clip(residual_j) / N is the total one, and
  sums to zero per prompt (unweighted: without ratio_clip).
  log_z_from_behaviour (TBA-prime's TB): VarGrad's estimate from d with the behaviour
  log-probs in place of the policy's.
  """
  ratio_clip: float | None = None
  residual_clip: float | None = None
  log_z_from_behaviour: bool = False


def trajectory_balance(policy_logprobs: Array, ref_logprobs: Array, rewards: Array,
                       group_ids: Array, beta: Array | float,
                       behaviour_logprobs: Array | None = None,
                       switches: TBSwitches = TBSwitches(),
                       ref_weight: Array | float = 1.0,
                       log_z: Array | None = None) -> tuple[Array, TBAux]:
  """VarGrad TB loss (module docstring); all inputs are per-sequence [N].

  `ref_weight` scales the reference term: d = log pi - ref_weight log pi_ref - r / beta.
  `log_z` [N], when given, is a learned log Z of each row's prompt (differentiated:
  TB as in Malkin et al. 2022) in place of the VarGrad estimate. `switches`: TBSwitches.
  """
  s = switches
  policy_logprobs = policy_logprobs.astype(jnp.float32)
  target = ref_weight * ref_logprobs + rewards / beta
  d = policy_logprobs - target
  if log_z is None:
    if s.log_z_from_behaviour:
      if behaviour_logprobs is None:
        raise ValueError("log_z_from_behaviour needs behaviour_logprobs")
      d_z = behaviour_logprobs - target
    else:
      d_z = d
    d_z = jax.lax.stop_gradient(d_z)
    log_z = -(group_mean(d_z, group_ids) if s.residual_clip is None
              else huber_location(d_z, group_ids, s.residual_clip))
  residuals = log_z + d
  weights = _clipped_ratio(policy_logprobs, behaviour_logprobs, s.ratio_clip)
  loss = jnp.mean(weights * _residual_penalty(residuals, s.residual_clip))
  kl = jnp.mean(jax.lax.stop_gradient(policy_logprobs - ref_logprobs))
  return loss, TBAux(log_z=jax.lax.stop_gradient(log_z),
                     residuals=jax.lax.stop_gradient(residuals), kl=kl, weights=weights)


def huber_location(values: Array, group_ids: Array, clip: float, steps: int = 32) -> Array:
  """[N]: each group's Huber M-estimate of location, the m with sum_group psi(v_i - m) = 0
  for psi = clip(., -clip, clip) (the argmin of the group's summed Huber loss at `clip`).

  f(m) is non-increasing, piecewise linear, > 0 at the group's min - clip and < 0 at its
  max + clip: Newton steps from the mean (exact once on the root's linear piece; 1-3 steps
  typically, <= 16 on heavy-tailed draws) inside that shrinking bracket, bisecting when a
  step would leave it or no v_i is within clip of m. Not differentiated.
  """
  seg = group_index(group_ids)
  n = values.shape[0]
  total = lambda x: jax.ops.segment_sum(x, seg, num_segments=n)[seg]
  lo = jax.ops.segment_min(values, seg, num_segments=n)[seg] - clip
  hi = jax.ops.segment_max(values, seg, num_segments=n)[seg] + clip

  def step(_, state):
    m, lo, hi = state
    f = total(jnp.clip(values - m, -clip, clip))
    slope = total((jnp.abs(values - m) < clip).astype(jnp.float32))  # -f'(m): the inliers
    lo, hi = jnp.where(f > 0, m, lo), jnp.where(f < 0, m, hi)
    newton = m + f / jnp.maximum(slope, 1.0)
    ok = (slope > 0) & (newton > lo) & (newton < hi)
    # Converged where f is 0 or its step rounds away (f then is rounding noise whose sign
    # would otherwise move the bracket onto m and send the next step to its middle).
    done = (f == 0) | ((slope > 0) & (newton == m))
    return jnp.where(done, m, jnp.where(ok, newton, 0.5 * (lo + hi))), lo, hi

  return jax.lax.fori_loop(0, steps, step, (group_mean(values, group_ids), lo, hi))[0]


def _residual_penalty(residuals, clip):
  """residual^2, or its Huber loss at `clip` (continuous value and gradient at +-clip)."""
  if clip is None:
    return residuals ** 2
  size = jnp.abs(residuals)
  return jnp.where(size <= clip, residuals ** 2, 2 * clip * size - clip ** 2)


def _clipped_ratio(policy_logprobs, behaviour_logprobs, ratio_clip):
  """stopgrad(min(pi_theta / pi_behaviour, clip)) per sequence, or ones."""
  if ratio_clip is None:
    return jnp.ones_like(policy_logprobs)
  if behaviour_logprobs is None:
    raise ValueError("ratio_clip needs behaviour_logprobs")
  # min() in log space first: exp of a large log-ratio would overflow.
  log_ratio = jnp.minimum(policy_logprobs - behaviour_logprobs, jnp.log(ratio_clip))
  return jax.lax.stop_gradient(jnp.exp(log_ratio))


# ---------------------------------------------------------------------------
# beta schedules (functions of the 1-based trainer step u, jit-safe).
# ---------------------------------------------------------------------------
def linear_beta(step: Array | int, beta_init: float, beta_final: float,
                anneal_steps: int, stop_step: int) -> Array:
  """The authors' anneal: beta_final (u-1)/D + beta_init (1 - (u-1)/D) for u < stop.

  u = step counts from 1 (the first update is u = 1 and gets beta_init);
  from u = stop_step on, beta = beta_final. GSM8K: D = stop = 500, so beta
  reaches beta_final smoothly; TL;DR: D = 128, stop = 32, an intentional jump.
  """
  frac = (jnp.asarray(step, jnp.float32) - 1.0) / anneal_steps
  annealed = beta_final * frac + beta_init * (1.0 - frac)
  return jnp.where(step < stop_step, annealed, beta_final).astype(jnp.float32)


def constant_beta(step: Array | int, beta: float) -> Array:
  del step
  return jnp.asarray(beta, jnp.float32)


def linear_ramp(step: Array | int, start: float, end: float, steps: int) -> Array:
  """start + (end - start) min(1, u / steps) at the 1-based step u: Lee et al.'s
  reward and lm temperature schedules (gfn_trainer.py L253-264, u = global_step)."""
  frac = jnp.minimum(1.0, jnp.asarray(step, jnp.float32) / steps)
  return jnp.asarray(start + (end - start) * frac, jnp.float32)


# ---------------------------------------------------------------------------
# Baselines.
# ---------------------------------------------------------------------------
class RLOOAux(NamedTuple):
  advantages: Array     # [N] leave-one-out advantages of the KL-penalised reward
  kl: Array             # scalar: mean of log pi_behaviour - log pi_ref (the shaping's KL)
  ratios: Array         # [N] pi_theta / pi_behaviour per sequence (ones without ratio_clip)
  clip_fraction: Array  # scalar: fraction of sequences whose clipped term is the active one


def rloo(policy_logprobs: Array, ref_logprobs: Array, rewards: Array, group_ids: Array,
         beta: Array | float, behaviour_logprobs: Array | None = None,
         ratio_clip: float | None = None) -> tuple[Array, RLOOAux]:
  """REINFORCE leave-one-out, or Proximal RLOO with `ratio_clip`; inputs per sequence [N].

  R_j = r_j - beta (log pi_b - log pi_ref)(y_j) with pi_b the policy that sampled
  y_j (`behaviour_logprobs`; the current policy, detached, when None): the shaped
  reward is fixed when the sample is drawn, as in the RLOO trainers of Noukhovitch
  et al. (async RLHF) and the TBA authors (tba_trainer_gsm8k.py L578-586). The
  baseline of y_j is the mean R over the OTHER members of its group, so
  A_j = n/(n-1) (R_j - mean_group R); a group of one has no baseline: A = 0.

  ratio_clip=None: loss = -mean_j A_j log pi_theta(y_j) (on-policy REINFORCE).
  ratio_clip=eps: Proximal RLOO, the TBA paper's Eq. 6 (from Noukhovitch et al.):
  PPO's clipped surrogate on the SEQUENCE ratio rho_j = pi_theta(y_j) / pi_b(y_j),
  loss = -mean_j min(rho_j A_j, clip(rho_j, 1 - eps, 1 + eps) A_j), whose gradient
  is rho_j A_j grad log pi_theta(y_j) where the unclipped term is the minimum and 0
  where the clipped one is (rho_j beyond 1 + eps with A_j > 0, below 1 - eps with
  A_j < 0). Log-ratios are capped at +-80 before exp (float32 overflow); a sample
  beyond the cap gives no gradient.
  """
  policy_logprobs = policy_logprobs.astype(jnp.float32)
  sampler = jax.lax.stop_gradient(policy_logprobs if behaviour_logprobs is None
                                  else behaviour_logprobs)
  log_ratio_ref = sampler - ref_logprobs
  shaped = rewards - beta * log_ratio_ref
  n = group_size(group_ids)
  centred = shaped - group_mean(shaped, group_ids)
  advantages = jnp.where(n > 1, centred * n / jnp.maximum(n - 1.0, 1.0), 0.0)
  kl = jnp.mean(log_ratio_ref)
  if ratio_clip is None:
    loss = -jnp.mean(jax.lax.stop_gradient(advantages) * policy_logprobs)
    ones = jnp.ones_like(policy_logprobs)
    return loss, RLOOAux(advantages=advantages, kl=kl, ratios=ones, clip_fraction=jnp.zeros(()))
  if behaviour_logprobs is None:
    raise ValueError("Proximal RLOO (ratio_clip) needs behaviour_logprobs")
  ratio = jnp.exp(jnp.clip(policy_logprobs - behaviour_logprobs, -80.0, 80.0))
  unclipped = ratio * advantages
  clipped = jnp.clip(ratio, 1.0 - ratio_clip, 1.0 + ratio_clip) * advantages
  loss = -jnp.mean(jnp.minimum(unclipped, clipped))
  return loss, RLOOAux(advantages=advantages, kl=kl, ratios=jax.lax.stop_gradient(ratio),
                       clip_fraction=jnp.mean(clipped < unclipped))


def token_k3(policy_logprobs: Array, ref_logprobs: Array, mask: Array) -> Array:
  """[N, T] per-token k3 estimate exp(ref - pi) - (ref - pi) - 1 of KL(pi_theta || pi_ref)
  (Schulman's; >= 0), zero where mask is 0. The log-ratio is zeroed there BEFORE exp: an
  overflow at padding would turn into a NaN gradient even though it is masked out.

  On tokens sampled from pi_theta its expected gradient is that of KL(pi_ref || pi_theta)
  at each position, -sum_v pi_ref(v) grad log pi_theta(v), which keeps mass where pi_ref
  has it.
  """
  log_ref_ratio = jnp.where(mask > 0, ref_logprobs - policy_logprobs.astype(jnp.float32), 0.0)
  return jnp.exp(log_ref_ratio) - log_ref_ratio - 1.0


class GRPOAux(NamedTuple):
  advantages: Array     # [N] group-normalised rewards
  kl: Array             # scalar: mean per-token k3 estimate of KL(pi_theta || pi_ref)
  clip_fraction: Array  # scalar: fraction of counted tokens with ratio outside 1 +- clip_eps


def grpo(policy_logprobs: Array, behaviour_logprobs: Array, ref_logprobs: Array,
         mask: Array, rewards: Array, group_ids: Array, beta: Array | float,
         clip_eps: float = 0.2, std_eps: float = 1e-4) -> tuple[Array, GRPOAux]:
  """GRPO (DeepSeekMath) with PER-TOKEN log-probs [N, T] and mask [N, T].

  A_j = (r_j - mean_group r) / (std_group r + std_eps) with the sample standard
  deviation (Bessel's n - 1), as TRL's GRPOTrainer (its default
  scale_rewards="group": trl/trainer/utils.py nanstd, std_eps 1e-4); a group of
  one gets A = 0. Per token: PPO clipped surrogate of the ratio
  pi_theta / pi_behaviour, minus beta times the k3 KL estimate
  exp(ref - pi) - (ref - pi) - 1. Averaged over each sequence's counted
  tokens, then over sequences (so equal-size micro-batches accumulate exactly).
  """
  lp = policy_logprobs.astype(jnp.float32)
  counted = mask > 0
  mean = group_mean(rewards, group_ids)
  n = group_size(group_ids)
  std = jnp.sqrt(group_mean((rewards - mean) ** 2, group_ids) * n / jnp.maximum(n - 1.0, 1.0))
  advantages = jnp.where(n > 1, (rewards - mean) / (std + std_eps), 0.0)
  # Log-ratios are zeroed at padding BEFORE exp: an overflow there would turn
  # into a NaN gradient even though the value is masked out later.
  ratio = jnp.exp(jnp.where(counted, lp - behaviour_logprobs, 0.0))
  clipped = jnp.clip(ratio, 1.0 - clip_eps, 1.0 + clip_eps)
  adv = advantages[:, None]
  surrogate = jnp.minimum(ratio * adv, clipped * adv)
  kl = token_k3(lp, ref_logprobs, mask)
  num_tokens = jnp.maximum(jnp.sum(counted, axis=-1), 1)
  per_sequence = masked_sum(-(surrogate - beta * kl), mask) / num_tokens
  total_tokens = jnp.maximum(jnp.sum(counted), 1)
  aux = GRPOAux(
      advantages=advantages,
      kl=jax.lax.stop_gradient(jnp.sum(jnp.where(counted, kl, 0.0)) / total_tokens),
      clip_fraction=jnp.sum(counted & (ratio != clipped)) / total_tokens)
  return jnp.mean(per_sequence), aux


class RatioAux(NamedTuple):
  advantages: Array     # [N] shaped reward minus its group mean
  kl: Array             # scalar: mean of log pi_behaviour - log pi_ref (the shaping's KL)
  ratio_mean: Array     # scalar: mean clipped ratio over counted tokens
  clip_fraction: Array  # scalar: fraction of counted tokens with ratio above the clip


def ratio(policy_logprobs: Array, behaviour_logprobs: Array, ref_logprobs: Array, mask: Array,
          rewards: Array, group_ids: Array, beta: Array | float,
          ratio_clip: float = 8.0, tokens_per_row: Array | float | None = None
          ) -> tuple[Array, RatioAux]:
  """TBA-prime's per-token ratio loss (tba-prime src/zeroband/training/loss.py L193-229)
  with PER-TOKEN log-probs [N, T] and mask [N, T].

  A_j = R_j - mean_group R with R_j = r_j - beta (log pi_b - log pi_ref)(y_j), the
  reward shaped by the KL the sample was drawn with (beta = 0: their "dr_grpo"
  advantage r - mean r, tba-prime src/zeroband/inference/rewards.py L167-168; no
  standard-deviation scaling). Each counted token t of y_j contributes
  -min(rho_t, c) A_j with rho_t = pi_theta / pi_b of that token, differentiated (the
  gradient is -rho_t A_j grad log pi_theta below the cap, 0 above it: their
  clamp(exp(.), 0, c)); the loss is the token sum over N tokens_per_row (default: this
  batch's counted tokens, so the token mean). The update gives a micro-batch its WHOLE
  batch's count per row, so ragged micro-batches average to the batch's gradient (theirs
  divides each micro-batch by its own tokens: its gradient depends on the micro-batching).
  Unlike GRPO there is no PPO min/clip pair: one cap, on the ratio only.
  """
  lp = policy_logprobs.astype(jnp.float32)
  counted = mask > 0
  log_ratio_ref = masked_sum(behaviour_logprobs, mask) - masked_sum(ref_logprobs, mask)
  shaped = rewards - beta * log_ratio_ref
  advantages = shaped - group_mean(shaped, group_ids)
  # Capped in log space before exp (their clamp after exp overflows to inf for a large
  # log-ratio); padding zeroed first so that it never produces a NaN gradient.
  log_ratio = jnp.where(counted, lp - behaviour_logprobs, 0.0)
  capped = jnp.exp(jnp.minimum(log_ratio, jnp.log(ratio_clip)))
  per_token = -capped * jax.lax.stop_gradient(advantages)[:, None]
  if tokens_per_row is None:
    tokens_per_row = jnp.maximum(jnp.sum(counted), 1) / counted.shape[0]
  num_tokens = tokens_per_row * counted.shape[0]
  loss = jnp.sum(jnp.where(counted, per_token, 0.0)) / num_tokens
  aux = RatioAux(
      advantages=advantages, kl=jnp.mean(log_ratio_ref),
      ratio_mean=jax.lax.stop_gradient(jnp.sum(jnp.where(counted, capped, 0.0)) / num_tokens),
      clip_fraction=jnp.sum(counted & (log_ratio > jnp.log(ratio_clip))) / num_tokens)
  return loss, aux
