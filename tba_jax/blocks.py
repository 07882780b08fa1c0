"""One decoder layer, as model.py stacks L of them: attention (its KV-cache write and
read, the attention backend), the MLP, their norms and residual wiring, and the LoRA
adapters beside the targeted projections.

Every architecture of model.py is these modules under ModelConfig switches (the module
docstring there lists them). With `cfg.lora` the targeted projections also carry
low-rank adapters (nnx.LoRA, leaves `.../q_lora/lora_a` and `lora_b`):
x W + (alpha / rank) x A B, the update computed beside the frozen projection rather
than merged into it, so the trainer's gradient is only the adapters' (lora.py splits,
merges and exports them).

Axis legend as in model.py: B batch, T query length, S cache slots, N query heads,
K kv heads, H head dim, D model dim, F mlp dim, L layers, R LoRA rank.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from tba_jax import attention as attention_lib
from tba_jax import kv_cache, paged_kv
from tba_jax.layers import ACTIVATION_FNS, Norm, apply_rope, dropped, param, project
from tba_jax.model_config import ModelConfig


def norm(cfg: ModelConfig, rngs: nnx.Rngs, dim: int | None = None) -> Norm:
  return Norm(dim or cfg.dim, cfg.norm, cfg.norm_eps, cfg.jnp_dtype, rngs)


def input_dims(projection: str) -> int:
  """How many leading dims of a projection's kernel are its input ([N,H,D] for o)."""
  return 2 if projection == "o" else 1


def _add_adapters(module: nnx.Module, cfg: ModelConfig, which: str, rngs: nnx.Rngs) -> None:
  """An nnx.LoRA [in, R] x [R, out] per adapter of `which` ("attn"/"mlp"), with the
  kernels' inputs and outputs flattened (the outputs of fused q/k/v concatenated)."""
  for name, kernels in cfg.lora_adapters(which):
    shapes = [getattr(module, k).shape for k in kernels]
    n_in = input_dims(kernels[0])
    setattr(module, name, nnx.LoRA(
        math.prod(shapes[0][:n_in]), cfg.lora.rank, sum(math.prod(s[n_in:]) for s in shapes),
        param_dtype=cfg.jnp_dtype, rngs=rngs,
        # torch's Linear init, as PEFT draws A: U(+-1 / sqrt(in)); B starts at 0.
        a_initializer=nnx.initializers.variance_scaling(1 / 3, "fan_in", "uniform")))


def _adapted(module: nnx.Module, which: str, x, **outs) -> list:
  """The projections `outs` of x [B,T,...] (by kernel name), each plus its adapter's
  update scale * x A B (a fused adapter's output split over its kernels), in order.
  Without adapters for them, `outs` unchanged: no operation is added."""
  cfg = module.cfg
  for name, kernels in cfg.lora_adapters(which):
    if kernels[0] not in outs:  # an adapter of the module's other input
      continue
    delta = getattr(module, name)(x.reshape(*x.shape[:2], -1)) * cfg.lora.scale  # [B,T,out]
    sizes = np.cumsum([math.prod(outs[k].shape[2:]) for k in kernels])[:-1]
    for k, d in zip(kernels, jnp.split(delta, sizes, axis=-1)):
      outs[k] = outs[k] + d.reshape(outs[k].shape)
  return list(outs.values())


class Attention(nnx.Module):

  def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs, own_weights: bool = False):
    d, n, k, h, dt = cfg.dim, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.jnp_dtype
    self.own_weights = own_weights  # Block's
    self.q = param(rngs, (d, n, h), dt, fan_in=d)
    self.k = param(rngs, (d, k, h), dt, fan_in=d)
    self.v = param(rngs, (d, k, h), dt, fan_in=d)
    self.o = param(rngs, (n, h, d), dt, fan_in=n * h)
    if cfg.qkv_bias:
      self.q_bias = param(rngs, (n, h), dt)
      self.k_bias = param(rngs, (k, h), dt)
      self.v_bias = param(rngs, (k, h), dt)
    if cfg.bias:
      self.o_bias = param(rngs, (d,), dt)
    if cfg.qk_norm:
      self.q_norm, self.k_norm = norm(cfg, rngs, h), norm(cfg, rngs, h)
    self.cfg = cfg
    _add_adapters(self, cfg, "attn", rngs)

  def __call__(self, x, positions, mask, kv, index, inv_freq, dropout=None, valid=None):
    """x [B,T,D]; mask [B,T,S]; valid [B,S]: the slots holding real tokens; kv = None,
    or (k, v, layer, page table): the stacked cache buffers [L,B,K,S,H] (or pages
    [L,K,P,page,H] with their table, paged_kv.py) and this layer's index into them;
    inv_freq: this layer's rotary frequencies (None: no rope); `dropout` on the
    attention probabilities (site 0)."""
    # [B,T,N,H], [B,T,K,H] x 2
    q, k, v = project(x, self.q[...], self.k[...], self.v[...], concat=self.own_weights)
    q, k, v = _adapted(self, "attn", x, q=q, k=k, v=v)
    if self.cfg.qkv_bias:
      q, k, v = q + self.q_bias[...], k + self.k_bias[...], v + self.v_bias[...]
    if self.cfg.qk_norm:  # per head, over H, before the rotation (Qwen3, Gemma 3)
      q, k = self.q_norm(q), self.k_norm(k)
    if inv_freq is not None:
      q, k = apply_rope(q, positions, inv_freq), apply_rope(k, positions, inv_freq)
    impl = attention_lib.for_model(self.cfg, q.dtype)  # as attention.check picks it
    if kv is not None:
      # Write only the T new keys/values, in place, at the layer's slots from
      # `index` of the stacked buffers, then read this layer's window back. Carrying the whole
      # cache through the layer scan (rather than scanning over it as xs/ys)
      # keeps XLA from copying every layer's cache on every decode step.
      k_all, v_all, layer, table = kv
      window = mask.shape[-1]
      if table is None:
        k_all, k = kv_cache.write_read(k_all, layer, index, k, window)
        v_all, v = kv_cache.write_read(v_all, layer, index, v, window)
      else:  # pages (paged_kv.py): written in place, the window gathered
        k_all, k = paged_kv.write_read(k_all, layer, table, index, k, window)
        v_all, v = paged_kv.write_read(v_all, layer, table, index, v, window)
      kv = (k_all, v_all, layer, table)
      if table is not None and impl == "pallas" and q.shape[1] == 1:
        pages = lambda buf: jax.lax.dynamic_index_in_dim(buf, layer, 0, keepdims=False)
        out = paged_kv.paged_decode(q, pages(k_all), pages(v_all), table, mask,
                                    self.cfg.attn_scale, window)
      elif dropout is not None:
        out = attention_lib.grouped(q, k.astype(q.dtype), v.astype(q.dtype), mask,
                                    self.cfg.attn_scale, dropout)
      else:
        out = attention_lib.cached(q, k.astype(q.dtype), v.astype(q.dtype), mask, valid, index,
                                   self.cfg.attn_scale, impl)
    else:
      out = attention_lib.uncached(q, k, v, mask, valid, self.cfg.attn_scale, impl, dropout)
    [out] = _adapted(self, "attn", out, o=jnp.einsum("BTNH,NHD->BTD", out, self.o[...]))
    return (out + self.o_bias[...] if self.cfg.bias else out), kv


