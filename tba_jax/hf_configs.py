"""Hugging Face configs per architecture: config.json <-> our configs (ModelConfig,
EncoderConfig), and the transformers config class an export writes.

Supported model_types: llama, mistral, qwen2, qwen3, gemma3_text, gpt_neox, gpt2
(decoders: a causal LM or ...ForSequenceClassification) and bert, roberta
(encoders: the bare model, for embeddings, or ...ForSequenceClassification). The
head is read from config.json's `architectures`. Gemma 3's multimodal checkpoints
(model_type gemma3, Gemma3ForConditionalGeneration: 4B and up) are refused by name;
their text tower is a gemma3_text model. The tensors' names and layouts are
hf_layouts.py's.
"""
from __future__ import annotations

from tba_jax.model_config import EncoderConfig, ModelConfig, RopeScaling

# model_type -> (config class, LM or bare class, classification class, backbone prefix).
HF_CLASSES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", "LlamaForSequenceClassification", "model."),
    "mistral": ("MistralConfig", "MistralForCausalLM", "MistralForSequenceClassification", "model."),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", "Qwen2ForSequenceClassification", "model."),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", "Qwen3ForSequenceClassification", "model."),
    "gemma3_text": ("Gemma3TextConfig", "Gemma3ForCausalLM", "Gemma3TextForSequenceClassification",
                    "model."),
    "gpt_neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM", "GPTNeoXForSequenceClassification",
                 "gpt_neox."),
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", "GPT2ForSequenceClassification", "transformer."),
    "bert": ("BertConfig", "BertModel", "BertForSequenceClassification", "bert."),
    "roberta": ("RobertaConfig", "RobertaModel", "RobertaForSequenceClassification", "roberta."),
}
SUPPORTED_MODEL_TYPES = tuple(HF_CLASSES)
ENCODER_TYPES = ("bert", "roberta")
_ACTIVATIONS = {"silu": "silu", "gelu": "gelu", "gelu_new": "gelu_tanh",
                "gelu_pytorch_tanh": "gelu_tanh"}


# ---------------------------------------------------------------------------
# config.json -> ModelConfig / EncoderConfig
# ---------------------------------------------------------------------------
def _rope(c: dict) -> tuple[float, RopeScaling | None, float]:
  """(theta, scaling, partial rotary fraction). transformers >= 5 writes
  `rope_parameters`; older files `rope_theta` + `rope_scaling` (GPT-NeoX:
  `rotary_emb_base` + `rotary_pct`)."""
  rope = dict(c.get("rope_parameters") or {})
  theta = rope.get("rope_theta", c.get("rope_theta", c.get("rotary_emb_base", 10000.0)))
  default_fraction = 0.25 if c.get("model_type") == "gpt_neox" else 1.0
  fraction = rope.get("partial_rotary_factor", c.get("rotary_pct", default_fraction))
  scaling = dict(c.get("rope_scaling") or {})
  scaling.update({k: v for k, v in rope.items() if k not in ("rope_theta", "partial_rotary_factor")})
  kind = scaling.get("rope_type", scaling.get("type", "default"))
  if kind == "default":
    rope_scaling = None
  elif kind == "llama3":
    rope_scaling = RopeScaling(
        "llama3", float(scaling["factor"]), float(scaling["low_freq_factor"]),
        float(scaling["high_freq_factor"]), int(scaling["original_max_position_embeddings"]))
  elif kind == "linear":
    rope_scaling = RopeScaling("linear", float(scaling["factor"]))
  else:
    raise ValueError(f"config.json: unsupported rope scaling type {kind!r} "
                     "(supported: default, llama3, linear)")
  return float(theta), rope_scaling, float(fraction)


def _gemma3_rope(c: dict) -> tuple[float, RopeScaling | None, float]:
  """(global theta, global scaling, the sliding layers' theta) of a Gemma 3 text config:
  transformers >= 5 writes rope_parameters per layer type, older files rope_theta,
  rope_scaling and rope_local_base_freq."""
  rope = c.get("rope_parameters") or {}
  full, local = dict(rope.get("full_attention") or {}), dict(rope.get("sliding_attention") or {})
  if not full:
    full = {"rope_theta": c.get("rope_theta", 1_000_000.0), **(c.get("rope_scaling") or {})}
    local = {"rope_theta": c.get("rope_local_base_freq", 10_000.0)}
  if local.get("rope_type", "default") != "default":
    raise ValueError(f"config.json: sliding layers with rope type {local['rope_type']!r} are not "
                     "supported (only default)")
  theta, scaling, _ = _rope({"rope_parameters": full})
  return theta, scaling, float(local.get("rope_theta", 10_000.0))


