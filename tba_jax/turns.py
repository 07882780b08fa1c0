"""Multi-turn sampling: model turns and environment replies in one KV cache per row.

  turns = TurnSampler(sampler, environment, encode, decode)
  out = turns(params, prompts, key, problems=problems)   # TurnRollouts
  rows = TurnRows(turns)        # a rows.RowSource of static batches with turns
  rows = streaming.StreamingRows(sampler, num_slots=N, turns=(environment, encode, decode))

Rows live in a pool of slots (`TurnPool`, continuous.Stream's interface; `TurnSampler` runs
one batch through a pool as wide as it): a row's prompt is prefilled into its slot
left-padded to the pool's prompt width T (the completion's column j sits at cache slot T + j,
position p + j for a prompt of p tokens), then rows decode in chunks with a cache index per
row, and a slot whose row finished takes the next queued row. A row's turn ends at EOS, at a stop
sequence (the environment's stop strings as tokens, checked on device), or at its turn's
token limit; the chunk then ends so that the host can hand the turn to the environment.
Replies run in a thread pool while the other rows keep decoding (a slow tool stalls only
its own row); a reply function that raises is answered by environment.failure_reply
(environment.FATAL ends the rollout). A reply is tokenized once, as plain text
(Tokenizer.encode_text: a printed "<|im_end|>" is no special token), or comes as ids
(Reply.ids: a chat template's tool turn, tasks/tool_calls.py), and those ids are what
the model sees: they are appended to the row's cache by a forward of the new tokens alone
(the row's last sampled token and the reply; nothing before it is recomputed) and written
into the row's columns, whose model mask is 0 there. The trajectory's tokens are therefore
exactly the model's context: nothing is decoded and re-encoded. A reply that does not fit
in the row ends it (replies_dropped; the call counters count replies that entered the
context). The reward reads each row's reward-mask tokens (environment.SCORES).

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
from tba_jax.rows import Feed, Group, Sample, Sampled
from tba_jax.tasks.environment import FATAL, SCORES, Environment, as_reply, failure_reply

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
  temperature: jax.Array        # [N] float32: each row's sampling temperature
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


@functools.partial(jax.jit, static_argnames=("model_config", "options", "limit"),
                   donate_argnames=("state",))
def _insert_program(params, state, prompt_tokens, prompt_mask, key, count, slots, row_ids,
                    temperatures, *, model_config, options, limit):
  """Rows i < count start in slot slots[i]: prompt i [U,T] (left-padded to the pool's prompt
  width T) prefilled into slots [0, T) of the slot's cache, its first token drawn with
  fold_in(fold_in(key, row_ids[i]), 0) at temperatures[i]. Vectors padded to U."""
  u, t = prompt_tokens.shape
  n, m = state.tokens.shape
  positions = model_lib.positions_from_mask(prompt_mask)
  logits, pre = sampler_lib.model_logits_fn(model_config)(
      params, prompt_tokens, positions, prompt_mask, KVCache.init(model_config, u, t))
  real = jnp.arange(u) < count
  at = jnp.where(real, slots, n)  # padding rows write out of bounds: dropped
  cache = state.cache
  kv = lambda buf, x: buf.at[:, at, :, :t].set(x.astype(buf.dtype), mode="drop")
  row_mask = jnp.zeros((u, cache.mask.shape[1]), bool).at[:, :t].set(prompt_mask > 0)
  cache = dataclasses.replace(cache, k=kv(cache.k, pre.k), v=kv(cache.v, pre.v),
                              mask=cache.mask.at[at].set(row_mask, mode="drop"),
                              index=cache.index.at[at].set(t, mode="drop"))
  row_keys = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, row_ids)
  first = jax.vmap(jax.random.fold_in, in_axes=(0, None))(row_keys, 0)
  token, lp, tempered = sampler_lib.choose_tokens(
      sampler_lib.mask_eos(logits, 0, options), first, options, temperatures)
  column = lambda x, fill, dtype: jnp.full((u, m), fill, dtype).at[:, 0].set(x)
  set_rows = lambda buf, x: buf.at[at].set(x, mode="drop")
  eos = jnp.isin(token, jnp.asarray(options.eos_ids, jnp.int32)) if options.eos_ids else False
  return dataclasses.replace(
      state, tokens=set_rows(state.tokens, column(token, options.pad_id, jnp.int32)),
      logprobs=set_rows(state.logprobs, column(lp, 0.0, jnp.float32)),
      tempered_logprobs=set_rows(state.tempered_logprobs, column(tempered, 0.0, jnp.float32)),
      lengths=set_rows(state.lengths, jnp.ones((u,), jnp.int32)),
      done=set_rows(state.done, eos | (limit <= 1)), last_token=set_rows(state.last_token, token),
      position=set_rows(state.position, jnp.sum(prompt_mask, axis=1).astype(jnp.int32)),
      row_keys=set_rows(state.row_keys, row_keys),
      temperature=set_rows(state.temperature, temperatures.astype(jnp.float32)),
      turn_start=set_rows(state.turn_start, jnp.zeros((u,), jnp.int32)),
      limit=set_rows(state.limit, jnp.full((u,), limit, jnp.int32)), cache=cache)


@functools.partial(jax.jit, static_argnames=("model_config", "options", "mesh", "num_slots",
                                             "cache_size"))
def _empty_pool(key, *, model_config, options, mesh, num_slots, cache_size):
  n, m = num_slots, options.max_new_tokens
  cache = KVCache.init(model_config, n, cache_size)
  kv = sharding.cache_sharding(model_config, mesh)
  cache = dataclasses.replace(cache, k=jax.lax.with_sharding_constraint(cache.k, kv),
                              v=jax.lax.with_sharding_constraint(cache.v, kv),
                              index=jnp.zeros((n,), jnp.int32))
  zeros = jnp.zeros((n,), jnp.int32)
  return TurnState(tokens=jnp.full((n, m), options.pad_id, jnp.int32),
                   logprobs=jnp.zeros((n, m), jnp.float32),
                   tempered_logprobs=jnp.zeros((n, m), jnp.float32), lengths=zeros,
                   done=jnp.ones((n,), bool), last_token=zeros, position=zeros,
                   row_keys=jax.random.split(key, n), temperature=jnp.ones((n,), jnp.float32),
                   turn_start=zeros, limit=zeros, cache=cache)


# ---------------------------------------------------------------------------
# The host side.
# ---------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class TurnRollouts(sampler_lib.Rollouts):
  """sampler.Rollouts with each row's turns (an evaluator reads it as Rollouts)."""
  model_mask: np.ndarray = None    # [B, M] int32: 1 = a model token, 0 = reply / padding
  reward_mask: np.ndarray = None   # [B, M] int32: 1 = a token the reward reads (module doc)
  turns: np.ndarray = None         # [B] int32: model turns
  # [B] what the row's environment did (searcher.SearchStats): int32, tool_seconds float64.
  tool_calls: np.ndarray = None
  tool_errors: np.ndarray = None
  reply_failures: np.ndarray = None
  tool_seconds: np.ndarray = None
  replies_dropped: np.ndarray = None


