"""Multi-turn sampling: model turns and environment replies in one KV cache per row.

  turns = TurnSampler(sampler, environment, encode, decode)
  out = turns(params, prompts, key, problems=problems)   # TurnRollouts
  rows = TurnRows(turns)        # a searcher.RowSource of static batches with turns

A batch is prefilled as the static sampler does (prompts left-padded to a bucket T; the
completion's column j sits at cache slot T + j, position p + j for a prompt of p tokens),
then decoded in chunks with a cache index per row. A row's turn ends at EOS, at a stop
sequence (the environment's stop strings as tokens, checked on device), or at its turn's
token limit; the chunk then ends so that the host can hand the turn to the environment.
Replies run in a thread pool while the other rows keep decoding (a slow tool stalls only
its own row). A reply is tokenized once, and those ids are what the model sees: they are
appended to the row's cache by a forward of the new tokens alone (the row's last sampled
token and the reply; nothing before it is recomputed) and written into the row's columns,
whose model mask is 0 there. The trajectory's tokens are therefore exactly the model's
context: nothing is decoded and re-encoded.

A stop string the device check missed (the model spelled it with other tokens) is found on
the host in the turn's text: the row is cut back to the shortest prefix of its turn whose
text holds the stop string; the cut tokens' cache slots are unmasked by the next append.

Randomness: the token of column j is drawn with fold_in(fold_in(key, row id), j), as the
continuous-batching pool draws it, so a row's tokens depend on its row id and the replies.

Axis legend: N rows (a batch bucket), M max_new_tokens (the trajectory's tokens, replies
included), T prompt bucket, S cache slots, R reply bucket, V vocab.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import threading
import time
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from tba_jax import batch as batch_lib
from tba_jax import model as model_lib
from tba_jax import sampler as sampler_lib
from tba_jax import sharding
from tba_jax.model import KVCache
from tba_jax.sampler import Sampler, SamplingOptions
from tba_jax.searcher import Feed, Group, Sample, Sampled
from tba_jax.tasks.environment import Environment, as_reply

REPLY_BUCKETS = (8, 16, 32, 64, 128, 256, 512)
DEFAULT_CHUNK_STEPS = 32


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class TurnState:
  """The rows on device. Row b's next input is last_token[b] at cache slot cache.index[b]."""
  tokens: jax.Array             # [N,M] int32: model tokens and reply tokens, pad_id after
  logprobs: jax.Array           # [N,M] float32 (sampler.Rollouts), 0 on reply tokens
  tempered_logprobs: jax.Array  # [N,M] float32, 0 on reply tokens
  lengths: jax.Array            # [N] int32: columns filled
  done: jax.Array               # [N] bool: the current turn ended (or a padding row)
  last_token: jax.Array         # [N] int32
  position: jax.Array           # [N] int32: position id of last_token
  row_keys: jax.Array           # [N] typed PRNG keys
  temperature: jax.Array        # float32 scalar
  turn_start: jax.Array         # [N] int32: the current model turn's first column
  limit: jax.Array              # [N] int32: the column the current turn must end before
  cache: Any                    # KVCache, index [N]


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


def _ended(token, lengths, limit, turn_start, tokens, options, stops):
  eos = jnp.isin(token, jnp.asarray(options.eos_ids, jnp.int32)) if options.eos_ids else False
  return eos | (lengths >= limit) | _stopped(tokens, lengths, turn_start, stops)


@functools.partial(jax.jit, static_argnames=("model_config", "options", "mesh", "extra_slots"))
def _start_program(params, prompt_tokens, prompt_mask, key, row_ids, row_valid, temperature,
                   limit, *, model_config, options, mesh, extra_slots):
  """The prompts [N,T] prefilled (the static sampler's prefill) and the first token drawn."""
  b, t = prompt_tokens.shape
  cache = KVCache.init(model_config, b, t)
  st = sampler_lib.prefill(sampler_lib.model_logits_fn(model_config), params, prompt_tokens,
                           prompt_mask, cache, key, row_ids, row_valid, options, temperature)
  # Slots for every column but the last, and for the widest append; one index per row.
  cache = st.cache.extend(options.max_new_tokens + extra_slots)
  cache = dataclasses.replace(cache, index=jnp.full((b,), t, jnp.int32))
  kv = sharding.cache_sharding(model_config, mesh)
  cache = dataclasses.replace(cache, k=jax.lax.with_sharding_constraint(cache.k, kv),
                              v=jax.lax.with_sharding_constraint(cache.v, kv))
  zeros = jnp.zeros((b,), jnp.int32)
  done = st.done | (limit <= 1)
  return TurnState(tokens=st.tokens, logprobs=st.logprobs, tempered_logprobs=st.tempered_logprobs,
                   lengths=st.lengths, done=done, last_token=st.last_token, position=st.position,
                   row_keys=st.row_keys, temperature=st.temperature, turn_start=zeros,
                   limit=limit, cache=cache)


