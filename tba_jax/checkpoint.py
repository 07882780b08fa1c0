"""Run checkpoints with orbax: train state, replay buffer, RNG, cursors, config.

Nothing the searchers generated is lost at a checkpoint: next to the global
replay buffer it holds the entries the searchers of every host had committed but
not yet merged (`unmerged`, gathered in process order), taken with their
prompt-stream cursors (searcher_pool.SearcherPool.snapshot).

Orbax writes each step to a temporary directory and renames it when complete,
so a process killed mid-save (SIGKILL, preemption) leaves every earlier
checkpoint intact and the half-written one is ignored on restart. A complete
checkpoint that no longer restores (a file truncated or deleted afterwards, a
disk error) is skipped: the run resumes from the newest one that restores and
the unreadable ones are moved to `<directory>_unreadable/` (kept, not deleted:
the resumed run will save those steps again).

A checkpoint records the experiment's config; resuming under a config that
changes what the run computes (model, task, loss, ...) is refused with the
differing keys named. Keys that only change how a run is observed or how long
it runs (`RESUMABLE_KEYS`) may differ.
"""
from __future__ import annotations

import json
import os
import time
from typing import Any, NamedTuple, Sequence

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from tba_jax import entries as entries_lib
from tba_jax.entries import Entry
from tba_jax.errors import UserError

# Top-level config sections / keys that may change between a run and its resume ("fault":
# the testing aid's section in configs of checkpoints older than faults.Plan).
RESUMABLE_KEYS = ("num_train_steps", "max_train_seconds", "eval", "log", "checkpoint",
                  "searcher.max_restarts", "searcher.mismatch_every", "fault")
# A refused resume lists at most this many differing keys (another variant differs in dozens).
MAX_DIFFERENCES_SHOWN = 8


class ConfigMismatchError(UserError, ValueError):
  """The workdir's checkpoints were written under a config that computes something else."""


class CheckpointError(UserError, RuntimeError):
  """No checkpoint in the directory restores."""


class Restored(NamedTuple):
  step: int
  train_state: Any
  buffer: dict[str, np.ndarray]  # ReplayBuffer.state_dict()
  meta: dict
  unmerged: list[Entry]          # the searchers' entries not yet merged, in process order


def _pack_unmerged(entries: Sequence[Entry]) -> dict[str, np.ndarray]:
  # Padded to the longest entry held (at least 1 row and column: orbax refuses zero-size
  # arrays); `count` says how many rows are real.
  width = lambda f: max([f(e) for e in entries] + [1])
  return entries_lib.pack(entries, max_prompt_len=width(lambda e: e.prompt.size),
                          max_completion_len=width(lambda e: e.length),
                          num_rows=max(len(entries), 1))


def _reason(error: Exception) -> str:
  # Storage errors run to hundreds of lines; the first line of the innermost cause (the
  # storage layer's, under orbax's) says what broke.
  while error.__cause__ is not None:
    error = error.__cause__
  first = next((line.strip() for line in str(error).splitlines() if line.strip()), "")
  first = first if len(first) <= 300 else first[:300] + " ..."
  return f"{type(error).__name__}: {first}" if first else type(error).__name__


def _flatten(d: dict, prefix: str = "") -> dict[str, Any]:
  out = {}
  for k, v in d.items():
    if isinstance(v, dict):
      out.update(_flatten(v, f"{prefix}{k}."))
    else:
      out[f"{prefix}{k}"] = v
  return out


def config_differences(saved: dict, current: dict) -> list[str]:
  """'key: saved -> current' for each key that matters and differs."""
  a, b = _flatten(saved), _flatten(current)
  keep = lambda k: not any(k == r or k.startswith(r + ".") for r in RESUMABLE_KEYS)
  return [f"{k}: {a.get(k, '<absent>')!r} -> {b.get(k, '<absent>')!r}"
          for k in sorted(set(a) | set(b)) if keep(k) and a.get(k) != b.get(k)]


def _jsonable(config_dict: dict) -> dict:
  # Round-trip through JSON so tuples/lists compare equal after a restore.
  return json.loads(json.dumps(config_dict, default=str))


