"""The trainer's optimizer: AdamW (optax's, or torch's arithmetic rounded to bfloat16)
with optional gradient-norm clipping, the learning-rate schedules it is built with, the
lr controls that scale its step by what the step does (`DriftControl`) or by whether the
reward still rises (`SaturationDecay`), and the weight update's rounding: how big a step is
and how it lands (train_step.py takes it).

Schedules are functions of the 1-based update index u, as the beta schedules: the
authors step their scheduler before each update (tba_trainer_gsm8k.py L665), so update
u uses lr(u) and the first update of a warmup already moves (optax counts from 0;
make_optimizer shifts by one).

Moments and rounding (train_step.py's docstring has the whole precision story): with
make_optimizer's default the moments and the update math are float32, and each new
weight is rounded to its dtype once (`apply_updates`). With moments_dtype="bfloat16"
the update is torch.optim.AdamW's on bfloat16 tensors, which is what the authors train
with (bf16 model, torch AdamW, no master copy): moments stored in bfloat16 and every
step of the arithmetic rounded to it (`adamw_rounded`; configs/gsm8k.py:rho1b). Either
way an update below half a bfloat16 ulp of a bfloat16 weight (2^-9 to 2^-8 of its
magnitude) is lost: Adam's steps are rarely above the lr, so at lr 1e-5 a weight larger
than about 4e-3 rarely moves.

Update-size control (`DriftControl`, config optim.lr_control="drift"): the step is tied to
what it does to the policy, not to a horizon. Each update measures its own effect, the
mean over the batch's rows of |log pi_new(y) - log pi_old(y)| per sequence (pi_old the
params before it, pi_new after; one extra teacher-forced forward, no backward:
train_step.make_update), and a scalar lr scale in the TrainState moves multiplicatively
towards the scale that would have hit `target`, within [min_scale, 1]
(DriftControl.next_scale); the next update's optimizer step is multiplied by it (Adam's
step is linear in the lr, so this IS an lr of lr(u) * scale). It composes with any
schedule: the intended pairing is a constant lr (the peak) with the controller supplying
the decay when, and as far as, the policy becomes easy to move (e.g. after its entropy
collapses), whatever the task's horizon.

Saturation decay (`SaturationDecay`, config optim.saturation_patience > 0): a second factor
on the step, cut by `factor` each time the trained batches' smoothed reward has gone
`patience` updates without a new best. It composes with either of the above (the step is
lr(u) x the drift scale x this factor). The drift scale measures the step it took, so where
it sits below 1 it rises to make up part of a cut; at 1 (its ceiling) the cut is whole.
"""
from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

Params = dict[str, Any]


# ---------------------------------------------------------------------------
# Learning-rate schedules (functions of the 1-based update u).
# ---------------------------------------------------------------------------
def warmup_stable_decay(peak_lr: float, warmup_steps: int, stable_steps: int,
                        decay_steps: int, final_lr: float = 0.0) -> optax.Schedule:
  """lr(u): linear warmup u / warmup, constant, cosine decay to final_lr, then final_lr.

  transformers' get_wsd_schedule (linear warmup, cosine decay), which the authors
  use, with phase LENGTHS (num_stable_steps / num_decay_steps): GSM8K's 50 / 350 /
  600 over 700 steps cuts the decay off at its midpoint (lr 5e-6 at the end).
  """
  return optax.join_schedules(
      [optax.linear_schedule(0.0, peak_lr, warmup_steps),
       optax.constant_schedule(peak_lr),
       optax.cosine_decay_schedule(peak_lr, decay_steps, alpha=final_lr / peak_lr if peak_lr else 0.0)],
      [warmup_steps, warmup_steps + stable_steps])


def warmup_linear(peak_lr: float, warmup_steps: int, total_steps: int,
                  final_lr: float = 0.0) -> optax.Schedule:
  """lr(u): linear warmup u / warmup, then linear decay to final_lr at total_steps."""
  return optax.join_schedules(
      [optax.linear_schedule(0.0, peak_lr, warmup_steps),
       optax.linear_schedule(peak_lr, final_lr, max(total_steps - warmup_steps, 1))],
      [warmup_steps])


def warmup_cosine(peak_lr: float, warmup_steps: int, total_steps: int,
                  final_lr: float = 0.0) -> optax.Schedule:
  """lr(u): linear warmup u / warmup, then cosine decay to final_lr at total_steps."""
  return optax.warmup_cosine_decay_schedule(0.0, peak_lr, warmup_steps,
                                            max(total_steps, warmup_steps + 1), final_lr)


