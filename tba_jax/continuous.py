"""Continuous batching: a fixed pool of row slots, refilled from a queue of prompts.

The static sampler decodes a batch until its longest row ends; finished rows
keep running, masked. Here a pool of N slots decodes in compiled chunks of
steps; between chunks the host hands out the rows that ended (EOS or their
length limit) and refills their slots with the next queued (prompt, row id),
so the pool stays full until the queue runs dry. Three compiled programs, none
recompiled as rows come and go (decode compiles once per (slot count, cache
size, window); prefill once per (prefill batch bucket, prompt bucket); insert
once per prefilled batch shape):
  prefill  the distinct prompts of a refill, left-padded to a prompt bucket,
           through the model once: their KV and last-position logits. The S
           samples of a prompt share it (kept until its last sample is placed).
  insert   copy a prefilled prompt's KV into each refilled slot, left-aligned
           (the prompt at slots [0, p), the completion from p on), and sample
           the row's first token from the prompt's logits with the row's key.
  decode   up to `max_steps` steps of every slot, each row writing its own
           next cache slot; it ends early once `min_free` slots are free (so
           the host can refill them), every row is done, or a row reaches the
           end of the attention window.
The window is the smallest multiple of `window_step` covering every live
row's filled slots: a decode step attends over that many slots, not the whole
cache (one compile per window). The attention's cost follows the longest live
row, not the cache size.

A row's tokens depend only on (key, its row id, its step): its random stream is
fold_in(fold_in(key, row id), step) as in the static sampler, and nothing else
of its slot or its neighbours enters its arithmetic beyond float32 round-off
(the window length changes the length of the attention sums).

Axis legend: N slots, M max_new_tokens, S cache slots per row, U distinct
prompts of one prefill, T prompt bucket, V vocab.
"""
from __future__ import annotations

import collections
import dataclasses
import functools
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from tba_jax import batch as batch_lib
from tba_jax import model as model_lib
from tba_jax import paged_kv
from tba_jax import sampler as sampler_lib
from tba_jax import sharding
from tba_jax.model import KVCache

# At most this many decode steps between host refills, and attention windows in
# multiples of this many cache slots.
DEFAULT_CHUNK_STEPS = 32
DEFAULT_WINDOW_STEP = 64


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class SlotState:
  """The pool on device. A free slot is `done` with length 0."""
  tokens: jax.Array  # [N,M] int32, pad_id beyond a row's length
  logprobs: jax.Array  # [N,M] float32 (see sampler.Rollouts)
  tempered_logprobs: jax.Array  # [N,M] float32
  lengths: jax.Array  # [N] int32: tokens sampled so far = the row's step = its next column
  done: jax.Array  # [N] bool: ended (EOS or M tokens) or free
  last_token: jax.Array  # [N] int32: the next input
  position: jax.Array  # [N] int32: its position id
  row_keys: jax.Array  # [N] typed PRNG keys: fold_in(key, row id)
  temperature: jax.Array  # [N] float32: each row's sampling temperature
  cache: Any  # KVCache with a per-row index [N]: the slot the next input goes to


@dataclasses.dataclass(frozen=True)
class Completion:
  """One finished row (host numpy arrays of its `length` tokens)."""
  row_id: int
  tokens: np.ndarray  # [n] int32, EOS included when it ended on one
  logprobs: np.ndarray  # [n] float32
  tempered_logprobs: np.ndarray  # [n] float32
  first_version: Any  # the params version its prompt was prefilled under
  last_version: Any  # the version of the last decode chunk it took part in


# ---------------------------------------------------------------------------
# Compiled programs.
# ---------------------------------------------------------------------------
def _page_sharding(model_config, mesh) -> jax.sharding.NamedSharding:
  """Pages [L,K,P,page,H]: kv heads as the cache's (over tensor), the pool whole on every
  device of the data axis (a row's pages can be anywhere in it)."""
  kv = sharding.cache_sharding(model_config, mesh)
  return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(None, *kv.spec[2:3]))