@dataclasses.dataclass(frozen=True)
class TurnCompletion:
  """One finished multi-turn row (continuous.Completion's fields, and its turns)."""
  row_id: int
  tokens: np.ndarray             # [n] int32: model turns and replies
  logprobs: np.ndarray           # [n] float32, 0 on reply tokens
  tempered_logprobs: np.ndarray  # [n] float32, 0 on reply tokens
  first_version: Any
  last_version: Any
  model_mask: np.ndarray         # [n] int32, 0 on reply tokens
  reward_mask: np.ndarray        # [n] int32, 1 on the tokens the reward reads
  turns: int
  tool_calls: int
  tool_errors: int
  reply_failures: int
  tool_seconds: float
  replies_dropped: int

  def sample(self) -> Sample:
    return Sample(self.tokens, self.tempered_logprobs, self.first_version, self.last_version,
                  **{f: getattr(self, f) for f in _SAMPLE_FIELDS})


# What a TurnCompletion hands on to its rows.Sample (and TurnRollouts holds per row).
_SAMPLE_FIELDS = ("model_mask", "reward_mask", "turns", "tool_calls", "tool_errors",
                  "reply_failures", "tool_seconds", "replies_dropped")


@dataclasses.dataclass
class _Row:
  row_id: int
  prompt_len: int
  problem: Any
  first_version: Any
  turns: int = 1
  tool_calls: int = 0
  tool_errors: int = 0
  reply_failures: int = 0
  tool_seconds: float = 0.0
  replies_dropped: int = 0
  finished: bool = False
  future: Any = None
  cut: int = 0
  env_columns: list = dataclasses.field(default_factory=list)  # (start, end) of each reply