def warmup_rsqrt(peak_lr: float, warmup_steps: int, stable_steps: int,
                 final_lr: float = 0.0) -> optax.Schedule:
  """lr(u): linear warmup u / warmup, constant to the knee k = warmup + stable, then
  peak_lr * sqrt(k / u), never below final_lr. A decay without a horizon: the step shrinks
  as 1 / sqrt(u) while the lr summed over the first u updates grows as sqrt(u), so a task
  that climbs for 200 updates is still learning at its end, where a cosine fixed in
  advance would have stopped at its floor."""
  knee = max(warmup_steps + stable_steps, 1)
  floor = final_lr / peak_lr if peak_lr else 0.0

  def schedule(u):
    u = jnp.asarray(u, jnp.float32)
    warm = jnp.minimum(u / warmup_steps, 1.0) if warmup_steps else 1.0
    return peak_lr * warm * jnp.maximum(jnp.sqrt(knee / jnp.maximum(u, knee)), floor)
  return schedule


# ---------------------------------------------------------------------------
# AdamW.
# ---------------------------------------------------------------------------
def make_optimizer(learning_rate: optax.ScalarOrSchedule, weight_decay: float,
                   max_grad_norm: float | None, b1: float = 0.9, b2: float = 0.999,
                   eps: float = 1e-8, moments_dtype: str = "float32"
                   ) -> optax.GradientTransformation:
  """AdamW (decoupled decay on every parameter, as torch.optim.AdamW), with
  optional clipping of the global gradient norm first.

  `learning_rate`: a constant or lr(u) of the 1-based update u (update u uses
  lr(u)). moments_dtype="bfloat16": `adamw_rounded`, torch's arithmetic on
  bfloat16 tensors (module docstring); "float32": optax.adamw.
  """
  lr = (lambda count: learning_rate(count + 1)) if callable(learning_rate) else learning_rate
  if moments_dtype == "float32":
    adamw = optax.adamw(lr, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay)
  elif moments_dtype == "bfloat16":
    adamw = adamw_rounded(lr, b1, b2, eps, weight_decay, jnp.bfloat16)
  else:
    raise ValueError(f"moments_dtype={moments_dtype!r}; expected 'float32' or 'bfloat16'")
  if max_grad_norm is None:
    return adamw
  return optax.chain(optax.clip_by_global_norm(max_grad_norm), adamw)


class RoundedAdamState(NamedTuple):
  count: jax.Array  # int32 updates taken
  mu: Params        # first moments, in the rounding dtype
  nu: Params        # second moments, in the rounding dtype


def adamw_rounded(learning_rate: optax.ScalarOrSchedule, b1: float, b2: float, eps: float,
                  weight_decay: float, dtype) -> optax.GradientTransformation:
  """torch.optim.AdamW's step on `dtype` (bfloat16) tensors, op for op.

  torch (single-tensor and foreach paths alike) computes each in-place op in
  float32 and rounds its result to the tensor dtype: exp_avg.lerp_(g, 1 - b1);
  exp_avg_sq.mul_(b2).addcmul_(g, g, 1 - b2); denom = (exp_avg_sq.sqrt() /
  sqrt(1 - b2^t)).add_(eps); param.addcdiv_(exp_avg, denom, -lr / (1 - b1^t)).
  The updates returned are float32 (-step * m / denom) so that the caller's
  `apply_updates` rounds the new weight once, as addcdiv_ does. Decoupled weight
  decay is subtracted in the same update (torch multiplies the weight by
  1 - lr * wd first, one more rounding; identical for wd = 0, the authors').
  """
  f32 = lambda x: x.astype(jnp.float32)
  rnd = lambda x: x.astype(dtype)

  def init(params):
    zeros = lambda p: jnp.zeros(p.shape, dtype)
    return RoundedAdamState(jnp.zeros((), jnp.int32), jax.tree.map(zeros, params),
                            jax.tree.map(zeros, params))

  def update(grads, state, params):
    lr = learning_rate(state.count) if callable(learning_rate) else learning_rate
    t = (state.count + 1).astype(jnp.float32)
    mu = jax.tree.map(lambda m, g: rnd(f32(m) + (1 - b1) * (f32(g) - f32(m))), state.mu, grads)
    nu = jax.tree.map(lambda v: rnd(f32(v) * b2), state.nu)
    nu = jax.tree.map(lambda v, g: rnd(f32(v) + (1 - b2) * f32(g) * f32(g)), nu, grads)
    step = lr / (1 - b1 ** t)
    bc2_sqrt = jnp.sqrt(1 - b2 ** t)

    def one(m, v, p):
      denom = rnd(f32(rnd(f32(rnd(jnp.sqrt(f32(v)))) / bc2_sqrt)) + eps)
      return -step * f32(m) / f32(denom) - lr * weight_decay * f32(p)

    updates = jax.tree.map(one, mu, nu, params)
    return updates, RoundedAdamState(state.count + 1, mu, nu)

  return optax.GradientTransformation(init, update)


