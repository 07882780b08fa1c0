"""A paged KV cache for the streaming searcher's pool (sampler.kv_pages).

Without pages every slot of a continuous.Stream reserves a full row of
max_prompt + max_new cache slots, whatever its completion's length. Here the
slots take fixed-size pages of `page_size` cache slots from one pool; a row
holds the pages its prompt and completion have reached (plus one decode chunk
ahead), so memory follows the rows' actual lengths (RL completions vary ~4x)
and more rows fit in flight.

  device  PagedKVCache: k/v pages [L,K,P,page,H] (the layout of the shipped
          paged kernels, per layer), a page table [N, pages_per_row] (row n's
          cache slot s lives at page table[n, s // page], offset s % page), the
          slots' mask [N,S] and next index [N], as KVCache.
  host    PageAllocator: the free list and each slot's pages; unallocated table
          entries point at the slot's own scratch page (pages 0..N-1), so a
          free or ended slot's masked writes never land in another row's page
          and a decode step's scatter indices stay unique (a prompt's insert
          writes only its own pages: PagedKVCache.put_row).

Decode reads a row's window of pages: an XLA gather into [B,K,W,H] followed by
the model's attention (attention.py) on CPU and without Pallas, or the
shipped paged-attention kernel reading the pages in place (attention_impl
pallas: jax.experimental.pallas.ops.gpu.paged_attention on GPU and, in
interpret mode, on CPU; ...ops.tpu.paged_attention on TPU). The kernels take a
length per row from slot 0, which holds because the pool's rows are
left-aligned (slot_programs.py), multi-turn rows too (an append rewrites a row from its
last kept token on, so its real slots stay [0, length)).

Axis legend (model.py): L layers, K kv heads, P pages, H head dim, N slots,
S cache slots per row, W window, T prompt slots.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

DEFAULT_PAGE_SIZE = 16
# "auto" pools take this fraction of the free memory of each of the searcher's devices
# (the rest: activations, the prefill's cache, fragmentation).
AUTO_MEMORY_FRACTION = 0.8
# ... and this one where the trainer shares them (one device: alternate mode). The pool is
# sized at the searcher's first round, before the first update, so the free memory it sees
# still holds the update's gradients and activations, and the largest of them, the float32
# logits of a micro-batch [rows, max_new_tokens, vocab] and their gradient, follows the
# trainer's batch, which the searcher does not know: benchmarks/memory.py's one-device
# `qwen` holds 7.9 GB of train state and a logits floor of 43.6 GB (6.2 GB with
# optim.num_microbatches=7). A quarter leaves the update three quarters: on an 80 GB
# device about 18 GB of pages, ~10x the 1.8 GB cache of that variant's static search
# batch (computed, not measured). A run that knows its update's peak sets sampler.kv_pages.
SHARED_MEMORY_FRACTION = 0.25


@dataclasses.dataclass(frozen=True)
class AutoPages:
  """A pool of as many pages as fit in `memory_fraction` of the free memory of each of
  the searcher's devices (auto_num_pages): continuous.Stream's kv_pages for
  sampler.kv_pages=0."""
  memory_fraction: float = AUTO_MEMORY_FRACTION


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class PagedKVCache:
  k: jax.Array  # [L,K,P,page,H]
  v: jax.Array  # [L,K,P,page,H]
  mask: jax.Array  # [N,S] bool: slot holds a real token
  index: jax.Array  # [N] int32: the next slot to write
  page_table: jax.Array  # [N, S // page] int32
  window: int | None = dataclasses.field(default=None, metadata=dict(static=True))

  @classmethod
  def init(cls, cfg, num_rows: int, row_size: int, num_pages: int, page_size: int,
           dtype=None) -> PagedKVCache:
    """A pool of `num_pages` pages (the first num_rows are the rows' scratch pages) for
    rows of `row_size` slots (a multiple of page_size)."""
    shape = (cfg.num_layers, cfg.num_kv_heads, num_pages, page_size, cfg.head_dim)
    dtype = dtype or cfg.jnp_dtype
    table = jnp.broadcast_to(jnp.arange(num_rows, dtype=jnp.int32)[:, None],
                             (num_rows, row_size // page_size))
    return cls(k=jnp.zeros(shape, dtype), v=jnp.zeros(shape, dtype),
               mask=jnp.zeros((num_rows, row_size), bool),
               index=jnp.zeros((num_rows,), jnp.int32), page_table=table)

  @property
  def page_size(self) -> int:
    return self.k.shape[3]

  def write_mask(self, token_mask: jax.Array) -> jax.Array:
    rows = jnp.arange(token_mask.shape[0])[:, None]
    cols = self.index[:, None] + jnp.arange(token_mask.shape[1])
    return self.mask.at[rows, cols].set(token_mask.astype(bool), unique_indices=True,
                                        indices_are_sorted=True, mode="promise_in_bounds")

  def put_row(self, slot, k, v, length) -> PagedKVCache:
    """Row `slot` starts over with k/v [L,K,T,H] at its slots [0, T), `length` of them
    real (the rest stays masked and is overwritten by the completion)."""
    t = k.shape[2]
    slots = jnp.arange(t)
    pages, offsets = self._where(self.page_table[slot][None], slots[None])  # [1,T]
    # Only the prompt's slots [0, length) are written: they lie in the row's own pages
    # (the host reserved them), so their (page, offset) pairs are unique. The bucket's
    # padding after them (masked, overwritten by the completion) can reach past the row's
    # pages, where every slot maps to its one scratch page (several bucket slots a scratch
    # slot: no uniqueness to promise): each goes to its own page past the pool's end
    # instead, which the scatter drops (mode="drop").
    pages = jnp.where(slots < length, pages[0], self.k.shape[2] + slots)
    put = lambda buf, x: buf.at[:, :, pages, offsets[0]].set(
        x.astype(buf.dtype), unique_indices=True, mode="drop")
    s = self.mask.shape[1]
    return dataclasses.replace(self, k=put(self.k, k), v=put(self.v, v),
                               mask=self.mask.at[slot].set(jnp.arange(s) < length),
                               index=self.index.at[slot].set(length))

  def _where(self, table, slots):
    """(pages, offsets) of cache slots [B,T] of the rows with page tables [B, S // page]."""
    return jnp.take_along_axis(table, slots // self.page_size, axis=1), slots % self.page_size


def write_read(buf, layer, table, index, new, window: int):
  """Writes `layer`'s T new keys (or values) [B,T,K,H] of each row at its slots from
  index [B] into the pages [L,K,P,page,H] and gathers that layer's first `window` slots
  of every row [B,K,W,H] (the paged twin of kv_cache.write_read)."""
  b, t = new.shape[:2]
  page = buf.shape[3]
  slots = index[:, None] + jnp.arange(t)  # [B,T]
  pages, offsets = jnp.take_along_axis(table, slots // page, axis=1), slots % page
  # Unique by construction (each row its own pages, a free row its scratch page):
  # promising it keeps the scatter in place (kv_cache.write_read). One exception, harmless:
  # a reply's append (slot_programs.append_replies) writes a bucket of slots from every row's
  # next slot, and its masked ones past a row's pages can meet twice in its scratch page,
  # whose contents are never read as a real token.
  # `layer` (traced) and the [B,T] pages and offsets are all advanced indices, apart
  # from each other: numpy's rule puts their [B,T] first, so the update is new [B,T,K,H].
  buf = buf.at[layer, :, pages, offsets].set(new.astype(buf.dtype), unique_indices=True,
                                             mode="promise_in_bounds")
  return buf, gather(buf, layer, table, window)


def gather(buf, layer, table, window: int):
  """Rows' first `window` slots [B,K,W,H] of `layer` from pages [L,K,P,page,H]."""
  _, k, _, page, h = buf.shape
  b = table.shape[0]
  rows = jax.lax.dynamic_index_in_dim(buf, layer, 0, keepdims=False)[:, table[:, :window // page]]
  return rows.reshape(k, b, window, h).swapaxes(0, 1)  # [K,B,W/page,page,H] -> [B,K,W,H]


def paged_decode(q, k_pages, v_pages, table, mask, scale, window: int):
  """One query per row [B,1,N,H] over `layer`'s pages [K,P,page,H] read in place by the
  shipped kernel, each row's real slots [0, length) (left-aligned, module doc)."""
  b, _, n, h = q.shape
  page = k_pages.shape[2]
  m = mask[:, 0]
  lengths = (m.shape[1] - jnp.argmax(m[:, ::-1], axis=-1)).astype(jnp.int32)
  scale = h ** -0.5 if scale is None else scale
  table = table[:, :window // page]
  # The kernels do not scale the logits: scale the queries (one multiply per head dim).
  q = (q[:, 0] * scale).astype(q.dtype)
  if jax.default_backend() == "tpu":
    from jax.experimental.pallas.ops.tpu.paged_attention import paged_attention as tpu_paged
    per_block = max(d for d in (1, 2, 4, 8) if table.shape[1] % d == 0)
    out = tpu_paged(q, k_pages, v_pages, lengths, table, pages_per_compute_block=per_block)
  else:
    from jax.experimental.pallas.ops.gpu import paged_attention as gpu_paged
    splits = max(d for d in (1, 2, 4, 8, 16) if table.shape[1] % d == 0)
    out = gpu_paged.paged_attention(q, k_pages, v_pages, table, lengths, k_splits=splits,
                                    pages_per_compute_block=1,
                                    interpret=jax.default_backend() == "cpu")
  return out[:, None].astype(q.dtype)


# ---------------------------------------------------------------------------
# The host side.
# ---------------------------------------------------------------------------
def pages_per_row(row_size: int, page_size: int) -> int:
  return -(-row_size // page_size)


def page_bytes(cfg, page_size: int) -> int:
  """HBM of one page: keys and values of every layer."""
  return 2 * cfg.num_layers * cfg.num_kv_heads * page_size * cfg.head_dim * cfg.jnp_dtype.itemsize


def auto_num_pages(cfg, devices, num_rows: int, row_size: int, page_size: int, *,
                   kv_shards: int = 1, memory_fraction: float = AUTO_MEMORY_FRACTION) -> int:
  """The pages that fit in `memory_fraction` of the free memory of the least free of
  `devices`, at most what every row at full length takes and at least the smallest pool
  (PageAllocator); 0 (no pages: full rows) where the devices do not report their memory
  (CPU). The pool is whole on every device of the data axis (slot_programs.page_sharding),
  so it is what fits on one device, not their sum; `kv_shards`: the devices a page's kv
  heads are split over (the tensor axis), each holding that share of a page."""
  free = []
  for d in devices:
    stats = d.memory_stats() or {}
    if "bytes_limit" not in stats:
      return 0
    free.append(stats["bytes_limit"] - stats.get("bytes_in_use", 0))
  full = num_rows + num_rows * pages_per_row(row_size, page_size)
  per_device = page_bytes(cfg, page_size) / kv_shards
  fits = int(memory_fraction * min(free) // per_device)
  return max(min(full, fits), num_rows + pages_per_row(row_size, page_size))


class PageAllocator:
  """Pages of a pool of `num_pages` for `num_rows` slots (host side, one thread): pages
  0..N-1 are the slots' scratch pages, the rest are handed out and given back."""

  def __init__(self, num_rows: int, row_size: int, num_pages: int, page_size: int):
    self.per_row = row_size // page_size
    if num_pages < num_rows + self.per_row:
      raise ValueError(f"kv_pages={num_pages}: a pool for {num_rows} slots needs at least "
                       f"{num_rows + self.per_row} pages ({num_rows} scratch pages and one full "
                       f"row of {self.per_row} pages of {page_size} slots)")
    self.page_size = page_size
    self.free = list(range(num_pages - 1, num_rows - 1, -1))  # pop() hands out low pages first
    self.rows: list[list[int]] = [[] for _ in range(num_rows)]
    self.table = np.repeat(np.arange(num_rows, dtype=np.int32)[:, None], self.per_row, axis=1)

  @property
  def num_free(self) -> int:
    return len(self.free)

  def needed(self, slot: int, num_slots: int) -> int:
    """More pages row `slot` needs to cover its first `num_slots` cache slots."""
    return max(0, min(self.per_row, -(-num_slots // self.page_size)) - len(self.rows[slot]))

  def grow(self, slot: int, num_slots: int) -> bool:
    """Row `slot` covers its first `num_slots` slots; False (nothing taken) when the
    pool has too few pages left."""
    more = self.needed(slot, num_slots)
    if more > len(self.free):
      return False
    for _ in range(more):
      self.table[slot, len(self.rows[slot])] = page = self.free.pop()
      self.rows[slot].append(page)
    return True

  def release(self, slot: int) -> None:
    self.free.extend(reversed(self.rows[slot]))
    self.rows[slot] = []
    self.table[slot] = slot
