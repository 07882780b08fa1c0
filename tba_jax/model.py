"""Decoder-only transformer: Llama 1/2/3, TinyLlama/RhoMath, SmolLM2, Mistral, Qwen2/2.5.

One implementation, matching Hugging Face transformers to float32 round-off:
RMSNorm, rotary embeddings in the rotate-half convention (with llama3 / linear
frequency scaling), grouped-query attention (optional q/k/v bias for Qwen2),
SwiGLU MLP, tied or untied output embedding.

The training forward and the cached decode step are one code path: a forward
over T new tokens writes their keys/values at slots [index, index + T) of a
key/value buffer and attends causally (by slot) over the valid slots. Without a
cache the buffer is just the T new tokens (index 0).

Layers are stacked along a leading axis and run with `nnx.scan` (one compiled
layer body, fast compiles for 30-layer models). Parameters travel as plain
nested dicts (`nnx.merge(graphdef, params)` inside jitted bodies), so weight
sync, checkpoints and resharding are ordinary pytree operations.

Einsum axis legend:
  B batch, T query length, S key/value length (cache slots), N query heads,
  K key/value heads, G query heads per kv head (N = K * G), H head dim,
  D model dim, F mlp dim, V vocab, L layers.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

Params = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class RopeScaling:
  """Rotary frequency scaling. `kind` is "llama3" or "linear" (HF rope_type)."""
  kind: str
  factor: float
  low_freq_factor: float = 1.0
  high_freq_factor: float = 4.0
  original_max_position_embeddings: int = 8192


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Architecture of a decoder-only transformer (hashable: a jit static arg)."""
  vocab_size: int
  dim: int
  mlp_dim: int
  num_layers: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  rms_norm_eps: float = 1e-5
  rope_theta: float = 10000.0
  rope_scaling: RopeScaling | None = None
  qkv_bias: bool = False  # Qwen2
  tie_embeddings: bool = False
  max_position_embeddings: int = 2048
  dtype: str = "float32"  # parameter and activation dtype; logits are float32
  model_type: str = "llama"  # the HF model_type written on export
  bos_token_id: int | None = None
  eos_token_id: int | None = None

  def __post_init__(self):
    if self.num_heads % self.num_kv_heads:
      raise ValueError(f"num_heads={self.num_heads} is not a multiple of "
                       f"num_kv_heads={self.num_kv_heads}")
    if self.head_dim % 2:
      raise ValueError(f"head_dim={self.head_dim} must be even for rotary embeddings")
    if self.dtype not in ("float32", "bfloat16"):
      raise ValueError(f"dtype must be 'float32' or 'bfloat16', got {self.dtype!r}")

  def replace(self, **kw) -> ModelConfig:
    return dataclasses.replace(self, **kw)

  @property
  def jnp_dtype(self):
    return jnp.dtype(self.dtype)


# ---------------------------------------------------------------------------
# Rotary embeddings (HF rotate-half convention).
# ---------------------------------------------------------------------------
def rope_inv_freq(cfg: ModelConfig) -> np.ndarray:
  """Inverse frequencies [H/2], float32, as HF computes them (incl. scaling)."""
  h = cfg.head_dim
  inv_freq = 1.0 / (cfg.rope_theta ** (np.arange(0, h, 2, dtype=np.int64).astype(np.float32) / h))
  s = cfg.rope_scaling
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
  """x [B,T,N,H] rotated by positions [B,T]; angles in float32 like HF."""
  freqs = positions[..., None].astype(jnp.float32) * inv_freq  # [B,T,H/2]
  emb = jnp.concatenate([freqs, freqs], axis=-1)[:, :, None, :]  # [B,T,1,H]
  cos, sin = jnp.cos(emb).astype(x.dtype), jnp.sin(emb).astype(x.dtype)
  x1, x2 = jnp.split(x, 2, axis=-1)
  rotated = jnp.concatenate([-x2, x1], axis=-1)
  return x * cos + rotated * sin


