"""Fault injection, a testing aid: a searcher that raises, a process that stops itself.

  plan = Plan(searcher_fail_at=3)       # or Plan.parse("stop_at_step=5,stop_signal=SIGTERM")
  loop.run(config, workdir, fault_plan=plan)

A plan is not part of the user's config: tests pass it to loop.run, and
tests/fault_worker.py runs an experiment's command line with one (docs/resume.md,
"Fault injection"). Its parts are built at the edges (loop.run, config_builders) only
when it asks for them, so a run without faults runs no code of this module.
"""
from __future__ import annotations

import dataclasses
import os
import signal

from tba_jax.tasks import RewardBatch, RewardFn

SIGNALS = ("SIGKILL", "SIGTERM")


class InjectedFault(RuntimeError):
  """The failure a `FailingReward` raises."""


class FailingReward:
  """A searcher's reward stage that raises at its `at_batch`-th batch (1-based).

  With `repeat`, it raises again on every later batch that holds the first
  prompt of that batch: a deterministic failure, as a prompt that always
  crashes the reward would be.
  """

  def __init__(self, reward: RewardFn, at_batch: int, repeat: bool):
    self.reward, self.at_batch, self.repeat = reward, at_batch, repeat
    self.num_batches = 0
    self.prompt: int | None = None  # the prompt that keeps failing (repeat)

  def __call__(self, batch: RewardBatch):
    self.num_batches += 1
    ids = sorted({p.id for p in batch.problems})
    if self.num_batches == self.at_batch or self.prompt in ids:
      if self.repeat and self.prompt is None:
        self.prompt = batch.problems[0].id
      raise InjectedFault(f"injected failure (searcher_fail_at={self.at_batch}) in "
                          f"reward batch {self.num_batches}, prompt ids {ids}")
    return self.reward(batch)


class ProcessStop:
  """Sends this process `signal_name` when called with `at_step`: SIGKILL is a crash
  (nothing after the last checkpoint is saved), SIGTERM a preemption notice."""

  def __init__(self, at_step: int, signal_name: str):
    if signal_name not in SIGNALS:
      raise ValueError(f"signal_name={signal_name!r}: must be one of {SIGNALS}")
    self.at_step, self.signal = at_step, getattr(signal, signal_name)

  def __call__(self, step: int) -> None:
    if step == self.at_step:
      print(f"stop_at_step={step}: sending this process {self.signal.name}", flush=True)
      os.kill(os.getpid(), self.signal)


@dataclasses.dataclass(frozen=True)
class Plan:
  """What fails on purpose; 0 = off."""
  searcher_fail_at: int = 0         # > 0: searcher `searcher`'s reward stage raises at its
                                    # n-th batch (FailingReward)
  searcher_fail_repeats: bool = False  # ... and on every later batch with that batch's first
                                       # prompt
  searcher: int = 0                 # the global index of that searcher
  stop_at_step: int = 0             # > 0: process `stop_process` signals itself after this
                                    # step's update (ProcessStop)
  stop_signal: str = "SIGKILL"      # "SIGKILL" (a crash) or "SIGTERM" (a preemption notice)
  stop_process: int = 0

  def __post_init__(self):
    if self.stop_signal not in SIGNALS:
      raise ValueError(f"stop_signal={self.stop_signal!r}: must be one of {SIGNALS}")

  @classmethod
  def parse(cls, text: str) -> Plan:
    """"key=value,..." of the fields ("" = no faults)."""
    kinds = {f.name: f.type for f in dataclasses.fields(cls)}
    values = {}
    for item in filter(None, text.split(",")):
      key, _, value = item.partition("=")
      if key not in kinds:
        raise ValueError(f"unknown fault {key!r}; the faults are {', '.join(kinds)}")
      values[key] = {"int": int, "bool": lambda v: v.lower() in ("1", "true", "yes"),
                     "str": str}[kinds[key]](value)
    return cls(**values)

  def reward(self, reward: RewardFn, searcher: int) -> RewardFn:
    """Searcher `searcher`'s reward stage, failing as planned."""
    if self.searcher_fail_at and searcher == self.searcher:
      return FailingReward(reward, self.searcher_fail_at, self.searcher_fail_repeats)
    return reward

  def process_stop(self, process: int) -> ProcessStop | None:
    """The stop of process `process`, when the plan stops it."""
    if self.stop_at_step and process == self.stop_process:
      return ProcessStop(self.stop_at_step, self.stop_signal)
    return None
