"""Two real processes on loopback (gloo), 2 fake CPU devices each."""
import json
import os
import socket
import subprocess
import sys

import numpy as np

from tba_jax import distributed, entries
from tba_jax.metrics import read_jsonl
from tba_jax.entries import Entry

HERE = os.path.dirname(os.path.abspath(__file__))


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def test_two_processes_share_one_buffer_and_train(tmp_path):
  port = _free_port()
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  env["PYTHONUNBUFFERED"] = "1"
  procs = [subprocess.Popen([sys.executable, os.path.join(HERE, "multihost_worker.py"), str(port),
                             str(i), str(tmp_path)], cwd=os.path.dirname(HERE), env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
           for i in range(2)]
  outputs = []
  try:
    for p in procs:
      outputs.append(p.communicate(timeout=420)[0])
  finally:
    for p in procs:  # never leave a process behind, whatever happened
      if p.poll() is None:
        p.kill()
        p.wait()
  for p, out in zip(procs, outputs):
    assert p.returncode == 0, out[-4000:]
  results = [json.loads(next(line[7:] for line in out.splitlines() if line.startswith("RESULT ")))
             for out in outputs]
  # Both hosts hold the same global buffer, with entries from both hosts' searchers...
  assert results[0]["buffer_digest"] == results[1]["buffer_digest"]
  versions = {int(k): v for k, v in results[0]["max_version_by_searcher"].items()}
  assert set(versions) == {0, 1}
  # ... and both searchers sampled with weights published after training began.
  assert min(versions.values()) > 0, versions
  rows = read_jsonl(str(tmp_path / "metrics.jsonl"))
  assert [r["step"] for r in rows if "loss" in r] == list(range(1, 7))
  assert results[0]["step"] == results[1]["step"] == 6


def test_all_gather_entries_is_identity_in_one_process():
  e = Entry(prompt_id=3, prompt=np.array([5, 6]), completion=np.array([7, 1]), reward=1.0,
            ref_logprobs=np.array([-0.5, -0.25]), behaviour_logprobs=np.array([-0.5, -0.3]),
            version=2, searcher_id=1, ended_with_eos=True)
  out = distributed.all_gather_entries([e], max_prompt_len=4, max_completion_len=4)
  assert len(out) == 1 and out[0].prompt_id == 3 and list(out[0].completion) == [7, 1]
  packed = entries.pack([e], max_prompt_len=4, max_completion_len=4, num_rows=3)
  assert int(packed["count"]) == 1 and packed["completion"].shape == (3, 4)
