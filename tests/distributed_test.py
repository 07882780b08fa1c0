"""Two real processes on loopback (gloo), 2 fake CPU devices each."""
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from tba_jax import distributed, entries
from tba_jax.metrics import read_jsonl
from tba_jax.entries import Entry

HERE = os.path.dirname(os.path.abspath(__file__))
HEARTBEAT_TIMEOUT_S = 20  # the workers' (distributed.initialize)


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _launch(workdir, *args):
  """The two workers, their output in files (a pipe nobody reads could block them)."""
  port = _free_port()
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  env["PYTHONUNBUFFERED"] = "1"
  procs = []
  for i in range(2):
    log = open(os.path.join(workdir, f"worker{i}-{port}.log"), "w+")
    procs.append(subprocess.Popen(
        [sys.executable, os.path.join(HERE, "multihost_worker.py"), str(port), str(i),
         str(workdir), *map(str, args)], cwd=os.path.dirname(HERE), env=env, stdout=log,
        stderr=subprocess.STDOUT, text=True))
    procs[-1].log = log
  return procs


def _output(proc):
  proc.log.seek(0)
  return proc.log.read()


@contextlib.contextmanager
def _terminated_at_exit(procs):
  try:
    yield procs
  finally:
    for p in procs:  # never leave a process behind, whatever happened
      if p.poll() is None:
        p.kill()
      p.wait()
      p.log.close()


def _result(proc):
  out = _output(proc)
  return json.loads(next(line[7:] for line in out.splitlines() if line.startswith("RESULT ")))


def _train_steps(workdir):
  path = os.path.join(workdir, "metrics.jsonl")
  return [r["step"] for r in read_jsonl(path) if "loss" in r] if os.path.exists(path) else []


def _wait(condition, procs, timeout):
  deadline = time.time() + timeout
  while time.time() < deadline and all(p.poll() is None for p in procs):
    if condition():
      return
    time.sleep(0.2)
  raise AssertionError("\n".join(_output(p)[-3000:] for p in procs))


def test_all_gather_entries_is_identity_in_one_process():
  e = Entry(prompt_id=3, prompt=np.array([5, 6]), completion=np.array([7, 1]), reward=1.0,
            ref_logprobs=np.array([-0.5, -0.25]), behaviour_logprobs=np.array([-0.5, -0.3]),
            version=2, searcher_id=1, ended_with_eos=True)
  out = distributed.all_gather_entries([e], max_prompt_len=4, max_completion_len=4)
  assert len(out) == 1 and out[0].prompt_id == 3 and list(out[0].completion) == [7, 1]
  packed = entries.pack([e], max_prompt_len=4, max_completion_len=4, num_rows=3)
  assert int(packed["count"]) == 1 and packed["completion"].shape == (3, 4)


@pytest.mark.slow  # ~99 s on 2 cores (2026-12-04): out of the default suite
def test_two_hosts_train_on_one_buffer_checkpoint_together_and_stop_when_one_is_lost(tmp_path):
  # Training until Ctrl-C (SIGINT) reaches process 1 only: both save the same step, name the
  # signal, and exit 0. (SIGTERM takes the same path: the signal's number is what the hosts
  # exchange; interrupts_test.py and experiment_test.py cover both signals on one host.)
  with _terminated_at_exit(_launch(tmp_path, 100_000, HEARTBEAT_TIMEOUT_S)) as procs:
    _wait(lambda: len(_train_steps(tmp_path)) >= 4, procs, timeout=400)
    procs[1].send_signal(signal.SIGINT)
    for p in procs:
      p.wait(timeout=120)
    for p in procs:
      assert p.returncode == 0, _output(p)[-4000:]
    results = [_result(p) for p in procs]
    step = results[0]["step"]
    assert [(r["step"], r["terminated"], r["signal"]) for r in results] == \
        [(step, True, "Ctrl-C")] * 2
    assert all(f"Ctrl-C: saved a checkpoint at step {step}" in _output(p) and
               "Rerun the same command on every host" in _output(p) for p in procs)
  saved = sorted(int(d) for d in os.listdir(tmp_path / "checkpoints") if d.isdigit())
  assert saved[-1] == step
  assert _train_steps(tmp_path) == list(range(1, step + 1))
  # Both hosts hold the same global buffer, with entries from both hosts' searchers...
  assert results[0]["buffer_digest"] == results[1]["buffer_digest"]
  versions = {int(k): v for k, v in results[0]["max_version_by_searcher"].items()}
  assert set(versions) == {0, 1}
  # ... and both searchers sampled with weights published after training began.
  assert min(versions.values()) > 0, versions

  # Resumed, then process 1 is SIGKILLed: process 0 stops with an error naming it, within
  # the heartbeat timeout.
  with _terminated_at_exit(_launch(tmp_path, 100_000, HEARTBEAT_TIMEOUT_S)) as procs:
    _wait(lambda: max(_train_steps(tmp_path)) > step, procs, timeout=400)
    assert f"Resumed from step {step}" in _output(procs[0])
    procs[1].kill()
    killed = time.time()
    procs[0].wait(timeout=HEARTBEAT_TIMEOUT_S + 60)
    waited = time.time() - killed
    out = _output(procs[0])
  assert procs[0].returncode not in (0, None), out[-3000:]
  assert waited < HEARTBEAT_TIMEOUT_S + 15, (waited, out[-3000:])
  # Named by the loop's ProcessLostError, or by JAX's termination if that came first.
  assert re.search(r"process\(es\) \[1\] of 2 stopped without notice|"
                   r"stopped sending heartbeats\):\s*1\b", out), out[-3000:]


def test_one_process_gathers_its_own_counts_and_never_reports_a_lost_peer():
  assert distributed.all_gather_ints(True, 3).tolist() == [[1, 3]]
  assert distributed.broadcast_flags(False, True) == (False, True)
  assert distributed.broadcast_max(0, signal.SIGINT, 3) == (0, signal.SIGINT, 3)
  assert distributed.lost_process_error(ValueError("a collective failed")) is None
