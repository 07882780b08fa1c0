r"""Runs side by side: what each run's task measures, against steps and wall-clock.

  python -m experiments.plot WORKDIR [WORKDIR ...] --out fig.png [--labels a,b] \
      [--metrics eval/policy_kl,eval/target_kl]

Each run records in its metrics.jsonl what shows whether it learned (the setup's
task metrics, run_info: tasks.Task.reward_metric and .headline, with labels and
units): the trained batches' reward and the headline evaluation metrics (GSM8K:
held-out accuracy; TL;DR: win rate, perplexity, KL; red-teaming: attack success
rate, toxicity, diversity). One row of panels per metric, against trainer steps
(left) and wall-clock (right); runs that measure the same metric share its panel.
Interrupted and resumed runs read as one history (metrics.read_jsonl). `--metrics` adds
panels for other metrics.jsonl keys, e.g. the distance to TB's target (target_distance.METRICS
names and labels them).
"""
import argparse
import os
import sys

from tba_jax.errors import UserError
from tba_jax.metrics import read_jsonl, read_setup
from tba_jax.target_distance import METRICS as TARGET_METRICS
from tba_jax.tasks import REWARD_HEADLINE, REWARD_METRIC, Metric


def run_metrics(path: str) -> list[Metric]:
  """The metrics a run's task names (recorded with its setup); a run of an older version
  recorded none: a reward-scored task's."""
  recorded = ((read_setup(path) or {}).get("task") or {}).get("metrics")
  return [Metric(**m) for m in recorded] if recorded else [REWARD_METRIC, *REWARD_HEADLINE]


def _time_axis(seconds: float) -> tuple[float, str]:
  if seconds > 2 * 3600:
    return 3600.0, "wall-clock (h)"
  return (60.0, "wall-clock (min)") if seconds > 120 else (1.0, "wall-clock (s)")


def extra_metrics(keys) -> list[Metric]:
  """--metrics: each key as a Metric (target_distance.METRICS' label and unit where it has
  one)."""
  return [TARGET_METRICS.get(k, Metric(k, k)) for k in keys]


def plot(workdirs, out, labels=None, extra=()):
  """Writes the figure to `out` and returns it (one row of 2 axes per metric); `extra`:
  Metrics drawn for every run after its task's (where it logged them)."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  labels = labels or [os.path.basename(os.path.normpath(w)) for w in workdirs]
  if len(labels) != len(workdirs):
    raise UserError(f"--labels: {len(labels)} label(s) for {len(workdirs)} run(s)")
  runs = []
  for workdir, label in zip(workdirs, labels):
    path = os.path.join(workdir, "metrics.jsonl")
    if not os.path.exists(path):
      raise UserError(f"{path} does not exist (is {workdir} a run's workdir?)")
    runs.append((label, read_jsonl(path), run_metrics(path) + list(extra)))
  panels = list(dict.fromkeys(m for _, _, metrics in runs for m in metrics))
  scale, time_label = _time_axis(max((r["wall_time"] for _, rows, _ in runs for r in rows),
                                     default=0.0))
  fig, axes = plt.subplots(len(panels), 2, figsize=(12, 2.8 * len(panels)), squeeze=False)
  colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
  for row, metric in enumerate(panels):
    for i, (label, rows, metrics) in enumerate(runs):
      if metric not in metrics:
        continue
      points = [(r["step"], r["wall_time"] / scale, r[metric.key]) for r in rows
                if isinstance(r.get(metric.key), (int, float))]  # not "nan" (metrics._clean)
      if not points:
        continue
      steps, times, values = zip(*points)
      style = dict(color=colors[i % len(colors)], label=label,
                   marker="o" if metric.key.startswith("eval/") else None)
      axes[row, 0].plot(steps, values, **style)
      axes[row, 1].plot(times, values, **style)
    for col, xlabel in enumerate(("trainer step", time_label)):
      ax = axes[row, col]
      ax.set(xlabel=xlabel, ylabel=metric.unit or metric.key.removeprefix("eval/"),
             title=metric.label if col == 0 else metric.key)
      ax.title.set_fontsize(9)
      ax.grid(alpha=0.3)
      if ax.lines:
        ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(out, dpi=110)
  plt.close(fig)
  return fig


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("workdirs", nargs="+")
  parser.add_argument("--out", required=True, help="PNG file to write")
  parser.add_argument("--labels", default="", help="comma-separated run labels")
  parser.add_argument("--metrics", default="",
                      help="comma-separated metrics.jsonl keys to draw as well")
  args = parser.parse_args()
  labels = args.labels.split(",") if args.labels else None
  extra = extra_metrics(args.metrics.split(",")) if args.metrics else ()
  try:
    fig = plot(args.workdirs, args.out, labels, extra)
  except UserError as e:
    sys.exit(f"error: {e}")
  keys = [ax.get_title() for ax in fig.axes[1::2]]
  print(f"{args.out}: {len(args.workdirs)} run(s), {len(keys)} metrics against steps and "
        f"wall-clock: {', '.join(keys)}")


if __name__ == "__main__":
  main()