# ---------------------------------------------------------------------------
# Modules.
# ---------------------------------------------------------------------------
def _param(rngs: nnx.Rngs, shape, dtype, fan_in: int | None = None, value: float | None = None):
  if value is not None:
    return nnx.Param(jnp.full(shape, value, dtype))
  std = 0.02 if fan_in is None else 1.0 / math.sqrt(fan_in)
  return nnx.Param((std * jax.random.normal(rngs.params(), shape)).astype(dtype))


class RMSNorm(nnx.Module):

  def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
    self.scale = _param(rngs, (cfg.dim,), cfg.jnp_dtype, value=1.0)
    self.eps = cfg.rms_norm_eps

  def __call__(self, x):
    # Normalise in float32, cast back, then scale (HF LlamaRMSNorm order).
    x32 = x.astype(jnp.float32)
    x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
    return self.scale[...] * x32.astype(x.dtype)


class Attention(nnx.Module):

  def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
    d, n, k, h, dt = cfg.dim, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.jnp_dtype
    self.q = _param(rngs, (d, n, h), dt, fan_in=d)
    self.k = _param(rngs, (d, k, h), dt, fan_in=d)
    self.v = _param(rngs, (d, k, h), dt, fan_in=d)
    self.o = _param(rngs, (n, h, d), dt, fan_in=n * h)
    if cfg.qkv_bias:
      self.q_bias = _param(rngs, (n, h), dt)
      self.k_bias = _param(rngs, (k, h), dt)
      self.v_bias = _param(rngs, (k, h), dt)
    self.cfg = cfg

  def __call__(self, x, positions, mask, kv, index):
    """x [B,T,D]; mask [B,T,S]; kv = None, or (k, v, layer): the stacked cache
    buffers [L,B,K,S,H] and this layer's index into them."""
    q, k, v = _project(x, self.q[...], self.k[...], self.v[...])  # [B,T,N,H], [B,T,K,H] x 2
    if self.cfg.qkv_bias:
      q, k, v = q + self.q_bias[...], k + self.k_bias[...], v + self.v_bias[...]
    inv_freq = rope_inv_freq(self.cfg)
    q, k = apply_rope(q, positions, inv_freq), apply_rope(k, positions, inv_freq)
    if kv is not None:
      # Write only the T new keys/values, in place, at [layer, :, index] of the
      # stacked buffers, then read this layer's slots back. Carrying the whole
      # cache through the layer scan (rather than scanning over it as xs/ys)
      # keeps XLA from copying every layer's cache on every decode step.
      k_all, v_all, layer = kv
      k_all, k = _cache_write_read(k_all, layer, index, k, mask.shape[-1])
      v_all, v = _cache_write_read(v_all, layer, index, v, mask.shape[-1])
      kv = (k_all, v_all, layer)
      out = _cached_attention(q, k.astype(q.dtype), v.astype(q.dtype), mask)
    else:
      # XLA's reference attention on CPU (exact); cuDNN/TPU kernels elsewhere.
      out = jax.nn.dot_product_attention(q, k, v, mask=mask[:, None])
    return jnp.einsum("BTNH,NHD->BTD", out, self.o[...]), kv