def _sliding(c: dict, model_type: str, num_layers: int) -> tuple[int, tuple[int, ...]]:
  """(window, indices of the sliding layers), as transformers decides them: Gemma 3 by
  layer_types (else every `sliding_window_pattern`-th layer is global), Qwen2 / Qwen3
  when use_sliding_window (layer_types, else the layers from max_window_layers on),
  Mistral every layer when sliding_window is set."""
  window = c.get("sliding_window") or 0
  if model_type in ("qwen2", "qwen3") and not c.get("use_sliding_window"):
    window = 0
  if not window or model_type == "llama":
    return 0, ()
  types = c.get("layer_types")
  if model_type == "gemma3_text" and not types:
    pattern = c.get("sliding_window_pattern", c.get("_sliding_window_pattern", 6))
    types = ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention"
             for i in range(num_layers)]
  elif model_type in ("qwen2", "qwen3") and not types:
    start = c.get("max_window_layers", num_layers)
    types = ["sliding_attention" if i >= start else "full_attention" for i in range(num_layers)]
  elif model_type == "mistral":
    types = ["sliding_attention"] * num_layers
  if len(types) != num_layers or set(types) - {"sliding_attention", "full_attention"}:
    raise ValueError(f"config.json: layer_types={types} must name sliding_attention or "
                     f"full_attention for each of the {num_layers} layers")
  layers = tuple(i for i, t in enumerate(types) if t == "sliding_attention")
  return (int(window), layers) if layers else (0, ())


def _gemma3(c: dict) -> dict:
  """The ModelConfig switches of a Gemma 3 text model (transformers' Gemma3TextModel)."""
  if c.get("use_bidirectional_attention"):
    raise ValueError("config.json: Gemma 3 with use_bidirectional_attention=true (an encoder) "
                     "is not supported")
  if c.get("attn_logit_softcapping") is not None:
    raise ValueError("config.json: attn_logit_softcapping is not supported (Gemma 3 checkpoints "
                     "set it to null)")
  theta, scaling, local = _gemma3_rope(c)
  return dict(norm="rms_plus_one", qk_norm=True, post_norms=True, embed_scale=True,
              attn_scale=float(c.get("query_pre_attn_scalar", 256)) ** -0.5,
              final_logit_softcap=c.get("final_logit_softcapping"), rope_theta=theta,
              rope_scaling=scaling, local_rope_theta=local)


def _head(c: dict, model_type: str) -> str:
  """"lm", "classifier" or "none" (a bare encoder), from config.json's architectures."""
  _, lm_or_bare, classifier, _ = HF_CLASSES[model_type]
  arch = (c.get("architectures") or [lm_or_bare])[0]
  if arch == classifier:
    return "classifier"
  if arch == lm_or_bare:
    return "none" if model_type in ENCODER_TYPES else "lm"
  raise ValueError(f"config.json: unsupported head architectures={c.get('architectures')} for "
                   f"model_type={model_type!r}; supported: {lm_or_bare}, {classifier}")


def _num_labels(c: dict) -> int:
  return len(c["id2label"]) if c.get("id2label") else int(c.get("num_labels", 2))


def _activation(c: dict, key: str) -> str:
  act = c.get(key, "gelu")
  if act not in _ACTIVATIONS:
    raise ValueError(f"config.json: unsupported {key}={act!r} (supported: {sorted(_ACTIVATIONS)})")
  return _ACTIVATIONS[act]


def _eos(c: dict):
  eos = c.get("eos_token_id")
  return eos[0] if isinstance(eos, list) else eos