class MLP(nnx.Module):
  """down(act(gate x) * up x) when gated (SwiGLU), else down(act(up x))."""

  def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs, own_weights: bool = False):
    d, f, dt = cfg.dim, cfg.mlp_dim, cfg.jnp_dtype
    self.own_weights = own_weights  # Block's
    if cfg.gated_mlp:
      self.gate = param(rngs, (d, f), dt, fan_in=d)
    self.up = param(rngs, (d, f), dt, fan_in=d)
    self.down = param(rngs, (f, d), dt, fan_in=f)
    if cfg.bias:
      if cfg.gated_mlp:
        self.gate_bias = param(rngs, (f,), dt)
      self.up_bias = param(rngs, (f,), dt)
      self.down_bias = param(rngs, (d,), dt)
    self.cfg = cfg
    _add_adapters(self, cfg, "mlp", rngs)

  def __call__(self, x):
    cfg, act = self.cfg, ACTIVATION_FNS[self.cfg.activation]
    if cfg.gated_mlp:
      gate, up = project(x, self.gate[...], self.up[...], concat=self.own_weights)  # [B,T,F] x 2
      gate, up = _adapted(self, "mlp", x, gate=gate, up=up)
      if cfg.bias:
        gate, up = gate + self.gate_bias[...], up + self.up_bias[...]
      h = act(gate) * up
    else:
      [up] = _adapted(self, "mlp", x, up=jnp.einsum("BTD,DF->BTF", x, self.up[...]))
      h = act(up + self.up_bias[...] if cfg.bias else up)
    [out] = _adapted(self, "mlp", h, down=jnp.einsum("BTF,FD->BTD", h, self.down[...]))
    return out + self.down_bias[...] if cfg.bias else out


class Block(nnx.Module):
  """One layer. `own_weights`: its weights are arrays of their own (model.decode_layout),
  not slices of the stacked layers. A one-token forward then multiplies by the concatenated
  q/k/v and gate/up kernels too (layers.project): in a decode loop the concatenations
  depend on nothing the loop changes, and XLA hoists them out of it (done once a call),
  where a scanned layer would copy them every step."""

  def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs, own_weights: bool = False):
    self.attn_norm = norm(cfg, rngs)
    self.attn = Attention(cfg, rngs, own_weights)
    self.mlp_norm = norm(cfg, rngs)
    self.mlp = MLP(cfg, rngs, own_weights)
    if cfg.post_norms:  # Gemma: each branch's output normed before it joins the residual
      self.attn_post_norm, self.mlp_post_norm = norm(cfg, rngs), norm(cfg, rngs)
    self.parallel, self.post_norms = cfg.parallel_residual, cfg.post_norms

  def __call__(self, x, positions, mask, kv, index, inv_freq, dropout=None, valid=None):
    h, kv = self.attn(self.attn_norm(x), positions, mask, kv, index, inv_freq, dropout, valid)
    if self.post_norms:
      h = self.attn_post_norm(h)
    h = dropped(h, dropout, 1)  # GPT-2's resid_pdrop, after each output projection
    if self.parallel:  # both branches read the block's input (GPT-NeoX)
      return x + h + dropped(self.mlp(self.mlp_norm(x)), dropout, 2), kv
    x = x + h
    h = self.mlp(self.mlp_norm(x))
    return x + dropped(self.mlp_post_norm(h) if self.post_norms else h, dropout, 2), kv

