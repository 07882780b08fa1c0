"""KV-cache sampling: prefill a left-padded prompt batch, then decode in a while_loop.

Two layers:
  core   `prefill` / `decode` over a `SamplingState`. They know the model only
         through a logits function
             logits_fn(params, tokens [B,T], positions [B,T], token_mask [B,T], cache)
               -> (float32 logits [B,V] of the LAST position, cache)
         and treat the cache as an opaque pytree, so their tests can use a fake
         model. One decode iteration feeds the last sampled token and samples
         the next; the loop stops after `max_new_tokens` tokens or as soon as
         every row has emitted an EOS id.
  shell  `Sampler` (buckets, mesh placement, one compiled prefill + decode per
         (batch bucket, prompt bucket)) and `generate`, a one-call wrapper.
Continuous batching (tba_jax/continuous.py) builds on this module: a caller that
wants it builds a `continuous.Stream` over a Sampler itself.

Randomness is drawn per row from fold_in(fold_in(key, row id), step), so a row's
tokens depend on (seed, its index in `prompts`, step) only: not on the batch
bucket, the padding rows or how the batch is sharded over devices.

The sampling temperature is a traced argument (one compiled program serves every
temperature: a searcher that explores with a temperature drawn per batch never
recompiles); `SamplingOptions.temperature` is only its default.

Axis legend: B batch, U distinct prompts, T prompt length (bucketed), S cache slots, V vocab,
N max_new_tokens.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from tba_jax import batch as batch_lib
from tba_jax import categorical
from tba_jax import model as model_lib
from tba_jax import sharding
from tba_jax.kv_cache import KVCache
from tba_jax.model import ModelConfig, Params

LogitsFn = Callable[..., tuple[jax.Array, Any]]

# Left padding up to a bucket is prefill compute spent on nothing, so prompt
# buckets are fine-grained (at most ~25% waste from 128 tokens on); each is one
# more compile only when a prompt of that length shows up.
DEFAULT_PROMPT_BUCKETS = (16, 32, 64, 96, 128, 160, 192, 224, 256, 320, 384, 448, 512, 640, 768,
                          896, 1024, 1280, 1536, 1792, 2048, 2560, 3072, 3584, 4096, 6144, 8192)
DEFAULT_BATCH_BUCKETS = tuple(2 ** i for i in range(0, 11))  # 1 .. 1024 rows


@dataclasses.dataclass(frozen=True)
class SamplingOptions:
  """How to pick tokens (hashable: a static argument of the jitted programs)."""
  max_new_tokens: int
  temperature: float = 1.0
  top_k: int = 0  # 0: no top-k truncation
  top_p: float = 1.0  # 1.0: no nucleus truncation
  greedy: bool = False  # argmax; temperature / top_k / top_p are then ignored
  # A row stops after emitting any of these (given as a tuple, a list, one id or None).
  eos_ids: tuple[int, ...] = ()
  pad_id: int = 0  # written after a row's EOS
  min_new_tokens: int = 0  # EOS ids are masked until this many tokens were sampled
  # The last of max_new_tokens is always eos_ids[0]: a row that reaches the limit ends with
  # an EOS, as if one were appended (red-teaming's attacks, GFNOrg/red-teaming).
  end_with_eos: bool = False

  def __post_init__(self):
    # The options key the compiled programs: hashable, one form per value whatever the caller
    # passed (a tokenizer's list of EOS ids, an int temperature).
    eos = self.eos_ids
    eos = () if eos is None else (eos,) if isinstance(eos, (int, np.integer)) else eos
    object.__setattr__(self, "eos_ids", tuple(int(e) for e in eos))
    object.__setattr__(self, "temperature", float(self.temperature))
    object.__setattr__(self, "top_p", float(self.top_p))
    if self.max_new_tokens < 1:
      raise ValueError(f"max_new_tokens={self.max_new_tokens} must be >= 1")
    if not self.greedy and not self.temperature > 0:
      raise ValueError(f"temperature={self.temperature} must be > 0 (use greedy=True for argmax)")
    if self.top_k < 0:
      raise ValueError(f"top_k={self.top_k} must be >= 0 (0 disables it)")
    if not 0 < self.top_p <= 1:
      raise ValueError(f"top_p={self.top_p} must be in (0, 1]")
    if self.min_new_tokens < 0:
      raise ValueError(f"min_new_tokens={self.min_new_tokens} must be >= 0")
    if self.end_with_eos and not self.eos_ids:
      raise ValueError("end_with_eos needs an EOS id")
    if self.end_with_eos and self.min_new_tokens >= self.max_new_tokens:
      raise ValueError(f"min_new_tokens={self.min_new_tokens} leaves no column for the EOS that "
                       f"end_with_eos puts last (max_new_tokens={self.max_new_tokens})")


@dataclasses.dataclass(frozen=True)
class Buckets:
  """The shapes a `Sampler` compiles for: one prefill and one decode program per (batch,
  prompt) bucket. Prompts are left-padded up to the next of `prompt`, batches filled up to
  the next of `batch` (rounded to a multiple of the mesh's "data" axis); `length`: how many
  completion widths the searcher's teacher-forced scoring passes are cut to
  (batch.completion_width; 1: max_new_tokens only)."""
  prompt: tuple[int, ...] = DEFAULT_PROMPT_BUCKETS
  batch: tuple[int, ...] = DEFAULT_BATCH_BUCKETS
  length: int = 1


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class PrefillBatch:
  """What `prefill` starts from: U left-padded prompts and the B rows that continue them."""
  tokens: jax.Array     # [U,T] int32 prompt ids, pad on the left
  mask: jax.Array       # [U,T] int32, 1 on the prompts' tokens
  row_ids: jax.Array    # [B] int32: seed each row's random stream
  row_valid: jax.Array  # [B] bool: False for the bucket's padding rows (they start done)
  # [B] int32: row b continues prompt source[b], so rows that share a prompt run it once
  # (the cache must then offer `take_rows`); None: U = B, row b continues prompt b.
  source: jax.Array | None = None


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class SamplingState:
  """The while_loop carry. Row b's next input is `last_token[b]` at `position[b]`."""
  step: jax.Array  # int32 scalar: tokens sampled so far (column of the next one)
  tokens: jax.Array  # [B,N] int32, pad_id after EOS and in unsampled columns
  logprobs: jax.Array  # [B,N] float32, under the truncated distribution
  tempered_logprobs: jax.Array  # [B,N] float32, log_softmax(logits / T)
  lengths: jax.Array  # [B] int32: tokens emitted, EOS included
  done: jax.Array  # [B] bool: emitted EOS (or a padding row of the bucket)
  last_token: jax.Array  # [B] int32
  position: jax.Array  # [B] int32: position id of last_token
  row_keys: jax.Array  # [B] typed PRNG keys, one stream per row
  temperature: jax.Array  # float32 scalar: the sampling temperature of this call
  cache: Any  # the model's cache pytree, threaded through opaquely


@dataclasses.dataclass(frozen=True)
class Rollouts:
  """Completions, one row per prompt in input order (host numpy arrays).

  tokens             [B, max_new_tokens] int32: sampled ids; pad_id after EOS.
  logprobs           [B, max_new_tokens] float32: log-prob of each sampled token
                     under the distribution it was actually drawn from, i.e.
                     log_softmax(logits / T) restricted to the top-k / top-p
                     kept set and renormalised over it. Without truncation it
                     equals tempered_logprobs. 0 on padding.
  tempered_logprobs  [B, max_new_tokens] float32: log_softmax(logits / T) of the
                     sampled token, never truncated (what the TB loss uses). 0 on
                     padding.
  lengths            [B] int32: tokens generated per row, EOS included.
  num_decode_steps   tokens sampled per row before the loop ended (the prefill's
                     token plus one per while_loop iteration): max_new_tokens,
                     or less when every row stopped early (= max(lengths) then).
  Greedy decoding takes the argmax; both log-prob fields are then
  log_softmax(logits) at temperature 1 (the point mass actually "sampled from"
  would give an uninformative 0). With `min_new_tokens` / `end_with_eos` the
  logits are those with the masked tokens at -inf (the distribution sampled from).
  """
  tokens: np.ndarray
  logprobs: np.ndarray
  tempered_logprobs: np.ndarray
  lengths: np.ndarray
  num_decode_steps: int


# ---------------------------------------------------------------------------
# Core: token choice (the draw itself: categorical.py), prefill, decode loop.
# ---------------------------------------------------------------------------
def mask_eos(logits: jax.Array, step: jax.Array, options: SamplingOptions) -> jax.Array:
  """logits [B,V] of column `step` (a scalar, or [B]) with EOS ids at -inf before
  `min_new_tokens`, and everything but eos_ids[0] at -inf in the last column when
  `end_with_eos`."""
  if not options.eos_ids or not (options.min_new_tokens or options.end_with_eos):
    return logits
  vocab = jnp.arange(logits.shape[-1])
  step = jnp.reshape(step, (-1, 1))  # one step for all rows, or one per row [B]
  if options.min_new_tokens:
    eos = jnp.isin(vocab, jnp.asarray(options.eos_ids, jnp.int32))
    logits = jnp.where(eos & (step < options.min_new_tokens), -jnp.inf, logits)
  if options.end_with_eos:
    last = step == options.max_new_tokens - 1
    logits = jnp.where(last & (vocab != options.eos_ids[0]), -jnp.inf, logits)
  return logits


def choose_tokens(logits: jax.Array, keys: jax.Array, options: SamplingOptions,
                  temperature: jax.Array | float | None = None):
  """(token [B] int32, logprob [B], tempered_logprob [B]) from float32 logits [B,V].

  `temperature`: a traced scalar or one per row [B] (None: options.temperature)."""
  if options.greedy:
    token = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    logprob = categorical.log_prob_of(logits, token)
    return token, logprob, logprob
  scaled = logits / (options.temperature if temperature is None
                     else jnp.reshape(temperature, (-1, 1)))
  kept = categorical.truncate(scaled, options.top_k, options.top_p)
  token = categorical.draw(kept, keys)
  tempered = categorical.log_prob_of(scaled, token)
  truncated = 0 < options.top_k < logits.shape[-1] or options.top_p < 1.0
  logprob = categorical.log_prob_of(kept, token) if truncated else tempered
  return token, logprob, tempered


def _record(state: SamplingState, logits: jax.Array, options: SamplingOptions) -> SamplingState:
  """Sample column `state.step` from `logits` [B,V] and append it."""
  keys = jax.vmap(jax.random.fold_in, in_axes=(0, None))(state.row_keys, state.step)
  logits = mask_eos(logits, state.step, options)
  token, logprob, tempered = choose_tokens(logits, keys, options, state.temperature)
  live = ~state.done
  token = jnp.where(live, token, options.pad_id)
  column = lambda buf, x: jax.lax.dynamic_update_slice_in_dim(buf, x[:, None], state.step, axis=1)
  hit_eos = jnp.isin(token, jnp.asarray(options.eos_ids, jnp.int32)) if options.eos_ids else False
  return dataclasses.replace(
      state,
      step=state.step + 1,
      tokens=column(state.tokens, token),
      logprobs=column(state.logprobs, jnp.where(live, logprob, 0.0)),
      tempered_logprobs=column(state.tempered_logprobs, jnp.where(live, tempered, 0.0)),
      lengths=state.lengths + live.astype(jnp.int32),
      done=state.done | (live & hit_eos),
      last_token=token,
      position=state.position + 1)


def prefill(logits_fn: LogitsFn, params, batch: PrefillBatch, cache, key: jax.Array,
            options: SamplingOptions,
            temperature: jax.Array | float | None = None) -> SamplingState:
  """Run the batch's prompts through the model and sample each row's first token.

  Rows with `row_valid` False start done, so they never hold the loop open.
  `temperature` (None: options.temperature) holds for the whole call.
  """
  b, n, source = batch.row_ids.shape[0], options.max_new_tokens, batch.source
  prompt_tokens, positions = batch.tokens, model_lib.positions_from_mask(batch.mask)
  logits, cache = logits_fn(params, prompt_tokens, positions, batch.mask, cache)
  if source is not None:
    logits, prompt_tokens, positions = logits[source], prompt_tokens[source], positions[source]
    cache = cache.take_rows(source)
  state = SamplingState(
      step=jnp.zeros((), jnp.int32),
      tokens=jnp.full((b, n), options.pad_id, jnp.int32),
      logprobs=jnp.zeros((b, n), jnp.float32),
      tempered_logprobs=jnp.zeros((b, n), jnp.float32),
      lengths=jnp.zeros((b,), jnp.int32),
      done=~batch.row_valid,
      last_token=prompt_tokens[:, -1],
      position=positions[:, -1],
      row_keys=jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, batch.row_ids),
      temperature=jnp.asarray(options.temperature if temperature is None else temperature,
                              jnp.float32),
      cache=cache)
  return _record(state, logits, options)


