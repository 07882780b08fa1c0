"""The functional KV cache of the decoder (model.py): one key/value buffer per layer,
stacked, passed into a forward and returned by it.

A forward over T new tokens writes their keys/values at slots [index, index + T) of
the buffers and attends causally (by slot) over the valid slots (`mask`); without a
cache the buffer is just the T new tokens (index 0). `index` is one scalar for the
whole batch (the static sampler) or one slot per row (continuous batching, where rows
start at different times). A row's real tokens occupy consecutive slots, so slot
distance is token distance for left padding, right padding and continuous batching
alike. Every layer keeps the full cache (no ring buffer); the streaming pool's paged
twin is paged_kv.PagedKVCache.

Axes as in model.py: L layers, B rows, K kv heads, S slots, T new tokens, H head dim.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from tba_jax.model_config import ModelConfig


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
  page_table = None  # a row per cache slot (paged_kv.PagedKVCache has pages instead)

  @classmethod
  def init(cls, cfg: ModelConfig, batch: int, size: int, dtype=None) -> KVCache:
    shape = (cfg.num_layers, batch, cfg.num_kv_heads, size, cfg.head_dim)
    dtype = dtype or cfg.jnp_dtype
    return cls(k=jnp.zeros(shape, dtype), v=jnp.zeros(shape, dtype),
               mask=jnp.zeros((batch, size), bool), index=jnp.zeros((), jnp.int32))

  def put_row(self, slot, k, v, length) -> KVCache:
    """Row `slot` (a per-row index) starts over with k/v [L,K,T,H] at its slots [0, T),
    `length` of them real (the rest stays masked, overwritten as the row grows)."""
    write = lambda buf, x: jax.lax.dynamic_update_slice(buf, x[:, None].astype(buf.dtype),
                                                        (0, slot, 0, 0, 0))
    return dataclasses.replace(
        self, k=write(self.k, k), v=write(self.v, v),
        mask=self.mask.at[slot].set(jnp.arange(self.mask.shape[1]) < length),
        index=self.index.at[slot].set(length))

  def take_rows(self, rows: jax.Array) -> KVCache:
    """The cache of rows `rows` [B'] (indices into this cache's B rows)."""
    index = self.index if jnp.ndim(self.index) == 0 else self.index[rows]
    return dataclasses.replace(self, k=self.k[:, rows], v=self.v[:, rows], mask=self.mask[rows],
                               index=index)

  def extend(self, num_slots: int) -> KVCache:
    """The same cache with `num_slots` more empty slots at the end."""
    pad = lambda x, axis: jnp.pad(x, [(0, num_slots if a == axis else 0) for a in range(x.ndim)])
    return dataclasses.replace(self, k=pad(self.k, 3), v=pad(self.v, 3), mask=pad(self.mask, 1))

  def write_mask(self, token_mask: jax.Array) -> jax.Array:
    """mask [B,S] with token_mask [B,T] written from `index` (1 = real token)."""
    token_mask = token_mask.astype(bool)
    if jnp.ndim(self.index) == 0:
      return jax.lax.dynamic_update_slice_in_dim(self.mask, token_mask, self.index, 1)
    rows, cols = row_slots(self.index, *token_mask.shape)
    return self.mask.at[rows, cols].set(token_mask, unique_indices=True, indices_are_sorted=True,
                                        mode="promise_in_bounds")


def write_read(buf, layer, index, new, window):
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
    rows, cols = row_slots(index, b, t)
    # Promising unique, in-bounds indices keeps the scatter in place: without
    # it XLA:CPU copies the whole stacked buffer per layer (measured 25x
    # slower decode steps at 30 layers).
    buf = buf.at[layer, rows, :, cols].set(new.astype(buf.dtype), unique_indices=True,
                                            indices_are_sorted=True, mode="promise_in_bounds")
  _, b, k, _, h = buf.shape
  return buf, jax.lax.dynamic_slice(buf, (layer, 0, 0, 0, 0), (1, b, k, window, h))[0]


def row_slots(index, b: int, t: int):
  """(rows [B,1], slots [B,T]): the cache slots of T new tokens, row b's from index[b]."""
  return jnp.arange(b)[:, None], index[:, None] + jnp.arange(t)
