"""Fault injection, a testing aid: a searcher that raises, a process that stops itself.

  reward = FailingReward(reward, at_batch=3, repeat=False)  # searcher's reward stage
  stop = ProcessStop(at_step=5, signal_name="SIGKILL")       # loop: stop(step) after each update

Both are built from the config's `fault` section at the edges (loop.run,
config_builders) only when it asks for them, so a run without faults runs no
code of this module. docs/resume.md "Fault injection" shows them from the command line.
"""
from __future__ import annotations

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
      raise InjectedFault(f"injected failure (fault.searcher_fail_at={self.at_batch}) in "
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
      print(f"fault.stop_at_step={step}: sending this process {self.signal.name}", flush=True)
      os.kill(os.getpid(), self.signal)
