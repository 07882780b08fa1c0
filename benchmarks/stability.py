r"""Does the `cpu` recipe keep what it learns? One change at a time, each run 3x longer.

  python -m benchmarks.stability --arms base lr_2e-5 --out /tmp/stability   # run, then report
  python -m benchmarks.stability --report --out /tmp/stability              # report only

Each arm is the `cpu` recipe (configs/gsm8k.py:cpu) for --steps steps with an evaluation
every --eval_every steps on every test problem x --eval_samples samples (T = 0.7), plus
the arm's overrides; arms run one after another (each needs ~8 GB and both cores). The
report prints, per arm, held-out sampled pass@1 (standard error over problems) at each
evaluation, the peak, the end, end - peak, and the update's diagnostics averaged over
the run's last third: per-completion `kl`, `policy_drift` (how far one update moves the
batch's log-probs), `entropy` of the sampled completions and `grad_norm`.
"""
import argparse
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ACC, SE = "eval/sampled_pass@1", "eval/sampled_pass@1_se"

# The cpu recipe before issue 25 moved it to a decaying lr, no clipping and paced searchers
# (2026-12-04): the arms measured from it keep their meaning on top of it.
BEFORE = ["optim.learning_rate=1e-5", "optim.schedule=constant", "optim.grad_clip_norm=1.0",
          "sync.paced=false"]

# name -> overrides of the cpu recipe.
ARMS = {
    "base": [],              # the recipe: lr 1.5e-5 cosine to 5e-7 over 40 updates, no
                             # clipping, paced, K = 8
    "long_decay": ["optim.decay_steps=0", "optim.final_lr=0"],  # the cosine over the whole run
    "floor_1.5e-6": ["optim.final_lr=1.5e-6"],       # the floor before (2026-12-05)
    "cosine_no_clip": ["sync.paced=false"],          # the recipe, unpaced
    "residual_clip": ["loss.residual_clip=4"],       # TB's residuals under a Huber loss at 4 nats
    "token_kl": ["loss.token_kl_coef=0.05"],         # plus a per-token k3 KL to the reference
    "behaviour_log_z": ["loss.log_z=behaviour"],     # VarGrad's log Z from the sampling policy
    # the recipe before, and one change each
    "before": BEFORE,                                # lr 1e-5 constant, clip 1, unpaced
    "paced": BEFORE + ["sync.paced=true"],           # searchers sample only a window's prompts
    "lr_2e-5": BEFORE + ["optim.learning_rate=2e-5"],
    "k4": BEFORE + ["buffer.samples_per_prompt=4"],  # the recipe's K before issue 25
    "alternate": BEFORE + ["sync.mode=alternate"],   # no staleness beyond the window
    "on_policy": BEFORE + ["sync.mode=alternate", "sync.every=1", "buffer.m=1.0"],  # synchronous
    "no_clip": BEFORE + ["optim.grad_clip_norm=0"],
    "beta_0.2": BEFORE + ["loss.beta_start=0.2", "loss.beta_end=0.2"],
    "learned_log_z": BEFORE + ["loss.log_z=learned"],
    "sync_every_4": BEFORE + ["sync.every=4"],       # staler samples
    "reward_replay": BEFORE + ["buffer.reward_weight=1.0"],  # off-latest slots by reward softmax
    "no_reuse": BEFORE + ["buffer.reuse_latest=false"],
}
DIAGNOSTICS = ("kl", "policy_drift", "entropy", "grad_norm")


def run_arm(name: str, overrides: list[str], args) -> None:
  cmd = [sys.executable, "-m", "experiments.gsm8k", "--config=configs/gsm8k.py:cpu",
         f"--workdir={os.path.join(args.out, name)}", f"--config.num_train_steps={args.steps}",
         f"--config.eval.every={args.eval_every}", "--config.eval.num_problems=0",
         f"--config.eval.num_samples={args.eval_samples}",
         f"--config.checkpoint.every={args.eval_every}", "--config.export=False",
         *[f"--config.{o}" for o in overrides]]
  print(f"[{name}] {' '.join(cmd[1:])}", flush=True)
  subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)


def summarise(workdir: str) -> dict | None:
  from tba_jax.metrics import read_jsonl
  path = os.path.join(workdir, "metrics.jsonl")
  if not os.path.exists(path):
    return None
  rows = read_jsonl(path)
  evals = [(r["step"], r[ACC], r.get(SE, float("nan"))) for r in rows if ACC in r]
  steps = [r for r in rows if "loss" in r]
  if not evals:
    return None
  last = steps[-max(len(steps) // 3, 1):]
  diag = {k: sum(r[k] for r in last if k in r) / max(sum(k in r for r in last), 1)
          for k in DIAGNOSTICS}
  peak = max(a for _, a, _ in evals)
  return {"evals": evals, "peak": peak, "end": evals[-1][1], "diag": diag}


def report(out: str, names: list[str]) -> None:
  print(f"| arm | held-out pass@1 by step (SE) | peak | end | end - peak | "
        f"{' | '.join(DIAGNOSTICS)} (last third) |")
  print("|---|---|---|---|---|" + "---|" * len(DIAGNOSTICS))
  for name in names:
    s = summarise(os.path.join(out, name))
    if s is None:
      continue
    curve = ", ".join(f"{st}: {a:.3f} ({se:.2f})" for st, a, se in s["evals"])
    diag = " | ".join(f"{s['diag'][k]:.3g}" for k in DIAGNOSTICS)
    print(f"| {name} | {curve} | {s['peak']:.3f} | {s['end']:.3f} | "
          f"{s['end'] - s['peak']:+.3f} | {diag} |")


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
  p.add_argument("--out", default="/tmp/stability")
  p.add_argument("--steps", type=int, default=90)
  p.add_argument("--eval_every", type=int, default=15)
  p.add_argument("--eval_samples", type=int, default=8)
  p.add_argument("--report", action="store_true", help="only print the table of --out")
  args = p.parse_args()
  if not args.report:
    for name in args.arms:
      run_arm(name, ARMS[name], args)
  names = args.arms if not args.report else sorted(os.listdir(args.out))
  report(args.out, names)


if __name__ == "__main__":
  main()
