"""The continuous-batching pool on device: its state and its compiled programs.

A pool of N row slots (continuous.Stream, the host side, hands rows in and takes them out).
A slot holds its row left-aligned in its KV cache row: the prompt at cache slots [0, p), the
row's column j at slot p + j, so its real slots are [0, p + columns fed) and a token's
position id is its cache slot (the paged kernels read a row's length from slot 0:
paged_kv.py). Five programs, none recompiled as rows come and go (decode compiles once per
(slot count, cache size, window); prefill once per (prefill batch bucket, prompt bucket);
insert once per prefilled batch shape; append once per reply bucket):
  prefill  the distinct prompts of a refill, left-padded to a prompt bucket, through the
           model once: their KV and last-position logits. The S samples of a prompt share it.
  insert   copy a prefilled prompt's KV into each refilled slot, left-aligned (the prompt's
           bucket padding rolled to the end, masked, overwritten by the row), and draw the
           row's first token from the prompt's logits.
  decode   up to `max_steps` steps of every slot, each row writing its own next cache slot;
           it ends early once `min_free` slots are done (so that the host can refill them or
           hand a turn to its environment), every row is done, or a row reaches the end of the
           attention window (a decode step attends over the first `window` slots only).
  append   a multi-turn row's reply (an environment's answer, tokenized) into its cache: a
           forward of the row's last kept token and the reply alone from the row's next
           slot (nothing before it is recomputed), written into the row's columns, where the
           host's model mask is 0, and the next turn's first token drawn.
  paging   the host's page table on device (paged_kv.py), and the slots it preempted freed.

A row's turn ends at EOS, at its turn's token limit (a row without turns has one turn of
max_new_tokens) or at a stop sequence (TurnRules.stops, checked on device); the row is then
`done` until the host appends a reply or frees its slot.

Randomness: the token of a row's column j is drawn with fold_in(fold_in(key, row id), j), as
the static sampler draws it, so a row's tokens depend only on (key, its row id) and its
replies; nothing of its slot or its neighbours enters its arithmetic beyond float32 round-off
(the window length changes the length of the attention sums).

Axis legend: N slots, M max_new_tokens (a row's columns, replies included), S cache slots
per row, U distinct prompts of one prefill, T prompt bucket, R reply bucket, V vocab.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp

from tba_jax import model as model_lib
from tba_jax import paged_kv
from tba_jax import sampler as sampler_lib
from tba_jax import sharding
from tba_jax.kv_cache import KVCache


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class SlotState:
  """The pool on device. A free slot is `done` with length 0. A row's next input is
  last_token at cache slot cache.index, which is also its position id (left-aligned rows)."""
  tokens: jax.Array  # [N,M] int32: model and reply tokens, pad_id beyond a row's length
  logprobs: jax.Array  # [N,M] float32 (see sampler.Rollouts), 0 on reply tokens
  tempered_logprobs: jax.Array  # [N,M] float32, 0 on reply tokens
  lengths: jax.Array  # [N] int32: columns filled = the row's step = its next column
  done: jax.Array  # [N] bool: its turn ended (EOS, a limit, a stop) or the slot is free
  last_token: jax.Array  # [N] int32: the next input
  row_keys: jax.Array  # [N] typed PRNG keys: fold_in(key, row id)
  temperature: jax.Array  # [N] float32: each row's sampling temperature
  turn_start: jax.Array  # [N] int32: the current model turn's first column
  limit: jax.Array  # [N] int32: the column the current turn must end before
  cache: Any  # KVCache (or paged_kv.PagedKVCache) with a per-row index [N]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Placement:
  """The rows i < count of an insert, each vector padded to N (one program serves any
  number of rows)."""
  count: jax.Array  # int32 scalar
  slots: jax.Array  # [N] int32: the slot row i starts in
  sources: jax.Array  # [N] int32: its prompt in the prefilled batch
  row_ids: jax.Array  # [N] int32: its row id (its random stream)
  prompt_lens: jax.Array  # [N] int32
  temperatures: jax.Array  # [N] float32


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Appends:
  """One reply per slot, for the slots with `take`."""
  take: jax.Array  # [N] bool
  cut: jax.Array  # [N] int32: the columns the row keeps (its turn cut at a stop string)
  tokens: jax.Array  # [N,R] int32: the reply, pad_id after it
  lengths: jax.Array  # [N] int32


@dataclasses.dataclass(frozen=True)
class TurnRules:
  """When a turn ends besides EOS (hashable: static in the programs)."""
  max_turn_tokens: int  # a model turn's tokens at most (max_new_tokens: rows without turns)
  stops: tuple[tuple[int, ...], ...] = ()  # stop sequences, as token ids


# ---------------------------------------------------------------------------
# The pool's cache: placement and allocation.
# ---------------------------------------------------------------------------
def page_sharding(model_config, mesh) -> jax.sharding.NamedSharding:
  """Pages [L,K,P,page,H]: kv heads as the cache's (over tensor), the pool whole on every
  device of the data axis (a row's pages can be anywhere in it)."""
  kv = sharding.cache_sharding(model_config, mesh)
  return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(None, *kv.spec[2:3]))


