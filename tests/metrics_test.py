"""metrics.jsonl rows and segments, wall-clock across resumes, TensorBoard events."""
import json
import os
import struct

import pytest

from tba_jax import metrics
from tba_jax.metrics import LatestFractionWatch, MetricsWriter, read_jsonl


def _write(path, rows):
  path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_a_resumed_segment_replaces_the_rows_it_reran_without_mixing_keys(tmp_path):
  path = tmp_path / "metrics.jsonl"
  _write(path, [
      {"step": 0, "wall_time": 0.0, "run": {"mode": "async"}},
      {"step": 0, "wall_time": 0.0, "eval/greedy_pass@1": 0.1},
      *[{"step": s, "wall_time": float(s), "loss": 10.0 + s} for s in range(1, 7)],
      {"step": 5, "wall_time": 5.5, "eval/greedy_pass@1": 0.9},  # killed after this
      # Resumed from the checkpoint at step 4: steps 5.. are run again.
      {"step": 4, "wall_time": 4.2, "run": {"mode": "async"}},
      *[{"step": s, "wall_time": 4.0 + s, "loss": 20.0 + s} for s in range(5, 8)],
  ])
  rows = read_jsonl(str(path))
  assert [r["step"] for r in rows] == list(range(8))
  assert [r.get("loss") for r in rows] == [None, 11, 12, 13, 14, 25, 26, 27]
  assert "eval/greedy_pass@1" not in rows[5]  # the dropped segment's eval does not leak in
  assert rows[0]["eval/greedy_pass@1"] == 0.1 and all("run" not in r for r in rows)
  assert [r["wall_time"] for r in rows] == sorted(r["wall_time"] for r in rows)


def test_malformed_row_names_the_file_and_line_and_a_cut_last_line_is_skipped(tmp_path):
  path = tmp_path / "metrics.jsonl"
  path.write_text('{"step": 1, "loss": 1.0}\n{"step": 2 "loss": 2.0}\n{"step": 3}\n')
  with pytest.raises(ValueError, match=r"metrics.jsonl, line 2: not a metrics row"):
    read_jsonl(str(path))
  path.write_text('{"step": 1, "loss": 1.0}\n{"step": 2, "lo')  # killed mid-write
  assert read_jsonl(str(path)) == [{"step": 1, "loss": 1.0}]
  # The next segment's writer removes the cut line before appending.
  writer = MetricsWriter(str(tmp_path), tensorboard=False)
  writer.write(2, {"loss": 2.0})
  writer.close()
  assert [r["step"] for r in read_jsonl(str(path))] == [1, 2]


def test_wall_time_continues_from_the_checkpoint_and_never_runs_backwards(tmp_path):
  writer = MetricsWriter(str(tmp_path), tensorboard=False)
  writer.start_segment(0, {})
  writer.write(1, {"loss": 1.0}, wall_time=100.0)
  writer.write(1, {"eval/x": 1.0}, wall_time=130.0)  # an evaluation after the last save
  writer.close()
  # Resumed from step 1 whose checkpoint recorded 110 s: the kept eval row ended at 130 s.
  writer = MetricsWriter(str(tmp_path), tensorboard=False, elapsed=110.0)
  assert 110.0 <= writer.elapsed() < 111.0
  writer.start_segment(1, {})
  writer.write(2, {"loss": 2.0})
  writer.close()
  rows = read_jsonl(str(tmp_path / "metrics.jsonl"))
  assert rows[0]["wall_time"] == 130.0 and 130.0 <= rows[1]["wall_time"] < 131.0


def _events(directory):
  """Every event in a TensorBoard directory (TFRecord framing: length, crc, data, crc)."""
  from tensorboardX.proto.event_pb2 import Event
  events = []
  for name in sorted(os.listdir(directory)):
    with open(os.path.join(directory, name), "rb") as f:
      data = f.read()
    pos = 0
    while pos < len(data):
      (length,) = struct.unpack("<Q", data[pos:pos + 8])
      events.append(Event.FromString(data[pos + 12:pos + 12 + length]))
      pos += 12 + length + 4
  return events


def test_tensorboard_tags_are_the_metrics_keys_and_staleness_is_a_histogram(tmp_path):
  writer = MetricsWriter(str(tmp_path))
  row = {"loss": 0.5, "eval/greedy_pass@1": 0.25, "pass@4": 0.75, "staleness_max": 3,
         "staleness_hist": [2, 0, 5, 1]}
  writer.write(7, row)
  writer.close()
  logged = json.loads((tmp_path / "metrics.jsonl").read_text())
  values = {v.tag: v for e in _events(tmp_path / "tensorboard") if e.step == 7
            for v in e.summary.value}
  scalars = {k for k, v in logged.items() if isinstance(v, (int, float)) and k != "step"}
  assert set(values) == scalars | {"staleness_hist"}
  for k in scalars:
    assert values[k].simple_value == pytest.approx(logged[k])
  hist = values["staleness_hist"].histo
  assert list(hist.bucket) == [2, 0, 5, 1] and hist.num == 8
  assert (hist.min, hist.max, hist.sum, hist.sum_squares) == (0, 3, 13, 29)
  assert list(hist.bucket_limit) == [0.5, 1.5, 2.5, 3.5]


