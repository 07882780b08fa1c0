"""Continuous batching: a fixed pool of row slots, refilled from a queue of prompts.

The static sampler decodes a batch until its longest row ends; finished rows keep running,
masked. Here a pool of N slots decodes in compiled chunks of steps (slot_programs.py: the
pool's device state and its programs); between chunks the host hands out the rows that
ended (EOS or their length limit) and refills their slots with the next queued (prompt, row
id), so the pool stays full until the queue runs dry. The samples of one prompt share one
prefill (kept until its last sample is placed). A decode step attends over a window of
cache slots, the smallest multiple of `window_step` covering every live row's filled slots,
not the whole cache (one compile per window): the attention's cost follows the longest live
row, not the cache size. With pages (paged_kv.py) the slots' caches come from one pool of
pages that rows take as they grow, so memory follows the rows' lengths.

Multi-turn rows (`replies`: an environment's side, replies.py) are rows whose turns end at
a stop string too: the decode chunk then ends so that the host can hand the turn to the
environment, whose reply runs in a thread pool while the other rows keep decoding; when it
comes back the pool appends its tokens to the row's cache (slot_programs.append_replies) and
the row decodes its next turn in the same slot. Single- and multi-turn rows share one decode
state, one decode program, the pages, the shared prefill and the windows.

A row's tokens depend only on (key, its row id) and its replies: its random stream is
fold_in(fold_in(key, row id), column) as in the static sampler (slot_programs.py).
"""
from __future__ import annotations

import collections
import dataclasses
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from tba_jax import batch as batch_lib
from tba_jax import paged_kv
from tba_jax import sampler as sampler_lib
from tba_jax import sharding
from tba_jax import slot_programs as programs
from tba_jax.replies import Replies, TurnRow, TurnStats

# At most this many decode steps between host refills, and attention windows in
# multiples of this many cache slots.
DEFAULT_CHUNK_STEPS = 32
DEFAULT_WINDOW_STEP = 64


@dataclasses.dataclass(frozen=True)
class Completion:
  """One finished row (host numpy arrays of its `length` columns)."""
  row_id: int
  tokens: np.ndarray  # [n] int32, EOS included when it ended on one
  logprobs: np.ndarray  # [n] float32, 0 on reply tokens
  tempered_logprobs: np.ndarray  # [n] float32, 0 on reply tokens
  first_version: Any  # the params version its prompt was prefilled under
  last_version: Any  # the version of the last decode chunk it took part in
  turn_stats: TurnStats | None = None  # a multi-turn row's masks and counters


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


@dataclasses.dataclass
class _Slot:
  """The host's record of an occupied slot."""
  row_id: int
  prompt: tuple  # (to queue the row again when it gives its pages back)
  temperature: float
  first_version: Any
  order: int  # placement order (paged pools preempt the newest)
  turn: TurnRow | None  # a multi-turn row's environment side
  length: int = 1  # columns filled (host copy, refreshed after each chunk and append)

  @property
  def decoding(self) -> bool:
    return self.turn is None or not self.turn.waiting


