r"""A compiled cost model of the recipes on real chips: every figure is a prediction.

  python -m benchmarks.roofline                 # three shapes, five chips, three recipes
  python -m benchmarks.roofline --json out.json

For RhoMath-1B, Qwen2.5-1.5B and Qwen2.5-7B shapes (bfloat16 weights, abstract
arrays: jax.ShapeDtypeStruct, nothing allocated) the project's own programs are
lowered and compiled for this machine's CPU, and XLA's cost_analysis() read off:
  decode   one sampler step (model.forward over a KV cache, a row's own slot each)
           at batch 64 and 256, the cache as long as the recipe's prompt + completion;
  prefill  64 prompts of the recipe's prompt length into a fresh cache;
  scoring  the reference log-probs of a micro-batch (model.completion_token_logprobs);
  update   a TB update of a micro-batch: the gradient of the completion log-probs
           and AdamW on float32 master weights (optim.make_optimizer).
XLA counts a while loop's body once, whatever its trip count (the model scans its
layers), so each program is compiled with 1 and 2 layers, unrolled, and extended
linearly to the shape's depth: cost(L) = cost(1) + (L - 1) (cost(2) - cost(1)).

A program's predicted time on a chip is its roofline bound, max(FLOPs / peak bf16
FLOP/s, bytes / HBM bandwidth): a lower bound (perfect overlap, every byte read
once at full bandwidth). The FLOPs are XLA's; the bytes are the HBM floor
(hbm_bytes: weights, KV cache, logits, optimizer state), because XLA:CPU's "bytes
accessed" (printed beside them) counts buffers a GPU/TPU program never re-reads. No MFU
is printed: the bound's MFU (the update's FLOPs over predicted time x peak) is 100%
wherever the program is compute-bound, as the updates here are, by construction; the
predicted tokens/s at peak says the same. What a chip reaches is a measurement
(benchmarks/accelerator.py's MFU; measured_vs_predicted.py's fraction of the bound).
One TBA step of a recipe, per chip, on one chip for both roles:
  sampling  rows / 256 decode passes of max_new_tokens steps at batch 256 (or at
            the rows, if fewer), plus their prefills;
  scoring   the reference pass over the step's rows (TL;DR: also a reward model
            pass of the policy's shape; red-teaming's victim replies and
            classifier are not modelled);
  update    num_microbatches micro-batch updates;
  sync      a weight publish every sync.every steps, spread over those steps: the
            float32 master weights read and a bfloat16 copy written in HBM, 4 + 2 =
            6 bytes a parameter (sync_bytes).
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import json
import math

# Peak dense bfloat16 FLOP/s (tflops, TFLOP/s), HBM bandwidth (hbm_gbps, GB/s), HBM
# (hbm_gb, GB), and for benchmarks/pod.py's collectives (GB = 1e9 bytes):
#   link_gbps   the chip-to-chip bandwidth inside a node (NVLink) or slice (ICI): GB/s
#               one chip can send at once, one direction, summed over all its links
#               (pod.py divides the bytes each device sends in a collective by it);
#   node_chips  how many chips that fast link joins (an 8-GPU HGX/DGX node; a TPU slice);
#   net_gbps    GB/s one chip can send, one direction, to a chip in another node (GPUs:
#               its own network card); None: not modelled (no TPU group here leaves a slice).
CHIPS = {
    # https://www.nvidia.com/en-us/data-center/h100/ (H100 SXM: 1,979 TFLOPS bf16 with
    # sparsity, i.e. 989 dense; 3.35 TB/s; 80 GB; NVLink 900 GB/s: both directions, 450
    # each way). Between nodes: https://www.nvidia.com/en-us/data-center/dgx-h100/ (DGX
    # H100 / H200 datasheet: 8 GPUs on NVLink/NVSwitch; for the compute network 8
    # single-port ConnectX-7 cards, up to 400 Gb/s InfiniBand/Ethernet, one per GPU):
    # 400 / 8 = 50 GB/s each way per GPU, 1/9 of NVLink's 450 (quoted as known, not
    # re-fetched when written).
    "H100": dict(tflops=989.0, hbm_gbps=3350.0, hbm_gb=80.0, link_gbps=450.0,
                 node_chips=8, net_gbps=50.0),
    # https://www.nvidia.com/en-us/data-center/h200/ (H200 SXM: 989 dense bf16; 4.8 TB/s;
    # 141 GB; NVLink 900 GB/s, 450 each way); nodes and network as H100's (DGX H200).
    "H200": dict(tflops=989.0, hbm_gbps=4800.0, hbm_gb=141.0, link_gbps=450.0,
                 node_chips=8, net_gbps=50.0),
    # TPUs: Google's "ICI bandwidth per chip" in Gbps / 8 (the pages below). It matches
    # the one-way rates of a chip's links summed, not both directions (which would be
    # twice): jax-ml/scaling-book's tpus.md ("How to Think About TPUs") gives per link,
    # one way, v5e 5e10, v5p and v6e 1e11 bytes/s, with 4 links (2-D torus) on v5e / v6e
    # and 6 (3-D) on v5p: 4 x 50 = 200 GB/s = 1,600 Gbps; 6 x 100 = 600 GB/s = 4,800
    # Gbps; v6e's 3,584 Gbps = 448 GB/s = 4 x 112 (the book rounds to 1e11). A collective
    # along one torus axis uses 2 of the links, so it gets at most half of link_gbps on
    # v5e / v6e (a third on v5p): pod.py's TPU times are optimistic by up to that much.
    # node_chips: the largest ICI slice (v5e / v6e 16 x 16, v5p 8,960 chips); between
    # slices (DCN) is not modelled.
    # https://cloud.google.com/tpu/docs/v5e (197 TFLOP/s bf16; 819 GB/s; 16 GB;
    # ICI 1,600 Gbps per chip)
    "v5e": dict(tflops=197.0, hbm_gbps=819.0, hbm_gb=16.0, link_gbps=200.0,
                node_chips=256, net_gbps=None),
    # https://cloud.google.com/tpu/docs/v5p (459 TFLOP/s bf16; 2,765 GB/s; 95 GB;
    # ICI 4,800 Gbps per chip)
    "v5p": dict(tflops=459.0, hbm_gbps=2765.0, hbm_gb=95.0, link_gbps=600.0,
                node_chips=8960, net_gbps=None),
    # https://cloud.google.com/tpu/docs/v6e (918 TFLOP/s bf16; 1,640 GB/s; 32 GB;
    # ICI 3,584 Gbps per chip)
    "v6e": dict(tflops=918.0, hbm_gbps=1640.0, hbm_gb=32.0, link_gbps=448.0,
                node_chips=256, net_gbps=None),
}
SHAPES = {"rho-1b": "realtreetune/rho-1b-sft-GSM8K", "qwen2.5-1.5b": "Qwen/Qwen2.5-1.5B-Instruct",
          "qwen2.5-7b": "Qwen/Qwen2.5-7B-Instruct"}
# The recipes whose lengths and batch sizes are read (config file, variant).
RECIPES = {"gsm8k": ("gsm8k", "rho1b"), "tldr": ("tldr", "pythia1b"), "redteam": ("redteam", "gpt2")}
DECODE_BATCHES = (64, 256)


def architecture(shape: str, num_layers: int | None = None):
  from benchmarks.memory import ARCHITECTURES
  from tba_jax.model import ModelConfig
  arch = dict(ARCHITECTURES[SHAPES[shape]], dtype="bfloat16")
  if num_layers is not None:
    arch["num_layers"] = num_layers
  return ModelConfig(**arch)


# benchmarks/accelerator.py's settings (its defaults), so benchmarks/gpu.sh and tpu.sh
# print its measurements beside these predictions: decode at a prompt of 128 and 256 new
# tokens, the update on 16 sequences of 640 tokens.
ACCELERATOR = dict(prompt_len=128, new_tokens=256, rows=16, microbatches=1, sync_every=1,
                   reward_model=False, train_len=640, variant="benchmarks/accelerator.py")


def recipe(name: str) -> dict:
  """The lengths and batch sizes of recipe `name` (its config file's values)."""
  import importlib
  if name == "accelerator":
    return dict(ACCELERATOR)
  module, variant = RECIPES[name]
  c = importlib.import_module(f"configs.{module}").get_config(variant)
  rows = c.buffer.num_prompts * c.buffer.samples_per_prompt
  return dict(prompt_len=c.task.max_prompt_len, new_tokens=c.sampler.max_new_tokens, rows=rows,
              microbatches=c.optim.num_microbatches, sync_every=c.sync.every,
              reward_model=name == "tldr", variant=f"configs/{module}.py:{variant}")


@contextlib.contextmanager
def unrolled_layers():
  """The model's layer scan unrolled (so cost_analysis counts every layer)."""
  from flax import nnx
  scan = nnx.scan
  nnx.scan = functools.partial(scan, unroll=True)
  try:
    yield
  finally:
    nnx.scan = scan


def _cost(fn, *args) -> dict:
  compiled = fn.lower(*args).compile()
  ca = compiled.cost_analysis()
  ca = ca[0] if isinstance(ca, (list, tuple)) else ca
  return {"flops": float(ca.get("flops", 0.0)), "bytes": float(ca.get("bytes accessed", 0.0))}


def programs(cfg, r: dict) -> dict:
  """cost_analysis of each program (module doc) for architecture cfg and recipe r."""
  import jax
  import jax.numpy as jnp
  import optax  # noqa: F401 (make_optimizer's)

  from tba_jax import model, optim, sampler
  from tba_jax.kv_cache import KVCache

  sds = jax.ShapeDtypeStruct
  params = model.param_shapes(cfg)
  logits_fn = sampler.model_logits_fn(cfg)
  s, tp, tc = r["prompt_len"] + r["new_tokens"], r["prompt_len"], r["new_tokens"]
  out = {}
  for b in DECODE_BATCHES:
    cache = jax.eval_shape(lambda b=b: KVCache.init(cfg, b, s))
    cache = KVCache(cache.k, cache.v, cache.mask, sds((b,), jnp.int32))
    tok = sds((b, 1), jnp.int32)
    out[f"decode{b}"] = _cost(jax.jit(logits_fn), params, tok, tok, tok, cache)
  u = 64
  fresh = jax.eval_shape(lambda: KVCache.init(cfg, u, tp))
  prompt = sds((u, tp), jnp.int32)
  out["prefill"] = _cost(jax.jit(logits_fn), params, prompt, prompt, prompt, fresh)
  micro = max(1, r["rows"] // r["microbatches"])
  seq = sds((micro, r.get("train_len", tp + tc)), jnp.int32)
  score = lambda p, t, m: model.completion_token_logprobs(cfg, p, t, m, tc, 1.0)
  out["scoring"] = _cost(jax.jit(score), params, seq, seq)

  master = jax.tree.map(lambda x: sds(x.shape, jnp.float32), params)
  optimizer = optim.make_optimizer(1e-5, 0.0, 1.0)
  opt_state = jax.eval_shape(optimizer.init, master)

  def update(master, opt_state, tokens, mask):
    def loss(p):
      p = jax.tree.map(lambda x: x.astype(jnp.bfloat16), p)  # bfloat16 compute
      lp = model.completion_token_logprobs(cfg, p, tokens, mask, tc, 1.0)
      return jnp.var(jnp.sum(lp, axis=-1))  # TB's VarGrad shape: a variance over rows
    grads = jax.grad(loss)(master)
    updates, opt_state = optimizer.update(grads, opt_state, master)
    return jax.tree.map(lambda p, d: p + d, master, updates), opt_state

  out["update"] = _cost(jax.jit(update, donate_argnums=(0, 1)), master, opt_state, seq, seq)
  return out


def hbm_bytes(cfg, r: dict) -> dict:
  """The bytes each program must move through HBM at least (the prediction's bytes):
  weights read once, the KV cache read / written, the float32 logits, and for the
  update the float32 master weights, AdamW moments and gradients read and written."""
  from tba_jax import model
  n = model.count_params(cfg)
  kv = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * 2  # per token, bfloat16
  s, tp, tc = r["prompt_len"] + r["new_tokens"], r["prompt_len"], r["new_tokens"]
  micro = max(1, r["rows"] // r["microbatches"])
  logits = micro * tc * cfg.vocab_size * 4
  out = {f"decode{b}": 2 * n + b * (s + 1) * kv + b * cfg.vocab_size * 4 for b in DECODE_BATCHES}
  out.update(prefill=2 * n + 64 * tp * kv, scoring=2 * n + logits,
             update=2 * n + (8 + 16 + 8) * n + 3 * logits)
  return out


def costs(shape: str, r: dict) -> dict:
  """Each program's FLOPs and XLA:CPU's bytes at the shape's full depth, from 1- and
  2-layer compiles, and the HBM floor `hbm` (hbm_bytes). XLA:CPU's "bytes accessed"
  is printed, not used: it counts an in-place cache update as its whole buffer (so
  per layer, the whole stacked cache) and every unfused CPU op's operands, which a
  GPU or TPU program fuses away."""
  with unrolled_layers():
    one, two = programs(architecture(shape, 1), r), programs(architecture(shape, 2), r)
  depth = architecture(shape).num_layers
  floor = hbm_bytes(architecture(shape), r)
  return {k: {"flops": one[k]["flops"] + (depth - 1) * (two[k]["flops"] - one[k]["flops"]),
              "xla_bytes": one[k]["bytes"] + (depth - 1) * (two[k]["bytes"] - one[k]["bytes"]),
              "bytes": floor[k]} for k in one}


def seconds(cost: dict, chip: dict) -> float:
  """The roofline bound of a program on a chip."""
  return max(cost["flops"] / (chip["tflops"] * 1e12), cost["bytes"] / (chip["hbm_gbps"] * 1e9))


def weight_bytes(shape: str) -> int:
  from tba_jax import model
  return model.count_params(architecture(shape)) * 2  # bfloat16


def sync_bytes(shape: str) -> int:
  """The HBM floor of one weight publish: the trainer's float32 master weights read (4
  bytes a parameter) and the searcher's bfloat16 copy written (2)."""
  from tba_jax import model
  return model.count_params(architecture(shape)) * (4 + 2)


def step(shape: str, r: dict, c: dict, chip: dict) -> dict:
  """Predicted seconds of one TBA step of recipe r, split (module doc)."""
  batch = 256 if r["rows"] >= 256 else r["rows"]
  decode_key = "decode256" if batch > 64 else "decode64"
  decode_tps = 256 if batch > 64 else 64
  passes = r["rows"] / decode_tps
  sampling = passes * (r["new_tokens"] * seconds(c[decode_key], chip)
                       + seconds(c["prefill"], chip) * decode_tps / 64)
  micro = r["microbatches"]
  scoring = micro * seconds(c["scoring"], chip) * (2 if r["reward_model"] else 1)
  update = micro * seconds(c["update"], chip)
  sync = sync_bytes(shape) / (chip["hbm_gbps"] * 1e9) / r["sync_every"]
  return dict(sampling=sampling, scoring=scoring, update=update, sync=sync,
              total=sampling + scoring + update + sync)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--shapes", default=",".join(SHAPES))
  parser.add_argument("--recipes", default=",".join(RECIPES),
                      help="of " + ", ".join(RECIPES) + ", accelerator (benchmarks/accelerator.py's)")
  parser.add_argument("--json", default="")
  args = parser.parse_args(argv)
  import time
  import jax
  start = time.perf_counter()
  shapes, names = args.shapes.split(","), args.recipes.split(",")
  recipes = {n: recipe(n) for n in names}
  table = {(sh, n): costs(sh, recipes[n]) for sh in shapes for n in names}
  print(f"# compiled on {jax.devices()[0].device_kind} in {time.perf_counter() - start:.0f} s; "
        "every figure below is predicted (roofline bound from XLA's cost_analysis)")
  for n in names:
    r = recipes[n]
    print(f"\n## {n} ({r['variant']}: prompt {r['prompt_len']}, new {r['new_tokens']}, "
          f"{r['rows']} rows/step in {r['microbatches']} micro-batches, sync every "
          f"{r['sync_every']})")
    print("| shape | program | GFLOP (XLA) | HBM GB (floor) | XLA:CPU GB | "
          + " | ".join(f"{k} predicted" for k in CHIPS) + " |")
    print("|---|---|---|---|---|" + "---|" * len(CHIPS))
    for sh in shapes:
      c = table[(sh, n)]
      for k in ("decode64", "decode256"):
        b = int(k[6:])
        cells = [f"{b / seconds(c[k], chip):,.0f} tok/s" for chip in CHIPS.values()]
        print(f"| {sh} | {k} | {c[k]['flops'] / 1e9:,.1f} | {c[k]['bytes'] / 1e9:,.2f} | "
              f"{c[k]['xla_bytes'] / 1e9:,.1f} | " + " | ".join(cells) + " |")
      tokens = max(1, r["rows"] // r["microbatches"]) * r.get(
          "train_len", r["prompt_len"] + r["new_tokens"])
      cells = [f"{tokens / seconds(c['update'], chip):,.0f} tok/s" for chip in CHIPS.values()]
      print(f"| {sh} | update | {c['update']['flops'] / 1e9:,.0f} | "
            f"{c['update']['bytes'] / 1e9:,.1f} | {c['update']['xla_bytes'] / 1e9:,.0f} | "
            + " | ".join(cells) + " |")
    print("\n| shape | TBA step predicted (s): sampling + scoring + update + sync | "
          + " | ".join(CHIPS) + " |")
    print("|---|---|" + "---|" * len(CHIPS))
    for sh in shapes:
      parts = [step(sh, r, table[(sh, n)], chip) for chip in CHIPS.values()]
      cells = [f"{p['total']:.2f} ({p['sampling']:.2f} + {p['scoring']:.2f} + {p['update']:.2f}"
               f" + {p['sync']:.3f})" for p in parts]
      print(f"| {sh} | predicted | " + " | ".join(cells) + " |")
  if args.json:
    with open(args.json, "w") as f:
      json.dump({f"{sh}/{n}": {"costs": table[(sh, n)], "recipe": recipes[n],
                               "steps": {k: step(sh, recipes[n], table[(sh, n)], chip)
                                         for k, chip in CHIPS.items()}}
                 for sh, n in table}, f, indent=1)
  return table


if __name__ == "__main__":
  main()