def test_latest_fraction_watch_warns_once_per_window_when_well_below_m():
  watch = LatestFractionWatch(0.95, window=10, margin=0.1)
  # At m on average (noisy): never.
  assert not any(watch(step, 1.0 if step % 10 else 0.5) for step in range(1, 101))
  low = [watch(step, 0.5) for step in range(101, 131)]
  warned = [101 + i for i, w in enumerate(low) if w]
  # As soon as the last 10 steps average below 0.85 (step 103: 0.80), then once per 10 steps.
  assert warned == [103, 113, 123], warned
  assert "only 0.80" in low[2] and "m = 0.95" in low[2]


def test_peak_watch_warns_only_past_the_noise_of_both_evaluations():
  from tba_jax.metrics import PeakWatch
  watch = PeakWatch("held-out eval/sampled_pass@1", drop=0.05)
  assert watch(0, 0.30, 0.03) is None
  assert watch(15, 0.80, 0.03) is None   # a new peak
  assert watch(30, 0.76, 0.03) is None   # 0.04 below: within max(0.05, 2 * 0.042)
  assert watch(45, 0.72, 0.03) is None   # 0.08 below, but 2 x hypot(0.03, 0.03) = 0.085 ...
  message = watch(60, 0.60, 0.03)        # ... 0.20 below: a warning naming step and peak
  assert message is not None and "0.600" in message and "peak 0.800 at step 15" in message
  assert watch(75, 0.90, 0.0) is None and watch.best == (75, 0.90, 0.0)


def test_the_console_summary_puts_the_headline_first_as_start_to_now():
  start = {"eval/win_rate": 0.25, "eval/kl": 0.0, "eval/gold_reward": 0.1}
  now = {"eval/gold_reward": 0.5, "eval/kl": 0.0123, "eval/win_rate": 0.75, "eval/pass@1": 1.0}
  assert metrics.summary(["eval/win_rate", "eval/perplexity", "eval/kl"], start, now) == (
      "eval/win_rate 0.250 -> 0.750, eval/kl 0.000 -> 0.012; "
      "eval/gold_reward 0.500, eval/pass@1 1.000")
  # No start (the step-0 evaluation itself, or a run that never made one): values alone.
  assert metrics.summary(["eval/kl"], {}, {"eval/kl": 0.5}) == "eval/kl 0.500"
  assert metrics.summary([], {}, {"eval/b": 2, "eval/a": 1}) == "eval/a 1.000, eval/b 2.000"
  # Standard errors follow their metric; pass@k in the order of k.
  now = {"eval/sampled_pass@1": 0.9, "eval/sampled_pass@1_se": 0.02, "eval/pass@16": 1.0,
         "eval/pass@2": 0.95, "eval/greedy_pass@1_se": 0.01, "eval/greedy_pass@1": 0.8}
  assert metrics.summary(["eval/sampled_pass@1"], {"eval/sampled_pass@1": 0.3}, now) == (
      "eval/sampled_pass@1 0.300 -> 0.900 ± 0.020; eval/greedy_pass@1 0.800 ± 0.010, "
      "eval/pass@2 0.950, eval/pass@16 1.000")


def test_the_step_0_evaluation_and_the_latest_setup_are_read_back(tmp_path):
  path = tmp_path / "metrics.jsonl"
  assert metrics.evaluation(str(path), 0) == {}  # no file yet: a fresh run
  _write(path, [
      {"step": 0, "wall_time": 0.0, "run": {"task": {"name": "a"}}},
      {"step": 0, "wall_time": 0.0, "eval/win_rate": 0.25, "eval_seconds": 3.0,
       "eval/kl": "nan"},  # as MetricsWriter stores a non-finite value
      {"step": 1, "wall_time": 1.0, "loss": 1.0},
      {"step": 1, "wall_time": 1.5, "run": {"task": {"name": "b"}}},  # a resume
  ])
  with open(path, "a") as f:
    f.write('{"step": 2, "run": {"ta')  # cut by a kill
  assert metrics.evaluation(str(path), 0) == {"eval/win_rate": 0.25}
  assert metrics.evaluation(str(path), 1) == {}
  assert metrics.read_setup(str(path)) == {"task": {"name": "b"}}
