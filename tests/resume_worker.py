"""`python -m experiments.gsm8k` with a log of what the searchers commit (experiment_test.py).

  python tests/resume_worker.py LOG FAULTS [experiment flags ...]

(FAULTS: tests/fault_worker.py's, "" = none.)

Each line of LOG is JSON: {"commit": [digests], "rows": [prompt ids], "thread": name} for
every batch a searcher commits to its local buffer (and for the entries a resume hands
back to it, from the main thread), {"snapshot": n} when a checkpoint copies a
searcher's unmerged entries, {"save": step} before the checkpoint is written. Commits
and snapshots are logged from calls the searcher makes under its commit lock, so their
order in the file is the order in which they happened.
"""
import hashlib
import json
import os
import sys
import threading

import fault_worker

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def digest(entry) -> str:
  """An entry's identity: every field, as the buffer stores it (entries.normalized)."""
  from tba_jax.entries import normalized
  e = normalized(entry)
  h = hashlib.sha256(json.dumps([e.prompt_id, e.reward, e.version, e.searcher_id,
                                 e.ended_with_eos]).encode())
  for a in (e.prompt, e.completion, e.ref_logprobs, e.behaviour_logprobs):
    h.update(a.tobytes())
  return h.hexdigest()


def _instrument(path: str) -> None:
  from tba_jax.checkpoint import Checkpointer
  from tba_jax.searcher import Searcher
  out, lock = open(path, "a"), threading.Lock()

  def log(record):
    with lock:
      out.write(json.dumps(record) + "\n")
      out.flush()

  init, save = Searcher.__init__, Checkpointer.save

  def logged_init(self, *args, **kwargs):
    init(self, *args, **kwargs)
    add, peek = self.buffer.add_many, self.buffer.peek_new

    def logged_add(entries):
      entries = list(entries)
      log({"commit": [digest(e) for e in entries],
           "rows": [e.prompt_id for e in entries],
           "thread": threading.current_thread().name})
      add(entries)

    def logged_peek():
      new = peek()
      log({"snapshot": len(new)})
      return new

    self.buffer.add_many, self.buffer.peek_new = logged_add, logged_peek

  def logged_save(self, step, *args, **kwargs):
    log({"save": step})
    save(self, step, *args, **kwargs)

  Searcher.__init__, Checkpointer.save = logged_init, logged_save


if __name__ == "__main__":
  sys.path.insert(0, ROOT)
  _instrument(sys.argv[1])
  fault_worker.run(sys.argv[2], "gsm8k", sys.argv[3:])
