"""Per-token loss masks (Entry.model_mask): an environment's tokens are conditioning, never
counted; a single-turn task trains bit-identically to the code before masks existed."""
import hashlib
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tba_jax import batch as batch_lib
from tba_jax import entries as entries_lib
from tba_jax import buffer_state, logprobs, replay_buffer
from tba_jax import train_step as ts
from tba_jax.model import completion_logits, init_params

GOLDEN = os.path.join(os.path.dirname(__file__), "data", "single_turn_golden.json")


def _entries(rng, masked: bool):
  out = []
  for pid in range(4):
    prompt = rng.integers(5, 128, rng.integers(2, 6))
    for j in range(2):
      n = int(rng.integers(1, 7))
      c = rng.integers(5, 128, n)
      eos = bool(j % 2)
      if eos:
        c[-1] = 3
      mask = None
      if masked:  # a reply in the middle of the completion
        mask = np.ones(n, np.int32)
        mask[n // 3:(2 * n) // 3] = 0
      out.append(entries_lib.Entry(pid, prompt, c, float(rng.normal()), rng.normal(size=n) - 3,
                                   rng.normal(size=n) - 3, version=0, ended_with_eos=eos,
                                   model_mask=mask))
  return out


@pytest.mark.parametrize("loss_fn", [ts.tb_loss, ts.rloo_loss, ts.grpo_loss, ts.ratio_loss],
                         ids=["tb", "rloo", "grpo", "ratio"])
def test_gradient_wrt_environment_token_logits_is_exactly_zero(tiny_cfg, loss_fn):
  entries = _entries(np.random.default_rng(1), masked=True)
  layout = batch_lib.Layout(8, 8, 0)
  batch = batch_lib.from_entries(entries, layout, True, [e.prompt_id for e in entries])
  logits = completion_logits(tiny_cfg, init_params(tiny_cfg, 0), batch.tokens,
                             batch.attention_mask, layout.completion_len)

  def loss(logits):
    lp = logprobs.token_logprobs(logits, batch.tokens[:, layout.prompt_len:])
    return loss_fn(lp, batch, jnp.float32(0.1))[0]

  grad = np.asarray(jax.grad(loss)(logits))
  env = np.zeros((len(entries), layout.completion_len), bool)
  for r, e in enumerate(entries):
    env[r, :e.length] = e.model_mask == 0
  assert env.any() and np.all(grad[env] == 0.0)
  assert np.any(grad[~env] != 0.0)  # the model's own tokens do get a gradient


def test_masks_survive_the_wire_format_and_the_buffer_state():
  entries = [entries_lib.normalized(e) for e in _entries(np.random.default_rng(2), masked=True)]
  back = entries_lib.unpack(entries_lib.pack(entries, max_prompt_len=8, max_completion_len=8))
  buf = replay_buffer.ReplayBuffer(8, None, "oldest", seed=0)
  buf.add_many(entries)
  again = replay_buffer.ReplayBuffer(8, None, "oldest", seed=0)
  again.load_state_dict(buf.state_dict())
  key = lambda e: (e.prompt_id, e.completion.tobytes())
  for want, got in ((entries, back), (sorted(entries, key=key), sorted(again.entries(), key=key))):
    assert len(want) == len(got)
    for a, b in zip(want, got):
      np.testing.assert_array_equal(a.model_mask, b.model_mask)


def test_states_saved_before_masks_load_with_all_ones():
  entries = [entries_lib.normalized(e) for e in _entries(np.random.default_rng(3), masked=False)]
  packed = entries_lib.pack(entries, max_prompt_len=8, max_completion_len=8)
  del packed["model_mask"]
  assert all((e.model_mask == 1).all() for e in entries_lib.unpack(packed))
  buf = replay_buffer.ReplayBuffer(8, None, "oldest", seed=0)
  buf.add_many(entries)
  state = buf.state_dict()
  # An old state: no model_mask array and no size for it.
  names = list(buffer_state.STATE_ARRAYS)
  state["sizes"] = np.delete(state["sizes"], names.index("model_mask"))
  del state["model_mask"]
  again = replay_buffer.ReplayBuffer(8, None, "oldest", seed=0)
  again.load_state_dict(state)
  assert len(again.entries()) == len(entries)
  assert all((e.model_mask == 1).all() for e in again.entries())


def test_a_single_turn_task_is_bit_identical_to_before_masks():
  """The pipeline of tests/data/single_turn_golden.json (entries -> wire format -> buffer
  state -> training batch): every batch array hashes as it did on main before masks existed
  (e29f72d). The losses and the update read an entry only through the batch, so equal
  batches give bit-equal updates (checked once across the two commits: TB, RLOO and GRPO,
  two updates each, every metric and parameter; XLA's floats are not hashed here, as they
  may differ between CPU types)."""
  rng = np.random.default_rng(0)
  entries = []
  for pid in range(4):
    prompt = rng.integers(5, 128, rng.integers(2, 6))
    for j in range(2):
      n = int(rng.integers(1, 7))
      c = rng.integers(5, 128, n)
      eos = bool(j % 2)
      if eos:
        c[-1] = 3
      entries.append(entries_lib.Entry(pid, prompt, c, float(rng.normal()), rng.normal(size=n) - 3,
                                       rng.normal(size=n) - 3, version=0, ended_with_eos=eos))
  entries = entries_lib.unpack(entries_lib.pack(entries, max_prompt_len=8, max_completion_len=8))
  buf = replay_buffer.ReplayBuffer(8, None, "oldest", seed=0)
  buf.add_many(entries)
  replay_buffer.ReplayBuffer(8, None, "oldest", seed=0).load_state_dict(buf.state_dict())
  layout = batch_lib.Layout(8, 8, 0)
  b = batch_lib.from_entries(entries, layout, True, [e.prompt_id for e in entries])
  out = {f"batch_{k}": np.asarray(v) for k, v in vars(b).items()}
  with open(GOLDEN) as f:
    golden = json.load(f)
  got = {k: hashlib.sha256(v.tobytes()).hexdigest()[:16] + ":" + str(v.dtype) for k, v in out.items()}
  assert sorted(got) == sorted(golden)
  assert [k for k in golden if got[k] != golden[k]] == []
