"""Metrics: one JSON line per step, TensorBoard events, optional Weights & Biases.

`WORKDIR/metrics.jsonl` holds one object per logged step ({"step", "wall_time",
...}; evaluation results under "eval/..." keys). A resumed run appends; readers
keep the last line of each step (see `read_jsonl`).
"""
from __future__ import annotations

import collections
import json
import math
import os
import time
from typing import Any


def _clean(value: Any):
  if hasattr(value, "item"):
    value = value.item()
  if isinstance(value, float) and not math.isfinite(value):
    return str(value)  # JSON has no NaN/inf; keep them visible as strings
  return value


class MetricsWriter:
  """Writes metrics from process 0; other processes pass `enabled=False`."""

  def __init__(self, workdir: str, *, tensorboard: bool = True, wandb_project: str | None = None,
               config_dict: dict | None = None, enabled: bool = True):
    self.enabled = enabled
    self.start = time.time()
    self.tb = self.wandb = None
    self.file = None
    if not enabled:
      return
    os.makedirs(workdir, exist_ok=True)
    self.file = open(os.path.join(workdir, "metrics.jsonl"), "a")
    if tensorboard:
      from tensorboardX import SummaryWriter  # no TensorFlow needed
      self.tb = SummaryWriter(os.path.join(workdir, "tensorboard"))
    if wandb_project:
      import wandb
      self.wandb = wandb.init(project=wandb_project, dir=workdir, config=config_dict, resume="allow")

  def write(self, step: int, metrics: dict[str, Any], wall_time: float | None = None) -> None:
    if not self.enabled:
      return
    row = {"step": int(step),
           "wall_time": round(time.time() - self.start if wall_time is None else wall_time, 3)}
    row.update({k: _clean(v) for k, v in metrics.items()})
    self.file.write(json.dumps(row) + "\n")
    self.file.flush()
    if self.tb is not None:
      for k, v in row.items():
        if isinstance(v, (int, float)) and k != "step":
          self.tb.add_scalar(k, v, step)
      self.tb.flush()
    if self.wandb is not None:
      self.wandb.log(row, step=step)

  def close(self) -> None:
    if self.file is not None:
      self.file.close()
    if self.tb is not None:
      self.tb.close()
    if self.wandb is not None:
      self.wandb.finish()


def read_jsonl(path: str) -> list[dict]:
  """Rows of a metrics.jsonl, the last one of each step, in step order.

  Rows with the same step but different keys (e.g. an eval row and a train row)
  are merged; a later value of the same key wins (a resumed run rewrote it).
  """
  by_step: dict[int, dict] = {}
  with open(path) as f:
    for line in f:
      if line.strip():
        row = json.loads(line)
        by_step.setdefault(row["step"], {}).update(row)
  return [by_step[s] for s in sorted(by_step)]


class LatestFractionWatch:
  """A warning when the fraction of batch slots from the latest sync stays well below m.

  Call once per step with the step's `fraction_from_latest`; returns a message (at
  most once per `window` steps) when the mean over the last `window` steps is
  below m - margin. With buffer.reuse_latest the m branch misses only when a sync
  brought fewer latest prompts than a batch holds; without it, whenever the
  searchers deliver fewer than k x B x m prompts per sync window.
  """

  def __init__(self, m: float, window: int = 20, margin: float = 0.1):
    self.m, self.window, self.margin = m, window, margin
    self.recent: collections.deque[float] = collections.deque(maxlen=window)
    self.last_warned = -window

  def __call__(self, step: int, fraction: float) -> str | None:
    self.recent.append(fraction)
    mean = sum(self.recent) / len(self.recent)
    if (len(self.recent) < self.window or mean >= self.m - self.margin
        or step - self.last_warned < self.window):
      return None
    self.last_warned = step
    return (f"warning: step {step}: only {mean:.2f} of the batch slots came from the latest "
            f"sync over the last {self.window} steps (m = {self.m}); the searchers deliver "
            "too few fresh prompts per sync window (more searchers or prompts per searcher "
            "batch, a longer sync.every, or buffer.reuse_latest=True)")