def _place_cache(cache: KVCache, model_config, mesh) -> KVCache:
  rows = lambda x: jax.lax.with_sharding_constraint(
      x, sharding.batch_sharding("searcher", mesh, x.ndim))
  kv = sharding.cache_sharding(model_config, mesh)
  if cache.page_table is not None:
    kv = _page_sharding(model_config, mesh)
    cache = dataclasses.replace(cache, page_table=rows(cache.page_table))
  return dataclasses.replace(
      cache, k=jax.lax.with_sharding_constraint(cache.k, kv),
      v=jax.lax.with_sharding_constraint(cache.v, kv), mask=rows(cache.mask),
      index=cache.index if jnp.ndim(cache.index) == 0 else rows(cache.index))


@functools.partial(jax.jit, static_argnames=("model_config", "options", "mesh", "num_slots",
                                             "cache_size", "num_pages", "page_size"))
def _empty_pool(key, *, model_config, options, mesh, num_slots, cache_size, num_pages=0,
                page_size=0):
  n, m = num_slots, options.max_new_tokens
  if num_pages:  # the slots take pages from one pool (paged_kv.py)
    cache = paged_kv.PagedKVCache.init(model_config, n, cache_size, num_pages, page_size)
  else:
    cache = KVCache.init(model_config, n, cache_size)
    cache = dataclasses.replace(cache, index=jnp.zeros((n,), jnp.int32))
  return SlotState(
      tokens=jnp.full((n, m), options.pad_id, jnp.int32),
      logprobs=jnp.zeros((n, m), jnp.float32), tempered_logprobs=jnp.zeros((n, m), jnp.float32),
      lengths=jnp.zeros((n,), jnp.int32), done=jnp.ones((n,), bool),
      last_token=jnp.zeros((n,), jnp.int32), position=jnp.zeros((n,), jnp.int32),
      row_keys=jax.random.split(key, n),  # placeholders: a row's key is set when it is placed
      temperature=jnp.ones((n,), jnp.float32),
      cache=_place_cache(cache, model_config, mesh))


def prefill_prompts(logits_fn, params, prompt_tokens, prompt_mask, cache):
  """(logits [U,V] of the last token, the cache filled) of left-padded prompts [U,T]."""
  positions = model_lib.positions_from_mask(prompt_mask)
  return logits_fn(params, prompt_tokens, positions, prompt_mask, cache)


def insert_rows(state: SlotState, prefilled: KVCache, logits, key, count, slots, sources,
                row_ids, prompt_lens, temperatures, options) -> SlotState:
  """Rows i < count: slot slots[i] starts row row_ids[i] at temperatures[i] from
  prefilled prompt sources[i] (KV [L,U,K,T,H], logits [U,V]) of prompt_lens[i]
  tokens. The vectors are padded to N, so one program serves any number of rows."""
  t, m = prefilled.k.shape[3], options.max_new_tokens
  eos = jnp.asarray(options.eos_ids, jnp.int32)

  def place(i, st: SlotState) -> SlotState:
    slot, src, p = slots[i], sources[i], prompt_lens[i]
    # Left-aligned in the slot: roll the left padding of the prompt bucket to
    # the end, where it stays masked and is overwritten by the completion.
    take = lambda x: jnp.roll(jax.lax.dynamic_index_in_dim(x, src, 1, keepdims=False), p - t, 2)
    cache = st.cache.put_row(slot, take(prefilled.k), take(prefilled.v), p)  # [L,K,T,H] each
    row_key = jax.random.fold_in(key, row_ids[i])
    row_logits = sampler_lib.mask_eos(jax.lax.dynamic_index_in_dim(logits, src), 0, options)
    token, logprob, tempered = sampler_lib.choose_tokens(
        row_logits, jax.random.fold_in(row_key, 0)[None], options, temperatures[i])
    first = lambda x, fill: jnp.full((m,), fill, x.dtype).at[0].set(x[0])
    return dataclasses.replace(
        st, tokens=st.tokens.at[slot].set(first(token, options.pad_id)),
        logprobs=st.logprobs.at[slot].set(first(logprob, 0)),
        tempered_logprobs=st.tempered_logprobs.at[slot].set(first(tempered, 0)),
        lengths=st.lengths.at[slot].set(1),
        done=st.done.at[slot].set(jnp.isin(token[0], eos) | (m == 1)),
        last_token=st.last_token.at[slot].set(token[0]), position=st.position.at[slot].set(p),
        row_keys=st.row_keys.at[slot].set(row_key),
        temperature=st.temperature.at[slot].set(temperatures[i]), cache=cache)

  return jax.lax.fori_loop(0, count, place, state)


