"""Run checkpoints with orbax: train state, replay buffer, RNG, cursors, config.

Orbax writes each step to a temporary directory and renames it when complete,
so a process killed mid-save (SIGKILL, preemption) leaves every earlier
checkpoint intact and the half-written one is ignored on restart.

A checkpoint records the experiment's config; resuming under a config that
changes what the run computes (model, task, loss, ...) is refused with the
differing keys named. Keys that only change how a run is observed or how long
it runs (`RESUMABLE_KEYS`) may differ.
"""
from __future__ import annotations

import json
import os
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

# Top-level config sections / keys that may change between a run and its resume.
RESUMABLE_KEYS = ("num_train_steps", "max_train_seconds", "eval", "log", "checkpoint")


class ConfigMismatchError(ValueError):
  pass


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
           config_dict: dict) -> None:
    """Blocking save of everything a resume needs (all processes call this)."""
    self.manager.save(step, args=ocp.args.Composite(
        train_state=ocp.args.StandardSave(train_state),
        buffer=ocp.args.StandardSave(buffer_state),
        meta=ocp.args.JsonSave(meta),
        config=ocp.args.JsonSave(_jsonable(config_dict))), force=True)
    self.manager.wait_until_finished()

  def check_config(self, config_dict: dict, step: int | None = None) -> None:
    step = self.latest_step() if step is None else step
    saved = self.manager.restore(step, args=ocp.args.Composite(config=ocp.args.JsonRestore()))
    diffs = config_differences(saved["config"], _jsonable(config_dict))
    if diffs:
      raise ConfigMismatchError(
          f"the checkpoint in {self.directory} (step {step}) was written by a different "
          "config; refusing to resume. Differences (checkpoint -> now):\n  " +
          "\n  ".join(diffs) + "\nUse a new --workdir, or restore the original settings.")

  def restore(self, abstract_train_state, config_dict: dict):
    """(step, train_state, buffer_state, meta) of the latest checkpoint, or None.

    `abstract_train_state`: a pytree of jax.ShapeDtypeStruct with shardings,
    so each array is restored straight onto its devices.
    """
    step = self.latest_step()
    if step is None:
      return None
    self.check_config(config_dict, step)
    restored = self.manager.restore(step, args=ocp.args.Composite(
        train_state=ocp.args.StandardRestore(abstract_train_state),
        buffer=ocp.args.StandardRestore(),
        meta=ocp.args.JsonRestore()))
    buffer_state = jax.tree.map(np.asarray, restored["buffer"])
    return step, restored["train_state"], buffer_state, restored["meta"]

  def close(self) -> None:
    self.manager.close()
