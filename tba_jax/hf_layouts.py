"""Hugging Face tensor layouts per architecture: HF tensor names (torch layout) <-> our
parameter leaves, and the other names a checkpoint may hold a tensor under.

The architectures (model_types) and their config.json fields are hf_configs.py's; each
`Spec` here is one HF tensor and the leaves of ours it holds, with the converters both
ways (transposes, head reshapes, fused q/k/v split and joined).
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import numpy as np

from tba_jax.hf_configs import HF_CLASSES
from tba_jax.model_config import EncoderConfig, ModelConfig


# ---------------------------------------------------------------------------
# Our parameter leaves <-> HF tensors.
# ---------------------------------------------------------------------------
class Spec(NamedTuple):
  """One HF tensor ('{i}' in `hf` = layer index; such leaves are stacked [L, ...])
  and the leaves it holds: to_ours(tensor) -> one array per leaf, to_hf(*arrays)
  -> tensor. Several leaves for GPT-NeoX's / GPT-2's fused q/k/v."""
  leaves: tuple[str, ...]
  hf: str
  to_ours: Callable
  to_hf: Callable


def _one(leaf: str, hf: str, to_ours=lambda w: w, to_hf=lambda w: w) -> Spec:
  return Spec((leaf,), hf, lambda w: (to_ours(w),), to_hf)


def _linear(leaf: str, hf: str) -> Spec:  # torch Linear [out, in] <-> ours [in, out]
  return _one(leaf, hf, lambda w: w.T, lambda w: w.T)


def _norm(leaf: str, hf: str, with_bias: bool) -> list[Spec]:
  specs = [_one(leaf + "/scale", hf + ".weight")]
  return specs + [_one(leaf + "/bias", hf + ".bias")] if with_bias else specs


def leaf_specs(cfg: ModelConfig | EncoderConfig) -> list[Spec]:
  """Every parameter leaf of `cfg` with its HF tensor (backbone names carry the
  ...For* classes' prefix; hf_checkpoints also tries them without it)."""
  d, n, h = cfg.dim, cfg.num_heads, cfg.head_dim
  heads_in = lambda heads: (lambda w: w.T.reshape(d, heads, h), lambda w: w.reshape(d, -1).T)
  heads_bias = lambda heads: (lambda b: b.reshape(heads, h), lambda b: b.reshape(-1))
  heads_out = (lambda w: w.T.reshape(n, h, d), lambda w: w.reshape(n * h, d).T)
  if isinstance(cfg, EncoderConfig):
    return _encoder_specs(cfg, heads_in(n), heads_bias(n), heads_out)
  p = HF_CLASSES[cfg.model_type][3]
  if cfg.model_type == "gpt_neox":
    specs = _gpt_neox_specs(cfg, p + "layers.{i}.", heads_out)
    specs += [_one("embed", p + "embed_in.weight")]
    specs += _norm("final_norm", p + "final_layer_norm", True)
    lm_head = "embed_out.weight"
  elif cfg.model_type == "gpt2":
    specs = _gpt2_specs(cfg, p + "h.{i}.")
    specs += [_one("embed", p + "wte.weight"), _one("pos_embed", p + "wpe.weight")]
    specs += _norm("final_norm", p + "ln_f", True)
    lm_head = "lm_head.weight"
  else:
    k = cfg.num_kv_heads
    layer = p + "layers.{i}."
    attn, mlp = layer + "self_attn.", layer + "mlp."
    # Gemma names its pre-MLP norm pre_feedforward_layernorm; post_attention_layernorm
    # is then the norm of the attention output (our attn_post_norm).
    pre_mlp = "pre_feedforward_layernorm" if cfg.post_norms else "post_attention_layernorm"
    specs = [
        _one("embed", p + "embed_tokens.weight"),
        _one("final_norm/scale", p + "norm.weight"),
        _one("layers/attn_norm/scale", layer + "input_layernorm.weight"),
        _one("layers/mlp_norm/scale", layer + pre_mlp + ".weight"),
        _one("layers/attn/q", attn + "q_proj.weight", *heads_in(n)),
        _one("layers/attn/k", attn + "k_proj.weight", *heads_in(k)),
        _one("layers/attn/v", attn + "v_proj.weight", *heads_in(k)),
        _one("layers/attn/o", attn + "o_proj.weight", *heads_out),
        _linear("layers/mlp/gate", mlp + "gate_proj.weight"),
        _linear("layers/mlp/up", mlp + "up_proj.weight"),
        _linear("layers/mlp/down", mlp + "down_proj.weight"),
    ]
    if cfg.qkv_bias:
      specs += [_one("layers/attn/q_bias", attn + "q_proj.bias", *heads_bias(n)),
                _one("layers/attn/k_bias", attn + "k_proj.bias", *heads_bias(k)),
                _one("layers/attn/v_bias", attn + "v_proj.bias", *heads_bias(k))]
    if cfg.qk_norm:
      specs += [_one("layers/attn/q_norm/scale", attn + "q_norm.weight"),
                _one("layers/attn/k_norm/scale", attn + "k_norm.weight")]
    if cfg.post_norms:
      specs += [_one("layers/attn_post_norm/scale", layer + "post_attention_layernorm.weight"),
                _one("layers/mlp_post_norm/scale", layer + "post_feedforward_layernorm.weight")]
    lm_head = "lm_head.weight"
  if cfg.num_labels:
    specs.append(_linear("score", "score.weight"))
  elif not cfg.tie_embeddings:
    specs.append(_linear("lm_head", lm_head))
  return specs


def _gpt_neox_specs(cfg: ModelConfig, layer: str, heads_out) -> list[Spec]:
  d, n, h = cfg.dim, cfg.num_heads, cfg.head_dim
  # query_key_value's outputs are per head [N, 3, H] (q, k, v of head 0, then head 1, ...).
  qkv = Spec(("layers/attn/q", "layers/attn/k", "layers/attn/v"),
             layer + "attention.query_key_value.weight",
             lambda w: tuple(np.moveaxis(w.T.reshape(d, n, 3, h), 2, 0)),
             lambda q, k, v: np.stack([q, k, v], axis=2).reshape(d, 3 * n * h).T)
  qkv_bias = Spec(("layers/attn/q_bias", "layers/attn/k_bias", "layers/attn/v_bias"),
                  layer + "attention.query_key_value.bias",
                  lambda b: tuple(np.moveaxis(b.reshape(n, 3, h), 1, 0)),
                  lambda q, k, v: np.stack([q, k, v], axis=1).reshape(-1))
  return [
      qkv, qkv_bias,
      _one("layers/attn/o", layer + "attention.dense.weight", *heads_out),
      _one("layers/attn/o_bias", layer + "attention.dense.bias"),
      _linear("layers/mlp/up", layer + "mlp.dense_h_to_4h.weight"),
      _one("layers/mlp/up_bias", layer + "mlp.dense_h_to_4h.bias"),
      _linear("layers/mlp/down", layer + "mlp.dense_4h_to_h.weight"),
      _one("layers/mlp/down_bias", layer + "mlp.dense_4h_to_h.bias"),
      *_norm("layers/attn_norm", layer + "input_layernorm", True),
      *_norm("layers/mlp_norm", layer + "post_attention_layernorm", True),
  ]


def _gpt2_specs(cfg: ModelConfig, layer: str) -> list[Spec]:
  # Conv1D weights are stored [in, out]: our layout already, up to head reshapes.
  d, n, h = cfg.dim, cfg.num_heads, cfg.head_dim
  qkv = Spec(("layers/attn/q", "layers/attn/k", "layers/attn/v"), layer + "attn.c_attn.weight",
             lambda w: tuple(x.reshape(d, n, h) for x in np.split(w, 3, axis=1)),
             lambda q, k, v: np.concatenate([x.reshape(d, -1) for x in (q, k, v)], axis=1))
  qkv_bias = Spec(("layers/attn/q_bias", "layers/attn/k_bias", "layers/attn/v_bias"),
                  layer + "attn.c_attn.bias",
                  lambda b: tuple(x.reshape(n, h) for x in np.split(b, 3)),
                  lambda q, k, v: np.concatenate([x.reshape(-1) for x in (q, k, v)]))
  return [
      qkv, qkv_bias,
      _one("layers/attn/o", layer + "attn.c_proj.weight", lambda w: w.reshape(n, h, d),
           lambda w: w.reshape(n * h, d)),
      _one("layers/attn/o_bias", layer + "attn.c_proj.bias"),
      _one("layers/mlp/up", layer + "mlp.c_fc.weight"),
      _one("layers/mlp/up_bias", layer + "mlp.c_fc.bias"),
      _one("layers/mlp/down", layer + "mlp.c_proj.weight"),
      _one("layers/mlp/down_bias", layer + "mlp.c_proj.bias"),
      *_norm("layers/attn_norm", layer + "ln_1", True),
      *_norm("layers/mlp_norm", layer + "ln_2", True),
  ]


def _encoder_specs(cfg: EncoderConfig, heads_in, heads_bias, heads_out) -> list[Spec]:
  p = HF_CLASSES[cfg.model_type][3]
  e, layer = p + "embeddings.", p + "encoder.layer.{i}."
  attn = layer + "attention."
  specs = [
      _one("embed", e + "word_embeddings.weight"),
      _one("pos_embed", e + "position_embeddings.weight"),
      _one("type_embed", e + "token_type_embeddings.weight"),
      *_norm("embed_norm", e + "LayerNorm", True),
      *[_one(f"layers/attn/{x}", attn + f"self.{name}.weight", *heads_in)
        for x, name in (("q", "query"), ("k", "key"), ("v", "value"))],
      *[_one(f"layers/attn/{x}_bias", attn + f"self.{name}.bias", *heads_bias)
        for x, name in (("q", "query"), ("k", "key"), ("v", "value"))],
      _one("layers/attn/o", attn + "output.dense.weight", *heads_out),
      _one("layers/attn/o_bias", attn + "output.dense.bias"),
      *_norm("layers/attn_norm", attn + "output.LayerNorm", True),
      _linear("layers/mlp/up", layer + "intermediate.dense.weight"),
      _one("layers/mlp/up_bias", layer + "intermediate.dense.bias"),
      _linear("layers/mlp/down", layer + "output.dense.weight"),
      _one("layers/mlp/down_bias", layer + "output.dense.bias"),
      *_norm("layers/mlp_norm", layer + "output.LayerNorm", True),
  ]
  if cfg.num_labels:
    pooler, score = (("classifier.dense", "classifier.out_proj") if cfg.model_type == "roberta"
                     else (p + "pooler.dense", "classifier"))
    specs += [_linear("pooler", pooler + ".weight"), _one("pooler_bias", pooler + ".bias"),
              _linear("score", score + ".weight"), _one("score_bias", score + ".bias")]
  return specs


def aliases(cfg: ModelConfig | EncoderConfig, name: str) -> list[str]:
  """Names under which a checkpoint may hold HF tensor `name`, preferred first:
  the bare backbone (BertModel, the original `gpt2` files) drops the prefix; old
  BERT files say LayerNorm.gamma / beta; old Pythia files embed_out, newer lm_head."""
  out = [name]
  prefix = HF_CLASSES[cfg.model_type][3]
  if name.startswith(prefix):
    out.append(name[len(prefix):])
  if name == "embed_out.weight":
    out.append("lm_head.weight")
  for new, old in ((".LayerNorm.weight", ".LayerNorm.gamma"), (".LayerNorm.bias", ".LayerNorm.beta")):
    if name.endswith(new):
      out += [x[:-len(new)] + old for x in list(out)]
  return out
