"""Jitted, sharded VarGrad-TB update on the trainer mesh (objectives in losses.py, the
optimizer and its lr schedules in optim.py).

One update = forward + backward over a TrainBatch (optionally in micro-batches
that each hold whole prompt groups), then the optimizer's step. Everything runs in one
jitted program on the trainer mesh: parameters and optimizer moments FSDP-
sharded (sharding.param_shardings), the batch split over "fsdp", the train
state (train_state.py) donated so its buffers are reused in place. `make_update`
takes what the update minimises (`Objective`) and how its forward runs (`Forward`).

Precision (the params dtype is whatever `train_state.init_state` got; the forward's is
`Forward.dtype`):
- float32 params, compute float32: everything in float32.
- float32 master weights: float32 params, compute "bfloat16". The loss
  casts the params to bfloat16 inside the program, so the forward/backward run
  in bfloat16 while gradients flow back through the cast as float32; AdamW
  moments and the weight update are float32 (configs/gsm8k.py:rho1b_stable).
- bfloat16 params: params stored in bfloat16, compute bfloat16; the moments float32, or
  bfloat16 with torch's rounding (optim.adamw_rounded: the authors' setup,
  configs/gsm8k.py:rho1b), each new weight rounded to bfloat16 once (optim.py).

LoRA (`model_config.lora`): the trained parameters are the adapters only (the
TrainState's params, optimizer moments and gradients cover nothing else); the
frozen base weights are an argument of every update (`update(state, batch,
base)`, not donated), in the model dtype (no master copy: they never change),
combined with the adapters inside the program (lora.py).

Update-size control (optim.DriftControl, config optim.lr_control="drift"): each update
measures what it did to the policy (one extra teacher-forced forward, no backward), and a
scalar lr scale in the TrainState, multiplying the next update's optimizer step, moves
towards the scale that would have hit the target. Saturation decay (optim.SaturationDecay,
optim.saturation_patience > 0): a second factor in the TrainState, cut when the batches'
smoothed reward stops rising.

Loss functions share one signature (`LossFn`) so the same update trains with
TB (`tb_loss`) or the baselines (`rloo_loss`, `grpo_loss`, `ratio_loss`); their switches are
keyword-only, bound with functools.partial. A loss that averages over tokens rather than
rows (`ratio_loss`) also takes `tokens_per_row`, which the update fills in (make_update).
"""
from __future__ import annotations

import dataclasses
import inspect
from typing import Callable

import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from tba_jax import lora, losses, model, optim, sharding
from tba_jax.batch import TrainBatch  # noqa: F401  (re-exported: train_step.TrainBatch)
from tba_jax.layers import Dropout
from tba_jax.logprobs import masked_sum, token_logprobs_and_entropy
from tba_jax.model import ModelConfig, Params
from tba_jax.train_state import (LearnedLogZ, TrainState, batch_shardings, float32,
                                 state_shardings)


# (policy per-token log-probs [N, Tc] float32, batch, beta) -> (loss, scalar metrics)
LossFn = Callable[[jax.Array, TrainBatch, jax.Array], tuple[jax.Array, dict[str, jax.Array]]]
# 1-based trainer step u -> beta (losses.linear_beta / losses.constant_beta, bound); the same
# shape for tb_loss's ref_weight
BetaSchedule = Callable[[jax.Array], jax.Array]


@dataclasses.dataclass(frozen=True)
class Objective:
  """What an update minimises: `loss_fn` on the policy's completion log-probs tempered at
  `temperature` (the searchers' sampling temperature), at beta = beta_schedule(u) of the
  1-based update u (the authors count trainer steps from 1). `ref_weight_schedule(u)`,
  when given, is passed to the loss as `ref_weight` (tb_loss: the tempered target of
  losses.py) and reported as "ref_weight"."""
  loss_fn: LossFn
  beta_schedule: BetaSchedule
  temperature: float
  ref_weight_schedule: BetaSchedule | None = None


@dataclasses.dataclass(frozen=True)
class Forward:
  """How an update's forward and backward run."""
  dtype: str = "float32"     # the compute dtype (module docstring: precision)
  # Equal micro-batches of whole groups (_group_sorted_microbatches), gradients averaged.
  num_microbatches: int = 1
  remat: bool = False        # each layer rematerialised in the backward
  # K > 1: every batch's rows come in runs of K sharing their prompt (the replay buffer's
  # slots; micro-batches keep them whole), whose prompt the forward runs once
  # (model.completion_logits).
  prompt_group: int = 1
  # > 0: the model's dropout (model.py) at that rate, masks from (dropout_seed, the
  # update's step, its micro-batch), so a resumed run draws the masks the uninterrupted
  # one would. 0: no dropout op at all.
  dropout: float = 0.0
  dropout_seed: int = 0

  def dropout_at(self, step, micro) -> Dropout | None:
    if not self.dropout:
      return None
    key = jax.random.fold_in(jax.random.fold_in(jax.random.key(self.dropout_seed), step), micro)
    return Dropout(key, self.dropout)


