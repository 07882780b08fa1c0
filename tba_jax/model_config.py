"""Architecture configs (hashable dataclasses: static arguments of jitted functions).

  ModelConfig    a decoder-only transformer: the Llama family (Llama 1/2/3.x,
                 TinyLlama/RhoMath, SmolLM2, Mistral), Qwen2, Qwen3, Gemma 3,
                 GPT-NeoX (Pythia) and GPT-2, as one block with switches; with an
                 LM head or a sequence-classification head (reward models).
  EncoderConfig  a BERT / RoBERTa encoder, with or without its
                 sequence-classification head (classifiers, sentence embeddings).
  LoRAConfig     low-rank adapters on a decoder's projections (ModelConfig.lora).
"""
from __future__ import annotations

import dataclasses

import jax.numpy as jnp

# LORA_TARGETS: the projections LoRA can adapt, by our parameter names (q/k/v/o, MLP
# gate/up/down); ATTENTION_IMPLS: attention.py's backends. Declared with the config's choices.
from tba_jax.choices import ATTENTION_IMPLS, LORA_TARGETS

ACTIVATIONS = ("silu", "gelu", "gelu_tanh")
# "rms": RMSNorm scaled by w (Llama); "rms_plus_one": by (1 + w), in float32 (Gemma);
# "layer": LayerNorm (GPT-NeoX, GPT-2).
NORMS = ("rms", "rms_plus_one", "layer")


@dataclasses.dataclass(frozen=True)
class RopeScaling:
  """Rotary frequency scaling. `kind` is "llama3" or "linear" (HF rope_type)."""
  kind: str
  factor: float
  low_freq_factor: float = 1.0
  high_freq_factor: float = 4.0
  original_max_position_embeddings: int = 8192


class _Config:
  """What both configs share: checks of the common fields, replace, the jnp dtype."""

  def _check_common(self) -> None:
    if self.dtype not in ("float32", "bfloat16"):
      raise ValueError(f"dtype must be 'float32' or 'bfloat16', got {self.dtype!r}")
    if self.activation not in ACTIVATIONS:
      raise ValueError(f"activation must be one of {ACTIVATIONS}, got {self.activation!r}")
    if self.num_labels < 0:
      raise ValueError(f"num_labels={self.num_labels} must be >= 0 (0: no classification head)")

  def replace(self, **kw):
    return dataclasses.replace(self, **kw)

  @property
  def jnp_dtype(self):
    return jnp.dtype(self.dtype)


@dataclasses.dataclass(frozen=True)
class LoRAConfig:
  """Low-rank adapters (PEFT's LoRA, dropout 0): each targeted projection W computes
  x W + (alpha / rank) x A B, with A [in, rank] and B [rank, out] trained and W frozen.

  `targets` name our projections (LORA_TARGETS). Where Hugging Face stores q, k, v
  as one fused projection (GPT-2's c_attn, GPT-NeoX's query_key_value) they get one
  adapter over the fused output, as PEFT gives that module: one A, one B whose
  columns are the q, k, v outputs.
  """
  rank: int
  alpha: float
  targets: tuple[str, ...]

  def __post_init__(self):
    if self.rank < 1:
      raise ValueError(f"LoRA rank={self.rank} must be >= 1 (rank 0 is full fine-tuning: "
                       "no LoRAConfig)")
    if not self.alpha > 0:
      raise ValueError(f"LoRA alpha={self.alpha} must be > 0")
    unknown = [t for t in self.targets if t not in LORA_TARGETS]
    if unknown or not self.targets or len(set(self.targets)) != len(self.targets):
      raise ValueError(f"LoRA targets={','.join(self.targets)!r}: must be distinct names from "
                       f"{','.join(LORA_TARGETS)}")

  @property
  def scale(self) -> float:
    return self.alpha / self.rank