def _draw(st: TurnState, logits, live, options):
  """The next token of every live row at its column st.lengths: (token, lp, tempered)."""
  keys = jax.vmap(jax.random.fold_in)(st.row_keys, st.lengths)
  logits = sampler_lib.mask_eos(logits, st.lengths, options)
  token, lp, tempered = sampler_lib.choose_tokens(logits, keys, options, st.temperature)
  return jnp.where(live, token, options.pad_id), lp, tempered


def _put_column(st: TurnState, live, token, lp, tempered, m):
  at = (jnp.arange(m)[None] == st.lengths[:, None]) & live[:, None]
  put = lambda buf, x: jnp.where(at, x[:, None], buf)
  return put(st.tokens, token), put(st.logprobs, lp), put(st.tempered_logprobs, tempered)


@functools.partial(jax.jit, static_argnames=("model_config", "options", "stops"),
                   donate_argnames=("state",))
def _decode_program(params, state, max_steps, *, model_config, options, stops):
  """Every live row for up to `max_steps` steps; stops as soon as one more row's turn
  ends (its reply can start while the others continue)."""
  logits_fn = sampler_lib.model_logits_fn(model_config)
  m = options.max_new_tokens
  min_done = jnp.sum(state.done) + 1

  def cond(carry):
    s, i = carry
    return (i < max_steps) & jnp.any(~s.done) & (jnp.sum(s.done) < min_done)

  def body(carry):
    s, i = carry
    live = ~s.done
    logits, cache = logits_fn(params, s.last_token[:, None], s.position[:, None],
                              live[:, None].astype(jnp.int32), s.cache)
    cache = dataclasses.replace(cache, index=jnp.where(live, cache.index, s.cache.index))
    token, lp, tempered = _draw(s, logits, live, options)
    tokens, logprobs, tempered_lp = _put_column(s, live, token, lp, tempered, m)
    lengths = s.lengths + live.astype(jnp.int32)
    ended = _ended(token, lengths, s.limit, s.turn_start, tokens, options, stops)
    return dataclasses.replace(
        s, tokens=tokens, logprobs=logprobs, tempered_logprobs=tempered_lp, lengths=lengths,
        done=s.done | (live & ended), last_token=jnp.where(live, token, s.last_token),
        position=s.position + live.astype(jnp.int32), cache=cache), i + 1

  state, _ = jax.lax.while_loop(cond, body, (state, jnp.zeros((), jnp.int32)))
  return state


@functools.partial(jax.jit, static_argnames=("model_config", "options", "stops",
                                             "max_turn_tokens"), donate_argnames=("state",))
