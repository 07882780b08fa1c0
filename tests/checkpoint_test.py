"""Run checkpoints: a damaged newest checkpoint falls back to the newest that restores."""
import os
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tba_jax.checkpoint import Checkpointer, CheckpointError, ConfigMismatchError
from tba_jax.entries import Entry

CONFIG = {"model": {"path": "random"}, "num_train_steps": 10}


class State(NamedTuple):  # a pytree node type, as the real TrainState is
  w: jax.Array
  step: jax.Array


def _state(step):
  # Random values: orbax compresses, and a constant array would fit in a few bytes.
  w = np.random.default_rng(step).normal(size=(64, 256)).astype(np.float32)
  return State(jnp.asarray(w), jnp.int32(step))


def _abstract():
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
                      _state(0))


def _save(directory, *steps):
  ckpt = Checkpointer(directory)
  for step in steps:
    ckpt.save(step, _state(step), {"x": np.arange(step + 1)}, {"step": step}, CONFIG)
  ckpt.close()


def _truncate_largest_array_file(step_dir):
  data = os.path.join(step_dir, "train_state", "ocdbt.process_0", "d")
  files = [os.path.join(data, f) for f in os.listdir(data)]
  path = max(files, key=os.path.getsize)
  with open(path, "r+b") as f:
    f.truncate(os.path.getsize(path) // 2)


def _remove_metadata(step_dir):
  os.remove(os.path.join(step_dir, "train_state", "_METADATA"))


@pytest.mark.parametrize("damage", [_truncate_largest_array_file, _remove_metadata])
def test_damaged_newest_checkpoint_falls_back_and_is_moved_aside(tmp_path, capsys, damage):
  directory = str(tmp_path / "checkpoints")
  _save(directory, 2, 4)
  damage(os.path.join(directory, "4"))
  ckpt = Checkpointer(directory)
  step, state, buffer, meta, unmerged = ckpt.restore(_abstract(), CONFIG)
  assert step == 2 and meta == {"step": 2} and unmerged == []
  np.testing.assert_array_equal(state.w, _state(2).w)
  np.testing.assert_array_equal(buffer["x"], np.arange(3))
  out = capsys.readouterr().out
  # One paragraph naming the skipped checkpoint and why, not the storage layer's dump.
  assert out.count("\n") == 1 and len(out) < 900, out
  assert "resuming from checkpoint 2; the newer checkpoint 4 does not restore (" in out
  aside = os.listdir(tmp_path / "checkpoints_unreadable")
  assert len(aside) == 1 and aside[0].startswith("4-")
  # The run saves step 4 again where the damaged one was.
  ckpt.save(4, _state(4), {"x": np.arange(5)}, {"step": 4}, CONFIG)
  assert ckpt.restore(_abstract(), CONFIG)[0] == 4
  ckpt.close()


def test_no_restorable_checkpoint_is_an_error_naming_each(tmp_path):
  directory = str(tmp_path / "checkpoints")
  _save(directory, 2, 4)
  _remove_metadata(os.path.join(directory, "2"))
  _truncate_largest_array_file(os.path.join(directory, "4"))
  with pytest.raises(CheckpointError, match=r"(?s)no checkpoint .* restores: step 4: .*step 2: "):
    Checkpointer(directory).restore(_abstract(), CONFIG)
  assert sorted(os.listdir(directory)) == ["2", "4"]  # nothing moved or deleted


def test_a_config_mismatch_is_refused_not_skipped(tmp_path):
  directory = str(tmp_path / "checkpoints")
  _save(directory, 2)
  changed = {"model": {"path": "other"}, "num_train_steps": 10}
  with pytest.raises(ConfigMismatchError, match="model.path: 'random' -> 'other'"):
    Checkpointer(directory).restore(_abstract(), changed)
  assert os.listdir(directory) == ["2"]


def test_a_resume_under_another_experiment_is_refused_in_one_line(tmp_path):
  directory = str(tmp_path / "checkpoints")
  ckpt = Checkpointer(directory)
  saved = {"task": {"name": "tldr"}, **{f"key{i}": i for i in range(37)}}
  ckpt.save(3, _state(3), {"x": np.arange(4)}, {"step": 3}, saved)
  other = {"task": {"name": "arithmetic"}, **{f"key{i}": -i for i in range(37)}}
  with pytest.raises(ConfigMismatchError) as refused:
    ckpt.check_config(other)
  assert str(refused.value) == (f"{directory} holds a checkpoint (step 3) of a tldr run, not of "
                                "this arithmetic run; use a new --workdir for this one.")
  # The same experiment under many changed keys: the first few, and how many more.
  with pytest.raises(ConfigMismatchError) as refused:
    ckpt.check_config({"task": {"name": "tldr"}, **{f"key{i}": -i for i in range(37)}})
  lines = str(refused.value).splitlines()
  assert lines[1:4] == ["  key1: 1 -> -1", "  key10: 10 -> -10", "  key11: 11 -> -11"]
  assert lines[-2:] == ["  ... and 28 more",
                        "Use a new --workdir, or restore the original settings."]
  ckpt.close()


def _entry(pid, completion, searcher):
  n = len(completion)
  return Entry(prompt_id=pid, prompt=np.arange(pid + 1), completion=np.array(completion),
               reward=0.5 * pid, ref_logprobs=-np.arange(n) / 3, behaviour_logprobs=-np.ones(n),
               version=pid + 1, searcher_id=searcher, ended_with_eos=bool(n))


def test_the_searchers_unmerged_entries_round_trip_in_order(tmp_path):
  directory = str(tmp_path / "checkpoints")
  unmerged = [_entry(3, [7, 8, 9], 1), _entry(0, [], 0), _entry(5, [4], 1)]
  ckpt = Checkpointer(directory)
  ckpt.save(2, _state(2), {"x": np.arange(3)}, {"step": 2}, CONFIG, unmerged=unmerged)
  ckpt.save(4, _state(4), {"x": np.arange(5)}, {"step": 4}, CONFIG)  # none unmerged
  restored = ckpt.restore(_abstract(), CONFIG)
  assert restored.step == 4 and restored.unmerged == []
  ckpt.manager.delete(4)
  back = ckpt.restore(_abstract(), CONFIG).unmerged
  assert len(back) == 3
  for a, b in zip(back, unmerged):
    assert (a.prompt_id, a.reward, a.version, a.searcher_id, a.ended_with_eos) == \
        (b.prompt_id, b.reward, b.version, b.searcher_id, b.ended_with_eos)
    for field in ("prompt", "completion", "ref_logprobs", "behaviour_logprobs"):
      np.testing.assert_array_equal(getattr(a, field), np.asarray(getattr(b, field), np.float32))
  ckpt.close()


def test_a_checkpoint_without_unmerged_entries_restores_with_none(tmp_path):
  # Checkpoints written before the searchers' entries were saved have no `unmerged` item.
  directory = str(tmp_path / "checkpoints")
  _save(directory, 2)
  import shutil
  shutil.rmtree(os.path.join(directory, "2", "unmerged"))
  restored = Checkpointer(directory).restore(_abstract(), CONFIG)
  assert restored.step == 2 and restored.unmerged == []


def test_saving_a_step_again_replaces_it(tmp_path):
  # A pre-fill stopped twice saves step 0 twice; the second holds more.
  ckpt = Checkpointer(str(tmp_path / "checkpoints"))
  ckpt.save(0, _state(0), {"x": np.arange(2)}, {"step": 0}, CONFIG)
  ckpt.save(0, _state(0), {"x": np.arange(5)}, {"step": 0}, CONFIG, unmerged=[_entry(1, [2], 0)])
  restored = ckpt.restore(_abstract(), CONFIG)
  np.testing.assert_array_equal(restored.buffer["x"], np.arange(5))
  assert [e.prompt_id for e in restored.unmerged] == [1]
  ckpt.close()