def decode(logits_fn: LogitsFn, params, state: SamplingState,
           options: SamplingOptions) -> SamplingState:
  """Sample until `max_new_tokens` columns are filled or every row is done."""

  def cond(s):
    # A cross-row reduction per step (a small all-reduce over the data axis).
    return (s.step < options.max_new_tokens) & ~jnp.all(s.done)

  def body(s):
    # Finished rows still run (static shapes) but their slot is marked invalid.
    logits, cache = logits_fn(params, s.last_token[:, None], s.position[:, None],
                              (~s.done)[:, None].astype(jnp.int32), s.cache)
    return _record(dataclasses.replace(s, cache=cache), logits, options)

  return jax.lax.while_loop(cond, body, state)


# ---------------------------------------------------------------------------
# Shell: the model's logits function, jitted programs, buckets and placement.
# ---------------------------------------------------------------------------
def model_logits_fn(model_config: ModelConfig) -> LogitsFn:
  """The LogitsFn of tba_jax.model: the training forward, cached."""

  def logits_fn(params, tokens, positions, token_mask, cache):
    hidden, cache = model_lib.forward(model_config, params, tokens, positions, token_mask, cache)
    # Only the last position is sampled from; unembedding all T prompt
    # positions would cost T times a [D,V] matmul per row for nothing.
    return model_lib.unembed(model_config, params, hidden[:, -1]), cache

  return logits_fn


