r"""A policy's TL;DR evaluation on its own, as a training run evaluates (tasks/tldr.py):
win rate under the gold reward model, Table 1's perplexity, the KL the authors log.

  python -m experiments.evaluate_tldr --config configs/tldr.py:pythia410m --workdir DIR \
      [--policy PATH] [--step N]

--policy: a Hugging Face directory or hub id (default WORKDIR/export, the run's exported
policy; the SFT model itself, e.g. mnoukhov/pythia410m-sft-tldr, gives the baseline). The
reference is the config's model.path (for `tiny`, the random initial policy of its seed),
the data, reward models and evaluation settings are the config's. --step picks the sampling
key the run uses at that step (default: the run's last step from WORKDIR/finished.json, or
0), so a run's export evaluated here reproduces the run's final eval/ metrics. The metrics
are printed and appended to WORKDIR/evaluation.jsonl (one line per evaluation). Every
experiment's runs are evaluated the same way by `tba eval` (experiments/evaluate.py).
"""
from experiments import launch
from experiments.evaluate import evaluate

if __name__ == "__main__":
  launch.main("tldr.py:pythia410m", job=evaluate)
