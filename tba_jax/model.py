"""Decoder-only transformer: Llama 1/2/3.x, TinyLlama/RhoMath, SmolLM2, Mistral,
Qwen2/2.5, Qwen3, Gemma 3, GPT-NeoX (Pythia) and GPT-2, with an LM head or a
sequence-classification head (reward models); `scores` and `embed` also dispatch to
the encoders (encoder.py).

One implementation, matching Hugging Face transformers to float32 round-off; the
architectures differ only by ModelConfig switches: RMSNorm or LayerNorm, rotary
embeddings in the rotate-half convention (llama3 / linear scaling; on a leading
fraction of each head for GPT-NeoX) or learned absolute positions (GPT-2),
grouped-query attention, optional biases, SwiGLU or plain GELU MLP, sequential or
parallel residual (GPT-NeoX), tied or untied output embedding, and Gemma 3's /
Qwen3's additions: a per-head norm on q and k, norms on the attention and MLP
outputs, a scaled embedding, Gemma's (1 + w) RMSNorm, an attention scale, a logit
softcap and sliding-window layers (their mask and rope base chosen per layer inside
the layer scan, so the stacked layers stay one compiled body). With a
`Dropout` (the training forward only; model.dropout), GPT-2's three dropouts on
every architecture: the embeddings' output, the attention probabilities, and
each attention and MLP output before its residual add. With `cfg.lora`, the
targeted projections also carry low-rank adapters beside the frozen weights, so the
trainer's gradient is only the adapters'. One layer (attention, MLP, norms, adapters)
is blocks.py's `Block`; this file stacks them, embeds, and reads the heads.

The training forward and the cached decode step are one code path: a forward over T
new tokens writes their keys/values into a KVCache (kv_cache.py: slots, index, mask)
and attends causally by slot over its valid slots; without a cache the buffer is just
the T new tokens. A sliding layer's query at slot q also drops slots at or before
q - window (transformers' kv > q - window: it sees itself and window - 1 earlier tokens).

Layers are stacked along a leading axis and run with `nnx.scan` (one compiled
layer body, fast compiles for 30-layer models). Parameters travel as plain
nested dicts (`nnx.merge(graphdef, params)` inside jitted bodies), so weight
sync, checkpoints and resharding are ordinary pytree operations.

Einsum axis legend:
  B batch, T query length, S key/value length (cache slots), N query heads,
  K key/value heads, G query heads per kv head (N = K * G), H head dim,
  D model dim, F mlp dim, V vocab, C labels, L layers, R LoRA rank.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from tba_jax import encoder as encoder_lib
from tba_jax.blocks import Block, norm
from tba_jax.kv_cache import KVCache
from tba_jax.layers import Dropout, dropped, mean_pool_normalized, param, rope_inv_freq
from tba_jax.logprobs import token_logprobs
from tba_jax.model_config import EncoderConfig, LoRAConfig, ModelConfig, RopeScaling  # noqa: F401 (re-exported)

Params = dict[str, Any]


# ---------------------------------------------------------------------------
# The decoder: embeddings, the scanned layers (blocks.py), the heads.
# ---------------------------------------------------------------------------
class Transformer(nnx.Module):

  def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
    self.cfg = cfg
    self.embed = param(rngs, (cfg.vocab_size, cfg.dim), cfg.jnp_dtype)
    if cfg.position_embedding == "learned":
      self.pos_embed = param(rngs, (cfg.max_position_embeddings, cfg.dim), cfg.jnp_dtype)

    @nnx.split_rngs(splits=cfg.num_layers)
    @nnx.vmap(in_axes=(0,), out_axes=0)
    def make_layers(rngs):
      return Block(cfg, rngs)

    self.layers = make_layers(rngs)
    self.final_norm = norm(cfg, rngs)
    if cfg.num_labels:  # a sequence-classification model has no LM head
      self.score = param(rngs, (cfg.dim, cfg.num_labels), cfg.jnp_dtype, fan_in=cfg.dim)
    elif not cfg.tie_embeddings:
      self.lm_head = param(rngs, (cfg.dim, cfg.vocab_size), cfg.jnp_dtype, fan_in=cfg.dim)

  def __call__(self, tokens, positions, token_mask, cache: KVCache | None = None,
               remat: bool = False, dropout: Dropout | None = None,
               blocks: tuple[Block, ...] | None = None):
    """Hidden states [B,T,D] after the final norm, and the updated cache.

    tokens, positions [B,T] int; token_mask [B,T] (1 = real token). With a cache,
    the T tokens occupy slots [cache.index, cache.index + T). `dropout`: the
    module docstring's (None: none, and no operation added). `blocks`: the layers
    one module each (decode_layout's), run one after another instead of self.layers'
    scan.
    """
    t = tokens.shape[1]
    if cache is None:
      index, kv_mask, window = 0, token_mask.astype(bool), t
    else:
      index, window = cache.index, cache.window or cache.mask.shape[1]
      kv_mask = cache.write_mask(token_mask)
    # Query t of row b sits at slot index (+ its row's offset) + t and sees
    # valid slots up to its own. It always sees itself (when inside the
    # window), so padding rows never softmax over an empty set.
    q_slot = jnp.reshape(index, (-1, 1, 1)) + jnp.arange(t)[:, None]  # [1 or B, T, 1]
    k_slot = jnp.arange(window)
    mask = ((k_slot <= q_slot) & kv_mask[:, None, :window]) | (k_slot == q_slot)

    cfg = self.cfg
    x = self.embed[...][tokens]
    if cfg.embed_scale:  # sqrt(D) rounded to the model dtype first, as transformers' Gemma
      x = x * np.float32(math.sqrt(cfg.dim)).astype(x.dtype)
    if cfg.position_embedding == "learned":
      x = x + self.pos_embed[...][positions]
    x = dropped(x, dropout, 0)  # GPT-2's embd_pdrop
    inv_freq = rope_inv_freq(cfg) if cfg.position_embedding == "rope" else None

    def layer(carry, block, key, *per_layer):  # key: this layer's dropout key, or None
      x, kv = carry
      m, f = mask, inv_freq
      if per_layer:  # this layer's mask and rope (sliding / global)
        [per] = per_layer
        m = jnp.where(per["sliding"], mask & (k_slot > q_slot - cfg.sliding_window), mask)
        f = None if inv_freq is None else per["inv_freq"]
      x, kv = block(x, positions, m, kv, index, f, None if key is None else dropout.at(key),
                    kv_mask[:, :window])
      if kv is not None:
        kv = (kv[0], kv[1], kv[2] + 1, kv[3])  # the next layer's index
      return x, kv

    if remat:
      layer = nnx.remat(layer)
    kv = None if cache is None else (cache.k, cache.v, jnp.zeros((), jnp.int32), cache.page_table)
    keys = None if dropout is None else dropout.layer_keys(cfg.num_layers)
    per_layer = _per_layer_attention(cfg) if cfg.sliding_layers else None
    if blocks is not None:
      # Each layer's weights are arrays of their own, read in place by its matmuls; the
      # scan's body would first copy its layer's slice out of every stacked weight.
      for i, block in enumerate(blocks):
        per = () if per_layer is None else (jax.tree.map(lambda a: a[i], per_layer),)
        x, kv = layer((x, kv), block, None if keys is None else keys[i], *per)
        # Each layer's output materialised, as the scan's carry is: otherwise XLA fuses
        # across layers and skips roundings to bfloat16 (excess precision), and the
        # decode layout's tokens would differ from the stacked forward's.
        x = jax.lax.optimization_barrier(x)
    else:
      xs, in_axes = (self.layers, keys), (nnx.Carry, 0, 0)
      if per_layer is not None:
        xs, in_axes = (*xs, per_layer), (*in_axes, 0)
      x, kv = nnx.scan(layer, in_axes=in_axes, out_axes=nnx.Carry)((x, kv), *xs)
    if cache is not None:
      cache = dataclasses.replace(cache, k=kv[0], v=kv[1], mask=kv_mask, index=index + t)
    return self.final_norm(x), cache

  def unembed(self, hidden):
    """Float32 logits [..., V] from final hidden states."""
    if self.cfg.num_labels:
      raise ValueError(f"this {self.cfg.model_type} checkpoint is a sequence-classification "
                       f"model (num_labels={self.cfg.num_labels}) without an LM head: use "
                       "model.scores, not logits or the sampler")
    if self.cfg.tie_embeddings:
      out = jnp.einsum("...D,VD->...V", hidden, self.embed[...], preferred_element_type=jnp.float32)
    else:
      out = jnp.einsum("...D,DV->...V", hidden, self.lm_head[...],
                       preferred_element_type=jnp.float32)
    c = self.cfg.final_logit_softcap
    return out if c is None else c * jnp.tanh(out / c)

  def classify(self, hidden, read_mask):
    """Float32 scores [B,C] read at each row's rightmost token with read_mask
    [B,T] = 1 (index 0 when none), found the way transformers'
    ...ForSequenceClassification finds its last non-pad token."""
    last = jnp.argmax(jnp.arange(hidden.shape[1]) * read_mask, axis=-1)
    h = jnp.take_along_axis(hidden, last[:, None, None], axis=1)[:, 0]  # [B,D]
    return jnp.einsum("BD,DC->BC", h, self.score[...], preferred_element_type=jnp.float32)


def _per_layer_attention(cfg: ModelConfig) -> dict:
  """What differs between sliding and global layers, stacked [L, ...] for the layer
  scan: whether the layer slides, and its rotary frequencies [L, rotary_dim / 2]."""
  sliding = np.isin(np.arange(cfg.num_layers), cfg.sliding_layers)
  out = {"sliding": jnp.asarray(sliding)}
  if cfg.position_embedding == "rope":
    out["inv_freq"] = jnp.asarray(np.stack([rope_inv_freq(cfg, local=s) for s in sliding]))
  return out


# ---------------------------------------------------------------------------
# Functional API over plain parameter dicts.
# ---------------------------------------------------------------------------
def _module(cfg: ModelConfig | EncoderConfig, seed: int):
  return (encoder_lib.Encoder if isinstance(cfg, EncoderConfig) else Transformer)(
      cfg, rngs=nnx.Rngs(seed))


@functools.lru_cache(maxsize=None)
def _graphdef_and_shapes(cfg: ModelConfig | EncoderConfig):
  graphdef, state = nnx.split(nnx.eval_shape(lambda: _module(cfg, 0)))
  return graphdef, nnx.to_pure_dict(state)


def bind(cfg: ModelConfig | EncoderConfig, params: Params):
  """The module for `params` (call inside jitted functions). With decode_layout's params
  its stacked layers are placeholders (shapes only): `forward` runs their blocks."""
  if isinstance(params.get("layers"), tuple):
    params = {**params, "layers": param_shapes(cfg)["layers"]}
  return nnx.merge(_graphdef_and_shapes(cfg)[0], params)


@functools.lru_cache(maxsize=None)
def _block_graphdef(cfg: ModelConfig):
  return nnx.split(nnx.eval_shape(lambda: Block(cfg, nnx.Rngs(0), own_weights=True)))[0]


def decode_layout(params: Params) -> Params:
  """The searcher's decode layout of a decoder's `params`: the same tree but for the stacked
  layers [L, ...], split into a tuple of L per-layer trees (a copy of the layer weights).

  A decode step reads every weight once for one token a row, so how it reads them is its
  cost: the layer scan's body first copies its layer's slice out of each stacked weight
  (XLA:CPU always, XLA:GPU before Triton gemms: 243 of a step's 680 kernels on an H200),
  while a layer's own arrays are read in place. `forward` runs these layers one after
  another (one compiled body per layer: for the one-token decode step only, where the
  scan's compile-time saving matters least). The trainer's params, checkpoints and
  sharding rules keep the stacked layout; the decode programs build this once per call,
  outside their loops. Same arithmetic: the same bits on XLA:CPU in float32 and bfloat16
  (tests/decode_ops_test.py), but for q/k/v biases in float32, whose decode log-probs
  moved by round-off (1.7e-6 in a 3-layer test model; tokens the same).
  """
  layers = params["layers"]
  num_layers = jax.tree.leaves(layers)[0].shape[0]
  return {**params, "layers": tuple(jax.tree.map(lambda x, i=i: x[i], layers)
                                    for i in range(num_layers))}


def param_shapes(cfg: ModelConfig | EncoderConfig) -> Params:
  """ShapeDtypeStructs of all parameters, without allocating anything."""
  return _graphdef_and_shapes(cfg)[1]


def count_params(cfg: ModelConfig | EncoderConfig) -> int:
  return sum(math.prod(x.shape) for x in jax.tree.leaves(param_shapes(cfg)))


def init_params(cfg: ModelConfig | EncoderConfig, seed: int = 0, shardings=None) -> Params:
  """Random parameters, created directly in `shardings` (a matching pytree)."""
  init = lambda: nnx.to_pure_dict(nnx.split(_module(cfg, seed))[1])
  return jax.jit(init, out_shardings=shardings)()


def positions_from_mask(attention_mask: jax.Array) -> jax.Array:
  """Position ids for a left-padded batch: 0 at the first real token."""
  return jnp.maximum(jnp.cumsum(attention_mask, axis=-1) - 1, 0).astype(jnp.int32)


def forward(cfg: ModelConfig, params: Params, tokens, positions, token_mask,
            cache: KVCache | None = None, remat: bool = False, dropout: Dropout | None = None):
  """(hidden [B,T,D], cache) — the shared training/decoding forward (`params` stacked, or
  in decode_layout)."""
  blocks = None
  if isinstance(params["layers"], tuple):
    blocks = tuple(nnx.merge(_block_graphdef(cfg), p) for p in params["layers"])
  return bind(cfg, params)(tokens, positions, token_mask, cache, remat, dropout, blocks)


def unembed(cfg: ModelConfig, params: Params, hidden) -> jax.Array:
  return bind(cfg, params).unembed(hidden)


def completion_logits(model_config: ModelConfig, params: Params, tokens: jax.Array,
                      attention_mask: jax.Array, completion_len: int, remat: bool = False,
                      dropout: Dropout | None = None, prompt_group: int = 1) -> jax.Array:
  """Logits [N, Tc, V] of the completion columns: logits[:, t] predicts completion token t.

  Only hidden[:, Tp-1:-1], the states that predict the completion tokens, are
  unembedded: prompt logits ([N, Tp, V], the largest activation) never exist.
  `dropout`: the model's (model.py), in the training forward only.

  `prompt_group` = K > 1: the rows come in runs of K that share their prompt columns
  (the K samples of a batch slot, batch.py). Each run's prompt then goes through the
  model once, its keys and values are repeated to the K rows (their gradients summed
  back), and only the completions run per row: (N / K) Tp + N (Tc - 1) tokens instead
  of N (Tp + Tc), the same numbers up to rounding. Not with dropout (its masks are per
  row) or remat (a rematerialised layer would save the whole cache it carries, per
  layer), where every row runs whole.
  """
  prompt_len = tokens.shape[1] - completion_len
  positions = positions_from_mask(attention_mask)
  if prompt_group > 1 and dropout is None and not remat and completion_len > 1:
    return _shared_prompt_logits(model_config, params, tokens, positions, attention_mask,
                                 prompt_len, prompt_group, remat)
  hidden, _ = forward(model_config, params, tokens, positions, attention_mask,
                            remat=remat, dropout=dropout)
  return unembed(model_config, params, hidden[:, prompt_len - 1:-1])


def _shared_prompt_logits(cfg, params, tokens, positions, attention_mask, prompt_len: int,
                          k: int, remat: bool):
  """completion_logits with each run of k rows' prompt run once (its docstring)."""
  n, t = tokens.shape
  if n % k:
    raise ValueError(f"{n} rows are not whole runs of prompt_group={k}")
  first = slice(None, None, k)  # the first row of every run holds its prompt
  cache = KVCache.init(cfg, n // k, t - 1)
  prompt_hidden, cache = forward(cfg, params, tokens[first, :prompt_len],
                                 positions[first, :prompt_len],
                                 attention_mask[first, :prompt_len], cache, remat)
  cache = dataclasses.replace(cache, k=jnp.repeat(cache.k, k, axis=1),
                              v=jnp.repeat(cache.v, k, axis=1),
                              mask=jnp.repeat(cache.mask, k, axis=0))
  # Completion tokens 0 .. Tc-2 predict tokens 1 .. Tc-1; the prompt's last state, token 0.
  span = slice(prompt_len, t - 1)
  hidden, _ = forward(cfg, params, tokens[:, span], positions[:, span], attention_mask[:, span],
                      cache, remat)
  hidden = jnp.concatenate([jnp.repeat(prompt_hidden[:, -1:], k, axis=0), hidden], axis=1)
  return unembed(cfg, params, hidden)


def completion_token_logprobs(model_config: ModelConfig, params: Params, tokens: jax.Array,
                              attention_mask: jax.Array, completion_len: int,
                              temperature: float, remat: bool = False,
                              dropout: Dropout | None = None, prompt_group: int = 1) -> jax.Array:
  """Per-token log-probs [N, Tc] (float32, tempered) of the completion columns."""
  logits = completion_logits(model_config, params, tokens, attention_mask, completion_len,
                             remat, dropout, prompt_group)
  return token_logprobs(logits, tokens[:, tokens.shape[1] - completion_len:], temperature)


def _hidden(cfg, params, tokens, attention_mask):
  """(bound module, last hidden states [B,T,D]) of a decoder or an encoder."""
  module = bind(cfg, params)
  if isinstance(cfg, EncoderConfig):
    return module, module(tokens, attention_mask)
  return module, module(tokens, positions_from_mask(attention_mask), attention_mask)[0]


@functools.partial(jax.jit, static_argnums=0)
def _logits(cfg, params, tokens, attention_mask):
  module, hidden = _hidden(cfg, params, tokens, attention_mask)
  return module.unembed(hidden)


def _inputs(tokens, attention_mask):
  tokens = jnp.asarray(tokens, jnp.int32)
  if attention_mask is None:
    attention_mask = jnp.ones_like(tokens)
  return tokens, jnp.asarray(attention_mask, jnp.int32)


def logits(model_config: ModelConfig, params: Params, tokens, attention_mask=None) -> jax.Array:
  """Float32 logits [B,T,V] for int tokens [B,T]; mask 1 = real (left padding ok)."""
  if isinstance(model_config, EncoderConfig):
    raise ValueError(f"a {model_config.model_type} encoder has no LM head: use model.scores "
                     "or model.embed")
  return _logits(model_config, params, *_inputs(tokens, attention_mask))


@functools.partial(jax.jit, static_argnums=0)
def _scores(cfg, params, tokens, attention_mask, read_mask):
  module, hidden = _hidden(cfg, params, tokens, attention_mask)
  if isinstance(cfg, EncoderConfig):
    return module.classify(hidden)
  return module.classify(hidden, read_mask)


def scores(cfg: ModelConfig | EncoderConfig, params: Params, tokens,
           attention_mask=None) -> jax.Array:
  """Float32 [B, num_labels]: what transformers' ...ForSequenceClassification
  returns as `.logits`, for int tokens [B,T] and mask [B,T] (1 = real token).

  Decoders read the score at each row's last real token (left or right padding;
  positions count real tokens only, as in TRL's reward forward). Without a mask
  every token is attended and, as transformers does, the score is read at the
  last token that is not `cfg.pad_token_id`. Encoders read their head at token 0.
  """
  if not cfg.num_labels:
    raise ValueError(f"this {cfg.model_type} checkpoint has no sequence-classification head "
                     "(num_labels=0): load a ...ForSequenceClassification checkpoint")
  given = attention_mask is not None
  tokens, attention_mask = _inputs(tokens, attention_mask)
  if given or isinstance(cfg, EncoderConfig) or cfg.pad_token_id is None:
    read_mask = attention_mask
  else:
    read_mask = (tokens != cfg.pad_token_id).astype(jnp.int32)
  return _scores(cfg, params, tokens, attention_mask, read_mask)


@functools.partial(jax.jit, static_argnums=0)
def _embed(cfg, params, tokens, attention_mask):
  return mean_pool_normalized(_hidden(cfg, params, tokens, attention_mask)[1], attention_mask)


def embed(cfg: ModelConfig | EncoderConfig, params: Params, tokens,
          attention_mask=None) -> jax.Array:
  """Float32 [B, D]: the last hidden states averaged over the real tokens (mask 1)
  and L2-normalised (sentence-transformers' mean pooling, e.g. all-MiniLM-L6-v2)."""
  return _embed(cfg, params, *_inputs(tokens, attention_mask))
