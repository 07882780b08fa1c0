"""A run's checkpoints as the loop keeps them: resume (the train state and reference, the
replay buffer, the searchers' unmerged entries and cursors), save, and the ways a run
stops after saving (a stop request, a searcher that gave up) or without (divergence).

The orbax side (atomic saves, fallback past damaged checkpoints, the config a resume must
match) is checkpoint.py's `Checkpointer`; this module decides what a run puts in it.
"""
from __future__ import annotations

import hashlib

import jax
import numpy as np

from tba_jax import interrupts
from tba_jax.checkpoint import Checkpointer
from tba_jax.metrics import MetricsWriter
from tba_jax.replay_buffer import ReplayBuffer
from tba_jax.searcher_pool import SearcherError, SearcherPool


class RunCheckpoints:
  """The run's checkpoints: resume, save, and the two ways a run stops after a save.

  The checkpointed tree is the train state, or with reference resets (a reference, not
  None) (state, reference); loss.ref_reset_every is part of the config a resume must
  match, so the structure always fits."""

  def __init__(self, checkpointer: Checkpointer, config_dict: dict, pool: SearcherPool,
               buffer: ReplayBuffer):
    self.checkpointer, self.config_dict, self.pool, self.buffer = (checkpointer, config_dict,
                                                                   pool, buffer)
    self.writer: MetricsWriter | None = None  # set once the run's writer exists

  def resume(self, state, reference):
    """(start step, wall time of earlier segments, state, reference) of the newest
    checkpoint, its buffer and searcher state loaded; (0, 0.0, ...) as given without one."""
    tree = state if reference is None else (state, reference)
    restored = self.checkpointer.restore(jax.tree.map(abstract, tree), self.config_dict)
    if restored is None:
      return 0, 0.0, state, reference
    step, meta = restored.step, restored.meta
    state, reference = (restored.train_state, None) if reference is None else \
        restored.train_state
    self.buffer.load_state_dict(restored.buffer)
    # The searchers' unmerged entries go back to their local buffers: the next sync merges
    # them, as it would have without the interruption.
    self.pool.load_snapshot(restored.unmerged, meta["searchers"])
    self.pool.publish(step, state.params)
    if reference is not None:
      self.pool.set_reference(reference)
    print(f"Resumed from step {step} ({len(self.buffer)} buffer entries, "
          f"{len(restored.unmerged)} searcher entries not merged yet).")
    return step, meta.get("wall_time", 0.0), state, reference  # (absent in older versions)

  def save(self, step: int, state, reference) -> None:
    # Every process takes part: orbax writes the global arrays collectively. The searchers
    # keep sampling: the snapshot copies their committed entries and cursors.
    unmerged, searchers = self.pool.snapshot()
    self.checkpointer.save(
        step, state if reference is None else (state, reference), self.buffer.state_dict(),
        {"step": step, "searchers": searchers, "wall_time": self.writer.elapsed()},
        self.config_dict, unmerged=unmerged)

  def preempted(self, step: int, signum: int, state, reference) -> dict:
    """SIGTERM or Ctrl-C on any process: every process saves this step and returns."""
    self.save(step, state, reference)
    print(interrupts.saved_message(signum, step, self.checkpointer.directory,
                                   jax.process_count()), flush=True)
    return {"step": step, "terminated": True, "signal": interrupts.NAMES[signum],
            **buffer_summary(self.buffer)}

  def gave_up(self, state, reference) -> SearcherError:
    """A searcher gave up (every process knows it): save, then the run's error."""
    self.save(int(state.step), state, reference)
    return self.pool.error(int(state.step))

  def diverged(self, m: dict, step: int) -> FloatingPointError:
    return FloatingPointError(
        f"loss is {m['loss']} at step {step} (grad_norm={m['grad_norm']}); stopping "
        f"without saving. The checkpoints in {self.checkpointer.directory} are intact.")


def buffer_summary(buffer: ReplayBuffer) -> dict:
  """A digest of the buffer's state (equal on every host) and versions per searcher."""
  state = buffer.state_dict()
  digest = hashlib.sha256()
  for k in sorted(state):
    digest.update(k.encode() + np.ascontiguousarray(state[k]).tobytes())
  versions = {}
  for e in buffer.entries():
    versions[e.searcher_id] = max(versions.get(e.searcher_id, 0), e.version)
  return {"buffer_digest": digest.hexdigest(), "max_version_by_searcher": versions}


def abstract(x):
  """The ShapeDtypeStruct of array x, its sharding kept (what orbax restores into)."""
  return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)