class Checkpointer:
  """Saves and restores a run under `directory` (keeps the newest `max_to_keep`)."""

  def __init__(self, directory: str, max_to_keep: int = 3):
    self.directory = os.path.abspath(directory)
    self.manager = ocp.CheckpointManager(
        self.directory,
        options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True,
                                             enable_async_checkpointing=False))

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def save(self, step: int, train_state, buffer_state: dict[str, np.ndarray], meta: dict,
           config_dict: dict, unmerged: Sequence[Entry] = ()) -> None:
    """Blocking save of everything a resume needs (all processes call this, with the same
    `buffer_state`, `meta` and `unmerged`)."""
    if step in self.manager.all_steps():
      # The same step again (a pre-fill stopped twice at step 0): the newer save holds more.
      self.manager.delete(step)
    self.manager.save(step, args=ocp.args.Composite(
        train_state=ocp.args.StandardSave(train_state),
        buffer=ocp.args.StandardSave(buffer_state),
        unmerged=ocp.args.StandardSave(_pack_unmerged(unmerged)),
        meta=ocp.args.JsonSave(meta),
        config=ocp.args.JsonSave(_jsonable(config_dict))), force=True)
    self.manager.wait_until_finished()

  def check_config(self, config_dict: dict, step: int | None = None) -> None:
    step = self.latest_step() if step is None else step
    if step is None:
      return
    saved = self.manager.restore(step, args=ocp.args.Composite(config=ocp.args.JsonRestore()))
    saved, current = saved["config"], _jsonable(config_dict)
    task = lambda c: c.get("task", {}).get("name")
    if task(saved) != task(current):  # another experiment: its differing keys say nothing
      raise ConfigMismatchError(
          f"{self.directory} holds a checkpoint (step {step}) of a {task(saved)} run, not of "
          f"this {task(current)} run; use a new --workdir for this one.")
    diffs = config_differences(saved, current)
    if diffs:
      shown = diffs[:MAX_DIFFERENCES_SHOWN] + (
          [f"... and {len(diffs) - MAX_DIFFERENCES_SHOWN} more"]
          if len(diffs) > MAX_DIFFERENCES_SHOWN else [])
      raise ConfigMismatchError(
          f"the checkpoint in {self.directory} (step {step}) was written by a different "
          "config; refusing to resume. Differences (checkpoint -> now):\n  " +
          "\n  ".join(shown) + "\nUse a new --workdir, or restore the original settings.")

  def restore(self, abstract_train_state, config_dict: dict) -> Restored | None:
    """The newest checkpoint that restores, or None when there is none.

    `abstract_train_state`: a pytree of jax.ShapeDtypeStruct with shardings,
    so each array is restored straight onto its devices. Newer checkpoints
    that fail to restore are reported and moved aside (module docstring); a
    config mismatch is never skipped.
    """
    skipped = []
    for step in sorted(self.manager.all_steps(), reverse=True):
      try:
        self.check_config(config_dict, step)
        # Checkpoints of older versions have no `unmerged` item.
        has_unmerged = (epath.Path(self.directory) / str(step) / "unmerged").exists()
        items = dict(train_state=ocp.args.StandardRestore(abstract_train_state),
                     buffer=ocp.args.StandardRestore(), meta=ocp.args.JsonRestore())
        if has_unmerged:
          items["unmerged"] = ocp.args.StandardRestore()
        restored = self.manager.restore(step, args=ocp.args.Composite(**items))
        unmerged = entries_lib.unpack(restored["unmerged"]) if has_unmerged else []
      except ConfigMismatchError:
        raise
      except Exception as e:  # whatever a damaged file raises: tensorstore, pytree, JSON
        skipped.append((step, _reason(e)))
        continue
      if skipped:
        self._set_aside(skipped, step)
      buffer_state = jax.tree.map(np.asarray, restored["buffer"])
      return Restored(step, restored["train_state"], buffer_state, restored["meta"], unmerged)
    if skipped:
      raise CheckpointError(
          f"no checkpoint in {self.directory} restores: " +
          "; ".join(f"step {s}: {r}" for s, r in skipped) +
          f". Move {self.directory} away to start the run afresh in this workdir.")
    return None

  def _set_aside(self, skipped: list[tuple[int, str]], restored_step: int) -> None:
    """Moves unreadable checkpoints out of the way of the steps the run will save again."""
    aside = epath.Path(self.directory + "_unreadable")
    if jax.process_index() == 0:
      aside.mkdir(parents=True, exist_ok=True)
      for step, _ in skipped:
        target = aside / f"{step}-{int(time.time())}"
        (epath.Path(self.directory) / str(step)).rename(target)
    if jax.process_count() > 1:
      from jax.experimental import multihost_utils
      multihost_utils.sync_global_devices("tba_jax: unreadable checkpoints moved")
    self.manager.reload()
    print(f"WARNING: resuming from checkpoint {restored_step}; the newer " +
          "; ".join(f"checkpoint {s} does not restore ({r})" for s, r in skipped) +
          f". Moved to {aside}/ (kept for inspection; the run saves those steps again).",
          flush=True)

  def close(self) -> None:
    self.manager.close()
