"""Architecture configs (hashable dataclasses: static arguments of jitted functions).

  ModelConfig    a decoder-only transformer: the Llama family (Llama 1/2/3,
                 TinyLlama/RhoMath, SmolLM2, Mistral), Qwen2, GPT-NeoX (Pythia)
                 and GPT-2, as one block with switches; with an LM head or a
                 sequence-classification head (reward models).
  EncoderConfig  a BERT / RoBERTa encoder, with or without its
                 sequence-classification head (classifiers, sentence embeddings).
"""
from __future__ import annotations

import dataclasses

import jax.numpy as jnp

ACTIVATIONS = ("silu", "gelu", "gelu_tanh")


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
class ModelConfig(_Config):
  """Architecture of a decoder-only transformer. The defaults are the Llama family;
  GPT-NeoX sets norm="layer", parallel_residual, rotary_fraction=0.25,
  activation="gelu", gated_mlp=False, qkv_bias and bias; GPT-2 the same but
  position_embedding="learned", sequential residual, activation="gelu_tanh"."""
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
  norm: str = "rms"  # "rms" (RMSNorm: scale) or "layer" (LayerNorm: scale and bias)
  parallel_residual: bool = False  # x + attn(norm1 x) + mlp(norm2 x) (GPT-NeoX)
  position_embedding: str = "rope"  # "rope", or "learned" absolute positions added to the input
  rotary_fraction: float = 1.0  # leading fraction of each head's dims that rotate (Pythia: 0.25)
  activation: str = "silu"  # "silu", "gelu" (exact, erf) or "gelu_tanh" (GPT-2's gelu_new)
  gated_mlp: bool = True  # down(act(gate x) * up x) (Llama); False: down(act(up x))
  bias: bool = False  # the attention output and MLP projections have biases
  num_labels: int = 0  # 0: LM head (logits); n > 0: a sequence-classification head [D, n]
  pad_token_id: int | None = None  # without a mask, scores() read at the last non-pad token

  def __post_init__(self):
    self._check_common()
    if self.num_heads % self.num_kv_heads:
      raise ValueError(f"num_heads={self.num_heads} is not a multiple of "
                       f"num_kv_heads={self.num_kv_heads}")
    if self.norm not in ("rms", "layer"):
      raise ValueError(f"norm must be 'rms' or 'layer', got {self.norm!r}")
    if self.position_embedding not in ("rope", "learned"):
      raise ValueError(f"position_embedding must be 'rope' or 'learned', got "
                       f"{self.position_embedding!r}")
    if self.position_embedding == "rope" and (self.rotary_dim < 2 or self.rotary_dim % 2):
      raise ValueError(f"head_dim={self.head_dim} x rotary_fraction={self.rotary_fraction} = "
                       f"{self.rotary_dim} rotary dims; rotary embeddings need a positive even count")

  @property
  def rotary_dim(self) -> int:
    """Rotated dims per head, truncated as HF truncates them."""
    return int(self.head_dim * self.rotary_fraction)


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