@functools.partial(jax.jit, static_argnames=("model_config", "options", "mesh"))
def prefill_program(params, batch: PrefillBatch, key, temperature, *, model_config, options,
                    mesh):
  """The prompts prefilled and the first tokens sampled: a `DecodeState` whose cache has a
  slot for every token still to be sampled."""
  u, t = batch.tokens.shape
  kv_sharding = sharding.cache_sharding(model_config, mesh)
  mask_sharding = sharding.batch_sharding("searcher", mesh)

  def place(cache):
    return dataclasses.replace(
        cache, k=jax.lax.with_sharding_constraint(cache.k, kv_sharding),
        v=jax.lax.with_sharding_constraint(cache.v, kv_sharding),
        mask=jax.lax.with_sharding_constraint(cache.mask, mask_sharding))

  # The prompt is prefilled into a cache of exactly T slots, so its attention
  # spans T keys rather than all T + N - 1; the slots for sampled tokens are
  # appended afterwards (one copy of the cache, cheap next to the prefill).
  cache = place(KVCache.init(model_config, u, t))
  state = prefill(model_logits_fn(model_config), params, batch, cache, key, options, temperature)
  # Every sampled token but the last (never fed back) needs a slot.
  return dataclasses.replace(state, cache=place(state.cache.extend(options.max_new_tokens - 1)))