def config_from_hf(c: dict, dtype: str = "float32") -> ModelConfig | EncoderConfig:
  """Our config from a Hugging Face config.json dict; refuses what we cannot run."""
  model_type = c.get("model_type")
  if model_type == "gemma3":
    raise ValueError("config.json: a multimodal Gemma 3 checkpoint (model_type='gemma3', "
                     f"architectures={c.get('architectures')}) is not supported; its text tower "
                     "as a Gemma3ForCausalLM (model_type 'gemma3_text') is")
  if model_type not in SUPPORTED_MODEL_TYPES:
    raise ValueError(f"config.json: unsupported architecture model_type={model_type!r} "
                     f"(architectures={c.get('architectures')}); supported: {SUPPORTED_MODEL_TYPES}")
  head = _head(c, model_type)
  num_labels = _num_labels(c) if head == "classifier" else 0
  if model_type in ENCODER_TYPES:
    return _encoder_config(c, model_type, num_labels, dtype)
  theta, scaling, fraction = _rope(c)
  common = dict(vocab_size=c["vocab_size"], dtype=dtype, model_type=model_type,
                bos_token_id=c.get("bos_token_id"), eos_token_id=_eos(c),
                pad_token_id=c.get("pad_token_id"), num_labels=num_labels)
  if model_type == "gpt2":
    if c.get("add_cross_attention") or c.get("scale_attn_by_inverse_layer_idx") or \
        not c.get("scale_attn_weights", True):
      raise ValueError("config.json: GPT-2 with cross-attention or non-default attention "
                       "scaling is not supported")
    d, heads = c["n_embd"], c["n_head"]
    return ModelConfig(
        dim=d, mlp_dim=c.get("n_inner") or 4 * d, num_layers=c["n_layer"], num_heads=heads,
        num_kv_heads=heads, head_dim=d // heads, norm_eps=c.get("layer_norm_epsilon", 1e-5),
        tie_embeddings=bool(c.get("tie_word_embeddings", True)),
        max_position_embeddings=c.get("n_positions", 1024), norm="layer",
        position_embedding="learned", activation=_activation(c, "activation_function"),
        gated_mlp=False, qkv_bias=True, bias=True, **common)
  heads = c["num_attention_heads"]
  gemma = model_type == "gemma3_text"
  shape = dict(dim=c["hidden_size"], mlp_dim=c["intermediate_size"],
               num_layers=c["num_hidden_layers"], num_heads=heads, rope_theta=theta,
               rope_scaling=scaling, max_position_embeddings=c.get("max_position_embeddings", 2048),
               tie_embeddings=bool(c.get("tie_word_embeddings", gemma)))
  if model_type == "gpt_neox":
    if not c.get("attention_bias", True):
      raise ValueError("config.json: GPT-NeoX with attention_bias=false is not supported")
    return ModelConfig(
        num_kv_heads=heads, head_dim=c["hidden_size"] // heads, rotary_fraction=fraction,
        norm_eps=c.get("layer_norm_eps", 1e-5), norm="layer",
        parallel_residual=bool(c.get("use_parallel_residual", True)),
        activation=_activation(c, "hidden_act"), gated_mlp=False, qkv_bias=True, bias=True,
        **shape, **common)
  if gemma:
    activation = _activation(c, "hidden_activation")
  elif c.get("hidden_act", "silu") != "silu":
    raise ValueError(f"config.json: unsupported hidden_act={c['hidden_act']!r} (only silu)")
  if c.get("mlp_bias"):
    raise ValueError("config.json: mlp_bias=true is not supported")
  if model_type != "qwen2" and c.get("attention_bias"):
    raise ValueError("config.json: attention_bias=true (bias on q/k/v/o) is not supported")
  window, sliding = _sliding(c, model_type, shape["num_layers"])
  extra = dict(qk_norm=model_type == "qwen3")
  if gemma:
    extra = dict(_gemma3(c), activation=activation)
  return ModelConfig(
      num_kv_heads=c.get("num_key_value_heads") or heads,
      head_dim=c.get("head_dim") or c["hidden_size"] // heads,
      norm_eps=c.get("rms_norm_eps", 1e-6), qkv_bias=model_type == "qwen2",
      sliding_window=window, sliding_layers=sliding, **{**shape, **extra}, **common)


def _encoder_config(c: dict, model_type: str, num_labels: int, dtype: str) -> EncoderConfig:
  if c.get("is_decoder") or c.get("add_cross_attention"):
    raise ValueError(f"config.json: a {model_type} decoder (is_decoder / cross-attention) is "
                     "not supported; only the encoder")
  if c.get("position_embedding_type", "absolute") != "absolute":
    raise ValueError(f"config.json: position_embedding_type={c['position_embedding_type']!r} "
                     "is not supported (only absolute)")
  default_pad = 1 if model_type == "roberta" else 0
  pad = c.get("pad_token_id")
  return EncoderConfig(
      vocab_size=c["vocab_size"], dim=c["hidden_size"], mlp_dim=c["intermediate_size"],
      num_layers=c["num_hidden_layers"], num_heads=c["num_attention_heads"],
      max_position_embeddings=c.get("max_position_embeddings", 512),
      type_vocab_size=c.get("type_vocab_size", 2), norm_eps=c.get("layer_norm_eps", 1e-12),
      activation=_activation(c, "hidden_act"), pad_token_id=default_pad if pad is None else pad,
      padding_positions=model_type == "roberta", num_labels=num_labels, dtype=dtype,
      model_type=model_type)


