r"""Overlay runs: reward and eval accuracy against step and against wall-clock.

  python -m experiments.plot WORKDIR [WORKDIR ...] --out fig.png [--labels a,b]
"""
import argparse
import os

from tba_jax.metrics import read_jsonl


def plot(workdirs, out, labels=None):
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  labels = labels or [os.path.basename(os.path.normpath(w)) for w in workdirs]
  fig, axes = plt.subplots(2, 2, figsize=(11, 7))
  for workdir, label in zip(workdirs, labels):
    path = os.path.join(workdir, "metrics.jsonl")
    if not os.path.exists(path):
      raise FileNotFoundError(f"{path} does not exist (is {workdir} a run's workdir?)")
    rows = read_jsonl(path)
    for col, x_key in enumerate(("step", "wall_time")):
      train = [r for r in rows if "reward_mean" in r]
      axes[0, col].plot([r[x_key] for r in train], [r["reward_mean"] for r in train], label=label)
      evals = [r for r in rows if any(k.startswith("eval/") for k in r)]
      for key in sorted({k for r in evals for k in r if k.startswith("eval/") and "pass" in k}):
        pts = [(r[x_key], r[key]) for r in evals if key in r]
        axes[1, col].plot(*zip(*pts), marker="o", label=f"{label} {key[5:]}")
  for col, xlabel in enumerate(("step", "wall-clock (s)")):
    axes[0, col].set(xlabel=xlabel, ylabel="train reward (mean)")
    axes[1, col].set(xlabel=xlabel, ylabel="held-out accuracy")
    for row in range(2):
      axes[row, col].grid(alpha=0.3)
      axes[row, col].legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(out, dpi=120)
  return out


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("workdirs", nargs="+")
  parser.add_argument("--out", required=True, help="PNG file to write")
  parser.add_argument("--labels", default="", help="comma-separated run labels")
  args = parser.parse_args()
  labels = args.labels.split(",") if args.labels else None
  print(plot(args.workdirs, args.out, labels))


if __name__ == "__main__":
  main()
