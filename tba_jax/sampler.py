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
from tba_jax import model as model_lib
from tba_jax import sharding
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
  eos_ids: tuple[int, ...] = ()  # a row stops after emitting any of these
  pad_id: int = 0  # written after a row's EOS
  min_new_tokens: int = 0  # EOS ids are masked until this many tokens were sampled
  # The last of max_new_tokens is always eos_ids[0]: a row that reaches the limit ends with
  # an EOS, as if one were appended (red-teaming's attacks, GFNOrg/red-teaming).
  end_with_eos: bool = False

  def __post_init__(self):
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
# Core: token choice, prefill, decode loop.
# ---------------------------------------------------------------------------
_SIGN = np.uint32(0x80000000)


def _to_ordered(x: jax.Array) -> jax.Array:
  """float32 -> uint32 with the same order (for -inf and finite values)."""
  u = jax.lax.bitcast_convert_type(x, jnp.uint32)
  return jnp.where(u >= _SIGN, ~u, u | _SIGN)


def _from_ordered(o: jax.Array) -> jax.Array:
  return jax.lax.bitcast_convert_type(jnp.where(o >= _SIGN, o & ~_SIGN, ~o), jnp.float32)


def _nucleus_threshold(x: jax.Array, top_p: float) -> jax.Array:
  """[B,1]: per row the smallest logit t such that the logits strictly above t
  hold less than top_p of softmax(x); the nucleus is then x >= t.

  That is transformers' rule (walking down the sorted vocabulary, a token is
  kept while the mass before it is < top_p; ties stay together), found without
  a sort: a [B,V] sort costs ~30x more than this on CPU. Bisection over the
  float32 values in order-preserving uint32 form pins t exactly in 32 masked
  sums.
  """
  probs = jax.nn.softmax(x, axis=-1)
  mass_above = lambda t: jnp.sum(jnp.where(x > t, probs, 0.0), axis=-1, keepdims=True)
  # Invariant: mass_above(lo) >= top_p (all the mass is above -inf) and
  # mass_above(hi) < top_p (none is above the max).
  lo = jnp.full(x.shape[:-1] + (1,), _to_ordered(jnp.float32(-jnp.inf)))
  hi = _to_ordered(jnp.max(x, axis=-1, keepdims=True))

  def halve(_, bounds):
    lo, hi = bounds
    mid = lo + (hi - lo) // 2
    inside = mass_above(_from_ordered(mid)) < top_p
    return jnp.where(inside, lo, mid), jnp.where(inside, mid, hi)

  _, hi = jax.lax.fori_loop(0, 32, halve, (lo, hi))
  return _from_ordered(hi)


def _truncate(scaled: jax.Array, top_k: int, top_p: float) -> jax.Array:
  """scaled [B,V] with -inf outside the top-k, then top-p, kept set (ties kept)."""
  kept = scaled
  if 0 < top_k < scaled.shape[-1]:
    # The k-th largest value as a min: slicing top_k's last column instead makes
    # XLA:CPU fall back to a full sort (~100x slower).
    kth = jnp.min(jax.lax.top_k(scaled, top_k)[0], axis=-1, keepdims=True)
    kept = jnp.where(scaled >= kth, scaled, -jnp.inf)
  if top_p < 1.0:
    kept = jnp.where(kept >= _nucleus_threshold(kept, top_p), kept, -jnp.inf)
  return kept


def _draw(kept: jax.Array, keys: jax.Array) -> jax.Array:
  """One token per row from softmax(kept), by inverse CDF on one uniform from the
  row's key. Gumbel-max would need B * V draws and two logs each per step (~20
  ms at batch 32 x 49k vocab on CPU, 5x this). Exact up to float32 rounding of
  the running sum; tokens outside the kept set have zero width, never drawn."""
  probs = jnp.exp(kept - jnp.max(kept, axis=-1, keepdims=True))
  cdf = jnp.cumsum(probs, axis=-1)
  total = cdf[:, -1:]
  u = jax.vmap(jax.random.uniform)(keys)[:, None]
  token = jnp.sum(cdf <= u * total, axis=-1)
  # u * total may round up to total: then the last kept token is the draw.
  return jnp.minimum(token, jnp.argmax(cdf >= total, axis=-1)).astype(jnp.int32)