def _place_cache(cache: KVCache, model_config, mesh) -> KVCache:
  rows = lambda x: jax.lax.with_sharding_constraint(
      x, sharding.batch_sharding("searcher", mesh, x.ndim))
  kv = sharding.cache_sharding(model_config, mesh)
  if cache.page_table is not None:
    kv = page_sharding(model_config, mesh)
    cache = dataclasses.replace(cache, page_table=rows(cache.page_table))
  return dataclasses.replace(
      cache, k=jax.lax.with_sharding_constraint(cache.k, kv),
      v=jax.lax.with_sharding_constraint(cache.v, kv), mask=rows(cache.mask),
      index=cache.index if jnp.ndim(cache.index) == 0 else rows(cache.index))


@functools.partial(jax.jit, static_argnames=("model_config", "options", "mesh", "num_slots",
                                             "cache_size", "num_pages", "page_size"))
def empty_pool(key, *, model_config, options, mesh, num_slots, cache_size, num_pages=0,
               page_size=0) -> SlotState:
  n, m = num_slots, options.max_new_tokens
  if num_pages:  # the slots take pages from one pool (paged_kv.py)
    cache = paged_kv.PagedKVCache.init(model_config, n, cache_size, num_pages, page_size)
  else:
    cache = KVCache.init(model_config, n, cache_size)
    cache = dataclasses.replace(cache, index=jnp.zeros((n,), jnp.int32))
  zeros = jnp.zeros((n,), jnp.int32)
  return SlotState(
      tokens=jnp.full((n, m), options.pad_id, jnp.int32),
      logprobs=jnp.zeros((n, m), jnp.float32), tempered_logprobs=jnp.zeros((n, m), jnp.float32),
      lengths=zeros, done=jnp.ones((n,), bool), last_token=zeros,
      row_keys=jax.random.split(key, n),  # placeholders: a row's key is set when it is placed
      temperature=jnp.ones((n,), jnp.float32), turn_start=zeros, limit=zeros,
      cache=_place_cache(cache, model_config, mesh))


# ---------------------------------------------------------------------------
# The programs' bodies.
# ---------------------------------------------------------------------------
def prefill_prompts(logits_fn, params, prompt_tokens, prompt_mask, cache):
  """(logits [U,V] of the last token, the cache filled) of left-padded prompts [U,T]."""
  positions = model_lib.positions_from_mask(prompt_mask)
  return logits_fn(params, prompt_tokens, positions, prompt_mask, cache)


def _stopped(tokens, lengths, turn_start, stops):
  """[N] bool: the row's last tokens are one of `stops` (static token tuples), inside its
  current turn."""
  hit = jnp.zeros(lengths.shape, bool)
  for seq in stops:
    k = len(seq)
    cols = lengths[:, None] - k + jnp.arange(k)[None]
    got = jnp.take_along_axis(tokens, jnp.clip(cols, 0, tokens.shape[1] - 1), axis=1)
    hit |= jnp.all(got == jnp.asarray(seq, jnp.int32)[None], axis=1) & (cols[:, 0] >= turn_start)
  return hit


