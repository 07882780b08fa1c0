"""Building blocks shared by the decoder (model.py) and the encoder (encoder.py):
parameter init, RMSNorm / LayerNorm, activations, rotary embeddings (HF
rotate-half convention), the fused projection, mean pooling and dropout.

Axis legend as in model.py: B batch, T length, N heads, H head dim, D model dim.
"""
from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

ACTIVATION_FNS = {
    "silu": jax.nn.silu,
    "gelu": functools.partial(jax.nn.gelu, approximate=False),  # erf (HF "gelu")
    "gelu_tanh": functools.partial(jax.nn.gelu, approximate=True),  # HF "gelu_new"
}


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Dropout:
  """Training-time dropout (torch's nn.Dropout): each unit zeroed with probability `rate`,
  the others scaled by 1 / (1 - rate). Masks come from `key` folded with a site number,
  so every place a forward drops units draws its own (and each layer its own key:
  `layer_keys`)."""
  key: jax.Array  # a typed PRNG key
  rate: float = dataclasses.field(metadata=dict(static=True))

  def __call__(self, x: jax.Array, site: int) -> jax.Array:
    keep = jax.random.bernoulli(jax.random.fold_in(self.key, site), 1.0 - self.rate, x.shape)
    return jnp.where(keep, x / (1.0 - self.rate), 0.0).astype(x.dtype)

  def layer_keys(self, num_layers: int) -> jax.Array:
    """[L] keys, one per layer, none of them a site's (scanned with the layers)."""
    return jax.random.split(jax.random.fold_in(self.key, 2**31 - 1), num_layers)

  def at(self, key: jax.Array) -> Dropout:
    """The same rate with another key (a layer's, from layer_keys)."""
    return Dropout(key, self.rate)


def dropped(x: jax.Array, dropout: Dropout | None, site: int) -> jax.Array:
  """x through `dropout` at `site`; x itself without dropout (no operation added)."""
  return x if dropout is None else dropout(x, site)


def param(rngs: nnx.Rngs, shape, dtype, fan_in: int | None = None, value: float | None = None):
  if value is not None:
    return nnx.Param(jnp.full(shape, value, dtype))
  std = 0.02 if fan_in is None else 1.0 / math.sqrt(fan_in)
  return nnx.Param((std * jax.random.normal(rngs.params(), shape)).astype(dtype))


class Norm(nnx.Module):
  """RMSNorm ("rms": times scale; "rms_plus_one": times 1 + scale, Gemma's) or
  LayerNorm ("layer": scale and bias) over the last axis."""

  def __init__(self, dim: int, kind: str, eps: float, dtype, rngs: nnx.Rngs):
    # Gemma stores the offset from 1: its identity scale is 0.
    self.scale = param(rngs, (dim,), dtype, value=0.0 if kind == "rms_plus_one" else 1.0)
    if kind == "layer":
      self.bias = param(rngs, (dim,), dtype, value=0.0)
    self.kind, self.eps = kind, eps

  def __call__(self, x):
    x32 = x.astype(jnp.float32)
    if self.kind == "rms":
      # Normalise in float32, cast back, then scale (HF LlamaRMSNorm order).
      x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
      return self.scale[...] * x32.astype(x.dtype)
    if self.kind == "rms_plus_one":
      # Gemma's order: the scale applied in float32, one cast at the end.
      x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
      return (x32 * (1.0 + self.scale[...].astype(jnp.float32))).astype(x.dtype)
    # torch's LayerNorm: statistics and the affine map in float32, one cast at the end.
    mean = jnp.mean(x32, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x32 - mean), axis=-1, keepdims=True)
    y = (x32 - mean) * jax.lax.rsqrt(var + self.eps)
    return (y * self.scale[...].astype(jnp.float32) + self.bias[...].astype(jnp.float32)).astype(x.dtype)