def decode_chunk(logits_fn, params, state: SlotState, max_steps, min_free, window: int,
                 options: sampler_lib.SamplingOptions):
  """Decode every live slot for up to `max_steps` steps (see the module doc);
  returns (state, steps taken)."""
  m = options.max_new_tokens
  eos = jnp.asarray(options.eos_ids, jnp.int32)

  def cond(carry):
    s, i = carry
    live = ~s.done
    # Every live row's next cache slot must lie inside the window.
    return ((i < max_steps) & jnp.any(live) & (jnp.sum(s.done) < min_free)
            & jnp.all(~live | (s.cache.index < window)))

  def body(carry):
    s, i = carry
    live = ~s.done
    # Ended and free slots still run (static shapes), masked, their index held.
    logits, cache = logits_fn(params, s.last_token[:, None], s.position[:, None],
                              live[:, None].astype(jnp.int32), s.cache)
    cache = dataclasses.replace(cache, index=jnp.where(live, cache.index, s.cache.index))
    keys = jax.vmap(jax.random.fold_in)(s.row_keys, s.lengths)
    logits = sampler_lib.mask_eos(logits, s.lengths, options)
    token, logprob, tempered = sampler_lib.choose_tokens(logits, keys, options, s.temperature)
    at = (jnp.arange(m)[None] == s.lengths[:, None]) & live[:, None]  # [N,M]: the row's column
    put = lambda buf, x: jnp.where(at, x[:, None], buf)
    lengths = s.lengths + live.astype(jnp.int32)
    ended = jnp.isin(token, eos) | (lengths >= m)
    return dataclasses.replace(
        s, tokens=put(s.tokens, token), logprobs=put(s.logprobs, logprob),
        tempered_logprobs=put(s.tempered_logprobs, tempered), lengths=lengths,
        done=s.done | (live & ended), last_token=jnp.where(live, token, s.last_token),
        position=s.position + live.astype(jnp.int32), cache=cache), i + 1

  state = dataclasses.replace(state, cache=dataclasses.replace(state.cache, window=window))
  state, steps = jax.lax.while_loop(cond, body, (state, jnp.zeros((), jnp.int32)))
  return dataclasses.replace(state, cache=dataclasses.replace(state.cache, window=None)), steps


@functools.partial(jax.jit, static_argnames=("model_config", "mesh"))
def _prefill_program(params, prompt_tokens, prompt_mask, *, model_config, mesh):
  u, t = prompt_tokens.shape
  cache = _place_cache(KVCache.init(model_config, u, t), model_config, mesh)
  return prefill_prompts(sampler_lib.model_logits_fn(model_config), params, prompt_tokens,
                         prompt_mask, cache)


# The pool (its cache the largest buffer) is donated: slots are rewritten in place.
@functools.partial(jax.jit, static_argnames=("options",), donate_argnames=("state",))
def _insert_program(state, prefilled, logits, key, count, slots, sources, row_ids, prompt_lens,
                    temperatures, *, options):
  return insert_rows(state, prefilled, logits, key, count, slots, sources, row_ids, prompt_lens,
                     temperatures, options)


@functools.partial(jax.jit, static_argnames=("model_config", "options", "window"),
                   donate_argnames=("state",))
def _decode_program(params, state, max_steps, min_free, *, model_config, options, window):
  return decode_chunk(sampler_lib.model_logits_fn(model_config), params, state, max_steps,
                      min_free, window, options)