def _record(st: SlotState, logits, rows, options, stops) -> SlotState:
  """Draws column st.lengths of the rows `rows` [N] from their logits [N,V] and writes it;
  a row whose turn ends with it is done. Every token of the pool is drawn here."""
  m = options.max_new_tokens
  keys = jax.vmap(jax.random.fold_in)(st.row_keys, st.lengths)
  logits = sampler_lib.mask_eos(logits, st.lengths, options)
  token, logprob, tempered = sampler_lib.choose_tokens(logits, keys, options, st.temperature)
  at = (jnp.arange(m)[None] == st.lengths[:, None]) & rows[:, None]  # [N,M]: the row's column
  put = lambda buf, x: jnp.where(at, x[:, None], buf)
  tokens, lengths = put(st.tokens, token), st.lengths + rows.astype(jnp.int32)
  ended = (jnp.isin(token, jnp.asarray(options.eos_ids, jnp.int32)) | (lengths >= st.limit)
           | _stopped(tokens, lengths, st.turn_start, stops))
  return dataclasses.replace(
      st, tokens=tokens, logprobs=put(st.logprobs, logprob),
      tempered_logprobs=put(st.tempered_logprobs, tempered), lengths=lengths,
      done=jnp.where(rows, ended, st.done), last_token=jnp.where(rows, token, st.last_token))


def insert_rows(state: SlotState, prefilled: KVCache, logits, key, rows: Placement, options,
                rules: TurnRules) -> SlotState:
  """Rows i < rows.count start: slot rows.slots[i] takes row rows.row_ids[i] of prefilled
  prompt rows.sources[i] (KV [L,U,K,T,H], logits [U,V]; rows.prompt_lens[i] tokens) at
  rows.temperatures[i], and draws its first token."""
  t, n = prefilled.k.shape[3], state.tokens.shape[0]

  def place(i, cache):
    src, p = rows.sources[i], rows.prompt_lens[i]
    # Left-aligned in the slot: roll the left padding of the prompt bucket to the end,
    # where it stays masked and is overwritten by the row's tokens.
    take = lambda x: jnp.roll(jax.lax.dynamic_index_in_dim(x, src, 1, keepdims=False), p - t, 2)
    return cache.put_row(rows.slots[i], take(prefilled.k), take(prefilled.v), p)  # [L,K,T,H]

  # Row i's values go to its slot; the padding rows' (i >= count) to slot N, dropped.
  at = jnp.where(jnp.arange(n) < rows.count, rows.slots, n)
  put = lambda buf, x: buf.at[at].set(x, mode="drop")
  new = put(jnp.zeros((n,), bool), True)
  clear = lambda buf, fill: jnp.where(new[:, None], fill, buf)
  st = dataclasses.replace(
      state, tokens=clear(state.tokens, options.pad_id), logprobs=clear(state.logprobs, 0.0),
      tempered_logprobs=clear(state.tempered_logprobs, 0.0),
      lengths=jnp.where(new, 0, state.lengths), turn_start=jnp.where(new, 0, state.turn_start),
      limit=jnp.where(new, min(rules.max_turn_tokens, options.max_new_tokens), state.limit),
      row_keys=put(state.row_keys, jax.vmap(jax.random.fold_in, in_axes=(None, 0))(
          key, rows.row_ids)),
      temperature=put(state.temperature, rows.temperatures),
      cache=jax.lax.fori_loop(0, rows.count, place, state.cache))
  source = put(jnp.zeros((n,), jnp.int32), rows.sources)  # each slot's prompt
  return _record(st, logits[source], new, options, rules.stops)


def decode_chunk(logits_fn, params, state: SlotState, max_steps, min_free, window: int,
                 options: sampler_lib.SamplingOptions, rules: TurnRules):
  """Decode every live slot for up to `max_steps` steps (see the module doc);
  returns (state, steps taken)."""

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
    logits, cache = logits_fn(params, s.last_token[:, None], s.cache.index[:, None],
                              live[:, None].astype(jnp.int32), s.cache)
    cache = dataclasses.replace(cache, index=jnp.where(live, cache.index, s.cache.index))
    return _record(dataclasses.replace(s, cache=cache), logits, live, options, rules.stops), i + 1

  state = dataclasses.replace(state, cache=dataclasses.replace(state.cache, window=window))
  state, steps = jax.lax.while_loop(cond, body, (state, jnp.zeros((), jnp.int32)))
  return dataclasses.replace(state, cache=dataclasses.replace(state.cache, window=None)), steps