def _cache_write_read(buf, layer, index, new, window):
  """Writes `layer`'s T new keys (or values) [B,T,K,H] into the stacked cache
  buffer [L,B,K,S,H] from slot `index` (a scalar: every row; [B]: one slot per
  row) and reads back that layer's first `window` slots [B,K,W,H].

  Both are in place on the carried buffer; reading only the window means a
  decode step does not pay for slots no row has reached.
  """
  if jnp.ndim(index) == 0:
    new = new.transpose(0, 2, 1, 3)[None].astype(buf.dtype)  # [1,B,K,T,H]
    buf = jax.lax.dynamic_update_slice(buf, new, (layer, 0, 0, index, 0))
  else:  # one write offset per row (continuous batching)
    b, t = new.shape[:2]
    rows, cols = _row_slots(index, b, t)
    # Promising unique, in-bounds indices keeps the scatter in place: without
    # it XLA:CPU copies the whole stacked buffer per layer (measured 25x
    # slower decode steps at 30 layers).
    buf = buf.at[layer, rows, :, cols].set(new.astype(buf.dtype), unique_indices=True,
                                            indices_are_sorted=True, mode="promise_in_bounds")
  _, b, k, _, h = buf.shape
  return buf, jax.lax.dynamic_slice(buf, (layer, 0, 0, 0, 0), (1, b, k, window, h))[0]


def _row_slots(index, b: int, t: int):
  """(rows [B,1], slots [B,T]): the cache slots of T new tokens, row b's from index[b]."""
  return jnp.arange(b)[:, None], index[:, None] + jnp.arange(t)


def _project(x, *kernels):
  """x [B,T,D] times each kernel [D, ...] -> [B,T, ...] each.

  Over many tokens (training, prefill) one matmul against the concatenated
  kernels: the wider matmul runs ~10% faster on CPU for q/k/v and gate/up, and
  the weight copy is small next to the work. For one decode token the copy
  would dominate, so separate matmuls. Same arithmetic either way.
  """
  if x.shape[1] == 1:
    return [jnp.einsum("BTD,D...->BT...", x, w) for w in kernels]
  flat = [w.reshape(w.shape[0], -1) for w in kernels]
  out = jnp.einsum("BTD,DE->BTE", x, jnp.concatenate(flat, axis=1))
  parts = jnp.split(out, np.cumsum([f.shape[1] for f in flat])[:-1], axis=-1)
  return [p.reshape(*x.shape[:2], *w.shape[1:]) for p, w in zip(parts, kernels)]