def apply_updates(params: Params, updates: Params) -> Params:
  """New weights: float32 arithmetic, rounded once to each param's dtype."""
  return jax.tree.map(lambda p, u: (p.astype(jnp.float32) + u).astype(p.dtype), params, updates)


# ---------------------------------------------------------------------------
# Update-size control.
# ---------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class DriftControl:
  """An lr scale that keeps what one update does to the policy near `target` (module doc).

  The measured signal, `update_drift`, is the mean over the trained batch's rows of
  |log pi_new(y) - log pi_old(y)| (nats per sequence, tempered log-probs over the
  completion mask), averaged over micro-batches exactly as the loss is. Absolute values,
  not the KL-style mean of log pi_old - log pi_new: TB raises some of a batch's
  sequences and lowers others, so the signed mean cancels (its sign is not even fixed:
  the rows come from older policies, so it is no KL estimate), while the mean |change| is
  first order in the step and about proportional to the lr. That makes the update of the
  scale, scale * (target / drift) ** gain, with gain 1 the scale that would have hit the
  target on this batch; a gain below 1 damps batch-to-batch noise (geometric smoothing).
  The scale stays in [min_scale, 1]: the lr never exceeds the schedule's and never falls
  below lr_min = min_scale x optim.learning_rate; a non-finite drift sends it to the floor.
  """
  target: float     # nats per sequence per update (optim.drift_target)
  min_scale: float  # in (0, 1]: optim.lr_min / optim.learning_rate
  gain: float       # in (0, 1] (optim.drift_gain)

  def next_scale(self, scale: jax.Array, drift: jax.Array) -> jax.Array:
    """The scale of the next update, after one at `scale` moved the policy by `drift`."""
    new = scale * (self.target / jnp.maximum(drift, 1e-12)) ** self.gain  # inf: clipped to 1
    return jnp.clip(jnp.where(jnp.isfinite(drift), new, self.min_scale), self.min_scale, 1.0)


@dataclasses.dataclass(frozen=True)
class SaturationDecay:
  """An lr factor that falls when the trained batches' reward stops rising (module doc).

  Its signal is each update's batch reward mean (free: the batch carries its rewards),
  smoothed by an exponential average with weight `smoothing` on the past (the first update's
  mean starts it). When the average has not risen more than `min_gain` above its best for
  `patience` updates, the factor is multiplied by `factor`, and the count starts again; it
  never falls below `min_scale`. A decay that waits for saturation, not for a horizon: a
  task whose reward keeps rising keeps its lr. Its state is float32 [4] (STATE_FIELDS); a
  non-finite reward leaves it unchanged.
  """
  patience: int     # updates without a new best before each cut (optim.saturation_patience)
  factor: float     # in (0, 1): each cut multiplies the lr by it (optim.saturation_factor)
  smoothing: float  # in [0, 1): the average's weight on its past (optim.saturation_smoothing)
  min_gain: float   # reward units: a rise that counts as a new best (saturation_min_gain)
  min_scale: float  # in (0, 1]: optim.lr_min / optim.learning_rate

  STATE_FIELDS = ("reward_average", "best", "since_best", "factor")

  @staticmethod
  def init() -> jax.Array:
    """The state before the first update: no average yet, no best, the factor 1."""
    return jnp.array([0.0, -jnp.inf, 0.0, 1.0], jnp.float32)

  @staticmethod
  def factor_of(state: jax.Array) -> jax.Array:
    """The factor the next update's step is multiplied by."""
    return state[3]

  @staticmethod
  def reward_average_of(state: jax.Array) -> jax.Array:
    return state[0]

  def next_state(self, state: jax.Array, reward: jax.Array, first: jax.Array) -> jax.Array:
    """The state after an update whose batch had mean reward `reward` (`first`: update 1)."""
    average, best, since, factor = state[0], state[1], state[2], state[3]
    average = jnp.where(first, reward, self.smoothing * average + (1 - self.smoothing) * reward)
    risen = average > best + self.min_gain
    best = jnp.where(risen, average, best)
    since = jnp.where(risen, 0.0, since + 1)
    cut = since >= self.patience
    factor = jnp.maximum(jnp.where(cut, factor * self.factor, factor), self.min_scale)
    new = jnp.stack([average, best, jnp.where(cut, 0.0, since), factor]).astype(jnp.float32)
    return jnp.where(jnp.isfinite(reward), new, state)