# The state (with its KV cache, the largest buffer) is donated: the loop
# updates it in place instead of holding a second copy. The layers are unstacked once a
# call, outside the loop, so that no step copies weight slices (model.decode_layout).
@functools.partial(jax.jit, static_argnames=("model_config", "options"), donate_argnames=("state",))
def decode_program(params, state, *, model_config, options):
  """Decodes `state` to `options.max_new_tokens`: the static sampler's loop, one index for
  all rows."""
  return decode(model_logits_fn(model_config), model_lib.decode_layout(params), state, options)


class Sampler:
  """Batched generation for a searcher: decodes with `options`, compiles once per
  (batch, prompt) bucket of `buckets`, dropping the padding rows from the outputs.

  `mesh` is a searcher mesh (sharding.make_mesh("searcher", devices, tensor)); None
  means the first device. Params go to `sharding.param_shardings(cfg, "searcher",
  mesh)` (no copy when they already live there), the batch over "data", the KV cache
  per `sharding.cache_sharding`. `share_prompts`: rows with equal prompts prefill them
  once (a bucket of the distinct prompts) and copy the keys and values to each row; the
  tokens are those of the rows prefilled one by one (False: every row prefills, for
  comparison).
  """

  def __init__(self, model_config: ModelConfig, options: SamplingOptions, *, mesh=None,
               buckets: Buckets = Buckets(), share_prompts: bool = True):
    self.model_config, self.options, self.share_prompts = model_config, options, share_prompts
    self.mesh = mesh if mesh is not None else sharding.make_mesh("searcher", jax.devices()[:1])
    data = sharding.batch_size_multiple("searcher", self.mesh)
    self.prompt_buckets = tuple(sorted(buckets.prompt))
    self.batch_buckets = tuple(sorted({-(-b // data) * data for b in buckets.batch}))
    self.length_buckets = buckets.length
    self.param_shardings = sharding.param_shardings(model_config, "searcher", self.mesh)

  def __call__(self, params: Params, prompts: Sequence[Sequence[int]], rng_key,
               temperature: float | None = None) -> Rollouts:
    """Completions of `prompts` (token-id lists, any lengths >= 1); `rng_key` a jax key.

    `temperature` (None: the sampler's) is traced: any value reuses the compiled programs.
    """
    temperature = self.options.temperature if temperature is None else float(temperature)
    if not self.options.greedy and not temperature > 0:
      raise ValueError(f"temperature={temperature} must be > 0")
    if not prompts:
      raise ValueError("no prompts")
    if any(len(p) == 0 for p in prompts):
      raise ValueError("every prompt needs at least one token")
    n = len(prompts)
    b = batch_lib.bucket(n, self.batch_buckets, "batch size")
    t = batch_lib.bucket(max(len(p) for p in prompts), self.prompt_buckets, "prompt length")
    # Rows with the same prompt (a searcher's samples of one question) prefill it once.
    unique: dict[tuple, int] = {}
    of_row = [unique.setdefault(tuple(p), len(unique)) for p in prompts]
    source, u = None, b
    if self.share_prompts and len(unique) < n:
      source = np.asarray(of_row + [0] * (b - n), np.int32)
      prompts, u = list(unique), batch_lib.bucket(len(unique), self.batch_buckets, "batch size")
    # Host-side left padding into the bucket shape; padding rows are pad tokens, masked.
    tokens, mask = batch_lib.left_pad(prompts, t, self.options.pad_id, num_rows=u)
    row_valid = np.arange(b) < n
    if not jax.dtypes.issubdtype(jnp.asarray(rng_key).dtype, jax.dtypes.prng_key):
      rng_key = jax.random.wrap_key_data(rng_key)

    params = jax.device_put(params, self.param_shardings)
    rows = lambda x: jax.device_put(x, sharding.batch_sharding("searcher", self.mesh, x.ndim))
    batch = PrefillBatch(rows(tokens), rows(mask), rows(np.arange(b, dtype=np.int32)),
                         rows(row_valid), None if source is None else rows(source))
    replicated = lambda x: jax.device_put(x, sharding.replicated(self.mesh))
    state = prefill_program(params, batch, replicated(rng_key),
                            replicated(np.float32(temperature)), model_config=self.model_config,
                            options=self.options, mesh=self.mesh)
    state = decode_program(params, state, model_config=self.model_config, options=self.options)
    # The one host sync of a call: fetch the outputs, drop the padding rows.
    out = jax.device_get((state.tokens, state.logprobs, state.tempered_logprobs, state.lengths,
                          state.step))
    return Rollouts(tokens=out[0][:n], logprobs=out[1][:n], tempered_logprobs=out[2][:n],
                    lengths=out[3][:n], num_decode_steps=int(out[4]))


def generate(model_config: ModelConfig, params: Params, prompts: Sequence[Sequence[int]],
             options: SamplingOptions, *, seed: int = 0, mesh=None) -> Rollouts:
  """Completions of `prompts` (lists of token ids, different lengths allowed).

  See `Rollouts` for the outputs and `Sampler` for buckets and placement
  (continuous.generate: the same outputs with at most N rows in flight).
  No eos_ids: never stops early. Compiled programs are cached across calls.
  """
  return Sampler(model_config, options, mesh=mesh)(params, prompts, jax.random.key(seed))