@dataclasses.dataclass(frozen=True)
class ModelConfig(_Config):
  """Architecture of a decoder-only transformer. The defaults are the Llama family;
  GPT-NeoX sets norm="layer", parallel_residual, rotary_fraction=0.25,
  activation="gelu", gated_mlp=False, qkv_bias and bias; GPT-2 the same but
  position_embedding="learned", sequential residual, activation="gelu_tanh".
  Qwen3 sets qk_norm; Gemma 3 norm="rms_plus_one", qk_norm, post_norms,
  embed_scale, activation="gelu_tanh", attn_scale, and sliding_window over
  sliding_layers with local_rope_theta (Mistral v0.1 and Qwen2's optional window:
  sliding_window over some or all layers, one rope)."""
  vocab_size: int
  dim: int
  mlp_dim: int
  num_layers: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  norm_eps: float = 1e-5
  rope_theta: float = 10000.0
  rope_scaling: RopeScaling | None = None
  qkv_bias: bool = False  # Qwen2, GPT-NeoX, GPT-2
  tie_embeddings: bool = False
  max_position_embeddings: int = 2048
  dtype: str = "float32"  # parameter and activation dtype; logits are float32
  model_type: str = "llama"  # the HF model_type written on export
  bos_token_id: int | None = None
  eos_token_id: int | None = None
  norm: str = "rms"  # NORMS: "rms", "rms_plus_one" (Gemma) or "layer" (LayerNorm)
  parallel_residual: bool = False  # x + attn(norm1 x) + mlp(norm2 x) (GPT-NeoX)
  position_embedding: str = "rope"  # "rope", or "learned" absolute positions added to the input
  rotary_fraction: float = 1.0  # leading fraction of each head's dims that rotate (Pythia: 0.25)
  activation: str = "silu"  # "silu", "gelu" (exact, erf) or "gelu_tanh" (GPT-2's gelu_new)
  gated_mlp: bool = True  # down(act(gate x) * up x) (Llama); False: down(act(up x))
  bias: bool = False  # the attention output and MLP projections have biases
  num_labels: int = 0  # 0: LM head (logits); n > 0: a sequence-classification head [D, n]
  pad_token_id: int | None = None  # without a mask, scores() read at the last non-pad token
  lora: LoRAConfig | None = None  # low-rank adapters on the projections (None: none)
  qk_norm: bool = False  # a per-head norm (cfg.norm, over H) on q and k before rope (Qwen3, Gemma 3)
  post_norms: bool = False  # the attention and MLP outputs normed before each residual add (Gemma 3)
  embed_scale: bool = False  # token embeddings times sqrt(dim), in the model dtype (Gemma)
  attn_scale: float | None = None  # attention logits q.k times this (None: head_dim ** -0.5)
  final_logit_softcap: float | None = None  # logits = c tanh(logits / c) (None: off)
  sliding_window: int = 0  # > 0: the sliding layers' queries see their last this-many tokens
  sliding_layers: tuple[int, ...] = ()  # indices of the layers with the sliding window
  local_rope_theta: float | None = None  # sliding layers' rope base, unscaled (None: as global)
  # Attention kernels (attention.py): "auto" (xla on CPU, cudnn on GPU, pallas on TPU, each
  # xla where its kernel cannot run the dtype or window), "xla", "cudnn" or "pallas"; the
  # numbers agree to float32 round-off.
  attention_impl: str = "auto"

  def __post_init__(self):
    self._check_common()
    if self.num_heads % self.num_kv_heads:
      raise ValueError(f"num_heads={self.num_heads} is not a multiple of "
                       f"num_kv_heads={self.num_kv_heads}")
    if self.norm not in NORMS:
      raise ValueError(f"norm must be one of {NORMS}, got {self.norm!r}")
    if self.sliding_window < 0 or bool(self.sliding_window) != bool(self.sliding_layers):
      raise ValueError(f"sliding_window={self.sliding_window} with sliding_layers="
                       f"{self.sliding_layers}: give both (a window > 0 and its layers) or neither")
    if any(not 0 <= i < self.num_layers for i in self.sliding_layers):
      raise ValueError(f"sliding_layers={self.sliding_layers}: indices must lie in "
                       f"[0, {self.num_layers})")
    if self.local_rope_theta is not None and not self.sliding_layers:
      raise ValueError("local_rope_theta needs sliding_layers (the layers it applies to)")
    if self.position_embedding not in ("rope", "learned"):
      raise ValueError(f"position_embedding must be 'rope' or 'learned', got "
                       f"{self.position_embedding!r}")
    if self.position_embedding == "rope" and (self.rotary_dim < 2 or self.rotary_dim % 2):
      raise ValueError(f"head_dim={self.head_dim} x rotary_fraction={self.rotary_fraction} = "
                       f"{self.rotary_dim} rotary dims; rotary embeddings need a positive even count")

    if self.attention_impl not in ATTENTION_IMPLS:
      raise ValueError(f"attention_impl={self.attention_impl!r}: must be one of "
                       f"{', '.join(ATTENTION_IMPLS)}")
    if self.lora is not None:
      self._check_lora()

  def _check_lora(self):
    targets = set(self.lora.targets)
    if "gate" in targets and not self.gated_mlp:
      raise ValueError(f"LoRA target 'gate': a {self.model_type} MLP has no gate projection "
                       "(targets: q, k, v, o, up, down)")
    qkv = targets & {"q", "k", "v"}
    if self.fused_qkv and qkv and qkv != {"q", "k", "v"}:
      raise ValueError(f"LoRA targets {','.join(sorted(qkv))}: {self.model_type} computes q, k "
                       "and v in one projection, which takes one adapter; target all three "
                       "or none")

  @property
  def rotary_dim(self) -> int:
    """Rotated dims per head, truncated as HF truncates them."""
    return int(self.head_dim * self.rotary_fraction)

  @property
  def projections(self) -> tuple[str, ...]:
    """The projections this architecture has, by our names (LORA_TARGETS)."""
    return tuple(p for p in LORA_TARGETS if p != "gate" or self.gated_mlp)

  @property
  def fused_qkv(self) -> bool:
    """Hugging Face stores q, k, v as one projection (GPT-2 c_attn, GPT-NeoX query_key_value)."""
    return self.model_type in ("gpt2", "gpt_neox")

  def lora_adapters(self, module: str) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """(adapter name, the projections it adapts) of `module` ("attn" or "mlp"), e.g.
    (("q_lora", ("q",)), ("v_lora", ("v",))), or (("qkv_lora", ("q", "k", "v")),) where
    q/k/v are fused. Empty without LoRA."""
    if self.lora is None:
      return ()
    names = ("q", "k", "v", "o") if module == "attn" else ("gate", "up", "down")
    targets = [t for t in names if t in self.lora.targets]
    out = []
    if self.fused_qkv and "q" in targets:
      out.append(("qkv_lora", ("q", "k", "v")))
      targets = [t for t in targets if t not in ("q", "k", "v")]
    return tuple(out + [(t + "_lora", (t,)) for t in targets])


@dataclasses.dataclass(frozen=True)
class EncoderConfig(_Config):
  """A BERT / RoBERTa encoder: post-LayerNorm blocks, bidirectional attention,
  word + learned absolute position + token-type embeddings, biases everywhere."""
  vocab_size: int
  dim: int
  mlp_dim: int
  num_layers: int
  num_heads: int
  max_position_embeddings: int = 512
  type_vocab_size: int = 2
  norm_eps: float = 1e-12
  activation: str = "gelu"
  pad_token_id: int = 0
  # RoBERTa: the i-th real token (from 1) sits at position pad_token_id + i and
  # padding at pad_token_id. BERT: position = index in the row.
  padding_positions: bool = False
  num_labels: int = 0  # 0: no classification head (embeddings only)
  dtype: str = "float32"
  model_type: str = "bert"  # "bert" or "roberta"

  def __post_init__(self):
    self._check_common()
    if self.dim % self.num_heads:
      raise ValueError(f"dim={self.dim} is not a multiple of num_heads={self.num_heads}")

  @property
  def head_dim(self) -> int:
    return self.dim // self.num_heads
