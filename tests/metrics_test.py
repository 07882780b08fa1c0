"""Metrics: the latest-fraction watch."""
from tba_jax.metrics import LatestFractionWatch


def test_latest_fraction_watch_warns_once_per_window_when_well_below_m():
  watch = LatestFractionWatch(0.95, window=10, margin=0.1)
  # At m on average (noisy): never.
  assert not any(watch(step, 1.0 if step % 10 else 0.5) for step in range(1, 101))
  low = [watch(step, 0.5) for step in range(101, 131)]
  warned = [101 + i for i, w in enumerate(low) if w]
  # As soon as the last 10 steps average below 0.85 (step 103: 0.80), then once per 10 steps.
  assert warned == [103, 113, 123], warned
  assert "only 0.80" in low[2] and "m = 0.95" in low[2]