# ---------------------------------------------------------------------------
# Loss functions with the LossFn signature.
# ---------------------------------------------------------------------------
def _sequence_loss(loss, token_logprobs, batch, beta, **kw):
  """A sequence-level loss from losses.py on sums over completion_mask."""
  mask = batch.completion_mask
  return loss(masked_sum(token_logprobs, mask), masked_sum(batch.ref_logprobs, mask),
              batch.rewards, batch.group_ids, beta,
              behaviour_logprobs=masked_sum(batch.behaviour_logprobs, mask), **kw)


def tb_loss(token_logprobs: jax.Array, batch: TrainBatch, beta: jax.Array, *,
            ratio_clip: float | None = None, ref_weight: jax.Array | float = 1.0,
            log_z: jax.Array | None = None,
            log_z_from_behaviour: bool = False,
            residual_clip: float | None = None,
            token_kl_coef: float | None = None) -> tuple[jax.Array, dict[str, jax.Array]]:
  """VarGrad TB on sequence sums over completion_mask (losses.trajectory_balance);
  `log_z` [N]: a learned log Z per row instead; ratio_clip, log_z_from_behaviour (VarGrad's
  estimate from the behaviour log-probs: TBA-prime), residual_clip (Huber at c): its
  losses.TBSwitches; token_kl_coef: plus a per-token k3 KL to the reference (losses.py)."""
  switches = losses.TBSwitches(ratio_clip=ratio_clip, residual_clip=residual_clip,
                               log_z_from_behaviour=log_z_from_behaviour)
  loss, aux = _sequence_loss(losses.trajectory_balance, token_logprobs, batch, beta,
                             switches=switches, ref_weight=ref_weight, log_z=log_z)
  metrics = {"log_z_mean": jnp.mean(aux.log_z), "kl": aux.kl,
             "ratio_weight_mean": jnp.mean(aux.weights),
             "residual_abs_mean": jnp.mean(jnp.abs(aux.residuals))}
  if residual_clip is not None:
    metrics["residual_clip_fraction"] = jnp.mean(jnp.abs(aux.residuals) > residual_clip)
  if token_kl_coef is not None:
    k3 = masked_sum(losses.token_k3(token_logprobs, batch.ref_logprobs, batch.completion_mask),
                    batch.completion_mask)
    loss = loss + 2.0 / beta * token_kl_coef * jnp.mean(k3)
    metrics["token_k3"] = jnp.sum(k3) / jnp.maximum(jnp.sum(batch.completion_mask), 1.0)
  return loss, metrics


def rloo_loss(token_logprobs: jax.Array, batch: TrainBatch, beta: jax.Array, *,
              ratio_clip: float | None = None) -> tuple[jax.Array, dict[str, jax.Array]]:
  """REINFORCE leave-one-out on sequence sums; Proximal RLOO with ratio_clip (losses.rloo)."""
  loss, aux = _sequence_loss(losses.rloo, token_logprobs, batch, beta, ratio_clip=ratio_clip)
  return loss, {"kl": aux.kl, "advantage_abs_mean": jnp.mean(jnp.abs(aux.advantages)),
                "clip_fraction": aux.clip_fraction}


def ratio_loss(token_logprobs: jax.Array, batch: TrainBatch, beta: jax.Array, *,
               ratio_clip: float = 8.0, tokens_per_row: jax.Array | None = None
               ) -> tuple[jax.Array, dict[str, jax.Array]]:
  """TBA-prime's per-token ratio loss (losses.ratio) on per-token log-probs; its token sum
  over len(batch) tokens_per_row (None: this batch's counted tokens)."""
  loss, aux = losses.ratio(token_logprobs, batch.behaviour_logprobs, batch.ref_logprobs,
                           batch.completion_mask, batch.rewards, batch.group_ids, beta,
                           ratio_clip=ratio_clip, tokens_per_row=tokens_per_row)
  return loss, {"kl": aux.kl, "ratio_mean": aux.ratio_mean, "clip_fraction": aux.clip_fraction,
                "advantage_abs_mean": jnp.mean(jnp.abs(aux.advantages))}


