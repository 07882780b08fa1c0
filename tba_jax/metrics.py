"""Metrics: one JSON line per step, TensorBoard events, optional Weights & Biases.

`WORKDIR/metrics.jsonl` holds one object per logged step ({"step", "wall_time",
...}; evaluation results under "eval/..." keys). Each run segment (the first
run, then every resume) starts with a row {"step": S, "wall_time": ..., "run":
{the setup}}, S the step it starts from. A resumed run re-runs the steps after
its checkpoint, so `read_jsonl` drops the earlier segment's rows after S: the
rows it returns are those of one uninterrupted history. `wall_time` counts the
seconds of training behind a row, across resumes (the elapsed time is saved in
every checkpoint); time a killed run spent after its last checkpoint is not in it.

TensorBoard tags are the metrics.jsonl keys exactly ("eval/greedy_pass@1", not
tensorboardX's cleaned "eval/greedy_pass_1"); `staleness_hist` is a histogram.
"""
from __future__ import annotations

import collections
import json
import math
import os
import re
import time
from typing import Any, Sequence


def _clean(value: Any):
  if hasattr(value, "item"):
    value = value.item()
  if isinstance(value, float) and not math.isfinite(value):
    return str(value)  # JSON has no NaN/inf; keep them visible as strings
  return value


class MetricsWriter:
  """Writes metrics from process 0; other processes pass `enabled=False`.

  `elapsed`: wall-clock seconds already spent by earlier segments of this run.
  """

  def __init__(self, workdir: str, *, tensorboard: bool = True, wandb_project: str | None = None,
               config_dict: dict | None = None, enabled: bool = True, elapsed: float = 0.0):
    self.enabled = enabled
    self.start = time.time() - elapsed
    self.path = os.path.join(workdir, "metrics.jsonl")
    self.tb = self.wandb = None
    self.file = None
    if not enabled:
      return
    os.makedirs(workdir, exist_ok=True)
    _drop_partial_last_line(self.path)
    self.file = open(self.path, "a")
    if tensorboard:
      from tensorboardX import FileWriter  # no TensorFlow needed
      self.tb = FileWriter(os.path.join(workdir, "tensorboard"))
    if wandb_project:
      import wandb
      self.wandb = wandb.init(project=wandb_project, dir=workdir, config=config_dict, resume="allow")

  def elapsed(self) -> float:
    """The run's wall-clock seconds so far, earlier segments included."""
    return time.time() - self.start

  def _append(self, row: dict) -> None:
    self.file.write(json.dumps(row) + "\n")
    self.file.flush()

  def start_segment(self, step: int, setup: dict) -> None:
    """Marks where this segment of the run starts (read_jsonl drops what it re-runs)."""
    if not self.enabled:
      return
    # The rows kept (steps <= `step`) can end after the checkpoint's clock stopped (an
    # evaluation after the last save): continue after them, so wall_time never runs backwards.
    self.file.flush()
    kept = read_jsonl(self.file.name)
    last = max((r["wall_time"] for r in kept if r["step"] <= step), default=0.0)
    self.start = min(self.start, time.time() - last)
    self._append({"step": int(step), "wall_time": round(self.elapsed(), 3), "run": setup})

  def write(self, step: int, metrics: dict[str, Any], wall_time: float | None = None) -> None:
    if not self.enabled:
      return
    row = {"step": int(step),
           "wall_time": round(self.elapsed() if wall_time is None else wall_time, 3)}
    row.update({k: _clean(v) for k, v in metrics.items()})
    self._append(row)
    if self.tb is not None:
      self.tb.add_summary(_tensorboard_summary(row), int(step))
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


def _tensorboard_summary(row: dict):
  """Scalars under their metrics.jsonl keys, `staleness_hist` as a histogram.

  Built as protos: tensorboardX's add_scalar rewrites characters TensorFlow op
  names cannot hold ('@' -> '_'), which TensorBoard's tags do not need.
  """
  from tensorboardX.proto.summary_pb2 import HistogramProto, Summary
  values = [Summary.Value(tag=k, simple_value=float(v)) for k, v in row.items()
            if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)]
  counts = row.get("staleness_hist")
  if counts:
    # counts[s] = samples s versions behind (the last bucket: that many or more); TensorBoard
    # bucket i holds the values in (bucket_limit[i-1], bucket_limit[i]].
    present = [s for s, c in enumerate(counts) if c]
    values.append(Summary.Value(tag="staleness_hist", histo=HistogramProto(
        min=float(present[0]), max=float(present[-1]), num=float(sum(counts)),
        sum=float(sum(s * c for s, c in enumerate(counts))),
        sum_squares=float(sum(s * s * c for s, c in enumerate(counts))),
        bucket_limit=[s + 0.5 for s in range(len(counts))], bucket=[float(c) for c in counts])))
  return Summary(value=values)


