"""The trainer's state (`TrainState`) and where it lives on the trainer mesh: FSDP-sharded
params and optimizer moments, the rest replicated (`state_shardings`), a fresh state on
those shardings (`init_state`) and the rows of a TrainBatch over the "fsdp" axis
(`batch_shardings`). train_step.make_update takes a state to the next.

What the state holds beside params, moments and the step depends on the run: log Z per
prompt with `LearnedLogZ` (TB with a learned log Z instead of VarGrad's estimate), the lr
scale of optim.DriftControl, the state of optim.SaturationDecay; each None without it.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh

from tba_jax import lora, model, optim, sharding
from tba_jax.batch import TrainBatch
from tba_jax.model import ModelConfig, Params


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class TrainState:
  params: Params             # the trained parameters (all, or the LoRA adapters): FSDP-sharded,
                             # float32 (master) or bfloat16
  opt_state: optax.OptState  # moments (float32, or bfloat16 with adamw_rounded), sharded like params
  step: jax.Array            # int32 scalar: updates taken so far
  # LearnedLogZ: log Z per prompt id [P] (float32, replicated) and its optimizer's state;
  # None with VarGrad's estimate.
  log_z: jax.Array | None = None
  log_z_opt_state: optax.OptState | None = None
  # DriftControl: the factor (float32 scalar, replicated; 1 at the start) the next update's
  # optimizer step is multiplied by; None without it.
  lr_scale: jax.Array | None = None
  # SaturationDecay: its state (float32 [4], replicated: optim.SaturationDecay.STATE_FIELDS,
  # the last its factor on the next update's step); None without it.
  saturation: jax.Array | None = None


@dataclasses.dataclass(frozen=True)
class LearnedLogZ:
  """TB with a learned log Z per prompt id instead of VarGrad's batch estimate.

  A float32 table of `num_prompts` entries (prompt ids index it; 0 at the start)
  trained with the policy, on the same loss, by its own `optimizer` (its gradient
  is neither clipped with the policy's nor counted in grad_norm).
  """
  optimizer: optax.GradientTransformation
  num_prompts: int


def float32(tree):
  """`tree` with every leaf cast to float32 (what the optimizer sees)."""
  return jax.tree.map(lambda x: x.astype(jnp.float32), tree)


def state_shardings(model_config: ModelConfig, optimizer: optax.GradientTransformation,
                    mesh: Mesh, learned_log_z: LearnedLogZ | None = None,
                    drift_control: optim.DriftControl | None = None,
                    saturation: optim.SaturationDecay | None = None) -> TrainState:
  """TrainState of NamedShardings: the trained params (lora.trained) and every
  param-shaped optimizer leaf FSDP-sharded on the trainer mesh, optimizer scalars,
  the step, log Z, the lr scale and the saturation state replicated."""
  param_sh = lora.trained(model_config, sharding.param_shardings(model_config, "trainer", mesh))
  opt_shapes = jax.eval_shape(lambda p: optimizer.init(float32(p)),
                              lora.trained(model_config, model.param_shapes(model_config)))
  opt_sh = optax.tree_map_params(optimizer, lambda _, s: s, opt_shapes, param_sh,
                                 transform_non_params=lambda _: sharding.replicated(mesh))
  replicated = sharding.replicated(mesh)
  log_z = log_z_opt = None
  if learned_log_z is not None:
    log_z = replicated
    log_z_opt = jax.tree.map(lambda _: replicated, jax.eval_shape(
        learned_log_z.optimizer.init, jnp.zeros(learned_log_z.num_prompts, jnp.float32)))
  return TrainState(params=param_sh, opt_state=opt_sh, step=replicated, log_z=log_z,
                    log_z_opt_state=log_z_opt,
                    lr_scale=None if drift_control is None else replicated,
                    saturation=None if saturation is None else replicated)


def batch_shardings(mesh: Mesh) -> TrainBatch:
  """Rows over the trainer's "fsdp" axis (N must be a multiple of its size)."""
  two, one = sharding.batch_sharding("trainer", mesh, 2), sharding.batch_sharding("trainer", mesh, 1)
  return TrainBatch(tokens=two, attention_mask=two, completion_mask=two, ref_logprobs=two,
                    behaviour_logprobs=two, rewards=one, group_ids=one, prompt_ids=one,
                    versions=one)


def init_state(params: Params, optimizer: optax.GradientTransformation,
               shardings: TrainState, learned_log_z: LearnedLogZ | None = None) -> TrainState:
  """A fresh TrainState on `shardings` (from state_shardings); step 0, an lr scale of 1
  and SaturationDecay.init() where the shardings have them (state_shardings with a
  DriftControl, a SaturationDecay).

  `params`: the trained parameters (lora.trained: with LoRA, the adapters). They
  are copied, so the caller's arrays survive the donation of the state by the
  first update. The optimizer decides its moments' dtype (float32
  even for bfloat16 params, unless it is adamw_rounded; module docstring).
  """
  params = jax.device_put(params, shardings.params)

  def init(params):
    log_z = log_z_opt = None
    if learned_log_z is not None:
      log_z = jnp.zeros(learned_log_z.num_prompts, jnp.float32)
      log_z_opt = learned_log_z.optimizer.init(log_z)
    return TrainState(params=jax.tree.map(jnp.copy, params),
                      opt_state=optimizer.init(float32(params)),
                      step=jnp.zeros((), jnp.int32), log_z=log_z, log_z_opt_state=log_z_opt,
                      lr_scale=None if shardings.lr_scale is None else jnp.ones((), jnp.float32),
                      saturation=(None if shardings.saturation is None else
                                  optim.SaturationDecay.init()))

  return jax.jit(init, out_shardings=shardings)(params)