def project(x, *kernels, concat: bool = False):
  """x [B,T,D] times each kernel [D, ...] -> [B,T, ...] each.

  Over many tokens (training, prefill) one matmul against the concatenated
  kernels: the wider matmul runs ~10% faster on CPU for q/k/v and gate/up, and
  the weight copy is small next to the work. For one decode token the copy
  would dominate, so separate matmuls, unless `concat` says the concatenation is
  free (computed once outside a decode loop: blocks.Block's own_weights). Same
  arithmetic either way (each output column is its own sum over D: equal bits on
  XLA:CPU in float32 and bfloat16, tests/decode_ops_test.py).
  """
  if x.shape[1] == 1 and not concat:
    return [jnp.einsum("BTD,D...->BT...", x, w) for w in kernels]
  flat = [w.reshape(w.shape[0], -1) for w in kernels]
  out = jnp.einsum("BTD,DE->BTE", x, jnp.concatenate(flat, axis=1))
  parts = jnp.split(out, np.cumsum([f.shape[1] for f in flat])[:-1], axis=-1)
  return [p.reshape(*x.shape[:2], *w.shape[1:]) for p, w in zip(parts, kernels)]


def rope_inv_freq(cfg, local: bool = False) -> np.ndarray:
  """Inverse frequencies [rotary_dim/2], float32, as HF computes them (incl. scaling).

  `local`: a sliding layer's, at cfg.local_rope_theta without scaling when the
  architecture gives its sliding layers their own base (Gemma 3), else the global ones.
  """
  h = cfg.rotary_dim
  own = local and cfg.local_rope_theta is not None
  theta = cfg.local_rope_theta if own else cfg.rope_theta
  inv_freq = 1.0 / (theta ** (np.arange(0, h, 2, dtype=np.int64).astype(np.float32) / h))
  s = None if own else cfg.rope_scaling
  if s is None:
    return inv_freq.astype(np.float32)
  if s.kind == "linear":
    return (inv_freq / s.factor).astype(np.float32)
  if s.kind == "llama3":
    low_wavelen = s.original_max_position_embeddings / s.low_freq_factor
    high_wavelen = s.original_max_position_embeddings / s.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = np.where(wavelen > low_wavelen, inv_freq / s.factor, inv_freq)
    smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) / (
        s.high_freq_factor - s.low_freq_factor)
    smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
    is_medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return np.where(is_medium, smoothed, scaled).astype(np.float32)
  raise ValueError(f"unsupported rope scaling kind {s.kind!r} (supported: llama3, linear)")


def apply_rope(x: jax.Array, positions: jax.Array, inv_freq: np.ndarray) -> jax.Array:
  """x [B,T,N,H] with its first 2 * len(inv_freq) dims of each head rotated by
  positions [B,T] (all of them but for GPT-NeoX's partial rotary); angles in float32.
  `inv_freq` is a constant, or a traced array (a layer's, inside the layer scan)."""
  rot = 2 * inv_freq.shape[0]
  x, rest = x[..., :rot], x[..., rot:]
  freqs = positions[..., None].astype(jnp.float32) * inv_freq  # [B,T,rot/2]
  emb = jnp.concatenate([freqs, freqs], axis=-1)[:, :, None, :]  # [B,T,1,rot]
  cos, sin = jnp.cos(emb).astype(x.dtype), jnp.sin(emb).astype(x.dtype)
  x1, x2 = jnp.split(x, 2, axis=-1)
  out = x * cos + jnp.concatenate([-x2, x1], axis=-1) * sin
  return jnp.concatenate([out, rest], axis=-1) if rest.shape[-1] else out


def mean_pool_normalized(hidden: jax.Array, mask: jax.Array) -> jax.Array:
  """float32 [B,D]: the mean of hidden [B,T,D] over the tokens with mask [B,T] = 1,
  L2-normalised (sentence-transformers' Pooling(mean) + Normalize, same epsilons)."""
  m = mask.astype(jnp.float32)[..., None]
  total = jnp.sum(hidden.astype(jnp.float32) * m, axis=1)
  mean = total / jnp.maximum(jnp.sum(m, axis=1), 1e-9)
  return mean / jnp.maximum(jnp.linalg.norm(mean, axis=-1, keepdims=True), 1e-12)