class TurnPool:
  """Multi-turn rows in a pool of `num_slots` slots (module doc), continuous.Stream's
  interface: `add` queues (prompt, row id, problem) rows, `step` refills free slots, then
  appends the replies that came back or decodes one chunk, and returns the rows that
  finished; `set_params` swaps the weights between steps (rows continue under them). Prompts
  are left-padded to the pool's widest prompt bucket. Call from one thread."""

  def __init__(self, sampler: Sampler, environment: Environment,
               encode: Callable[[str], list[int]], decode: Callable[[Sequence[int]], str],
               params, rng_key, *, num_slots: int, max_prompt_len: int,
               chunk_steps: int = DEFAULT_CHUNK_STEPS, version: Any = None, executor=None):
    self.sampler, self.env, self.encode, self.decode = sampler, environment, encode, decode
    self.options: SamplingOptions = sampler.options
    self.num_slots, self.chunk_steps = num_slots, chunk_steps
    self.prompt_width = batch_lib.bucket(max_prompt_len, sampler.prompt_buckets, "prompt length")
    self.stops = stop_sequences(environment, encode)
    self.reply_bucket = batch_lib.bucket(environment.max_reply_tokens, REPLY_BUCKETS,
                                         "environment max_reply_tokens")
    self.executor = executor or concurrent.futures.ThreadPoolExecutor(
        environment.num_workers, thread_name_prefix="tba-env")
    if not jax.dtypes.issubdtype(jnp.asarray(rng_key).dtype, jax.dtypes.prng_key):
      rng_key = jax.random.wrap_key_data(rng_key)
    self.key = jax.device_put(rng_key, sharding.replicated(sampler.mesh))
    self.set_params(params, version)
    o = self.options
    self.state = _empty_pool(self.key, model_config=sampler.model_config, options=o,
                             mesh=sampler.mesh, num_slots=num_slots,
                             cache_size=self.prompt_width + o.max_new_tokens +
                             self.reply_bucket + 1)
    self.queue: list[tuple] = []          # (prompt, row id, temperature, problem)
    self.slots: list[_Row | None] = [None] * num_slots
    self._static = dict(model_config=sampler.model_config, options=o, stops=self.stops)

  def add(self, prompts, row_ids, temperature: float | None = None, problems=None) -> None:
    temperature = self.options.temperature if temperature is None else float(temperature)
    if not self.options.greedy and not temperature > 0:
      raise ValueError(f"temperature={temperature} must be > 0")
    problems = [None] * len(prompts) if problems is None else problems
    for p, r, problem in zip(prompts, row_ids, problems, strict=True):
      p = [int(x) for x in p]
      if not p or len(p) > self.prompt_width:
        raise ValueError(f"a prompt of {len(p)} tokens: needs 1 to {self.prompt_width}")
      self.queue.append((p, int(r), temperature, problem))

  def set_params(self, params, version: Any = None) -> None:
    self.params = jax.device_put(params, self.sampler.param_shardings)
    self.version = version

  @property
  def num_queued(self) -> int:
    return len(self.queue)

  @property
  def num_in_flight(self) -> int:
    return sum(s is not None for s in self.slots)

  def busy(self) -> bool:
    return bool(self.queue) or self.num_in_flight > 0

  def step(self) -> list[TurnCompletion]:
    """One round (class doc); the rows that finished in it."""
    self._refill()
    done, lengths, tokens = jax.device_get((self.state.done, self.state.lengths,
                                            self.state.tokens))
    for j, row in enumerate(self.slots):
      if row is not None and done[j] and not row.finished and row.future is None and \
          row.cut < lengths[j]:
        self._turn_ended(row, tokens[j], int(lengths[j]))
    ready = [j for j, row in enumerate(self.slots)
             if row is not None and row.future is not None and row.future.done()]
    live = any(row is not None and not done[j] for j, row in enumerate(self.slots))
    if ready:
      self._append(ready)
    elif live:
      self.state = _decode_program(self.params, self.state, self.chunk_steps, **self._static)
    else:
      waiting = [row.future for row in self.slots if row is not None and row.future is not None]
      if waiting:  # every row waits for its reply: nothing to decode until one comes
        concurrent.futures.wait(waiting, return_when=concurrent.futures.FIRST_COMPLETED)
    return self._finished()

  def _finished(self) -> list[TurnCompletion]:
    ended = [j for j, row in enumerate(self.slots) if row is not None and row.finished]
    if not ended:
      return []
    tokens, logprobs, tempered, lengths = jax.device_get(
        (self.state.tokens, self.state.logprobs, self.state.tempered_logprobs,
         self.state.lengths))
    out = []
    for j in ended:
      row, n = self.slots[j], int(lengths[j])
      mask = np.ones(n, np.int32)
      for start, end in row.env_columns:
        mask[start:end] = 0
      out.append(TurnCompletion(row.row_id, tokens[j, :n], logprobs[j, :n], tempered[j, :n],
                                row.first_version, self.version, mask,
                                SCORES[self.env.score](mask), row.turns, row.tool_calls,
                                row.tool_errors, row.reply_failures, row.tool_seconds,
                                row.replies_dropped))
      self.slots[j] = None
    return out

  def _refill(self) -> None:
    free = [j for j, row in enumerate(self.slots) if row is None]
    rows, self.queue = self.queue[:len(free)], self.queue[len(free):]
    if not rows:
      return
    s, o = self.sampler, self.options
    u = batch_lib.bucket(len(rows), s.batch_buckets, "refill batch")
    tokens, mask = batch_lib.left_pad([r[0] for r in rows], self.prompt_width, o.pad_id,
                                      num_rows=u)
    vec = lambda values, dt: np.array(list(values) + [0] * (u - len(rows)), dt)
    place = lambda x: jax.device_put(x, sharding.batch_sharding("searcher", s.mesh, x.ndim))
    self.state = _insert_program(
        self.params, self.state, place(tokens), place(mask), self.key, len(rows),
        vec(free[:len(rows)], np.int32), vec((r[1] for r in rows), np.int32),
        vec((r[2] for r in rows), np.float32), model_config=s.model_config, options=o,
        limit=min(self.env.max_turn_tokens, o.max_new_tokens))
    for j, (prompt, row_id, _, problem) in zip(free, rows):
      self.slots[j] = _Row(row_id, len(prompt), problem, self.version)

  def _turn_ended(self, row: _Row, tokens: np.ndarray, length: int) -> None:
    """Row's turn ended at `length` columns: the last one, or its reply starts (threads)."""
    o, env = self.options, self.env
    start = row.env_columns[-1][1] if row.env_columns else 0
    if length and int(tokens[length - 1]) in o.eos_ids or row.turns >= env.max_turns:
      row.finished = True
      return
    turn = [int(x) for x in tokens[start:length]]
    if not any(stop in self.decode(turn) for stop in env.stop):
      row.finished = True  # a limit, with no tool call pending
      return
    # The shortest prefix holding a stop string (the device check may have missed it).
    cut = next(j for j in range(1, len(turn) + 1)
               if any(stop in self.decode(turn[:j]) for stop in env.stop))
    row.cut = start + cut
    text, problem = self.decode(turn[:cut]), row.problem

    def run():
      begin = time.perf_counter()
      try:
        out = env.reply(problem, text)
      except FATAL:
        raise
      except Exception as e:  # the model's turn broke the reply function: it reads why
        out = failure_reply(e)
      return as_reply(out), time.perf_counter() - begin

    row.future = self.executor.submit(run)

  def _append(self, ready: list[int]) -> None:
    """The finished replies of slots `ready` into their caches (one append program)."""
    o, env, n = self.options, self.env, self.num_slots
    m, r = o.max_new_tokens, self.reply_bucket
    take = np.zeros(n, bool)
    cut, plen = np.ones(n, np.int32), np.zeros(n, np.int32)
    reply, reply_len = np.full((n, r), o.pad_id, np.int32), np.zeros(n, np.int32)
    for j in ready:
      row = self.slots[j]
      reply_out, seconds = row.future.result()  # re-raises environment.FATAL
      row.future = None
      if reply_out is None:
        row.finished = True
        continue
      # A chat template's tool turn comes tokenized (its markup's special tokens parsed);
      # any other reply is plain text (module doc).
      ids = list(reply_out.ids) if reply_out.ids is not None else self.encode(reply_out.text)
      ids = ids[:env.max_reply_tokens]
      if not ids or row.cut + len(ids) + 1 > m:  # no room for the reply and one more token
        row.finished = True
        row.replies_dropped += 1
        continue
      row.tool_calls += reply_out.tool_calls
      row.tool_errors += int(reply_out.error)
      row.reply_failures += int(reply_out.failed)
      row.tool_seconds += seconds
      take[j], cut[j], plen[j] = True, row.cut, row.prompt_len
      reply[j, :len(ids)], reply_len[j] = ids, len(ids)
      row.env_columns.append((row.cut, row.cut + len(ids)))
      row.turns += 1
    if not take.any():
      return
    place = lambda x: jax.device_put(x, sharding.batch_sharding("searcher", self.sampler.mesh,
                                                                x.ndim))
    self.state = _append_program(self.params, self.state, place(take), place(cut), place(plen),
                                 place(reply), place(reply_len),
                                 max_turn_tokens=env.max_turn_tokens, **self._static)