def grpo_loss(token_logprobs: jax.Array, batch: TrainBatch, beta: jax.Array, *,
              clip_eps: float = 0.2) -> tuple[jax.Array, dict[str, jax.Array]]:
  loss, aux = losses.grpo(token_logprobs, batch.behaviour_logprobs, batch.ref_logprobs,
                          batch.completion_mask, batch.rewards, batch.group_ids, beta,
                          clip_eps=clip_eps)
  return loss, {"kl": aux.kl, "clip_fraction": aux.clip_fraction}


# ---------------------------------------------------------------------------
# The update.
# ---------------------------------------------------------------------------
def check_microbatches(num_rows: int, num_microbatches: int, fsdp: int) -> None:
  """Raises ValueError unless `num_rows` cut into `num_microbatches` equal micro-batches
  whose size is a multiple of the trainer's `fsdp` devices (every shard gets rows)."""
  rows, left = divmod(num_rows, num_microbatches)
  if left or rows % fsdp:
    raise ValueError(f"a batch of {num_rows} rows does not split into num_microbatches="
                     f"{num_microbatches} equal micro-batches of a multiple of the trainer's "
                     f"{fsdp} fsdp devices")


def _group_sorted_microbatches(batch: TrainBatch, num_microbatches: int,
                               mesh: Mesh) -> TrainBatch:
  """Leaves [M, N/M, ...]: rows stably sorted by group, then cut in M.

  Sorting makes each group contiguous whatever the input layout, so with G
  groups of equal size and G a multiple of M every micro-batch holds whole
  groups, and the loss and gradient equal the whole batch's (log Z and the
  baselines are per-group means: a split group would get two wrong halves).
  The replay buffer's batches have B groups of K (batch.py); configs refuse a
  B that M does not divide (config_checks). Unequal group sizes must be
  arranged by the caller.
  """
  check_microbatches(batch.rewards.shape[0], num_microbatches,
                     mesh.shape[sharding.BATCH_AXIS["trainer"]])
  order = jnp.argsort(losses.group_index(batch.group_ids), stable=True)

  def cut(x):
    x = x[order].reshape(num_microbatches, x.shape[0] // num_microbatches, *x.shape[1:])
    # [N, ...] -> [M, N/M, ...]: keep each micro-batch's rows spread over "fsdp".
    spec = P(None, sharding.BATCH_AXIS["trainer"], *([None] * (x.ndim - 2)))
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))

  return jax.tree.map(cut, batch)


