"""Tiny random transformers (PyTorch) checkpoints in the real on-disk format."""
import numpy as np

TINY = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
            rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2, pad_token_id=0)

VARIANTS = {
    "llama": ("LlamaConfig", dict(tie_word_embeddings=False, rope_theta=10000.0)),
    "llama_tied": ("LlamaConfig", dict(tie_word_embeddings=True, rope_theta=500000.0)),
    "llama3_scaling": ("LlamaConfig", dict(
        tie_word_embeddings=False,
        rope_parameters=dict(rope_type="llama3", rope_theta=500000.0, factor=8.0,
                             low_freq_factor=1.0, high_freq_factor=4.0,
                             original_max_position_embeddings=16))),
    "qwen2": ("Qwen2Config", dict(tie_word_embeddings=True, rope_theta=1000000.0)),
    "mistral": ("MistralConfig", dict(tie_word_embeddings=False, sliding_window=None)),
}


def make_hf_model(variant: str, seed: int = 0):
  """A random float32 transformers causal LM of the given variant."""
  import torch
  import transformers
  cls_name, extra = VARIANTS[variant]
  config = getattr(transformers, cls_name)(**TINY, **extra)
  torch.manual_seed(seed)
  model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
  with torch.no_grad():  # non-trivial norms and biases, so their loading is tested
    for name, p in model.named_parameters():
      if "norm" in name or name.endswith("bias"):
        p.copy_(p + 0.1 * torch.randn_like(p))
  return model.eval()


def hf_logits(model, tokens: np.ndarray, mask: np.ndarray) -> np.ndarray:
  """transformers' float32 logits with explicit left-padding-aware positions."""
  import torch
  positions = np.maximum(np.cumsum(mask, -1) - 1, 0)
  with torch.no_grad():
    out = model(input_ids=torch.tensor(tokens), attention_mask=torch.tensor(mask),
                position_ids=torch.tensor(positions))
  return out.logits.float().numpy()


def left_padded_batch(rng: np.random.Generator, lengths, vocab: int = 128, pad: int = 0):
  t = max(lengths)
  tokens = np.full((len(lengths), t), pad, np.int64)
  mask = np.zeros((len(lengths), t), np.int64)
  for i, n in enumerate(lengths):
    tokens[i, t - n:] = rng.integers(3, vocab, n)
    mask[i, t - n:] = 1
  return tokens, mask