def stop_sequences(environment: Environment, encode) -> tuple[tuple[int, ...], ...]:
  """The stop strings as token sequences, as the tokenizer spells them alone and after a
  space (other spellings are caught on the host: module doc)."""
  seqs = {tuple(encode(s)) for s in environment.stop} | {
      tuple(encode(" " + s))[1:] for s in environment.stop if len(encode(" " + s)) > 1}
  return tuple(sorted(s for s in seqs if s))


class TurnSampler:
  """Multi-turn completions of a batch of prompts through `sampler`'s model, devices and
  decoding settings (a TurnPool as wide as the batch's bucket); `encode` / `decode` the
  tokenizer's (text <-> ids, no special tokens added or parsed: Tokenizer.encode_text).
  `problems`: prompt token tuple -> Problem, for callers that pass none (an evaluator)."""

  def __init__(self, sampler: Sampler, environment: Environment,
               encode: Callable[[str], list[int]], decode: Callable[[Sequence[int]], str], *,
               chunk_steps: int = DEFAULT_CHUNK_STEPS, problems: dict | None = None):
    self.sampler, self.env, self.encode, self.decode = sampler, environment, encode, decode
    self.chunk_steps, self.problems = chunk_steps, problems or {}
    self.executor = concurrent.futures.ThreadPoolExecutor(environment.num_workers,
                                                          thread_name_prefix="tba-env")

  def __call__(self, params, prompts: Sequence[Sequence[int]], rng_key,
               temperature: float | None = None, problems: Sequence[Any] | None = None
               ) -> TurnRollouts:
    if not prompts:
      raise ValueError("no prompts")
    n, m = len(prompts), self.sampler.options.max_new_tokens
    if problems is None:
      problems = [self.problems.get(tuple(int(x) for x in p)) for p in prompts]
    pool = TurnPool(self.sampler, self.env, self.encode, self.decode, params, rng_key,
                    num_slots=batch_lib.bucket(n, self.sampler.batch_buckets, "batch size"),
                    max_prompt_len=max(map(len, prompts)), chunk_steps=self.chunk_steps,
                    executor=self.executor)
    pool.add(prompts, range(n), temperature, problems)
    done: dict[int, TurnCompletion] = {}
    while pool.busy():
      done.update((c.row_id, c) for c in pool.step())
    rows = [done[i] for i in range(n)]
    pad = lambda x, fill, dt: np.array([np.pad(np.asarray(c, dt), (0, m - len(c)),
                                               constant_values=fill) for c in x], dt)
    field = lambda name, dt: np.array([getattr(c, name) for c in rows], dt)
    return TurnRollouts(
        tokens=pad([c.tokens for c in rows], self.sampler.options.pad_id, np.int32),
        logprobs=pad([c.logprobs for c in rows], 0, np.float32),
        tempered_logprobs=pad([c.tempered_logprobs for c in rows], 0, np.float32),
        lengths=np.array([len(c.tokens) for c in rows], np.int32),
        num_decode_steps=max(len(c.tokens) for c in rows),
        model_mask=pad([c.model_mask for c in rows], 0, np.int32),
        reward_mask=pad([c.reward_mask for c in rows], 0, np.int32),
        turns=field("turns", np.int32), tool_calls=field("tool_calls", np.int32),
        tool_errors=field("tool_errors", np.int32),
        reply_failures=field("reply_failures", np.int32),
        tool_seconds=field("tool_seconds", np.float64),
        replies_dropped=field("replies_dropped", np.int32))


class TurnRows:
  """A rows.RowSource of static batches with turns: num_prompts prompts x S rows through
  a TurnSampler, one batch per `sample` (rows.StaticRows's cursor and keys)."""

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
      per_row = {f: getattr(out, f)[r] for f in _SAMPLE_FIELDS}
      per_row = {f: x[:k] if np.ndim(x) else x.item() for f, x in per_row.items()}
      return Sample(out.tokens[r, :k], out.tempered_logprobs[r, :k], version, version,
                    **per_row)

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
