r"""Asynchronous TBA against tba_jax's synchronous on-policy mode, side by side.

  python -m benchmarks.async_speedup --minutes 8 --target 0.6 --out /tmp/async_vs_sync

Both runs use the embedded `cpu` config (SmolLM2-135M-Instruct, offline
arithmetic, the same seed, prompts, batch shape B x K and evaluation), one
after the other, each in a fresh process with no compilation cache and the
same wall-clock budget for training:

  async  the config as it is: searcher thread(s) generating S samples per prompt
         while the trainer trains from the buffer (m, k, reuse as configured);
  sync   sync.mode=alternate, k=1, m=1, S=K, pre-fill of one batch, no
         de-duplication and K entries kept per prompt: every step generates
         B x K fresh samples with the current weights, then trains on exactly
         them (no reuse; staleness 0) -- synchronous on-policy training.

Held-out sampled accuracy is evaluated every --eval_seconds of wall-clock in
both. Prints: time to reach --target, accuracy at the common budget, the
ratio, trainer idle / searcher busy fractions, staleness, steps and samples;
saves both runs' metrics under --out and an overlaid plot (--out/compare.png).
"""
import argparse
import json
import os
import subprocess
import sys
import time

from experiments.plot import plot
from tba_jax.metrics import read_jsonl

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the runs' working directory

ACC = "eval/sampled_pass@1"


def _run(name, out, budget, eval_seconds, overrides):
  workdir = os.path.join(out, name)
  cmd = [sys.executable, "-m", "experiments.gsm8k", "--config=configs/gsm8k.py:cpu",
         f"--workdir={workdir}", "--compilation_cache=", "--config.num_train_steps=100000",
         f"--config.max_train_seconds={budget}", f"--config.eval.every_seconds={eval_seconds}",
         "--config.eval.every=0", "--config.checkpoint.every=100000", "--config.export=False",
         *overrides]
  print(f"[{name}] {' '.join(cmd[1:])}", flush=True)
  t0 = time.time()
  subprocess.run(cmd, cwd=ROOT, check=True, stderr=subprocess.DEVNULL)
  print(f"[{name}] finished in {time.time() - t0:.0f} s", flush=True)
  return workdir


def _summary(workdir, target):
  rows = read_jsonl(os.path.join(workdir, "metrics.jsonl"))
  train = [r for r in rows if "loss" in r]
  samples = {r["step"]: r["searcher_samples"] for r in train}  # generated up to each step
  evals = [(r["wall_time"], r[ACC], samples.get(r["step"], 0)) for r in rows if ACC in r]
  reached = next(((t, s) for t, a, s in evals if a >= target), (None, None))
  return {
      "start_accuracy": evals[0][1], "final_accuracy": evals[-1][1],
      "best_accuracy": max(a for _, a, _ in evals), "seconds_to_target": reached[0],
      "samples_to_target": reached[1], "evals": evals, "steps": len(train),
      "samples_generated": train[-1]["searcher_samples"],
      "trainer_idle_fraction": train[-1]["trainer_idle_fraction"],
      "searcher_busy_fraction": train[-1]["searcher_busy_fraction"],
      "staleness_mean": sum(r["staleness_mean"] for r in train) / len(train),
      "staleness_max": max(r["staleness_max"] for r in train),
      "step_seconds_median": sorted(r["step_seconds"] for r in train)[len(train) // 2],
  }


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--minutes", type=float, default=8.0, help="training budget per run")
  parser.add_argument("--target", type=float, default=0.6, help="held-out sampled accuracy")
  parser.add_argument("--eval_seconds", type=float, default=90.0)
  parser.add_argument("--out", default="/tmp/tba_async_vs_sync")
  parser.add_argument("--only", default="", help="run only 'async' or 'sync' (reuse the other)")
  args = parser.parse_args()
  from configs.gsm8k import get_config
  c = get_config("cpu")
  b, k = c.buffer.num_prompts, c.buffer.samples_per_prompt
  sync = ["--config.sync.mode=alternate", "--config.sync.every=1", "--config.buffer.m=1.0",
          f"--config.sampler.num_samples_per_prompt={k}", f"--config.sampler.num_prompts_per_batch={b}",
          f"--config.buffer.prefill={b * k}", "--config.buffer.dedup=False",
          f"--config.buffer.max_per_prompt={k}"]
  budget = int(args.minutes * 60)
  os.makedirs(args.out, exist_ok=True)
  runs = {"async": [], "sync": sync}
  for name, overrides in runs.items():
    if args.only in ("", name):
      _run(name, args.out, budget, args.eval_seconds, overrides)
  results = {name: _summary(os.path.join(args.out, name), args.target) for name in runs}
  with open(os.path.join(args.out, "summary.json"), "w") as f:
    json.dump(results, f, indent=1)
  png = plot([os.path.join(args.out, n) for n in runs], os.path.join(args.out, "compare.png"),
             list(runs))

  a, s = results["async"], results["sync"]
  print(f"\ncpu config, B={b} prompts x K={k}; async S={c.sampler.num_samples_per_prompt}, "
        f"m={c.buffer.m}, k={c.sync.every}; training budget {budget} s each; target {args.target}")
  print(f"{'':>26} {'async':>10} {'sync':>10}")
  for key in ("start_accuracy", "final_accuracy", "best_accuracy", "seconds_to_target",
              "samples_to_target", "steps",
              "samples_generated", "step_seconds_median", "trainer_idle_fraction",
              "searcher_busy_fraction", "staleness_mean", "staleness_max"):
    fmt = lambda v: "not reached" if v is None else (f"{v:.3f}" if isinstance(v, float) else str(v))
    print(f"{key:>26} {fmt(a[key]):>10} {fmt(s[key]):>10}")
  if a["seconds_to_target"] and s["seconds_to_target"]:
    print(f"time-to-target ratio (sync / async): {s['seconds_to_target'] / a['seconds_to_target']:.2f}x")
  else:
    print("time-to-target ratio: undefined (a run did not reach the target)")
  print(f"accuracy at equal wall-clock ({budget} s): async {a['final_accuracy']:.3f} vs "
        f"sync {s['final_accuracy']:.3f}")
  print(f"plot: {png}")


if __name__ == "__main__":
  main()