class Stream:
  """Completions from a pool of `num_slots` rows, fed from a queue of prompts.

  A searcher keeps it busy: `add` queues (prompt, row id) pairs at any time, `step` refills
  free slots from the queue, runs one decode chunk under the current params and returns
  the rows that ended in it, and `set_params` swaps the weights (and names their version)
  between chunks (rows in flight continue under the new ones; each completion carries the
  first and last version it was decoded under). Rows are taken grouped by prompt, so the
  samples of one prompt share one prefill; their outputs depend on (key, row id) only,
  never on the order they ran in. kv_pages > 0: the slots take pages of `page_size` cache
  slots from a pool of kv_pages (paged_kv.py); AutoPages (None: the default one): as many as
  fit (auto_num_pages). `replies`: the environment side of multi-turn rows (module doc).
  Call from one thread.
  """

  def __init__(self, sampler: sampler_lib.Sampler, params, rng_key, *, num_slots: int,
               max_prompt_len: int, chunk_steps: int = DEFAULT_CHUNK_STEPS,
               window_step: int = DEFAULT_WINDOW_STEP,
               kv_pages: int | paged_kv.AutoPages | None = 0,
               page_size: int = paged_kv.DEFAULT_PAGE_SIZE, replies: Replies | None = None):
    check_pool(sampler, num_slots, chunk_steps, window_step)
    if kv_pages != 0 and (page_size < 1 or window_step % page_size):
      raise ValueError(f"window_step={window_step} must be a multiple of page_size={page_size}")
    self.sampler, self.options, self.mesh = sampler, sampler.options, sampler.mesh
    self.num_slots, self.chunk_steps, self.window_step = num_slots, chunk_steps, window_step
    self.replies = replies
    self.max_prompt_bucket = batch_lib.bucket(max_prompt_len, sampler.prompt_buckets,
                                              "prompt length")
    m = self.options.max_new_tokens
    # Every column but the last (never fed back) takes a cache slot; one more because an
    # ended row keeps running, masked, writing at its next slot, and with turns a reply
    # bucket more: an append writes one from every row's next slot (decode and append writes
    # are scatters promised to stay in bounds).
    self.cache_size = self.max_prompt_bucket + m + (replies.reply_bucket if replies else 0)
    self.rules = (programs.TurnRules(min(replies.environment.max_turn_tokens, m), replies.stops)
                  if replies else programs.TurnRules(m))
    self.pages = None
    if kv_pages is None:
      kv_pages = paged_kv.AutoPages()
    if isinstance(kv_pages, paged_kv.AutoPages):  # none reported (as on CPU): 0
      cfg = sampler.model_config
      row = -(-self.cache_size // page_size) * page_size
      # The kv heads of a page split over the tensor axis (or not: the shard's head count).
      heads = programs.page_sharding(cfg, self.mesh).shard_shape((1, cfg.num_kv_heads, 1, 1, 1))[1]
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
    self.set_params(params)
    self.state = programs.empty_pool(
        self.key, model_config=sampler.model_config, options=self.options, mesh=self.mesh,
        num_slots=num_slots, cache_size=self.cache_size, num_pages=kv_pages,
        page_size=page_size if kv_pages else 0)
    # prompt -> (row id, temperature, problem) waiting, in arrival order of the prompts (a
    # prompt's samples run together, so its prefill is shared).
    self.queue: collections.OrderedDict[tuple, collections.deque] = collections.OrderedDict()
    self.slots: list[_Slot | None] = [None] * num_slots  # None: free
    self._placed = 0  # rows placed so far (their order)
    self.stats = StreamStats()

  # -- feeding ---------------------------------------------------------------
  def add(self, prompts: Sequence[Sequence[int]], row_ids: Sequence[int],
          temperature: float | None = None, problems: Sequence[Any] | None = None) -> None:
    """Queue rows: row_ids[i] samples a completion of prompts[i] (ids seed the
    rows' random streams, so each should be used once per key) at `temperature`
    (None: the sampler's; any value runs in the same compiled programs); problems[i] is
    what a multi-turn row's environment replies to."""
    temperature = self.options.temperature if temperature is None else float(temperature)
    if not self.options.greedy and not temperature > 0:
      raise ValueError(f"temperature={temperature} must be > 0")
    if len(prompts) != len(row_ids):
      raise ValueError(f"{len(prompts)} prompts but {len(row_ids)} row ids")
    for p, r, problem in zip(prompts, row_ids, problems or [None] * len(prompts), strict=True):
      p = tuple(int(x) for x in p)
      if not p:
        raise ValueError("every prompt needs at least one token")
      if len(p) > self.max_prompt_bucket:
        raise ValueError(f"prompt of {len(p)} tokens exceeds this stream's max_prompt_len "
                         f"(bucket {self.max_prompt_bucket})")
      self.queue.setdefault(p, collections.deque()).append((int(r), temperature, problem))

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
    """Append the replies that came back, refill free slots, run one decode chunk; return
    the rows that ended. With pages the rows in flight first take the pages of their next
    chunk (and reply) and new rows only what is left: admitting first would hand a new row
    the pages a row in flight needs next, then take them back (a preemption, its prefill and
    insert wasted)."""
    appends, ended = self._take_replies() if self.replies else ({}, [])
    out = self._complete(ended)
    if self.pages is not None:
      self._page()
    appends = {j: ids for j, ids in appends.items() if self.slots[j] is not None}  # preempted?
    if appends:
      self._append(appends)
    self._refill()
    decoding = [j for j, s in enumerate(self.slots) if s is not None and s.decoding]
    if not decoding:  # every row waits for its reply: nothing to decode until one comes
      if self.replies:
        self.replies.wait([s.turn for s in self.slots if s is not None])
      return out
    # Row j's next input goes to cache slot prompt_len + length - 1.
    reach = max(len(self.slots[j].prompt) + self.slots[j].length for j in decoding)
    window = min(self.cache_size, -(-reach // self.window_step) * self.window_step)
    # Stop as soon as one more row ends, to refill its slot or hand its turn to the
    # environment, unless nothing waits for that (with pages, slots can stay free while
    # rows wait for pages).
    waits = self.queue or self.replies
    min_free = self.num_slots - len(decoding) + 1 if waits else self.num_slots + 1
    self.state, steps = programs.decode_program(
        self.params, self.state, self.chunk_steps, min_free,
        model_config=self.sampler.model_config, options=self.options, rules=self.rules,
        window=window)
    # The host sync of a chunk: which rows ended, and their outputs.
    done, lengths, steps = jax.device_get((self.state.done, self.state.lengths, steps))
    self.stats.decode_steps += int(steps)
    self.stats.chunks += 1
    for j in decoding:
      self.slots[j].length = int(lengths[j])
    ended = [j for j in decoding if done[j]]
    if not ended:
      return out
    outputs = jax.device_get((self.state.tokens, self.state.logprobs,
                              self.state.tempered_logprobs))
    if self.replies:  # a turn that ended at a stop string: the row waits for its reply
      ended = [j for j in ended if not self.replies.turn_ended(
          self.slots[j].turn, outputs[0][j, :self.slots[j].length], self.options.eos_ids)]
    return out + self._complete(ended, outputs)

  def _complete(self, ended: list[int], outputs=None) -> list[Completion]:
    """The rows of slots `ended`, handed out; their slots freed."""
    if not ended:
      return []
    tokens, logprobs, tempered = outputs or jax.device_get(
        (self.state.tokens, self.state.logprobs, self.state.tempered_logprobs))
    out = []
    for j in ended:
      s, n = self.slots[j], self.slots[j].length
      out.append(Completion(s.row_id, tokens[j, :n], logprobs[j, :n], tempered[j, :n],
                            s.first_version, self.version,
                            None if s.turn is None else self.replies.stats(s.turn, n)))
      self.slots[j] = None
      if self.pages is not None:
        self.pages.release(j)
      self.stats.rows_finished += 1
      self.stats.tokens += n
    return out

  def _take_replies(self) -> tuple[dict[int, list[int]], list[int]]:
    """The replies that came back: {slot: tokens to append}, and the slots whose rows they
    ended."""
    appends, ended = {}, []
    for j, s in enumerate(self.slots):
      if s is None or s.decoding or not s.turn.future.done():
        continue
      # Room for the reply and the next turn's first token.
      ids = self.replies.take(s.turn, self.options.max_new_tokens - s.turn.cut - 1)
      if ids is None:
        ended.append(j)
      else:
        appends[j], s.length = ids, s.turn.cut + len(ids) + 1
    return appends, ended

  def _append(self, appends: dict[int, list[int]]) -> None:
    """The replies `appends` into their rows' caches (one append program)."""
    n, r = self.num_slots, self.replies.reply_bucket
    take, cut, lengths = np.zeros(n, bool), np.ones(n, np.int32), np.zeros(n, np.int32)
    tokens = np.full((n, r), self.options.pad_id, np.int32)
    for j, ids in appends.items():
      take[j], cut[j], lengths[j] = True, self.slots[j].turn.cut, len(ids)
      tokens[j, :len(ids)] = ids
    rows = lambda x: jax.device_put(x, sharding.batch_sharding("searcher", self.mesh, x.ndim))
    self.state = programs.append_program(
        self.params, self.state, programs.Appends(rows(take), rows(cut), rows(tokens),
                                                  rows(lengths)),
        model_config=self.sampler.model_config, options=self.options, rules=self.rules)

  def _refill(self) -> None:
    free = [j for j, s in enumerate(self.slots) if s is None]
    rows = []  # (slot, prompt, (row id, temperature, problem))
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
    for slot, prompt, (row_id, temperature, problem) in rows:
      logits, batch, u = self.prefilled[prompt]
      by_batch.setdefault(id(batch), (batch, logits, []))[2].append(
          (slot, u, row_id, len(prompt), temperature))
      self._placed += 1
      self.slots[slot] = _Slot(row_id, prompt, temperature, self.version, self._placed,
                               TurnRow(problem) if self.replies else None)
    n = self.num_slots
    if self.pages is not None:  # the new rows' pages, before their prompts are written
      self.state = programs.paging_program(self.state, jnp.asarray(self.pages.table),
                                           np.zeros(n, bool))
    for batch, logits, placed in by_batch.values():
      vec = lambda k, dtype=np.int32: np.array([x[k] for x in placed] + [0] * (n - len(placed)),
                                               dtype)
      placement = programs.Placement(np.int32(len(placed)), vec(0), vec(1), vec(2), vec(3),
                                     vec(4, np.float32))
      self.state = programs.insert_program(self.state, batch, logits, self.key, placement,
                                           options=self.options, rules=self.rules)
    for prompt in {p for _, p, _ in rows} - set(self.queue):  # every sample placed
      del self.prefilled[prompt]
    self.stats.refills += 1
    self.stats.rows_started += len(rows)

  def _page(self) -> None:
    """Every row in flight has the pages of the slots its next chunk can write; where the
    pool runs short the newest rows give theirs back and return to the queue's front (their
    tokens depend on (key, row id) and their replies only: they sample again the same)."""
    live = sorted((j for j, s in enumerate(self.slots) if s is not None),
                  key=lambda j: self.slots[j].order)
    dropped = np.zeros((self.num_slots,), bool)
    for j in live:
      s = self.slots[j]
      if s is None:  # dropped below, for an older row
        continue
      need = min(self.cache_size, len(s.prompt) + s.length - 1 + self.chunk_steps)
      while self.slots[j] is not None and not self.pages.grow(j, need):
        newest = max((k for k in live if self.slots[k] is not None),
                     key=lambda k: self.slots[k].order)
        self._requeue(newest)
        dropped[newest] = True
    self.state = programs.paging_program(self.state, jnp.asarray(self.pages.table),
                                         jnp.asarray(dropped))

  def _requeue(self, j: int) -> None:
    s = self.slots[j]
    self.queue[s.prompt] = self.queue.pop(s.prompt, collections.deque())
    problem = None if s.turn is None else s.turn.problem
    self.queue[s.prompt].appendleft((s.row_id, s.temperature, problem))
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
    logits, batch = programs.prefill_program(self.params, rows(tokens), rows(mask),
                                             model_config=self.sampler.model_config,
                                             mesh=self.mesh)
    for i, p in enumerate(prompts):
      self.prefilled[p] = (logits, batch, i)
    self.stats.prefilled_prompts += len(prompts)


def drain(stream: Stream) -> dict[int, Completion]:
  """Steps `stream` until its queue and slots are empty: its completions by row id."""
  out = {}
  while stream.busy():
    out.update((c.row_id, c) for c in stream.step())
  return out


def rollouts(completions: Sequence[Completion],
             options: sampler_lib.SamplingOptions) -> sampler_lib.Rollouts:
  """The static sampler's Rollouts of `completions` (row i: completions[i])."""
  m = options.max_new_tokens
  floats = lambda name: np.array([np.pad(getattr(c, name), (0, m - len(c.tokens)))
                                  for c in completions], np.float32)
  lengths = np.array([len(c.tokens) for c in completions], np.int32)
  return sampler_lib.Rollouts(
      tokens=batch_lib.right_pad([c.tokens for c in completions], m, options.pad_id)[0],
      logprobs=floats("logprobs"), tempered_logprobs=floats("tempered_logprobs"),
      lengths=lengths, num_decode_steps=int(lengths.max()))


def generate(sampler: sampler_lib.Sampler, params, prompts: Sequence[Sequence[int]],
             rng_key, temperature: float | None = None, *, num_slots: int,
             chunk_steps: int = DEFAULT_CHUNK_STEPS, window_step: int = DEFAULT_WINDOW_STEP,
             kv_pages: int = 0, page_size: int = paged_kv.DEFAULT_PAGE_SIZE
             ) -> sampler_lib.Rollouts:
  """`sampler(params, prompts, rng_key, temperature)` through a pool of `num_slots` rows:
  the same Rollouts (row i is prompts[i], seeded by its index i)."""
  if not prompts:
    raise ValueError("no prompts")
  stream = Stream(sampler, params, rng_key, num_slots=num_slots,
                  max_prompt_len=max(map(len, prompts)), chunk_steps=chunk_steps,
                  window_step=window_step, kv_pages=kv_pages, page_size=page_size)
  stream.add(prompts, range(len(prompts)), temperature)
  done = drain(stream)
  return rollouts([done[i] for i in range(len(prompts))], sampler.options)
