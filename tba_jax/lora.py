"""LoRA adapters as plain pytrees: split from and combined with the base, and merged
into it.

With `ModelConfig.lora`, the parameter dict of model.py holds the base weights
and, under each targeted projection's module, an adapter `{name}_lora/lora_a`
[L, in, R] and `lora_b` [L, R, out] (nnx.LoRA's leaves, stacked over layers).
The runtime keeps the two apart:

  base, adapters = split(params)    # frozen base, trained adapters
  params = combine(base, adapters)  # the dict model.forward takes (no copy)
  merged = merge(cfg, params)       # W + (alpha / R) A B: base_config(cfg)'s dict

so the trainer differentiates and optimizes only the adapters, a weight sync moves
only the adapters (the searchers hold the base once), the reference policy is the
base with the adapters off (`base_config(cfg)` over `base`), and a checkpoint holds
the adapters and their optimizer state. `hf_checkpoints.save_peft` writes the adapters
in PEFT's format (the model never depends on a file format).
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from tba_jax import blocks
from tba_jax import model as model_lib
from tba_jax.model import ModelConfig, Params

_SUFFIX = "_lora"


# ---------------------------------------------------------------------------
# The two halves of a parameter dict.
# ---------------------------------------------------------------------------
def base_config(cfg: ModelConfig) -> ModelConfig:
  """The model without adapters: the reference policy, and the merged export's config."""
  return cfg.replace(lora=None)


def split(params: Params) -> tuple[Params, Params]:
  """(base, adapters) of a parameter dict (or of any tree shaped like one): the
  subtrees under `*_lora` keys are the adapters. The leaves are not copied."""
  base, adapters = {}, {}
  for key, value in params.items():
    if key.endswith(_SUFFIX):
      adapters[key] = value
    elif isinstance(value, dict):
      b, a = split(value)
      base[key] = b
      if a:
        adapters[key] = a
    else:
      base[key] = value
  return base, adapters


def combine(base: Params, adapters: Params) -> Params:
  """The parameter dict holding both (the inverse of `split`; leaves not copied)."""
  out = dict(base)
  for key, value in adapters.items():
    out[key] = combine(out[key], value) if key in out and not key.endswith(_SUFFIX) else value
  return out


def trained(cfg: ModelConfig, tree: Params) -> Params:
  """The part of a parameter-shaped tree the trainer trains: everything, or the adapters."""
  return tree if cfg.lora is None else split(tree)[1]


def frozen(cfg: ModelConfig, tree: Params) -> Params:
  """The part it holds fixed: nothing ({}), or the base."""
  return {} if cfg.lora is None else split(tree)[0]


def count(cfg: ModelConfig) -> int:
  """Adapter parameters of `cfg` (0 without LoRA)."""
  if cfg.lora is None:
    return 0
  return sum(math.prod(x.shape) for x in jax.tree.leaves(split(model_lib.param_shapes(cfg))[1]))


def init_adapters(cfg: ModelConfig, seed: int = 0, shardings=None) -> Params:
  """Fresh adapters of `cfg` (A random, B zero: the adapted model starts as its base),
  created directly in `shardings` (an adapter-shaped pytree). The base weights the
  same module would draw are dead code in the jitted program: never allocated."""
  def init():
    module = model_lib.Transformer(cfg, rngs=nnx.Rngs(seed))
    return split(nnx.to_pure_dict(nnx.split(module)[1]))[1]
  return jax.jit(init, out_shardings=shardings)()


# ---------------------------------------------------------------------------
# Merging.
# ---------------------------------------------------------------------------
def _deltas(cfg: ModelConfig, adapters: Params):
  """(module, kernel name, scale * A B reshaped to the kernel's [L, ...] shape) per
  adapted kernel, float32."""
  shapes = model_lib.param_shapes(base_config(cfg))["layers"]
  for which in ("attn", "mlp"):
    for name, kernels in cfg.lora_adapters(which):
      a, b = adapters["layers"][which][name]["lora_a"], adapters["layers"][which][name]["lora_b"]
      delta = cfg.lora.scale * jnp.einsum("LIR,LRO->LIO", a.astype(jnp.float32),
                                          b.astype(jnp.float32))
      n_in = blocks.input_dims(kernels[0])
      sizes = np.cumsum([math.prod(shapes[which][k].shape[1 + n_in:]) for k in kernels])[:-1]
      for k, d in zip(kernels, jnp.split(delta, sizes, axis=-1)):
        yield which, k, d.reshape(shapes[which][k].shape)


@functools.partial(jax.jit, static_argnums=0)
def merge(cfg: ModelConfig, params: Params) -> Params:
  """`base_config(cfg)`'s parameters with every adapter folded in: W + scale A B,
  summed in float32 and rounded once to W's dtype (as PEFT's merge_and_unload)."""
  base, adapters = split(params)
  layers = {which: dict(base["layers"][which]) for which in ("attn", "mlp")}
  for which, k, delta in _deltas(cfg, adapters):
    w = layers[which][k]
    layers[which][k] = (w.astype(jnp.float32) + delta).astype(w.dtype)
  return {**base, "layers": {**base["layers"], **layers}}