def _drop_partial_last_line(path: str) -> None:
  """A run killed mid-write leaves a last line without its newline; appending after it
  would corrupt the next row too."""
  if not os.path.exists(path):
    return
  with open(path, "rb+") as f:
    data = f.read()
    if data and not data.endswith(b"\n"):
      f.truncate(data.rfind(b"\n") + 1)


def read_jsonl(path: str) -> list[dict]:
  """A metrics.jsonl's rows in step order, one per step (an eval row merged into its step's).

  Rows of one segment with the same step are merged. A segment start at step S
  (a resume) drops every earlier row after S, so an interrupted run reads as
  the history its checkpoints continued, never a mix of the two segments.
  """
  by_step: dict[int, dict] = {}
  with open(path) as f:
    for number, line in enumerate(f, 1):
      if not line.strip():
        continue
      try:
        row = json.loads(line)
        step = row["step"]
      except (json.JSONDecodeError, KeyError, TypeError) as e:
        if not line.endswith("\n"):
          break  # the last row of a killed (or running) run, cut short: not a row yet
        raise ValueError(f"{path}, line {number}: not a metrics row ({e}): {line[:80]!r}") from None
      if "run" in row:
        by_step = {s: r for s, r in by_step.items() if s <= step}
        continue
      by_step.setdefault(step, {}).update(row)
  return [by_step[s] for s in sorted(by_step)]


def read_setup(path: str) -> dict | None:
  """The setup the latest segment of a run recorded (its first row's "run" field; run_info)."""
  setup = None
  with open(path) as f:
    for line in f:
      if '"run"' in line:
        try:
          setup = json.loads(line).get("run", setup)
        except json.JSONDecodeError:  # a row cut by a kill
          pass
  return setup


def evaluation(path: str, step: int) -> dict:
  """The eval/ metrics logged at `step` in a metrics.jsonl ({} when there are none; a
  non-finite value, stored as a string, is left out)."""
  if not os.path.exists(path):
    return {}
  row = next((r for r in read_jsonl(path) if r["step"] == step), {})
  return {k: v for k, v in row.items() if k.startswith("eval/") and isinstance(v, (int, float))}


def summary(headline: Sequence[str], start: dict, now: dict) -> str:
  """The metrics `now` for the console: each of the `headline` keys first, as `start ->
  now` where `start` has it ("eval/win_rate 0.250 -> 0.750"), then the others in natural
  order (pass@2 before pass@16). A metric's standard error (`KEY_se`) follows it as
  "± se" rather than standing alone."""
  def shown(k: str) -> str:
    se = f" ± {now[k + '_se']:.3f}" if k + "_se" in now else ""
    return (f"{k} {start[k]:.3f} -> {now[k]:.3f}{se}" if k in start and k in headline
            else f"{k} {now[k]:.3f}{se}")

  natural = lambda k: [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", k)]
  keys = [k for k in headline if k in now]
  others = sorted((k for k in now if k not in keys and not k.endswith("_se")), key=natural)
  parts = [", ".join(shown(k) for k in keys), ", ".join(shown(k) for k in others)]
  return "; ".join(p for p in parts if p)


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


class PeakWatch:
  """A warning when a held-out metric falls well below its running peak.

  Call with every evaluation's (step, value, standard error); returns a message when
  the value is more than max(`drop`, 2 x the two evaluations' combined standard
  error) below the best so far, so that sampling noise alone rarely triggers it.
  (Post-training runs often peak and then unlearn: issue "runs that keep improving".)
  """

  def __init__(self, name: str, drop: float = 0.05):
    self.name, self.drop = name, drop
    self.best: tuple[int, float, float] | None = None  # (step, value, standard error)

  def __call__(self, step: int, value: float, stderr: float = 0.0) -> str | None:
    """`value` of `name` at `step`, with its standard error (0: unknown)."""
    if self.best is None or value > self.best[1]:
      self.best = (step, value, stderr)
      return None
    best_step, best, best_se = self.best
    margin = max(self.drop, 2.0 * math.hypot(stderr, best_se))
    if best - value <= margin:
      return None
    return (f"warning: step {step}: {self.name} {value:.3f} is {best - value:.3f} below its "
            f"peak {best:.3f} at step {best_step} (more than {margin:.3f}); the policy may be "
            "drifting from what it learned (check kl, entropy, policy_drift in metrics.jsonl)")
