r"""LoRA against full fine-tuning, and a LoRA searcher's two ways to apply adapters.

  python -m benchmarks.lora runs [--rank 16]    # the `cpu` run twice: full, then LoRA
  python -m benchmarks.lora searcher [--rank 16] [--repeats 5]

runs      `python -m experiments.gsm8k --config configs/gsm8k.py:cpu` as it is (full
          fine-tuning) and with --config.model.lora.rank=R, one after the other, each in
          a fresh process with no compilation cache. Prints per run: wall-clock, held-out
          accuracy (eval/sampled_pass@1) at each evaluation, the trainer's median step
          time, the bytes a weight sync publishes (the published tree in the searchers'
          dtype: every weight, or only the adapters) and the process's peak RSS; and the
          machine's load average before and after (the machine may be shared).
searcher  SmolLM2-135M-Instruct (float32, the `cpu` searcher's batch: 4 prompts x 8
          samples, 32 new tokens) with rank-R adapters on every projection, on one CPU
          device. unmerged: the sampler runs the model with its adapters (x W + s x A B
          beside each projection), the searcher holds the base once plus the adapters;
          merged: after each sync the searcher folds the adapters into a copy of the base
          (lora.merge) and samples the plain model, holding the base (its reference) and
          the merged copy. Prints the sampling time per batch (best of --repeats), the
          merge time per sync, and the weight bytes each way holds.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from benchmarks.timing import best_of

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the runs' working directory

ACC = "eval/sampled_pass@1"

def _published_bytes(overrides: list[str]) -> int:
  """Bytes one sync publishes under the `cpu` config with `overrides`: the trained tree
  (all weights, or the adapters) in the searchers' dtype."""
  import jax
  import jax.numpy as jnp

  from configs import gsm8k
  from tba_jax import config_builders, hf_checkpoints, lora, model
  c = gsm8k.get_config(",".join(["cpu", *overrides]))
  cfg = hf_checkpoints.read_config(config_builders.model_path(c.model.path))
  cfg = cfg.replace(lora=config_builders.lora_config(c.model.lora, cfg))
  size = jnp.dtype(c.sync.weights_dtype or c.model.dtype).itemsize
  return sum(x.size for x in jax.tree.leaves(lora.trained(cfg, model.param_shapes(cfg)))) * size