def _append_program(params, state, rows, cut, prompt_lens, reply, reply_lens, *, model_config,
                    options, stops, max_turn_tokens):
  """Rows with rows[b]: cut back to `cut[b]` columns, reply[b, :reply_lens[b]] appended (a
  forward of the row's last token and the reply, written from its next cache slot on), and
  the new turn's first token drawn. Other rows run masked and keep their state."""
  m, (n, r) = options.max_new_tokens, reply.shape
  t = state.cache.mask.shape[1] - m - r - 1  # the prompt bucket (_start_program's extension)
  k = jnp.where(rows, reply_lens, 0)
  last = jnp.take_along_axis(state.tokens, jnp.clip(cut - 1, 0, m - 1)[:, None], axis=1)[:, 0]
  inputs = jnp.concatenate([jnp.where(rows, last, state.last_token)[:, None], reply], axis=1)
  first_slot = jnp.where(rows, t + cut - 1, state.cache.index)
  first_pos = jnp.where(rows, prompt_lens + cut - 1, state.position)
  in_mask = rows[:, None] & (jnp.arange(r + 1)[None] <= k[:, None])
  # The cut tokens' slots (a stop found on the host) no longer hold the row's context.
  kept = ~rows[:, None] | (jnp.arange(state.cache.mask.shape[1])[None] < first_slot[:, None])
  cache = dataclasses.replace(state.cache, mask=state.cache.mask & kept, index=first_slot)
  positions = first_pos[:, None] + jnp.arange(r + 1)[None]
  hidden, cache = model_lib.forward(model_config, params, inputs, positions,
                                    in_mask.astype(jnp.int32), cache)
  # The logits of each row's last reply token draw its next model token.
  h = jnp.take_along_axis(hidden, k[:, None, None], axis=1)[:, 0]
  logits = model_lib.unembed(model_config, params, h)
  cache = dataclasses.replace(cache, index=jnp.where(rows, first_slot + k + 1, state.cache.index))
  cols = jnp.arange(m)[None]
  fill = rows[:, None] & (cols >= cut[:, None])
  reply_at = jnp.take_along_axis(reply, jnp.clip(cols - cut[:, None], 0, r - 1), axis=1)
  is_reply = fill & (cols < (cut + k)[:, None])
  tokens = jnp.where(is_reply, reply_at, jnp.where(fill, options.pad_id, state.tokens))
  zero = lambda x: jnp.where(fill, 0.0, x)
  lengths = jnp.where(rows, cut + k, state.lengths)
  st = dataclasses.replace(state, tokens=tokens, logprobs=zero(state.logprobs),
                           tempered_logprobs=zero(state.tempered_logprobs), lengths=lengths)
  token, lp, tempered = _draw(st, logits, rows, options)
  tokens, logprobs, tempered_lp = _put_column(st, rows, token, lp, tempered, m)
  turn_start = jnp.where(rows, lengths, state.turn_start)
  limit = jnp.where(rows, jnp.minimum(lengths + max_turn_tokens, m), state.limit)
  lengths = lengths + rows.astype(jnp.int32)
  ended = _ended(token, lengths, limit, turn_start, tokens, options, stops)
  return dataclasses.replace(
      st, tokens=tokens, logprobs=logprobs, tempered_logprobs=tempered_lp, lengths=lengths,
      done=jnp.where(rows, ended, state.done), last_token=jnp.where(rows, token, state.last_token),
      position=jnp.where(rows, first_pos + k + 1, state.position), turn_start=turn_start,
      limit=limit, cache=cache)


# ---------------------------------------------------------------------------
# The host side.
# ---------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class TurnRollouts(sampler_lib.Rollouts):
  """sampler.Rollouts with each row's turns (an evaluator reads it as Rollouts)."""
  model_mask: np.ndarray = None    # [B, M] int32: 1 = a model token, 0 = reply / padding
  turns: np.ndarray = None         # [B] int32: model turns
  tool_calls: np.ndarray = None    # [B] int32
  tool_errors: np.ndarray = None   # [B] int32
  tool_seconds: np.ndarray = None  # [B] float64: time in the environment's replies


@dataclasses.dataclass
class _Row:
  prompt_len: int
  problem: Any
  turns: int = 1
  tool_calls: int = 0
  tool_errors: int = 0
  tool_seconds: float = 0.0
  finished: bool = False
  future: Any = None
  cut: int = 0
  env_columns: list = dataclasses.field(default_factory=list)  # (start, end) of each reply