def append_replies(model_config, params, state: SlotState, replies: Appends, options,
                   rules: TurnRules) -> SlotState:
  """Rows with replies.take: cut back to replies.cut columns, the reply appended (module
  doc) and the next turn's first token drawn from the logits after the reply's last token.
  The other rows run masked and keep their state."""
  m, (n, r) = options.max_new_tokens, replies.tokens.shape
  rows, cut, index = replies.take, replies.cut, state.cache.index
  k = jnp.where(rows, replies.lengths, 0)
  # Column cut - 1, the turn's last kept token, is fed again at its own slot (the columns
  # after it were fed at the slots after it; the last column never was): a row's next slot
  # is index = p + lengths - 1, so column cut - 1 sits at index - lengths + cut.
  first = jnp.where(rows, index - state.lengths + cut, index)
  last = jnp.take_along_axis(state.tokens, jnp.clip(cut - 1, 0, m - 1)[:, None], axis=1)[:, 0]
  inputs = jnp.concatenate([jnp.where(rows, last, state.last_token)[:, None], replies.tokens], 1)
  in_mask = rows[:, None] & (jnp.arange(r + 1)[None] <= k[:, None])
  # The cut tokens' slots no longer hold the row's context. The masked inputs after a
  # reply (and every input of the other rows) write past the rows' real slots, where
  # nothing is read until the rows overwrite them (with pages: the row's own pages or its
  # scratch page).
  kept = ~rows[:, None] | (jnp.arange(state.cache.mask.shape[1])[None] < first[:, None])
  cache = dataclasses.replace(state.cache, mask=state.cache.mask & kept, index=first)
  hidden, cache = model_lib.forward(model_config, params, inputs,
                                    first[:, None] + jnp.arange(r + 1)[None],
                                    in_mask.astype(jnp.int32), cache)
  logits = model_lib.unembed(model_config, params,
                             jnp.take_along_axis(hidden, k[:, None, None], axis=1)[:, 0])
  cache = dataclasses.replace(cache, index=jnp.where(rows, first + k + 1, index))
  cols = jnp.arange(m)[None]
  fill = rows[:, None] & (cols >= cut[:, None])
  reply_at = jnp.take_along_axis(replies.tokens, jnp.clip(cols - cut[:, None], 0, r - 1), axis=1)
  tokens = jnp.where(fill & (cols < (cut + k)[:, None]), reply_at,
                     jnp.where(fill, options.pad_id, state.tokens))
  zero = lambda x: jnp.where(fill, 0.0, x)
  lengths = jnp.where(rows, cut + k, state.lengths)
  st = dataclasses.replace(
      state, tokens=tokens, logprobs=zero(state.logprobs),
      tempered_logprobs=zero(state.tempered_logprobs), lengths=lengths,
      turn_start=jnp.where(rows, lengths, state.turn_start),
      limit=jnp.where(rows, jnp.minimum(lengths + rules.max_turn_tokens, m), state.limit),
      cache=cache)
  return _record(st, logits, rows, options, rules.stops)


# ---------------------------------------------------------------------------
# The compiled programs. The pool (its cache the largest buffer) is donated: slots are
# rewritten in place.
# ---------------------------------------------------------------------------
@functools.partial(jax.jit, static_argnames=("model_config", "mesh"))
def prefill_program(params, prompt_tokens, prompt_mask, *, model_config, mesh):
  u, t = prompt_tokens.shape
  cache = _place_cache(KVCache.init(model_config, u, t), model_config, mesh)
  return prefill_prompts(sampler_lib.model_logits_fn(model_config), params, prompt_tokens,
                         prompt_mask, cache)


@functools.partial(jax.jit, static_argnames=("options", "rules"), donate_argnames=("state",))
def insert_program(state, prefilled, logits, key, rows, *, options, rules):
  return insert_rows(state, prefilled, logits, key, rows, options, rules)


@functools.partial(jax.jit, static_argnames=("model_config", "options", "rules", "window"),
                   donate_argnames=("state",))
def decode_program(params, state, max_steps, min_free, *, model_config, options, rules, window):
  # The layers unstacked once a chunk, outside its loop: no step copies weight slices
  # (model.decode_layout).
  return decode_chunk(sampler_lib.model_logits_fn(model_config), model_lib.decode_layout(params),
                      state, max_steps, min_free, window, options, rules)


@functools.partial(jax.jit, static_argnames=("model_config", "options", "rules"),
                   donate_argnames=("state",))
def append_program(params, state, replies, *, model_config, options, rules):
  return append_replies(model_config, params, state, replies, options, rules)


@functools.partial(jax.jit, donate_argnames=("state",))
def paging_program(state, page_table, dropped):
  """The host's page table on device, and the `dropped` [N] slots freed (paged_kv.py:
  rows preempted when the pool runs out of pages)."""
  cache = dataclasses.replace(state.cache, page_table=page_table)
  return dataclasses.replace(state, cache=cache, done=state.done | dropped,
                             lengths=jnp.where(dropped, 0, state.lengths))
