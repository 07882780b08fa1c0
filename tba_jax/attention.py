"""Attention backends (ModelConfig.attention_impl): one math, several kernels.

  xla     the reference: jax.nn.dot_product_attention's XLA path without a cache
          and a grouped einsum over the cache slots with one (`grouped`). Exact on
          CPU; the only one that drops attention probabilities (model.dropout).
  cudnn   jax.nn.dot_product_attention(implementation="cudnn"): cuDNN's fused
          attention for the training forward and fresh prefills (GPU, bfloat16 or
          float16 only), given the layer's own mask (as a bias: a sliding layer's
          window included); the decode step stays on `grouped` (one query per row
          is a memory-bound read of the cache, which cuDNN's kernel does not target).
  pallas  the kernels JAX ships in jax.experimental.pallas.ops: on GPU the
          Triton flash attention (`gpu.attention.mha`, segment ids + causal) for
          the training forward and fresh prefills, and the split-K decode kernel
          (`gpu.decode_attention.gqa`, one [start, end) slot range per row) for
          decode; on TPU the flash attention kernel (`tpu.flash_attention`) for
          the training forward and prefills, `grouped` for unpaged decode (the
          TPU ships decode kernels only over pages: paged_kv.py). On CPU the GPU
          kernels run in Pallas interpret mode: slow, exact, used by the tests.
          None of them takes a sliding window, so a model with sliding layers
          refuses `pallas`.
  auto    the first of (the device's kernel, xla) that can run the model in the
          queries' dtype and apply every mask it has (resolve()): xla on CPU;
          cudnn on GPU (xla for a float32 model); pallas on TPU (xla for a model
          with sliding layers).

How our masks map onto the Pallas kernels' (so they need no mask array):
  * training / fresh prefill: the mask is causal-by-slot AND the key slot holds a
    real token, OR the key is the query itself. With segment ids 1 for real
    tokens and 0 for padding plus the kernel's causal flag, every real query
    sees exactly what the xla path shows it; a padding query sees earlier
    padding instead of only itself, and no real token ever reads a padding
    position's output, so every real position's logits agree. A prefill into a
    cache that already holds tokens (index > 0) takes the `grouped` path: the
    kernels' causal mask assumes queries start at slot 0.
  * decode: every row's visible slots are one run [start, end) (its prompt is
    contiguous, left- or right-aligned, its completion follows it, and a
    sliding window cuts the run's front), so the decode kernel's per-row
    (start, length) says the same. Rows that ended (their token masked) read a
    slightly different run; their outputs are discarded by the samplers.
The kernels take as many kv heads as query heads (gpu.attention.mha, the TPU
flash kernel), so grouped-query models repeat their kv heads G times for them.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from tba_jax.layers import dropped
from tba_jax.model_config import ATTENTION_IMPLS as IMPLS
_BACKENDS = {"cudnn": ("gpu",), "pallas": ("gpu", "tpu", "cpu")}
_AUTO = {"cpu": "xla", "gpu": "cudnn", "tpu": "pallas"}
# Backends whose training forward and prefill apply a sliding window (cuDNN through the
# layer's mask); Pallas's flash kernels know only causal + segment ids.
_WINDOWED = ("xla", "cudnn")


def resolve(impl: str, backend: str | None = None, dtype=jnp.bfloat16,
            sliding: bool = False) -> str:
  """The backend `impl` runs as on `backend` (default: JAX's) for queries of `dtype` in a
  model with (`sliding`) or without sliding-window layers: raises ValueError when it
  cannot run there or cannot apply the window. `auto` falls back to xla where the
  device's kernel cannot: cuDNN takes no float32, Pallas no window."""
  backend = backend or jax.default_backend()
  if impl not in IMPLS:
    raise ValueError(f"attention_impl={impl!r}: must be one of {', '.join(IMPLS)}")
  half = jnp.dtype(dtype) in (jnp.bfloat16, jnp.float16)
  if impl == "auto":
    impl = _AUTO.get(backend, "xla")
    return "xla" if (impl == "cudnn" and not half) or (sliding and impl not in _WINDOWED) else impl
  if impl in _BACKENDS and backend not in _BACKENDS[impl]:
    raise ValueError(f"attention_impl={impl!r} needs a {' or '.join(_BACKENDS[impl])} device; "
                     f"this process's backend is {backend!r} (use 'xla' or 'auto')")
  if impl == "cudnn" and not half:
    raise ValueError(f"attention_impl='cudnn' takes bfloat16 or float16, not "
                     f"{jnp.dtype(dtype).name} (use 'xla', 'pallas' or 'auto')")
  if sliding and impl not in _WINDOWED:
    raise ValueError(f"attention_impl={impl!r}: its kernels apply no sliding window and this "
                     f"model has sliding-window layers (use {', '.join(map(repr, _WINDOWED))} "
                     "or 'auto')")
  return impl


def for_model(cfg, dtype, backend: str | None = None) -> str:
  """The backend cfg's layers run as for queries of `dtype`: the forward's choice."""
  return resolve(cfg.attention_impl, backend, dtype, sliding=bool(cfg.sliding_layers))


def check(cfg, dtypes=()) -> dict[str, str]:
  """{dtype: backend} for cfg's own dtype and every one of `dtypes` the run also computes
  in (float32 master weights: the bfloat16 compute and published dtypes), as the forward
  picks them; raises ValueError where cfg's attention_impl cannot run cfg on this backend."""
  names = dict.fromkeys(jnp.dtype(d).name for d in (cfg.jnp_dtype, *dtypes))
  return {d: for_model(cfg, d) for d in names}


def _interpret() -> bool:
  return jax.default_backend() == "cpu"


def _repeat_kv(x, groups: int):
  """[B,S,K,H] -> [B,S,N,H], kv head k serving query heads k*G .. k*G+G-1."""
  return x if groups == 1 else jnp.repeat(x, groups, axis=2)


def _pad_to(x, axis: int, size: int):
  return jnp.pad(x, [(0, size - x.shape[axis] if a == axis else 0) for a in range(x.ndim)])


def causal_attention(q, k, v, mask, valid, scale, impl: str):
  """Causal self-attention over a fresh sequence: q [B,T,N,H], k/v [B,S,K,H] at
  slots [0, S) (S >= T, the queries at slots [0, T)), mask [B,T,S] (the layer's: causal,
  valid keys, its window), valid [B,S] (slot holds a real token) -> [B,T,N,H]; `impl` a
  resolved fused backend (module doc). cuDNN applies `mask`; the Pallas kernels rebuild
  it from `valid` and their causal flag, so resolve() keeps sliding windows from them."""
  b, t, n, h = q.shape
  s, kh = k.shape[1], k.shape[2]
  scale = h ** -0.5 if scale is None else scale
  if impl == "cudnn":
    # cuDNN takes a mask (as a bias) only over even lengths: a prefill into a cache of
    # prompt + max_new_tokens - 1 slots is often odd. Pad both with masked-out slots; a
    # padding query sees itself, so no softmax runs over an empty set.
    te, se = t + t % 2, s + s % 2
    q, k, v = _pad_to(q, 1, te), _pad_to(k, 1, se), _pad_to(v, 1, se)
    mask = _pad_to(_pad_to(mask, 1, te), 2, se) | (jnp.arange(se) == jnp.arange(te)[:, None])
    return jax.nn.dot_product_attention(q, k, v, mask=mask[:, None], scale=scale,
                                        implementation="cudnn")[:, :t]
  k, v = _repeat_kv(k, n // kh), _repeat_kv(v, n // kh)
  seg = valid.astype(jnp.int32)
  if jax.default_backend() == "tpu":
    from jax.experimental.pallas.ops.tpu import flash_attention as tpu_flash
    out = tpu_flash.flash_attention(
        q.swapaxes(1, 2), k.swapaxes(1, 2), v.swapaxes(1, 2),
        segment_ids=tpu_flash.SegmentIds(seg[:, :t], seg), causal=True, sm_scale=scale)
    return out.swapaxes(1, 2)
  from jax.experimental.pallas.ops.gpu import attention as gpu_attention
  # The kernel tiles T and S by 128 forward and 32 backward (or takes them whole
  # when shorter), and reads the queries' segment ids from the keys' array: one
  # padded length for both.
  size = kernel_length(max(s, t), 128)
  out = gpu_attention.mha(_pad_to(q, 1, size), _pad_to(k, 1, size), _pad_to(v, 1, size),
                          _pad_to(seg, 1, size), sm_scale=scale, causal=True,
                          interpret=_interpret())
  return out[:, :t]


def kernel_length(n: int, tile: int) -> int:
  """`n` padded for a Pallas GPU kernel that tiles it by `tile` (a power of two) or
  takes it whole when shorter: Triton's blocks are powers of two, at least 16."""
  return max(16, 1 << (n - 1).bit_length()) if n <= tile else -(-n // tile) * tile


def _decode_split(s: int) -> tuple[int, int]:
  """(k_splits, padded S) for gpu.decode_attention.gqa: at most 16 chunks, each of
  kernel_length (it reads a chunk in blocks of up to 256 slots)."""
  if s <= 256:
    return -(-s // 16), -(-s // 16) * 16
  return 16, 16 * kernel_length(-(-s // 16), 256)


def decode_attention(q, k, v, mask, scale):
  """One query per row through the shipped decode kernel: q [B,1,N,H], k/v
  [B,K,S,H] (the cache window), mask [B,1,S] (one contiguous run per row, module
  doc) -> [B,1,N,H]."""
  from jax.experimental.pallas.ops.gpu import decode_attention as gpu_decode
  b, _, n, h = q.shape
  s = k.shape[2]
  m = mask[:, 0]
  start = jnp.argmax(m, axis=-1).astype(jnp.int32)
  end = (s - jnp.argmax(m[:, ::-1], axis=-1)).astype(jnp.int32)
  splits, size = _decode_split(s)
  # gqa takes [B,S,K,H] and swaps to [B,K,S,H] itself: the two transposes cancel.
  kt, vt = (_pad_to(x, 2, size).swapaxes(1, 2) for x in (k, v))
  out = gpu_decode.gqa(q[:, 0], kt, vt, start, end, sm_scale=h ** -0.5 if scale is None else scale,
                       k_splits=splits, interpret=_interpret())
  return out[:, None].astype(q.dtype)


def grouped(q, k, v, mask, scale=None, dropout=None):
  """jax.nn.dot_product_attention's math (float32 softmax, same mask fill) over
  cache slots: q [B,T,N,H], k/v [B,K,S,H], mask [B,T,S] -> [B,T,N,H]; logits
  times `scale` (None: H ** -0.5); `dropout` on the probabilities (site 0).

  The cache is stored kv-head-major so both einsums are batched over (B, K) with
  those axes leading in every operand: no transposed copy of any layer's cache on
  a decode step.
  """
  b, t, n, h = q.shape
  q = q.reshape(b, t, k.shape[1], n // k.shape[1], h)  # query head n = kv head * G + g
  logits = jnp.einsum("BTKGH,BKSH->BKGTS", q, k, preferred_element_type=jnp.float32)
  logits = logits * (h ** -0.5 if scale is None else scale)
  logits = jnp.where(mask[:, None, None], logits, -0.7 * jnp.finfo(jnp.float32).max)
  probs = dropped(jax.nn.softmax(logits, axis=-1), dropout, 0).astype(v.dtype)
  out = jnp.einsum("BKGTS,BKSH->BKGTH", probs, v)
  return out.transpose(0, 3, 1, 2, 4).reshape(b, t, n, h)


def uncached(q, k, v, mask, valid, scale, impl: str, dropout=None):
  """The training forward's attention: q [B,T,N,H], k/v [B,T,K,H], mask [B,T,T],
  valid [B,T]."""
  if dropout is not None:  # the fused kernels cannot drop probabilities: the same math
    return grouped(q, k.swapaxes(1, 2), v.swapaxes(1, 2), mask, scale, dropout)
  if impl == "xla":  # XLA's reference attention (exact on CPU)
    return jax.nn.dot_product_attention(q, k, v, mask=mask[:, None], scale=scale)
  return causal_attention(q, k, v, mask, valid, scale, impl)


def cached(q, k, v, mask, valid, index, scale, impl: str):
  """Attention over cache slots: q [B,T,N,H] written at slots from `index`, k/v
  [B,K,S,H] (the window), mask [B,T,S], valid [B,S]."""
  if impl == "xla":
    return grouped(q, k, v, mask, scale)
  if q.shape[1] == 1:
    if impl == "cudnn" or jax.default_backend() == "tpu":
      return grouped(q, k, v, mask, scale)
    return decode_attention(q, k, v, mask, scale)
  # A prefill: fused when the cache was empty (every row from slot 0), else grouped.
  fused = lambda: causal_attention(q, k.swapaxes(1, 2), v.swapaxes(1, 2), mask, valid, scale,
                                  impl)
  return jax.lax.cond(jnp.all(index == 0), fused, lambda: grouped(q, k, v, mask, scale))
