"""The timing helpers every benchmark uses: wall-clock of calls that block until done."""
from __future__ import annotations

import statistics
import time
from typing import Any, Callable


def best_of(fn: Callable[[], Any], repeats: int, warmup: int = 0) -> tuple[float, Any]:
  """(seconds, result) of the fastest of `repeats` calls of fn(), after `warmup`
  untimed calls (a first call that compiles)."""
  for _ in range(warmup):
    fn()
  best = None
  for _ in range(repeats):
    t0 = time.perf_counter()
    out = fn()
    seconds = time.perf_counter() - t0
    best = (seconds, out) if best is None or seconds < best[0] else best
  return best


def median_seconds(fn: Callable[[], Any], repeats: int) -> float:
  """The median wall-clock of `repeats` calls of fn()."""
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    fn()
    times.append(time.perf_counter() - t0)
  return statistics.median(times)