def _run(name: str, out: str, overrides: list[str]) -> dict:
  workdir = os.path.join(out, name)
  cmd = [sys.executable, "-m", "experiments.gsm8k", "--config=configs/gsm8k.py:cpu",
         f"--workdir={workdir}", "--compilation_cache=",
         *[f"--config.{o}" for o in overrides]]
  load = os.getloadavg()[0]
  print(f"[{name}] {' '.join(cmd[1:])}  (load average {load:.1f})", flush=True)
  t0 = time.time()
  proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  _, status, usage = os.wait4(proc.pid, 0)
  seconds = time.time() - t0
  if status:
    raise SystemExit(f"[{name}] failed (status {status}); rerun the command above to see why")
  from tba_jax.metrics import read_jsonl
  rows = read_jsonl(os.path.join(workdir, "metrics.jsonl"))
  steps = sorted(r["step_seconds"] for r in rows if "step_seconds" in r)
  return {"name": name, "wall_seconds": seconds, "load_before": load,
          "load_after": os.getloadavg()[0],
          "accuracy": [(r["step"], r[ACC]) for r in rows if ACC in r],
          "step_seconds_median": steps[len(steps) // 2],
          "sync_bytes": _published_bytes(overrides),
          "peak_rss_mb": usage.ru_maxrss / 1024}  # Linux: kilobytes


def runs(args) -> None:
  out = args.out
  results = [_run("full", out, []), _run(f"lora_r{args.rank}", out, [f"model.lora.rank={args.rank}"])]
  print(f"\n{'run':>10} {'wall-clock':>11} {'accuracy (step: value)':>34} {'step s':>7} "
        f"{'sync MB':>8} {'peak RSS MB':>12} {'load':>10}")
  for r in results:
    acc = ", ".join(f"{s}: {a:.3f}" for s, a in r["accuracy"])
    print(f"{r['name']:>10} {r['wall_seconds'] / 60:>7.1f} min {acc:>34} "
          f"{r['step_seconds_median']:>7.2f} {r['sync_bytes'] / 1e6:>8.2f} "
          f"{r['peak_rss_mb']:>12.0f} {r['load_before']:>4.1f}-{r['load_after']:.1f}")
  with open(os.path.join(out, "summary.json"), "w") as f:
    json.dump(results, f, indent=1)


def searcher(args) -> None:
  import jax

  from configs import gsm8k
  from tba_jax import config_builders, hf_checkpoints, lora, sharding
  from tba_jax.sampler import Sampler, SamplingOptions

  c = gsm8k.get_config("cpu")
  mesh = sharding.make_mesh("searcher", jax.devices()[:1])
  base_cfg, base = hf_checkpoints.load(hf_checkpoints.smollm2_gguf_path(), mesh=mesh,
                                       role="searcher")
  c.unlock()
  c.model.lora.rank = args.rank
  cfg = base_cfg.replace(lora=config_builders.lora_config(c.model.lora, base_cfg))
  # Trained-looking adapters (B no longer zero); the values do not change the timing.
  adapters = lora.init_adapters(cfg, 0, lora.trained(cfg, sharding.param_shardings(cfg, "searcher", mesh)))
  adapters = jax.tree.map(lambda x: x + 1e-3, adapters)
  tok = config_builders.load_tokenizer(c.model)
  task = config_builders.build_task(c.task, tok)
  problems = task.train[:c.sampler.num_prompts_per_batch]
  prompts = [tok.encode_prompt(task.prompt(p)) for p in problems
             for _ in range(c.sampler.num_samples_per_prompt)]
  options = SamplingOptions(max_new_tokens=c.sampler.max_new_tokens,
                            temperature=c.sampler.temperature, eos_ids=())
  sample = lambda config: Sampler(config, options, mesh=mesh)
  unmerged, merged = sample(cfg), sample(base_cfg)  # eos_ids=(): every row decodes all tokens
  params = lora.combine(base, adapters)
  key = jax.random.key(0)
  merge = lambda: jax.block_until_ready(lora.merge(cfg, params))
  plain = merge()
  unmerged(params, prompts, key), merged(plain, prompts, key)  # compile
  t_unmerged = best_of(lambda: unmerged(params, prompts, key), args.repeats)[0]
  t_merged = best_of(lambda: merged(plain, prompts, key), args.repeats)[0]
  t_merge = best_of(merge, args.repeats)[0]
  nbytes = lambda tree: sum(x.nbytes for x in jax.tree.leaves(tree))
  tokens = len(prompts) * c.sampler.max_new_tokens
  print(f"SmolLM2-135M float32, LoRA rank {args.rank} on {','.join(cfg.lora.targets)} "
        f"({lora.count(cfg) / 1e6:.1f}M), batch {len(prompts)} x {c.sampler.max_new_tokens} "
        f"new tokens, {jax.devices()[0].platform}, load average {os.getloadavg()[0]:.1f}")
  print(f"{'searcher':>10} {'sample s':>9} {'tok/s':>7} {'merge s/sync':>13} {'weights MB':>11}")
  print(f"{'unmerged':>10} {t_unmerged:>9.3f} {tokens / t_unmerged:>7.0f} {0.0:>13.3f} "
        f"{(nbytes(base) + nbytes(adapters)) / 1e6:>11.0f}")
  print(f"{'merged':>10} {t_merged:>9.3f} {tokens / t_merged:>7.0f} {t_merge:>13.3f} "
        f"{(nbytes(base) + nbytes(plain)) / 1e6:>11.0f}")


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("part", choices=["runs", "searcher"])
  parser.add_argument("--rank", type=int, default=16)
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--out", default="/tmp/tba_lora_vs_full")
  args = parser.parse_args()
  if args.part == "searcher":
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
  {"runs": runs, "searcher": searcher}[args.part](args)


if __name__ == "__main__":
  main()
