r"""Where would optim.SaturationDecay have first cut the lr? Its rule replayed on logged runs.

  python -m benchmarks.saturation_replay WORKDIR [WORKDIR ...] [--patience 4 6 8] \
      [--smoothing 0.5 0.7 0.9] [--min_gain 0 0.01 0.03]

The decay's state moves only with each update's batch `reward_mean`, which every run logs
(WORKDIR/metrics.jsonl), so on a run trained without it the first cut is exactly where it
would have come in that run (what follows a cut depends on the run it changes). Prints, per
setting, the update each run's first cut would have reduced ('-': none), and the updates
each run logged. A rule that tells a task which has saturated from one still climbing
cuts the first early and the second late or never.
"""
import argparse
import itertools
import json
import os

import numpy as np

from tba_jax import optim


def rewards(workdir: str) -> list[float]:
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f if line.strip()]
  return [r["reward_mean"] for r in rows if "reward_mean" in r]


def first_cut(decay: optim.SaturationDecay, run: list[float]) -> int | None:
  """The 1-based update whose step the first cut would have multiplied, or None."""
  state = decay.init()
  for u, reward in enumerate(run, start=1):
    state = decay.next_state(state, np.float32(reward), np.bool_(u == 1))
    if float(decay.factor_of(state)) < 1:
      return u + 1
  return None


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("workdirs", nargs="+")
  parser.add_argument("--patience", type=int, nargs="+", default=[4, 6, 8])
  parser.add_argument("--smoothing", type=float, nargs="+", default=[0.5, 0.7, 0.9])
  parser.add_argument("--min_gain", type=float, nargs="+", default=[0.0, 0.01, 0.03])
  args = parser.parse_args(argv)
  runs = {w: rewards(w) for w in args.workdirs}
  for i, w in enumerate(runs):
    print(f"run {i}: {w} ({len(runs[w])} updates)")
  print("smoothing patience min_gain  first cut per run")
  for s, p, g in itertools.product(args.smoothing, args.patience, args.min_gain):
    decay = optim.SaturationDecay(p, 0.5, s, g, min_scale=1e-3)
    cuts = [first_cut(decay, run) for run in runs.values()]
    print(f"{s:9g} {p:8d} {g:8g}  " + " ".join(f"{c or '-':>4}" for c in cuts))


if __name__ == "__main__":
  main()