class TurnSampler:
  """Multi-turn completions (module doc) through `sampler`'s model, devices and decoding
  settings; `encode` / `decode` the tokenizer's (text <-> ids, no special tokens added)."""

  def __init__(self, sampler: Sampler, environment: Environment,
               encode: Callable[[str], list[int]], decode: Callable[[Sequence[int]], str], *,
               chunk_steps: int = DEFAULT_CHUNK_STEPS, problems: dict | None = None):
    self.sampler, self.env, self.encode, self.decode = sampler, environment, encode, decode
    self.options: SamplingOptions = sampler.options
    self.chunk_steps = chunk_steps
    # The stop strings as token sequences, as the tokenizer spells them alone and after a
    # space; other spellings are caught on the host (module doc).
    seqs = {tuple(encode(s)) for s in environment.stop} | {
        tuple(encode(" " + s))[1:] for s in environment.stop if len(encode(" " + s)) > 1}
    self.stops = tuple(sorted(s for s in seqs if s))
    self.reply_bucket = batch_lib.bucket(environment.max_reply_tokens, REPLY_BUCKETS,
                                         "environment max_reply_tokens")
    self.problems = problems or {}  # prompt token tuple -> Problem (an evaluator's rows)
    self._pool = concurrent.futures.ThreadPoolExecutor(environment.num_workers,
                                                       thread_name_prefix="tba-env")
    self._lock = threading.Lock()

  def __call__(self, params, prompts: Sequence[Sequence[int]], rng_key,
               temperature: float | None = None, problems: Sequence[Any] | None = None
               ) -> TurnRollouts:
    o, env = self.options, self.env
    temperature = o.temperature if temperature is None else float(temperature)
    if not prompts:
      raise ValueError("no prompts")
    n, m = len(prompts), o.max_new_tokens
    if problems is None:
      problems = [self.problems.get(tuple(int(x) for x in p)) for p in prompts]
    s = self.sampler
    b = batch_lib.bucket(n, s.batch_buckets, "batch size")
    t = batch_lib.bucket(max(len(p) for p in prompts), s.prompt_buckets, "prompt length")
    tokens, mask = batch_lib.left_pad(prompts, t, o.pad_id, num_rows=b)
    if not jax.dtypes.issubdtype(jnp.asarray(rng_key).dtype, jax.dtypes.prng_key):
      rng_key = jax.random.wrap_key_data(rng_key)
    params = jax.device_put(params, s.param_shardings)
    place = lambda x: jax.device_put(x, sharding.batch_sharding("searcher", s.mesh, x.ndim))
    limit = np.full(b, min(env.max_turn_tokens, m), np.int32)
    state = _start_program(
        params, place(tokens), place(mask), jax.device_put(rng_key, sharding.replicated(s.mesh)),
        place(np.arange(b, dtype=np.int32)), place(np.arange(b) < n),
        jax.device_put(np.float32(temperature), sharding.replicated(s.mesh)), place(limit),
        model_config=s.model_config, options=o, mesh=s.mesh, extra_slots=self.reply_bucket + 1)
    rows = [_Row(len(p), problems[i]) for i, p in enumerate(prompts)]
    static = dict(model_config=s.model_config, options=o, stops=self.stops)
    while True:
      done, lengths, toks = jax.device_get((state.done, state.lengths, state.tokens))
      for i, row in enumerate(rows):
        if done[i] and not row.finished and row.future is None and row.cut < lengths[i]:
          self._turn_ended(row, toks[i], int(lengths[i]))
      ready = [i for i, row in enumerate(rows) if row.future is not None and row.future.done()]
      live = any(not done[i] for i in range(n))
      if not ready and not live:
        waiting = [row.future for row in rows if row.future is not None]
        if not waiting:
          break
        concurrent.futures.wait(waiting, return_when=concurrent.futures.FIRST_COMPLETED)
        continue
      if ready:
        state = self._append(params, state, rows, ready, lengths, static)
      elif live:
        state = _decode_program(params, state, self.chunk_steps, **static)
    out = jax.device_get((state.tokens, state.logprobs, state.tempered_logprobs, state.lengths))
    model_mask = (np.arange(m)[None] < out[3][:n, None]).astype(np.int32)
    for i, row in enumerate(rows):
      for start, end in row.env_columns:
        model_mask[i, start:end] = 0
    field = lambda name, dt: np.array([getattr(r, name) for r in rows], dt)
    return TurnRollouts(tokens=out[0][:n], logprobs=out[1][:n], tempered_logprobs=out[2][:n],
                        lengths=out[3][:n], num_decode_steps=int(out[3][:n].max()),
                        model_mask=model_mask, turns=field("turns", np.int32),
                        tool_calls=field("tool_calls", np.int32),
                        tool_errors=field("tool_errors", np.int32),
                        tool_seconds=field("tool_seconds", np.float64))

  def _turn_ended(self, row: _Row, tokens: np.ndarray, length: int) -> None:
    """Row's turn ended at `length` columns: the last one, or its reply starts (threads)."""
    o, env = self.options, self.env
    start = row.env_columns[-1][1] if row.env_columns else 0
    if length and int(tokens[length - 1]) in o.eos_ids or row.turns >= env.max_turns:
      row.finished = True
      return
    turn = [int(x) for x in tokens[start:length]]
    text = self.decode(turn)
    if not any(stop in text for stop in env.stop):
      row.finished = True  # a limit, with no tool call pending
      return
    # The shortest prefix holding a stop string (the device check may have missed it).
    cut = next(j for j in range(1, len(turn) + 1)
               if any(stop in self.decode(turn[:j]) for stop in env.stop))
    row.cut = start + cut
    text = self.decode(turn[:cut])

    def run():
      begin = time.perf_counter()
      reply = as_reply(env.reply(row.problem, text))
      return reply, time.perf_counter() - begin

    row.future = self._pool.submit(run)

  def _append(self, params, state, rows, ready, lengths, static):
    """The finished replies of rows `ready` into their caches (one append program)."""
    o, env, n = self.options, self.env, state.tokens.shape[0]
    m, r = o.max_new_tokens, self.reply_bucket
    take = np.zeros(n, bool)
    cut, plen = np.ones(n, np.int32), np.zeros(n, np.int32)
    reply, reply_len = np.full((n, r), o.pad_id, np.int32), np.zeros(n, np.int32)
    for i in ready:
      row = rows[i]
      reply_out, seconds = row.future.result()
      row.future = None
      row.tool_seconds += seconds
      if reply_out is None:
        row.finished = True
        continue
      row.tool_calls += reply_out.tool_calls
      row.tool_errors += int(reply_out.error)
      ids = self.encode(reply_out.text)[:env.max_reply_tokens]
      if not ids or row.cut + len(ids) + 1 > m:  # no room for the reply and one more token
        row.finished = True
        continue
      take[i], cut[i], plen[i] = True, row.cut, row.prompt_len
      reply[i, :len(ids)], reply_len[i] = ids, len(ids)
      row.env_columns.append((row.cut, row.cut + len(ids)))
      row.turns += 1
    if not take.any():
      return state
    place = lambda x: jax.device_put(x, sharding.batch_sharding("searcher", self.sampler.mesh,
                                                                x.ndim))
    return _append_program(params, state, place(take), place(cut), place(plen), place(reply),
                           place(reply_len), max_turn_tokens=env.max_turn_tokens, **static)


