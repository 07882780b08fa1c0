"""The buffer's checkpoint format: named non-empty arrays that give the state back."""
import numpy as np

from tba_jax import buffer_state
from tba_jax.entries import Entry, normalized


def _entry(pid, completion, version=0, **kw):
  n = len(completion)
  return normalized(Entry(prompt_id=pid, prompt=np.array([100 + pid, 7], np.int32),
                          completion=np.array(completion, np.int32), reward=0.5 * pid,
                          ref_logprobs=np.full(n, -0.1, np.float32),
                          behaviour_logprobs=np.full(n, -0.2, np.float32), version=version,
                          **kw))


def _snapshot(entries, seqs, **kw):
  counters = dict(zip(buffer_state.COUNTERS, (7, 5, 2, 9, 1, 0)))
  return buffer_state.Snapshot(
      seqs=seqs, entries=entries, prompts={e.prompt_id: e.prompt for e in entries},
      pending=[1], latest=[0, 1], latest_left=[1], windows=[3], counters=counters,
      rng_state=np.random.default_rng(0).bit_generator.state, **kw)


def test_every_array_is_non_empty_and_the_state_comes_back():
  entries = [_entry(0, [10, 2], version=3, temperature=0.6, last_version=5, ended_with_eos=True),
             _entry(1, [11, 12, 13], model_mask=np.array([1, 0, 1], np.int32))]
  want = _snapshot(entries, [2, 6], max_entries=8)
  state = buffer_state.to_arrays(want)
  assert all(v.size > 0 for v in state.values())
  got = buffer_state.from_arrays(state)
  assert (got.seqs, got.pending, got.latest, got.latest_left, got.windows, got.counters,
          got.max_entries, got.rng_state) == (want.seqs, want.pending, want.latest,
                                               want.latest_left, want.windows, want.counters,
                                               8, want.rng_state)
  assert {p: t.tolist() for p, t in got.prompts.items()} == {0: [100, 7], 1: [101, 7]}
  for a, b in zip(got.entries, entries):
    assert (a.prompt_id, a.reward, a.version, a.last_version, a.temperature,
            a.ended_with_eos) == (b.prompt_id, b.reward, b.version, b.last_version,
                                  b.temperature, b.ended_with_eos)
    for name in ("completion", "ref_logprobs", "behaviour_logprobs", "model_mask"):
      np.testing.assert_array_equal(getattr(a, name), getattr(b, name))


def test_an_empty_buffer_and_no_cap_round_trip():
  state = buffer_state.to_arrays(_snapshot([], [], max_entries=None))
  assert all(v.size > 0 for v in state.values())
  got = buffer_state.from_arrays(state)
  assert got.entries == [] and got.prompts == {} and got.max_entries == 0  # 0: no cap
