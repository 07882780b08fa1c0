"""Tiny random transformers (PyTorch) checkpoints in the real on-disk format."""
import json
import shutil

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
# Qwen3, Gemma 3 and sliding windows (tests/model_families_test.py), on the same TINY shape.
FAMILIES = {
    # Qwen3: per-head q/k RMSNorm, head_dim set apart from hidden / heads.
    "qwen3": ("Qwen3Config", dict(tie_word_embeddings=True, head_dim=32,
                                  rope_parameters=dict(rope_type="default", rope_theta=1e6))),
    # Gemma 3 text: (1 + w) norms before and after each branch, q/k norms, scaled
    # embeddings, sliding (window 3) and global layers with their own rope bases, linear
    # rope scaling on the global ones (the 4B+ text towers' setting), logit softcap.
    "gemma3": ("Gemma3TextConfig", dict(
        num_hidden_layers=4, head_dim=16, query_pre_attn_scalar=24, sliding_window=3,
        layer_types=["sliding_attention", "full_attention"] * 2, final_logit_softcapping=5.0,
        rope_parameters={"full_attention": dict(rope_type="linear", factor=4.0, rope_theta=1e6),
                         "sliding_attention": dict(rope_type="default", rope_theta=1e4)})),
    # Mistral v0.1's window on every layer; Qwen2's on the layers from max_window_layers on.
    "mistral_sliding": ("MistralConfig", dict(tie_word_embeddings=False, sliding_window=3)),
    "qwen2_sliding": ("Qwen2Config", dict(tie_word_embeddings=True, use_sliding_window=True,
                                          sliding_window=4, max_window_layers=1)),
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


# Architectures beyond the Llama family: (transformers config class, its kwargs).
_NEOX = dict(vocab_size=128, hidden_size=64, intermediate_size=256, num_hidden_layers=2,
             num_attention_heads=4, max_position_embeddings=256, layer_norm_eps=1e-5,
             rope_parameters=dict(rope_type="default", rope_theta=10000.0,
                                  partial_rotary_factor=0.25),
             bos_token_id=1, eos_token_id=2, pad_token_id=0)
_ENCODER = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, type_vocab_size=2)
MODELS = {
    **{name: (cls, {**TINY, **extra}) for name, (cls, extra) in {**VARIANTS, **FAMILIES}.items()},
    "gpt_neox": ("GPTNeoXConfig", _NEOX),
    "gpt_neox_sequential": ("GPTNeoXConfig", dict(_NEOX, use_parallel_residual=False)),
    "gpt2": ("GPT2Config", dict(vocab_size=128, n_embd=64, n_layer=2, n_head=4, n_positions=64,
                                bos_token_id=1, eos_token_id=2, pad_token_id=0)),
    "bert": ("BertConfig", dict(_ENCODER, max_position_embeddings=64, pad_token_id=0)),
    # RoBERTa positions start at pad_token_id + 1, so the table is 2 rows longer.
    "roberta": ("RobertaConfig", dict(_ENCODER, max_position_embeddings=66, pad_token_id=1,
                                      bos_token_id=0, eos_token_id=2)),
}
PAD = {"roberta": 1}  # pad id of each model (0 for the others)


def make_model(name: str, head: str = "lm", num_labels: int = 3, seed: int = 0, **overrides):
  """A random float32 transformers model of MODELS[name] (config kwargs updated by
  `overrides`) with `head`: "lm" (causal LM), "classifier"
  (...ForSequenceClassification) or "bare" (the backbone).

  Weights are drawn with std 0.2 rather than transformers' 0.02: outputs then
  spread over O(1) (a 1e-4 tolerance means something) and greedy tokens depend
  on the context (at 0.02 a tiny model repeats one token whatever the prompt)."""
  import torch
  import transformers
  cls_name, kw = MODELS[name]
  kw = {**kw, "initializer_range": 0.2, **overrides}
  config = getattr(transformers, cls_name)(**kw, num_labels=num_labels)
  auto = {"lm": transformers.AutoModelForCausalLM, "bare": transformers.AutoModel,
          "classifier": transformers.AutoModelForSequenceClassification}[head]
  torch.manual_seed(seed)
  model = auto.from_config(config, dtype=torch.float32)
  with torch.no_grad():  # non-trivial norms and biases, so their loading is tested
    for p in model.parameters():
      if p.ndim == 1:
        p.copy_(p + 0.1 * torch.randn_like(p))
  return model.eval()


def hf_scores(model, tokens: np.ndarray, mask: np.ndarray) -> np.ndarray:
  """`.logits` of a transformers ...ForSequenceClassification; decoders get the
  positions of the real tokens (as TRL's reward forward passes them)."""
  import torch
  kw = dict(input_ids=torch.tensor(tokens), attention_mask=torch.tensor(mask))
  if model.config.model_type not in ("bert", "roberta"):
    kw["position_ids"] = torch.tensor(np.maximum(np.cumsum(mask, -1) - 1, 0))
  with torch.no_grad():
    return model(**kw).logits.float().numpy()


def hf_embeddings(model, tokens: np.ndarray, mask: np.ndarray) -> np.ndarray:
  """sentence-transformers' Pooling(mean) + Normalize over a bare encoder's output."""
  import torch
  with torch.no_grad():
    hidden = model(input_ids=torch.tensor(tokens), attention_mask=torch.tensor(mask)).last_hidden_state
    m = torch.tensor(mask)[..., None].float()
    mean = (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)
    return torch.nn.functional.normalize(mean, p=2, dim=1).numpy()


def padded_batch(rng: np.random.Generator, lengths, side: str, vocab: int = 128, pad: int = 0):
  """Random real tokens (ids >= 3, never a pad id) padded on `side` ("left" / "right")."""
  tokens, mask = left_padded_batch(rng, lengths, vocab, pad)
  if side == "right":
    for i, n in enumerate(lengths):
      tokens[i], mask[i] = np.roll(tokens[i], n - len(tokens[i])), np.roll(mask[i], n - len(mask[i]))
  return tokens, mask


def edit_config(path: str, tmp_path, **changes) -> str:
  """A copy of checkpoint directory `path` (at tmp_path / "edited") with config.json's
  keys updated by `changes`."""
  dst = tmp_path / "edited"
  shutil.copytree(path, dst)
  c = json.loads((dst / "config.json").read_text())
  c.update(changes)
  (dst / "config.json").write_text(json.dumps(c))
  return str(dst)