class TurnRows:
  """A searcher.RowSource of static batches with turns: num_prompts prompts x S rows through
  a TurnSampler, one batch per `sample` (searcher.StaticRows's cursor and keys)."""

  def __init__(self, turns: TurnSampler):
    self.turns, self.sampler = turns, turns.sampler
    self.num_batches = 0

  def sample(self, feed: Feed) -> Sampled:
    version, params = feed.mailbox.get()
    with feed.lock:
      ids, b = feed.take(feed.num_prompts), self.num_batches
    temperature = feed.temperature(b)
    s = feed.num_samples
    rows = [i for i in ids for _ in range(s)]  # prompt-major, as StaticRows
    out = self.turns(params, [feed.prompt_tokens[i] for i in rows],
                     jax.random.fold_in(feed.key, b), temperature=temperature,
                     problems=[feed.problems[i] for i in rows])

    def row(r):
      k = out.lengths[r]
      return Sample(out.tokens[r, :k], out.tempered_logprobs[r, :k], version, version,
                    model_mask=out.model_mask[r, :k], turns=int(out.turns[r]),
                    tool_calls=int(out.tool_calls[r]), tool_errors=int(out.tool_errors[r]),
                    tool_seconds=float(out.tool_seconds[r]))

    groups = [Group(i, temperature, tuple(row(k * s + j) for j in range(s)))
              for k, i in enumerate(ids)]
    return Sampled(groups, (version, params))

  def committed(self, groups: Sequence[Group]) -> None:
    self.num_batches += 1

  def drop(self) -> None:
    pass

  def cursor(self) -> dict:
    return {"num_batches": self.num_batches}

  def load_cursor(self, state: dict) -> None:
    self.num_batches = int(state["num_batches"])