@functools.partial(jax.jit, donate_argnames=("state",))
def _paging_program(state, page_table, dropped):
  """The host's page table on device, and the `dropped` [N] slots freed (paged_kv.py:
  rows preempted when the pool runs out of pages)."""
  cache = dataclasses.replace(state.cache, page_table=page_table)
  return dataclasses.replace(state, cache=cache, done=state.done | dropped,
                             lengths=jnp.where(dropped, 0, state.lengths))


# ---------------------------------------------------------------------------
# The host side: queue, prefilled prompts, slots.
# ---------------------------------------------------------------------------
def check_pool(sampler: sampler_lib.Sampler, num_slots: int, chunk_steps: int,
               window_step: int) -> None:
  """Raises ValueError unless a pool of `num_slots` rows splits over the sampler's mesh
  and the chunk and window sizes are positive."""
  data = sharding.batch_size_multiple("searcher", sampler.mesh)
  if num_slots < 1 or num_slots % data:
    raise ValueError(f"num_slots={num_slots} must be a positive multiple of the mesh's "
                     f"data axis ({data})")
  if chunk_steps < 1 or window_step < 1:
    raise ValueError(f"chunk_steps={chunk_steps} and window_step={window_step} must be >= 1")


@dataclasses.dataclass
class StreamStats:
  decode_steps: int = 0  # pool steps (each runs all N slots)
  chunks: int = 0
  refills: int = 0
  prefilled_prompts: int = 0  # distinct prompts run through the model
  rows_started: int = 0
  rows_finished: int = 0
  tokens: int = 0  # tokens of finished rows
  preempted: int = 0  # rows that gave their pages back and queued again (paged pools)