def _log_prob_of(x: jax.Array, token: jax.Array) -> jax.Array:
  """log_softmax(x)[b, token[b]] without materialising a [B,V] log_softmax."""
  picked = jnp.take_along_axis(x, token[:, None], axis=-1)[:, 0]
  return picked - jax.nn.logsumexp(x, axis=-1)


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
    logprob = _log_prob_of(logits, token)
    return token, logprob, logprob
  scaled = logits / (options.temperature if temperature is None
                     else jnp.reshape(temperature, (-1, 1)))
  kept = _truncate(scaled, options.top_k, options.top_p)
  token = _draw(kept, keys)
  tempered = _log_prob_of(scaled, token)
  truncated = 0 < options.top_k < logits.shape[-1] or options.top_p < 1.0
  logprob = _log_prob_of(kept, token) if truncated else tempered
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


def prefill(logits_fn: LogitsFn, params, prompt_tokens: jax.Array, prompt_mask: jax.Array,
            cache, key: jax.Array, row_ids: jax.Array, row_valid: jax.Array,
            options: SamplingOptions, temperature: jax.Array | float | None = None,
            source: jax.Array | None = None) -> SamplingState:
  """Run the left-padded prompts [B,T] through the model and sample the first token.

  `row_ids` [B] seed each row's random stream; rows with `row_valid` False
  (bucket padding) start done, so they never hold the loop open. `temperature`
  (None: options.temperature) holds for the whole call. `source` [B] (None: row b
  continues prompt b): row b continues prompt source[b] of the [U,T] prompts, so rows
  that share a prompt run it once; the cache must then offer `take_rows`.
  """
  b, n = row_ids.shape[0], options.max_new_tokens
  positions = model_lib.positions_from_mask(prompt_mask)
  logits, cache = logits_fn(params, prompt_tokens, positions, prompt_mask, cache)
  if source is not None:
    logits, prompt_tokens, positions = logits[source], prompt_tokens[source], positions[source]
    cache = cache.take_rows(source)
  state = SamplingState(
      step=jnp.zeros((), jnp.int32),
      tokens=jnp.full((b, n), options.pad_id, jnp.int32),
      logprobs=jnp.zeros((b, n), jnp.float32),
      tempered_logprobs=jnp.zeros((b, n), jnp.float32),
      lengths=jnp.zeros((b,), jnp.int32),
      done=~row_valid,
      last_token=prompt_tokens[:, -1],
      position=positions[:, -1],
      row_keys=jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, row_ids),
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
def _prefill_program(params, prompt_tokens, prompt_mask, key, row_ids, row_valid, temperature,
                     source, *, model_config, options, mesh):
  u, t = prompt_tokens.shape
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
  cache = place(model_lib.KVCache.init(model_config, u, t))
  state = prefill(model_logits_fn(model_config), params, prompt_tokens, prompt_mask, cache, key,
                  row_ids, row_valid, options, temperature, source)
  # Every sampled token but the last (never fed back) needs a slot.
  return dataclasses.replace(state, cache=place(state.cache.extend(options.max_new_tokens - 1)))


# The state (with its KV cache, the largest buffer) is donated: the loop
# updates it in place instead of holding a second copy.
@functools.partial(jax.jit, static_argnames=("model_config", "options"), donate_argnames=("state",))
def _decode_program(params, state, *, model_config, options):
  return decode(model_logits_fn(model_config), params, state, options)


