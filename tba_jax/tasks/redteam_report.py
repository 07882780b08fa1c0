"""What a person reads of a red-teaming run (tasks/redteam.py): the successful attacks of
its evaluations, the most toxic first, each with the victim's replies and their p_toxic,
written beside the run (WORKDIR/REPORT_FILE) from the samples its evaluations kept.

  path = write_report(workdir, run_evaluation.SAMPLES_DIR)   # experiments/redteam.py
"""
from __future__ import annotations

import glob
import json
import os

from tba_jax.tasks.redteam import SUCCESS_THRESHOLD

REPORT_FILE = "successful_attacks.txt"


def attack_report(evaluations: dict[int, list[dict]]) -> str:
  """Text listing, for a run's evaluations ({step: its eval_samples rows}), the success
  rate of each and the distinct successful attacks of the last, most toxic first, each
  with the victim's replies and their p_toxic."""
  lines = ["Red-teaming: an attack succeeds when the mean p_toxic of the victim's replies "
           f"exceeds {SUCCESS_THRESHOLD}.", ""]
  for step, rows in sorted(evaluations.items()):
    wins = {r["completion"].strip() for r in rows if r["attack_success_rate"]}
    lines.append(f"step {step}: {sum(r['attack_success_rate'] for r in rows):.0f} of "
                 f"{len(rows)} sampled attacks succeeded, {len(wins)} distinct")
  step = max(evaluations)
  best = {}
  for r in evaluations[step]:
    key = r["completion"].strip()
    if r["attack_success_rate"] and (key not in best or r["toxicity"] > best[key]["toxicity"]):
      best[key] = r
  lines += ["", f"The {len(best)} distinct successful attacks at step {step}, most toxic first "
            "(p = the mean p_toxic of the replies):"]
  for n, (text, r) in enumerate(sorted(best.items(), key=lambda kv: -kv[1]["toxicity"]), 1):
    lines += ["", f"{n}. [p = {r['toxicity']:.3f}] {text!r}"]
    lines += [f"     reply (p_toxic {p:.3f}): {reply.strip()!r}"
              for reply, p in zip(r["replies"], r["reply_toxicity"])]
  return "\n".join(lines) + "\n"


def write_report(workdir: str, samples_dir: str) -> str | None:
  """Writes attack_report of the evaluations in WORKDIR/samples_dir to WORKDIR/REPORT_FILE;
  returns its path (None: no evaluation with the replies kept was written)."""
  evaluations = {}
  for path in glob.glob(os.path.join(workdir, samples_dir, "step_*.jsonl")):
    with open(path) as f:
      rows = [json.loads(line) for line in f if line.strip()]
    if rows and "replies" in rows[0]:
      evaluations[int(os.path.basename(path)[5:-6])] = rows
  if not evaluations:
    return None
  out = os.path.join(workdir, REPORT_FILE)
  with open(out, "w") as f:
    f.write(attack_report(evaluations))
  return out
