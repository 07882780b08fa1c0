"""GGUF files (llama architecture) read under Hugging Face tensor names: tensors
dequantised to float32, llama.cpp's rotary row permutation of q/k undone, and the
ModelConfig described by the metadata. hf_checkpoints.load uses it for .gguf paths."""
from __future__ import annotations

import functools
import os

import numpy as np

from tba_jax.model_config import ModelConfig


def _unpermute(w: np.ndarray, heads: int) -> np.ndarray:
  """Undo llama.cpp's rotary row permutation of a q/k projection [heads*H, D]."""
  return w.reshape(heads, w.shape[0] // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


_GGUF_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def gguf_reader(path: str):
  """A parsed GGUF file (memory-mapped). Parsing the vocabulary takes seconds, so
  the model loader and the tokenizer share one reader per file version."""
  stat = os.stat(path)
  return _gguf_reader(os.path.abspath(path), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=2)
def _gguf_reader(path: str, mtime_ns: int, size: int):
  import gguf
  return gguf.GGUFReader(path)


class GGUFWeights:
  """Reads a llama-architecture GGUF file under Hugging Face tensor names."""

  def __init__(self, path: str):
    import gguf
    self.gguf, self.path = gguf, path
    self.reader = gguf_reader(path)
    self.tensors = {t.name: t for t in self.reader.tensors}
    arch = self.field("general.architecture")
    if arch != "llama":
      raise ValueError(f"{path}: unsupported GGUF architecture {arch!r} (supported: llama)")

  def field(self, key, default=None):
    f = self.reader.fields.get(key)
    return default if f is None else f.contents()

  def config(self, dtype: str) -> ModelConfig:
    a = "llama."
    heads = self.field(a + "attention.head_count")
    dim = self.field(a + "embedding_length")
    return ModelConfig(
        vocab_size=self.field(a + "vocab_size") or len(self.field("tokenizer.ggml.tokens")),
        dim=dim, mlp_dim=self.field(a + "feed_forward_length"),
        num_layers=self.field(a + "block_count"), num_heads=heads,
        num_kv_heads=self.field(a + "attention.head_count_kv", heads),
        head_dim=self.field(a + "rope.dimension_count", dim // heads),
        norm_eps=float(self.field(a + "attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=float(self.field(a + "rope.freq_base", 10000.0)),
        tie_embeddings="output.weight" not in self.tensors,
        max_position_embeddings=self.field(a + "context_length", 2048), dtype=dtype,
        model_type="llama", bos_token_id=self.field("tokenizer.ggml.bos_token_id"),
        eos_token_id=self.field("tokenizer.ggml.eos_token_id"))

  def __call__(self, name: str) -> np.ndarray:
    if name.startswith("model.layers."):
      _, _, i, rest = name.split(".", 3)
      gguf_name = f"blk.{i}.{_GGUF_NAMES.get(rest, rest)}"
    else:
      gguf_name = _GGUF_NAMES.get(name, name)
    if gguf_name not in self.tensors:
      raise KeyError(f"{self.path}: GGUF file has no tensor {gguf_name!r} (for {name!r})")
    t = self.tensors[gguf_name]
    w = self.gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
    w = w.reshape([int(x) for x in reversed(t.shape)])  # GGUF lists dims innermost first
    if gguf_name.endswith("attn_q.weight"):
      w = _unpermute(w, self.field("llama.attention.head_count"))
    elif gguf_name.endswith("attn_k.weight"):
      w = _unpermute(w, self.field("llama.attention.head_count_kv"))
    return w