def _cached_attention(q, k, v, mask):
  """jax.nn.dot_product_attention's math (float32 softmax, same mask fill) over
  cache slots: q [B,T,N,H], k/v [B,K,S,H], mask [B,T,S] -> [B,T,N,H].

  Used for cached (sampling) calls. The cache is stored kv-head-major so both
  einsums are batched over (B, K) with those axes leading in every operand:
  no transposed copy of any layer's cache on a decode step.
  """
  b, t, n, h = q.shape
  q = q.reshape(b, t, k.shape[1], n // k.shape[1], h)  # query head n = kv head * G + g
  logits = jnp.einsum("BTKGH,BKSH->BKGTS", q, k, preferred_element_type=jnp.float32)
  logits = logits * (h ** -0.5)
  logits = jnp.where(mask[:, None, None], logits, -0.7 * jnp.finfo(jnp.float32).max)
  probs = jax.nn.softmax(logits, axis=-1).astype(v.dtype)
  out = jnp.einsum("BKGTS,BKSH->BKGTH", probs, v)
  return out.transpose(0, 3, 1, 2, 4).reshape(b, t, n, h)


class MLP(nnx.Module):

  def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
    d, f, dt = cfg.dim, cfg.mlp_dim, cfg.jnp_dtype
    self.gate = _param(rngs, (d, f), dt, fan_in=d)
    self.up = _param(rngs, (d, f), dt, fan_in=d)
    self.down = _param(rngs, (f, d), dt, fan_in=f)

  def __call__(self, x):
    gate, up = _project(x, self.gate[...], self.up[...])  # [B,T,F] x 2
    gate = jax.nn.silu(gate)
    return jnp.einsum("BTF,FD->BTD", gate * up, self.down[...])


class Block(nnx.Module):

  def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
    self.attn_norm = RMSNorm(cfg, rngs)
    self.attn = Attention(cfg, rngs)
    self.mlp_norm = RMSNorm(cfg, rngs)
    self.mlp = MLP(cfg, rngs)

  def __call__(self, x, positions, mask, kv, index):
    h, kv = self.attn(self.attn_norm(x), positions, mask, kv, index)
    x = x + h
    return x + self.mlp(self.mlp_norm(x)), kv


class Transformer(nnx.Module):

  def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
    self.cfg = cfg
    self.embed = _param(rngs, (cfg.vocab_size, cfg.dim), cfg.jnp_dtype)

    @nnx.split_rngs(splits=cfg.num_layers)
    @nnx.vmap(in_axes=(0,), out_axes=0)
    def make_layers(rngs):
      return Block(cfg, rngs)

    self.layers = make_layers(rngs)
    self.final_norm = RMSNorm(cfg, rngs)
    if not cfg.tie_embeddings:
      self.lm_head = _param(rngs, (cfg.dim, cfg.vocab_size), cfg.jnp_dtype, fan_in=cfg.dim)

  def __call__(self, tokens, positions, token_mask, cache: KVCache | None = None,
               remat: bool = False):
    """Hidden states [B,T,D] after the final norm, and the updated cache.

    tokens, positions [B,T] int; token_mask [B,T] (1 = real token). With a cache,
    the T tokens occupy slots [cache.index, cache.index + T).
    """
    t = tokens.shape[1]
    if cache is None:
      index, kv_mask, window = 0, token_mask.astype(bool), t
    else:
      index, window = cache.index, cache.window or cache.mask.shape[1]
      kv_mask = cache.write_mask(token_mask)
    # Query t of row b sits at slot index (+ its row's offset) + t and sees
    # valid slots up to its own. It always sees itself (when inside the
    # window), so padding rows never softmax over an empty set.
    q_slot = jnp.reshape(index, (-1, 1, 1)) + jnp.arange(t)[:, None]  # [1 or B, T, 1]
    k_slot = jnp.arange(window)
    mask = ((k_slot <= q_slot) & kv_mask[:, None, :window]) | (k_slot == q_slot)

    x = self.embed[...][tokens]

    def layer(carry, block):
      x, kv = carry
      x, kv = block(x, positions, mask, kv, index)
      if kv is not None:
        kv = (kv[0], kv[1], kv[2] + 1)  # the next layer's index
      return x, kv

    if remat:
      layer = nnx.remat(layer)
    kv = None if cache is None else (cache.k, cache.v, jnp.zeros((), jnp.int32))
    x, kv = nnx.scan(layer, in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)((x, kv), self.layers)
    if cache is not None:
      cache = dataclasses.replace(cache, k=kv[0], v=kv[1], mask=kv_mask, index=index + t)
    return self.final_norm(x), cache

  def unembed(self, hidden):
    """Float32 logits [..., V] from final hidden states."""
    if self.cfg.tie_embeddings:
      return jnp.einsum("...D,VD->...V", hidden, self.embed[...],
                        preferred_element_type=jnp.float32)
    return jnp.einsum("...D,DV->...V", hidden, self.lm_head[...],
                      preferred_element_type=jnp.float32)


# ---------------------------------------------------------------------------
# Functional KV cache.
# ---------------------------------------------------------------------------
@jax.tree_util.register_dataclass
@dataclasses.dataclass
class KVCache:
  k: jax.Array  # [L,B,K,S,H]
  v: jax.Array  # [L,B,K,S,H]
  mask: jax.Array  # [B,S] bool: slot holds a real token
  # The next slot to write: an int32 scalar (same for all rows) or [B] (one per
  # row, for continuous batching, where rows start at different times).
  index: jax.Array
  # Attend over the first `window` slots only (None: all S). Static: each
  # window is its own compiled program; every row's slots in use must lie
  # inside it.
  window: int | None = dataclasses.field(default=None, metadata=dict(static=True))

  @classmethod
  def init(cls, cfg: ModelConfig, batch: int, size: int, dtype=None) -> KVCache:
    shape = (cfg.num_layers, batch, cfg.num_kv_heads, size, cfg.head_dim)
    dtype = dtype or cfg.jnp_dtype
    return cls(k=jnp.zeros(shape, dtype), v=jnp.zeros(shape, dtype),
               mask=jnp.zeros((batch, size), bool), index=jnp.zeros((), jnp.int32))

  def extend(self, num_slots: int) -> KVCache:
    """The same cache with `num_slots` more empty slots at the end."""
    pad = lambda x, axis: jnp.pad(x, [(0, num_slots if a == axis else 0) for a in range(x.ndim)])
    return dataclasses.replace(self, k=pad(self.k, 3), v=pad(self.v, 3), mask=pad(self.mask, 1))

  def write_mask(self, token_mask: jax.Array) -> jax.Array:
    """mask [B,S] with token_mask [B,T] written from `index` (1 = real token)."""
    token_mask = token_mask.astype(bool)
    if jnp.ndim(self.index) == 0:
      return jax.lax.dynamic_update_slice_in_dim(self.mask, token_mask, self.index, 1)
    rows, cols = _row_slots(self.index, *token_mask.shape)
    return self.mask.at[rows, cols].set(token_mask, unique_indices=True, indices_are_sorted=True,
                                        mode="promise_in_bounds")


# ---------------------------------------------------------------------------
# Functional API over plain parameter dicts.
# ---------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _graphdef_and_shapes(cfg: ModelConfig):
  graphdef, state = nnx.split(nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0))))
  return graphdef, nnx.to_pure_dict(state)