class Sampler:
  """Batched generation for a searcher: compiles once per (batch, prompt) bucket.

  Prompt lengths are left-padded up to the next of `prompt_buckets`; batch
  sizes up to the next of `batch_buckets` rounded to a multiple of the mesh's
  "data" axis (padding rows are dropped from the outputs). `mesh` is a
  searcher mesh (sharding.make_mesh("searcher", devices, tensor)); None means
  the first device. Params go to `sharding.param_shardings(cfg, "searcher",
  mesh)` (no copy when they already live there), the batch over "data", the
  KV cache per `sharding.cache_sharding`. `length_buckets`: the completion widths
  of the searcher's teacher-forced scoring passes (batch.completion_width).
  `share_prompts`: rows with equal prompts prefill them once (a bucket of the distinct
  prompts) and copy the keys and values to each row; the tokens are those of the rows
  prefilled one by one (False: every row prefills, for comparison).
  """

  def __init__(self, model_config: ModelConfig, *, max_new_tokens: int, temperature: float = 1.0,
               top_k: int = 0, top_p: float = 1.0, greedy: bool = False,
               eos_ids: Sequence[int] | int | None = None, pad_id: int = 0, mesh=None,
               min_new_tokens: int = 0, end_with_eos: bool = False,
               prompt_buckets: Sequence[int] = DEFAULT_PROMPT_BUCKETS,
               batch_buckets: Sequence[int] = DEFAULT_BATCH_BUCKETS, length_buckets: int = 1,
               share_prompts: bool = True):
    if eos_ids is None:
      eos_ids = ()
    elif isinstance(eos_ids, (int, np.integer)):
      eos_ids = (eos_ids,)
    self.model_config = model_config
    self.options = SamplingOptions(
        max_new_tokens=max_new_tokens, temperature=float(temperature), top_k=int(top_k),
        top_p=float(top_p), greedy=bool(greedy), eos_ids=tuple(int(e) for e in eos_ids),
        pad_id=int(pad_id), min_new_tokens=int(min_new_tokens), end_with_eos=bool(end_with_eos))
    self.mesh = mesh if mesh is not None else sharding.make_mesh("searcher", jax.devices()[:1])
    data = sharding.batch_size_multiple("searcher", self.mesh)
    self.prompt_buckets = tuple(sorted(prompt_buckets))
    self.batch_buckets = tuple(sorted({-(-b // data) * data for b in batch_buckets}))
    self.length_buckets = length_buckets
    self.share_prompts = share_prompts
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
    state = _prefill_program(
        params, rows(tokens), rows(mask), jax.device_put(rng_key, sharding.replicated(self.mesh)),
        rows(np.arange(b, dtype=np.int32)), rows(row_valid),
        jax.device_put(np.float32(temperature), sharding.replicated(self.mesh)),
        None if source is None else rows(source),
        model_config=self.model_config, options=self.options, mesh=self.mesh)
    state = _decode_program(params, state, model_config=self.model_config, options=self.options)
    # The one host sync of a call: fetch the outputs, drop the padding rows.
    out = jax.device_get((state.tokens, state.logprobs, state.tempered_logprobs, state.lengths,
                          state.step))
    return Rollouts(tokens=out[0][:n], logprobs=out[1][:n], tempered_logprobs=out[2][:n],
                    lengths=out[3][:n], num_decode_steps=int(out[4]))


def generate(model_config: ModelConfig, params: Params, prompts: Sequence[Sequence[int]], *,
             max_new_tokens: int, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
             greedy: bool = False, eos_ids: Sequence[int] | int | None = None, pad_id: int = 0,
             seed: int = 0, mesh=None, min_new_tokens: int = 0,
             end_with_eos: bool = False) -> Rollouts:
  """Completions of `prompts` (lists of token ids, different lengths allowed).

  See `Rollouts` for the outputs and `Sampler` for buckets and placement
  (continuous.generate: the same outputs with at most N rows in flight).
  eos_ids=None never stops early. Compiled programs are cached across calls.
  """
  sampler = Sampler(model_config, max_new_tokens=max_new_tokens, temperature=temperature,
                    top_k=top_k, top_p=top_p, greedy=greedy, eos_ids=eos_ids, pad_id=pad_id,
                    mesh=mesh, min_new_tokens=min_new_tokens, end_with_eos=end_with_eos)
  return sampler(params, prompts, jax.random.key(seed))
