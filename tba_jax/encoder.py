"""BERT / RoBERTa encoders: sequence classifiers and sentence embeddings.

Matches transformers' BertModel / RobertaModel and their
...ForSequenceClassification heads to float32 round-off:
  embeddings  LayerNorm(word + token type 0 + learned absolute position); BERT
              numbers positions 0.. along the row, RoBERTa counts real tokens
              from pad_token_id + 1 and puts padding at pad_token_id
  blocks      post-LayerNorm: x = LN(x + attn(x)); x = LN(x + mlp(x)), with
              bidirectional attention over the real tokens and biases everywhere
  head        tanh(h[:, 0] @ pooler + b) @ score + b: BERT's pooler + classifier
              and RoBERTa's classifier.dense + out_proj are the same computation
Sentence embeddings (all-MiniLM-L6-v2 is a BERT) are the mean of the last hidden
states over the real tokens, L2-normalised (layers.mean_pool_normalized).

The modules only; tba_jax.model.scores / embed run them. Parameter names and
shapes follow the decoder's (q [D,N,H], o [N,H,D], up [D,F], ...), so one
sharding table covers both. Axis legend as in model.py.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from tba_jax.layers import ACTIVATION_FNS, Norm, param, project
from tba_jax.model_config import EncoderConfig


def _norm(cfg: EncoderConfig, rngs: nnx.Rngs) -> Norm:
  return Norm(cfg.dim, "layer", cfg.norm_eps, cfg.jnp_dtype, rngs)


class Attention(nnx.Module):

  def __init__(self, cfg: EncoderConfig, rngs: nnx.Rngs):
    d, n, h, dt = cfg.dim, cfg.num_heads, cfg.head_dim, cfg.jnp_dtype
    self.q = param(rngs, (d, n, h), dt, fan_in=d)
    self.k = param(rngs, (d, n, h), dt, fan_in=d)
    self.v = param(rngs, (d, n, h), dt, fan_in=d)
    self.o = param(rngs, (n, h, d), dt, fan_in=n * h)
    self.q_bias = param(rngs, (n, h), dt)
    self.k_bias = param(rngs, (n, h), dt)
    self.v_bias = param(rngs, (n, h), dt)
    self.o_bias = param(rngs, (d,), dt)

  def __call__(self, x, mask):
    """x [B,T,D]; mask [B,1,1,S] bool: the keys every query may see (real tokens)."""
    q, k, v = project(x, self.q[...], self.k[...], self.v[...])  # [B,T,N,H] x 3
    q, k, v = q + self.q_bias[...], k + self.k_bias[...], v + self.v_bias[...]
    out = jax.nn.dot_product_attention(q, k, v, mask=mask)
    return jnp.einsum("BTNH,NHD->BTD", out, self.o[...]) + self.o_bias[...]


class MLP(nnx.Module):

  def __init__(self, cfg: EncoderConfig, rngs: nnx.Rngs):
    d, f, dt = cfg.dim, cfg.mlp_dim, cfg.jnp_dtype
    self.up = param(rngs, (d, f), dt, fan_in=d)
    self.up_bias = param(rngs, (f,), dt)
    self.down = param(rngs, (f, d), dt, fan_in=f)
    self.down_bias = param(rngs, (d,), dt)
    self.act = ACTIVATION_FNS[cfg.activation]

  def __call__(self, x):
    h = self.act(jnp.einsum("BTD,DF->BTF", x, self.up[...]) + self.up_bias[...])
    return jnp.einsum("BTF,FD->BTD", h, self.down[...]) + self.down_bias[...]


class Block(nnx.Module):

  def __init__(self, cfg: EncoderConfig, rngs: nnx.Rngs):
    self.attn = Attention(cfg, rngs)
    self.attn_norm = _norm(cfg, rngs)
    self.mlp = MLP(cfg, rngs)
    self.mlp_norm = _norm(cfg, rngs)

  def __call__(self, x, mask):
    x = self.attn_norm(x + self.attn(x, mask))
    return self.mlp_norm(x + self.mlp(x))


class Encoder(nnx.Module):

  def __init__(self, cfg: EncoderConfig, rngs: nnx.Rngs):
    d, dt = cfg.dim, cfg.jnp_dtype
    self.cfg = cfg
    self.embed = param(rngs, (cfg.vocab_size, d), dt)
    self.pos_embed = param(rngs, (cfg.max_position_embeddings, d), dt)
    self.type_embed = param(rngs, (cfg.type_vocab_size, d), dt)
    self.embed_norm = _norm(cfg, rngs)

    @nnx.split_rngs(splits=cfg.num_layers)
    @nnx.vmap(in_axes=(0,), out_axes=0)
    def make_layers(rngs):
      return Block(cfg, rngs)

    self.layers = make_layers(rngs)
    if cfg.num_labels:
      self.pooler = param(rngs, (d, d), dt, fan_in=d)
      self.pooler_bias = param(rngs, (d,), dt)
      self.score = param(rngs, (d, cfg.num_labels), dt, fan_in=d)
      self.score_bias = param(rngs, (cfg.num_labels,), dt)

  def __call__(self, tokens, token_mask):
    """Last hidden states [B,T,D] of int tokens [B,T]; token_mask [B,T] 1 = real."""
    cfg = self.cfg
    if cfg.padding_positions:
      count = jnp.cumsum(token_mask, axis=-1)
      positions = jnp.where(token_mask > 0, cfg.pad_token_id + count, cfg.pad_token_id)
    else:
      positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
    # One segment: token type 0 everywhere. Summed in transformers' order.
    x = self.embed[...][tokens] + self.type_embed[...][0]
    x = self.embed_norm(x + self.pos_embed[...][positions])
    mask = token_mask.astype(bool)[:, None, None, :]  # [B,1,1,S]: keys only (bidirectional)

    def layer(x, block):
      return block(x, mask)

    return nnx.scan(layer, in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)(x, self.layers)

  def classify(self, hidden):
    """Float32 scores [B,C] from the last hidden states [B,T,D] (read at token 0)."""
    pooled = jnp.tanh(jnp.einsum("BD,DE->BE", hidden[:, 0], self.pooler[...]) +
                      self.pooler_bias[...])
    out = jnp.einsum("BD,DC->BC", pooled, self.score[...], preferred_element_type=jnp.float32)
    return out + self.score_bias[...].astype(jnp.float32)
