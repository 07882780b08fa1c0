r"""Rows in flight that fit on one searcher device, with and without KV pages: computed
(not measured).

  python -m benchmarks.kv_rows                  # the recipes below on the five chips
  python -m benchmarks.kv_rows --mean 0.25,0.5  # rows' mean length as a fraction of max

A searcher device holds its weights (benchmarks/memory.py's searcher_weights: the
sampled copy, the published one during a sync, the reference); paged_kv.py's auto pool
takes AUTO_MEMORY_FRACTION of the rest. Without pages each row in flight reserves
max_prompt_len + max_new_tokens slots; with pages (16 slots each) a row holds the pages
its length has reached plus one decode chunk (32 steps) ahead, so the rows that fit
depend on the rows' mean length: --mean gives it as a fraction of the maximum (RL
completions vary ~4x in length; the fractions are assumptions, not measurements).
"""
from __future__ import annotations

import argparse

RECIPES = ("rho1b", "qwen", "qwen_lora", "tldr:pythia1b", "redteam:gpt2", "math:tba_prime")


def _estimate(arg: str) -> tuple[dict, object]:
  """(benchmarks.memory's estimate, the recipe's config)."""
  from benchmarks import memory
  from configs import gsm8k, math as math_config, redteam, tldr
  if arg.startswith("tldr:"):
    return memory.estimate_tldr(arg[5:]), tldr.get_config(arg[5:])
  if arg.startswith("redteam:"):
    return memory.estimate(arg), redteam.get_config(arg[8:])
  if arg.startswith("math:"):
    return memory.estimate(arg), math_config.get_config(arg[5:])
  return memory.estimate(arg), gsm8k.get_config(arg)


def rows_in_flight(arg: str, hbm_gb: float, mean: float, page: int = 16, chunk: int = 32):
  """(rows without pages, rows with pages) on a device of `hbm_gb`."""
  import jax.numpy as jnp

  from benchmarks import memory
  from tba_jax import paged_kv
  e, c = _estimate(arg)
  if arg.startswith("tldr:"):
    arch = memory.pythia_shape(c.model.path)
  else:
    arch = memory.ARCHITECTURES[c.model.path]
  per_token = (2 * arch["num_layers"] * arch["num_kv_heads"] * arch["head_dim"]
               * jnp.dtype(c.sync.weights_dtype or c.model.dtype).itemsize)
  weights = e["searcher_weights"] + e.get("searcher_reward", 0)
  budget = paged_kv.AUTO_MEMORY_FRACTION * (hbm_gb * 1e9 - weights)
  if budget <= 0:
    return 0, 0
  full = c.task.max_prompt_len + c.sampler.max_new_tokens
  held = min(full, mean * full + chunk)
  paged = -(-int(held) // page) * page + page  # whole pages, and a row's scratch page
  return int(budget // (full * per_token)), int(budget // (paged * per_token))


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--mean", default="0.25,0.5")
  parser.add_argument("--recipes", default=",".join(RECIPES))
  args = parser.parse_args(argv)
  from benchmarks.roofline import CHIPS
  means = [float(m) for m in args.mean.split(",")]
  print("| recipe | chip (HBM GB) | rows without pages (computed) | "
        + " | ".join(f"rows with pages, mean length {m:g} x max (computed)" for m in means) + " |")
  print("|---|---|---|" + "---|" * len(means))
  for arg in args.recipes.split(","):
    for name, chip in CHIPS.items():
      counts = [rows_in_flight(arg, chip["hbm_gb"], m) for m in means]
      print(f"| `{arg}` | {name} ({chip['hbm_gb']:.0f}) | {counts[0][0]:,} | "
            + " | ".join(f"{p:,}" for _, p in counts) + " |")


if __name__ == "__main__":
  main()