def make_update(model_config: ModelConfig, optimizer: optax.GradientTransformation,
                objective: Objective, mesh: Mesh, *, forward: Forward = Forward(),
                lr_schedule: optax.ScalarOrSchedule | None = None,
                learned_log_z: LearnedLogZ | None = None,
                drift_control: optim.DriftControl | None = None,
                saturation: optim.SaturationDecay | None = None
                ) -> Callable[[TrainState, TrainBatch], tuple[TrainState, dict[str, jax.Array]]]:
  """The jitted `update(state, batch) -> (state, metrics)` on the trainer `mesh`.

  The state is donated (do not use it after the call). beta for the update that takes
  the state from step s to s + 1 is objective.beta_schedule(s + 1). Rows N must split into
  `forward.num_microbatches` equal micro-batches of whole groups (_group_sorted_microbatches)
  whose size is a multiple of the "fsdp" axis (else ValueError when it compiles). Gradients
  are averaged over micro-batches, which equals the big-batch gradient because every loss
  here is a mean over sequences of per-group terms, or (a loss_fn taking `tokens_per_row`:
  ratio_loss) a token sum over the WHOLE batch's counted tokens per row times the
  micro-batch's rows, given to it here. Compiles once per batch shape.

  metrics (replicated scalars): loss, grad_norm (before clipping), beta, lr (with
  `lr_schedule`, the one given to optim.make_optimizer: lr(u) of u = step + 1, times the
  factors of a DriftControl and a SaturationDecay), reward_mean, num_tokens (real prompt +
  completion tokens: tokens/s is num_tokens over the caller's wall time of the step),
  completion_tokens, entropy, policy_drift and the loss function's own (TB: log_z_mean, kl,
  ratio_weight_mean, residual_abs_mean and, with residual_clip, residual_clip_fraction).

  With LoRA the program is `update(state, batch, base)`: `base` the frozen weights
  (lora.frozen; on their trainer shardings), differentiated through but not trained.
  With `learned_log_z` (init_state and state_shardings given the same) the loss gets each
  row's entry of the state's log Z table as `log_z`, and the table trains alongside.
  `drift_control` (init_state and state_shardings given the same): the optimizer's step
  is multiplied by the state's lr_scale, the update's effect on the batch is measured by
  one more forward at the new params (per micro-batch, no backward; with dropout two, both
  without it) and the scale updated (DriftControl); metrics lr_scale (the one this update
  applied), update_drift (the mean per-sequence |change| of log pi) and update_drift_max.
  `saturation` (init_state and state_shardings given the same): the step is multiplied by
  the state's factor too, and the state moves on with the batch's reward_mean
  (SaturationDecay); metrics saturation_factor (the one this update applied) and
  reward_average.
  """
  f, num_microbatches = forward, forward.num_microbatches
  compute_config = model_config.replace(dtype=f.dtype)
  state_sh = state_shardings(model_config, optimizer, mesh, learned_log_z, drift_control,
                             saturation)
  # Read once from the signature (functools.partial keeps it; a wrapper needs functools.wraps).
  per_token = "tokens_per_row" in inspect.signature(objective.loss_fn).parameters

  def policy_logprobs(params, frozen, batch, drop):
    """(per-token log-probs [N, Tc], entropies) of the policy; differentiable in params."""
    # Master weights: the cast is part of the differentiated function, so the
    # gradient w.r.t. float32 params comes back in float32. (A frozen base already
    # in the compute dtype is not cast: astype to the same dtype is no copy.)
    params = jax.tree.map(lambda p: p.astype(compute_config.jnp_dtype),
                          lora.combine(frozen, params))
    logits = model.completion_logits(compute_config, params, batch.tokens, batch.attention_mask,
                                     batch.completion_mask.shape[1], f.remat, drop,
                                     f.prompt_group)
    return token_logprobs_and_entropy(logits, batch.tokens[:, batch.prompt_len:],
                                      objective.temperature)

  def sequence_logprobs(params, frozen, batch):
    """log pi(y) [N] of each row, no dropout: what DriftControl compares before and after."""
    return masked_sum(policy_logprobs(params, frozen, batch, None)[0], batch.completion_mask)

  def objective_fn(trainable, frozen, batch, beta, extra, drop):
    params, log_z = trainable  # log_z: None (VarGrad) or the learned table
    mask = batch.completion_mask
    token_lp, token_entropy = policy_logprobs(params, frozen, batch, drop)
    if log_z is not None:
      extra = {**extra, "log_z": log_z[batch.prompt_ids]}
    loss, aux = objective.loss_fn(token_lp, batch, beta, **extra)
    # Diagnostics (not differentiated): the policy's per-token entropy where the batch's
    # completions were sampled, and |log pi_theta - log pi_behaviour| per sequence (how far
    # the policy moved since the samples were drawn: staleness in nats). Means over rows of
    # per-row figures, so equal micro-batches average to the whole batch's value.
    counted = jnp.maximum(jnp.sum(mask, axis=-1), 1.0)
    entropy = masked_sum(token_entropy, mask) / counted
    drift = masked_sum(jax.lax.stop_gradient(token_lp) - batch.behaviour_logprobs, mask)
    aux = {**aux, "entropy": jnp.mean(entropy), "policy_drift": jnp.mean(jnp.abs(drift))}
    # log pi(y) [rows] before the update, for DriftControl (without it unused: dropped).
    return loss, (aux, masked_sum(jax.lax.stop_gradient(token_lp), mask))

  grad_fn = jax.value_and_grad(objective_fn, has_aux=True)

  def update_with(state: TrainState, batch: TrainBatch, frozen: Params):
    beta = objective.beta_schedule(state.step + 1)
    extra = ({} if objective.ref_weight_schedule is None else
             {"ref_weight": objective.ref_weight_schedule(state.step + 1)})
    loss_kw = extra  # extra is reported in the metrics too; the token count is not
    if per_token:
      counted = jnp.sum(batch.completion_mask > 0)
      loss_kw = {**extra, "tokens_per_row": jnp.maximum(counted, 1) / batch.rewards.shape[0]}
    trainable = (state.params, state.log_z)
    if num_microbatches == 1:
      micro = batch
      (loss, (aux, old_lp)), (grads, log_z_grad) = grad_fn(trainable, frozen, batch, beta,
                                                           loss_kw, f.dropout_at(state.step, 0))
      grads = float32(grads)
    else:
      micro = _group_sorted_microbatches(batch, num_microbatches, mesh)

      def accumulate(grad_sum, micro_batch_and_index):
        micro_batch, i = micro_batch_and_index
        (loss, aux), grads = grad_fn(trainable, frozen, micro_batch, beta, loss_kw,
                                     f.dropout_at(state.step, i))
        grad_sum = jax.tree.map(lambda a, g: a + g.astype(jnp.float32), grad_sum, grads)
        grad_sum = (jax.lax.with_sharding_constraint(grad_sum[0], state_sh.params), grad_sum[1])
        return grad_sum, (loss, aux)

      zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), trainable)
      grad_sum, (loss, (aux, old_lp)) = jax.lax.scan(accumulate, zeros,
                                                     (micro, jnp.arange(num_microbatches)))
      grads, log_z_grad = jax.tree.map(lambda g: g / num_microbatches, grad_sum)
      loss, aux = jnp.mean(loss), jax.tree.map(jnp.mean, aux)

    # The optimizer sees float32 params and gradients (bfloat16 ones convert exactly);
    # bfloat16 params are rounded once, when the new weights are stored.
    updates, opt_state = optimizer.update(grads, state.opt_state, float32(state.params))
    lr_scale, step_factor = state.lr_scale, jnp.ones((), jnp.float32)
    if drift_control is not None:
      step_factor = lr_scale
    if saturation is not None:
      step_factor = step_factor * saturation.factor_of(state.saturation)
    if drift_control is not None or saturation is not None:
      # the step is linear in the lr (AdamW's decay term too)
      updates = jax.tree.map(lambda u: u * step_factor, updates)
    params = optim.apply_updates(state.params, updates)
    control_metrics = {}
    if drift_control is not None:
      # What this update did to the policy: log pi(y) of the batch's rows at the new params
      # against the old, in the micro-batch layout the gradient used ([M, N/M] rows, or [N]),
      # so the mean over rows is the loss's average over micro-batches.
      measure = lambda p: (sequence_logprobs(p, frozen, micro) if num_microbatches == 1 else
                           jax.lax.map(lambda mb: sequence_logprobs(p, frozen, mb), micro))
      if f.dropout:  # the training forward's log-probs had dropout: the old ones again, without
        old_lp = measure(state.params)
      change = jnp.abs(measure(params) - old_lp)
      drift = jnp.mean(change)
      control_metrics = {"lr_scale": lr_scale, "update_drift": drift,
                         "update_drift_max": jnp.max(change)}
      lr_scale = drift_control.next_scale(lr_scale, drift)
    saturation_state = state.saturation
    if saturation is not None:
      saturation_state = saturation.next_state(state.saturation, jnp.mean(batch.rewards),
                                               state.step == 0)
      control_metrics = {**control_metrics,
                         "saturation_factor": saturation.factor_of(state.saturation),
                         "reward_average": saturation.reward_average_of(saturation_state)}
    metrics = {
        "loss": loss, "grad_norm": optax.global_norm(grads), "beta": beta,
        "reward_mean": jnp.mean(batch.rewards),
        "num_tokens": jnp.sum(batch.attention_mask),
        "completion_tokens": jnp.sum(batch.completion_mask),
        **aux, **extra, **control_metrics,
    }
    if lr_schedule is not None:
      lr = lr_schedule(state.step + 1) if callable(lr_schedule) else lr_schedule
      lr = jnp.asarray(lr, jnp.float32)
      metrics["lr"] = lr * step_factor
    log_z, log_z_opt = state.log_z, state.log_z_opt_state
    if learned_log_z is not None:
      z_updates, log_z_opt = learned_log_z.optimizer.update(log_z_grad, log_z_opt, log_z)
      log_z = optax.apply_updates(log_z, z_updates)
    return TrainState(params=params, opt_state=opt_state, step=state.step + 1, log_z=log_z,
                      log_z_opt_state=log_z_opt, lr_scale=lr_scale,
                      saturation=saturation_state), metrics

  out_sh = (state_sh, sharding.replicated(mesh))
  if model_config.lora is None:  # nothing frozen: the two-argument program

    def update(state: TrainState, batch: TrainBatch):
      return update_with(state, batch, {})

    return jax.jit(update, in_shardings=(state_sh, batch_shardings(mesh)), out_shardings=out_sh,
                   donate_argnums=0)
  frozen_sh = lora.frozen(model_config, sharding.param_shardings(model_config, "trainer", mesh))
  return jax.jit(update_with, in_shardings=(state_sh, batch_shardings(mesh), frozen_sh),
                 out_shardings=out_sh, donate_argnums=0)