# ---------------------------------------------------------------------------
# ModelConfig -> transformers config (export)
# ---------------------------------------------------------------------------
def config_to_hf(cfg: ModelConfig):
  """A transformers PretrainedConfig describing decoder `cfg`."""
  import transformers
  if not isinstance(cfg, ModelConfig):
    raise ValueError(f"save_hf writes decoders only, not a {cfg.model_type} encoder")
  config_cls, lm_cls, classifier_cls, _ = HF_CLASSES[cfg.model_type]
  kw = dict(
      vocab_size=cfg.vocab_size, num_hidden_layers=cfg.num_layers,
      num_attention_heads=cfg.num_heads, tie_word_embeddings=cfg.tie_embeddings,
      bos_token_id=cfg.bos_token_id, eos_token_id=cfg.eos_token_id,
      pad_token_id=cfg.pad_token_id, torch_dtype=cfg.dtype,
      # Serving stacks (vLLM, TRL's reference model) pick the model class from this.
      architectures=[classifier_cls if cfg.num_labels else lm_cls])
  if cfg.num_labels:
    kw["num_labels"] = cfg.num_labels
  if cfg.sliding_layers and cfg.model_type not in ("mistral", "qwen2", "qwen3", "gemma3_text"):
    raise ValueError(f"a {cfg.model_type} checkpoint cannot describe sliding-window layers")
  if cfg.model_type == "mistral" and len(cfg.sliding_layers) not in (0, cfg.num_layers):
    raise ValueError("Mistral's sliding window covers every layer or none")
  rope = {"rope_type": "default", "rope_theta": cfg.rope_theta}
  if cfg.rope_scaling is not None:
    s = cfg.rope_scaling
    rope.update(rope_type=s.kind, factor=s.factor)
    if s.kind == "llama3":
      rope.update(low_freq_factor=s.low_freq_factor, high_freq_factor=s.high_freq_factor,
                  original_max_position_embeddings=s.original_max_position_embeddings)
  if cfg.model_type == "gpt2":
    kw.update(n_embd=cfg.dim, n_inner=cfg.mlp_dim, n_positions=cfg.max_position_embeddings,
              layer_norm_epsilon=cfg.norm_eps, activation_function=_hf_activation(cfg))
  elif cfg.model_type == "gpt_neox":
    kw.update(hidden_size=cfg.dim, intermediate_size=cfg.mlp_dim, layer_norm_eps=cfg.norm_eps,
              rope_parameters={**rope, "partial_rotary_factor": cfg.rotary_fraction},
              use_parallel_residual=cfg.parallel_residual, hidden_act=_hf_activation(cfg),
              max_position_embeddings=cfg.max_position_embeddings)
  else:
    kw.update(hidden_size=cfg.dim, intermediate_size=cfg.mlp_dim,
              num_key_value_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
              rms_norm_eps=cfg.norm_eps, rope_parameters=rope, hidden_act="silu",
              max_position_embeddings=cfg.max_position_embeddings)
    kw.update(_hf_sliding(cfg))
    if cfg.model_type == "gemma3_text":
      del kw["hidden_act"]
      act = "gelu_pytorch_tanh" if cfg.activation == "gelu_tanh" else _hf_activation(cfg)
      kw.update(hidden_activation=act, final_logit_softcapping=cfg.final_logit_softcap,
                query_pre_attn_scalar=round(cfg.attn_scale ** -2), rope_parameters={
                    "full_attention": rope, "sliding_attention": {
                        "rope_type": "default", "rope_theta": cfg.local_rope_theta or cfg.rope_theta}})
  return getattr(transformers, config_cls)(**kw)


def _hf_sliding(cfg: ModelConfig) -> dict:
  """The config.json keys that place `cfg`'s sliding-window layers."""
  window = cfg.sliding_window or None
  if cfg.model_type == "mistral":
    return {"sliding_window": window}
  if cfg.model_type not in ("qwen2", "qwen3", "gemma3_text"):
    return {}
  types = ["sliding_attention" if i in cfg.sliding_layers else "full_attention"
           for i in range(cfg.num_layers)]
  out = {"sliding_window": window, "layer_types": types}
  if cfg.model_type != "gemma3_text":  # Qwen's switch, and where its window starts
    out.update(use_sliding_window=bool(window),
               max_window_layers=min(cfg.sliding_layers, default=cfg.num_layers))
  return out


def _hf_activation(cfg: ModelConfig) -> str:
  return {"gelu": "gelu", "gelu_tanh": "gelu_new", "silu": "silu"}[cfg.activation]