def bind(cfg: ModelConfig, params: Params) -> Transformer:
  """The module for `params` (call inside jitted functions)."""
  return nnx.merge(_graphdef_and_shapes(cfg)[0], params)


def param_shapes(cfg: ModelConfig) -> Params:
  """ShapeDtypeStructs of all parameters, without allocating anything."""
  return _graphdef_and_shapes(cfg)[1]


def count_params(cfg: ModelConfig) -> int:
  return sum(math.prod(x.shape) for x in jax.tree.leaves(param_shapes(cfg)))


def init_params(cfg: ModelConfig, seed: int = 0, shardings=None) -> Params:
  """Random parameters, created directly in `shardings` (a matching pytree)."""
  init = lambda: nnx.to_pure_dict(nnx.split(Transformer(cfg, rngs=nnx.Rngs(seed)))[1])
  return jax.jit(init, out_shardings=shardings)()


def positions_from_mask(attention_mask: jax.Array) -> jax.Array:
  """Position ids for a left-padded batch: 0 at the first real token."""
  return jnp.maximum(jnp.cumsum(attention_mask, axis=-1) - 1, 0).astype(jnp.int32)


def forward(cfg: ModelConfig, params: Params, tokens, positions, token_mask,
            cache: KVCache | None = None, remat: bool = False):
  """(hidden [B,T,D], cache) — the shared training/decoding forward."""
  return bind(cfg, params)(tokens, positions, token_mask, cache, remat)


def unembed(cfg: ModelConfig, params: Params, hidden) -> jax.Array:
  return bind(cfg, params).unembed(hidden)


@functools.partial(jax.jit, static_argnums=0)
def _logits(cfg, params, tokens, attention_mask):
  model = bind(cfg, params)
  hidden, _ = model(tokens, positions_from_mask(attention_mask), attention_mask)
  return model.unembed(hidden)


def logits(model_config: ModelConfig, params: Params, tokens, attention_mask=None) -> jax.Array:
  """Float32 logits [B,T,V] for int tokens [B,T]; mask 1 = real (left padding ok)."""
  tokens = jnp.asarray(tokens, jnp.int32)
  if attention_mask is None:
    attention_mask = jnp.ones_like(tokens)
  return _logits(model_config, params, tokens, jnp.asarray(attention_mask, jnp.int32))