class Stream:
  """Completions from a pool of `num_slots` rows, fed from a queue of prompts.

  A searcher keeps it busy: `add` queues (prompt, row id) pairs at any time,
  `step` refills free slots from the queue, runs one decode chunk under the
  current params and returns the rows that ended in it, and `set_params` swaps
  the weights between chunks (rows in flight continue under the new ones; each
  completion carries the first and last version it was decoded under). Rows
  are taken grouped by prompt, so the samples of one prompt share one prefill;
  their outputs depend on (key, row id) only, never on the order they ran in.
  Call from one thread.
  """

  def __init__(self, sampler: sampler_lib.Sampler, params, rng_key, *, num_slots: int,
               max_prompt_len: int, chunk_steps: int = DEFAULT_CHUNK_STEPS,
               window_step: int = DEFAULT_WINDOW_STEP, version: Any = None,
               kv_pages: int | paged_kv.AutoPages | None = 0,
               page_size: int = paged_kv.DEFAULT_PAGE_SIZE):
    check_pool(sampler, num_slots, chunk_steps, window_step)
    if kv_pages != 0 and (page_size < 1 or window_step % page_size):
      raise ValueError(f"window_step={window_step} must be a multiple of page_size={page_size}")
    self.sampler, self.options, self.mesh = sampler, sampler.options, sampler.mesh
    self.num_slots, self.chunk_steps, self.window_step = num_slots, chunk_steps, window_step
    self.max_prompt_bucket = batch_lib.bucket(max_prompt_len, sampler.prompt_buckets,
                                              "prompt length")
    # Every sampled token but the last (never fed back) takes a slot; one more
    # because an ended row keeps running, masked, writing at its next slot
    # (decode writes are scatters promised to stay in bounds).
    self.cache_size = self.max_prompt_bucket + self.options.max_new_tokens
    # kv_pages > 0: the slots take pages of `page_size` cache slots from a pool of
    # kv_pages (paged_kv.py), each row whole pages; AutoPages (None: the default one): as
    # many as fit (auto_num_pages).
    self.pages = None
    if kv_pages is None:
      kv_pages = paged_kv.AutoPages()
    if isinstance(kv_pages, paged_kv.AutoPages):  # none reported (as on CPU): 0
      cfg = sampler.model_config
      row = -(-self.cache_size // page_size) * page_size
      # The kv heads of a page split over the tensor axis (or not: the shard's head count).
      heads = _page_sharding(cfg, self.mesh).shard_shape((1, cfg.num_kv_heads, 1, 1, 1))[1]
      kv_pages = paged_kv.auto_num_pages(
          cfg, list(self.mesh.devices.flat), num_slots, row, page_size,
          kv_shards=cfg.num_kv_heads // heads, memory_fraction=kv_pages.memory_fraction)
    if kv_pages:
      self.cache_size = -(-self.cache_size // page_size) * page_size
      self.pages = paged_kv.PageAllocator(num_slots, self.cache_size, kv_pages, page_size)
    if not jax.dtypes.issubdtype(jnp.asarray(rng_key).dtype, jax.dtypes.prng_key):
      rng_key = jax.random.wrap_key_data(rng_key)
    self.key = jax.device_put(rng_key, sharding.replicated(self.mesh))
    # prompt -> (logits, prefilled KV batch, its row), while samples of it wait.
    self.prefilled: dict[tuple, tuple] = {}
    self.set_params(params, version)
    self.state = _empty_pool(self.key, model_config=sampler.model_config, options=self.options,
                             mesh=self.mesh, num_slots=num_slots, cache_size=self.cache_size,
                             num_pages=kv_pages, page_size=page_size if kv_pages else 0)
    # prompt -> row ids waiting, in arrival order of the prompts (a prompt's
    # samples run together, so its prefill is shared).
    self.queue: collections.OrderedDict[tuple, collections.deque] = collections.OrderedDict()
    self.slots: list[_Slot | None] = [None] * num_slots  # None: free
    self._placed = 0  # rows placed so far (their order)
    self.stats = StreamStats()

  # -- feeding ---------------------------------------------------------------
  def add(self, prompts: Sequence[Sequence[int]], row_ids: Sequence[int],
          temperature: float | None = None) -> None:
    """Queue rows: row_ids[i] samples a completion of prompts[i] (ids seed the
    rows' random streams, so each should be used once per key) at `temperature`
    (None: the sampler's; any value runs in the same compiled programs)."""
    temperature = self.options.temperature if temperature is None else float(temperature)
    if not self.options.greedy and not temperature > 0:
      raise ValueError(f"temperature={temperature} must be > 0")
    if len(prompts) != len(row_ids):
      raise ValueError(f"{len(prompts)} prompts but {len(row_ids)} row ids")
    for p, r in zip(prompts, row_ids):
      p = tuple(int(x) for x in p)
      if not p:
        raise ValueError("every prompt needs at least one token")
      if len(p) > self.max_prompt_bucket:
        raise ValueError(f"prompt of {len(p)} tokens exceeds this stream's max_prompt_len "
                         f"(bucket {self.max_prompt_bucket})")
      self.queue.setdefault(p, collections.deque()).append((int(r), temperature))

  def set_params(self, params, version: Any = None) -> None:
    """Decode the next chunks under `params`. Prefilled prompts of the old
    weights are dropped, so a row's first version is that of its prompt's KV."""
    self.params = jax.device_put(params, self.sampler.param_shardings)
    self.version = version
    self.prefilled.clear()

  @property
  def num_queued(self) -> int:
    return sum(len(q) for q in self.queue.values())

  @property
  def num_in_flight(self) -> int:
    return sum(s is not None for s in self.slots)

  def busy(self) -> bool:
    return bool(self.queue) or self.num_in_flight > 0

  # -- one round ---------------------------------------------------------------
  def step(self) -> list[Completion]:
    """Refill free slots, run one decode chunk, return the rows that ended. With pages the
    live rows first take the pages of their next chunk and new rows only what is left:
    admitting first would hand a new row the pages a live row needs next, then take them
    back (a preemption, its prefill and insert wasted)."""
    if self.pages is not None:
      self._page()
    self._refill()
    live = [s for s in self.slots if s is not None]
    if not live:
      return []
    # Row j's next input goes to cache slot prompt_len + length - 1.
    reach = max(s.prompt_len + s.length for s in live)
    window = min(self.cache_size, -(-reach // self.window_step) * self.window_step)
    # Stop to refill as soon as a slot frees up, unless nothing is waiting (with pages,
    # slots can stay free while rows wait for pages).
    min_free = self.num_slots - len(live) + 1 if self.queue else self.num_slots + 1
    self.state, steps = _decode_program(
        self.params, self.state, self.chunk_steps, min_free,
        model_config=self.sampler.model_config, options=self.options, window=window)
    # The host sync of a chunk: which rows ended, and their outputs.
    done, lengths, steps = jax.device_get((self.state.done, self.state.lengths, steps))
    self.stats.decode_steps += int(steps)
    self.stats.chunks += 1
    for j, s in enumerate(self.slots):
      if s is not None:
        s.length = int(lengths[j])
    ended = [j for j, s in enumerate(self.slots) if s is not None and done[j]]
    if not ended:
      return []
    tokens, logprobs, tempered = jax.device_get(
        (self.state.tokens, self.state.logprobs, self.state.tempered_logprobs))
    out = []
    for j in ended:
      s, n = self.slots[j], self.slots[j].length
      out.append(Completion(row_id=s.row_id, tokens=tokens[j, :n], logprobs=logprobs[j, :n],
                            tempered_logprobs=tempered[j, :n], first_version=s.first_version,
                            last_version=self.version))
      self.slots[j] = None
      if self.pages is not None:
        self.pages.release(j)
      self.stats.rows_finished += 1
      self.stats.tokens += n
    return out

  def _refill(self) -> None:
    free = [j for j, s in enumerate(self.slots) if s is None]
    rows = []  # (slot, prompt, (row id, temperature))
    while len(rows) < len(free) and self.queue:
      prompt, ids = next(iter(self.queue.items()))
      # With pages, a row starts once its prompt and one chunk fit in the free pages.
      if self.pages is not None and not self.pages.grow(
          free[len(rows)], min(self.cache_size, len(prompt) + self.chunk_steps)):
        break
      rows.append((free[len(rows)], prompt, ids.popleft()))
      if not ids:
        del self.queue[prompt]
    if not rows:
      return
    new = list(dict.fromkeys(p for _, p, _ in rows if p not in self.prefilled))
    if new:
      self._prefill(new)
    # One insert per prefilled batch the rows draw from (the current one, and
    # an earlier one whose prompt still had samples waiting).
    by_batch: dict[int, tuple] = {}
    for slot, prompt, (row_id, temperature) in rows:
      logits, batch, u = self.prefilled[prompt]
      by_batch.setdefault(id(batch), (batch, logits, []))[2].append(
          (slot, u, row_id, len(prompt), temperature))
      self._placed += 1
      self.slots[slot] = _Slot(row_id, len(prompt), self.version, prompt, temperature,
                               self._placed)
    n = self.num_slots
    if self.pages is not None:  # the new rows' pages, before their prompts are written
      self.state = _paging_program(self.state, jnp.asarray(self.pages.table), np.zeros(n, bool))
    for batch, logits, placed in by_batch.values():
      vec = lambda k, dtype=np.int32: np.array([x[k] for x in placed] + [1] * (n - len(placed)),
                                               dtype)
      self.state = _insert_program(self.state, batch, logits, self.key, len(placed), vec(0),
                                   vec(1), vec(2), vec(3), vec(4, np.float32),
                                   options=self.options)
    for prompt in {p for _, p, _ in rows} - set(self.queue):  # every sample placed
      del self.prefilled[prompt]
    self.stats.refills += 1
    self.stats.rows_started += len(rows)

  def _page(self) -> None:
    """Every live row's pages cover the slots its next chunk can write; where the pool
    runs short the newest rows give theirs back and return to the queue's front (their
    tokens depend on (key, row id) only: they sample again the same)."""
    live = sorted((j for j, s in enumerate(self.slots) if s is not None),
                  key=lambda j: self.slots[j].order)
    dropped = np.zeros((self.num_slots,), bool)
    for j in live:
      s = self.slots[j]
      if s is None:  # dropped below, for an older row
        continue
      need = min(self.cache_size, s.prompt_len + s.length - 1 + self.chunk_steps)
      while self.slots[j] is not None and not self.pages.grow(j, need):
        newest = max((k for k in live if self.slots[k] is not None),
                     key=lambda k: self.slots[k].order)
        self._requeue(newest)
        dropped[newest] = True
    self.state = _paging_program(self.state, jnp.asarray(self.pages.table), jnp.asarray(dropped))

  def _requeue(self, j: int) -> None:
    s = self.slots[j]
    self.queue[s.prompt] = self.queue.pop(s.prompt, collections.deque())
    self.queue[s.prompt].appendleft((s.row_id, s.temperature))
    self.queue.move_to_end(s.prompt, last=False)
    self.slots[j] = None
    self.pages.release(j)
    self.stats.rows_started -= 1
    self.stats.preempted += 1

  def _prefill(self, prompts: list[tuple]) -> None:
    """The distinct `prompts` through the model in one batch, left-padded."""
    u = batch_lib.bucket(len(prompts), self.sampler.batch_buckets, "prefill batch")
    t = batch_lib.bucket(max(map(len, prompts)), self.sampler.prompt_buckets, "prompt length")
    tokens, mask = batch_lib.left_pad(prompts, t, self.options.pad_id, num_rows=u)
    rows = lambda x: jax.device_put(x, sharding.batch_sharding("searcher", self.mesh, x.ndim))
    logits, batch = _prefill_program(self.params, rows(tokens), rows(mask),
                                     model_config=self.sampler.model_config, mesh=self.mesh)
    for i, p in enumerate(prompts):
      self.prefilled[p] = (logits, batch, i)
    self.stats.prefilled_prompts += len(prompts)


@dataclasses.dataclass
class _Slot:
  """The host's record of an occupied slot."""
  row_id: int
  prompt_len: int
  first_version: Any
  prompt: tuple = ()  # (paged pools: to queue the row again when it gives its pages back)
  temperature: float = 1.0
  order: int = 0  # placement order (paged pools preempt the newest)
  length: int = 1  # tokens sampled (host copy, refreshed after each chunk)


def generate(sampler: sampler_lib.Sampler, params, prompts: Sequence[Sequence[int]],
             rng_key, temperature: float | None = None, *, num_slots: int,
             chunk_steps: int = DEFAULT_CHUNK_STEPS, window_step: int = DEFAULT_WINDOW_STEP,
             kv_pages: int = 0, page_size: int = paged_kv.DEFAULT_PAGE_SIZE
             ) -> sampler_lib.Rollouts:
  """`sampler(params, prompts, rng_key, temperature)` through a pool of `num_slots` rows:
  the same Rollouts (row i is prompts[i], seeded by its index i)."""
  if not prompts:
    raise ValueError("no prompts")
  n, m = len(prompts), sampler.options.max_new_tokens
  stream = Stream(sampler, params, rng_key, num_slots=num_slots,
                  max_prompt_len=max(map(len, prompts)), chunk_steps=chunk_steps,
                  window_step=window_step, kv_pages=kv_pages, page_size=page_size)
  stream.add(prompts, range(n), temperature)
  tokens = np.full((n, m), sampler.options.pad_id, np.int32)
  logprobs, tempered = np.zeros((n, m), np.float32), np.zeros((n, m), np.float32)
  lengths = np.zeros((n,), np.int32)
  while stream.busy():
    for c in stream.step():
      k = len(c.tokens)
      tokens[c.row_id, :k], logprobs[c.row_id, :k], tempered[c.row_id, :k] = (
          c.tokens, c.logprobs, c.tempered_logprobs)
      lengths[c.row_id] = k
  return sampler_lib.Rollouts(tokens=tokens, logprobs=logprobs, tempered_logprobs=tempered,
                              lengths=lengths, num_decode_steps=int(lengths.max()))
