"""Replay buffer: the m rule, sampling laws, caps, layout, threads, save/restore, merging."""
import copy
import sys
import threading

import numpy as np
import pytest

from tba_jax import buffer_state
from tba_jax import entries as entries_lib
from tba_jax import replay_buffer as rb
from tba_jax.batch import Layout
from tba_jax.entries import Entry
from tba_jax.replay_buffer import ReplayBuffer

SIZES = dict(layout=Layout(prompt_len=6, completion_len=8, pad_id=0))


def make_entry(pid, completion, reward=0.0, version=0, eos=True, prompt=None, searcher=0,
               temperature=1.0, ref=None, last_version=None):
  completion = np.asarray(completion, np.int32)
  n = completion.size
  ref = -0.1 * np.arange(1, n + 1, dtype=np.float32) if ref is None else np.full(n, ref / n)
  return Entry(prompt_id=pid, prompt=np.array(prompt if prompt is not None else [100 + pid, 7]),
               completion=completion, reward=reward, ref_logprobs=ref,
               behaviour_logprobs=-0.2 * np.arange(1, n + 1, dtype=np.float32),
               version=version, searcher_id=searcher, ended_with_eos=eos,
               temperature=temperature, last_version=last_version)


def fill(buf, pid, n, version=0, rewards=None, start=10):
  """n distinct completions for prompt pid (token start+j, then EOS=2)."""
  buf.add_many([make_entry(pid, [start + j, 2], 0.0 if rewards is None else rewards[j], version)
                for j in range(n)])


def binomial_ok(successes, n, p, sds=5.0):
  return abs(successes - n * p) <= sds * np.sqrt(n * p * (1 - p)) + 1e-9


def assert_same_entries(a, b):
  assert len(a) == len(b)
  for x, y in zip(a, b):
    for f in ("prompt_id", "reward", "version", "searcher_id", "ended_with_eos", "temperature",
              "last_version"):
      assert getattr(x, f) == getattr(y, f), f
    for f in ("prompt", "completion", "ref_logprobs", "behaviour_logprobs"):
      np.testing.assert_array_equal(getattr(x, f), getattr(y, f))


def assert_same_batch(a, b):
  for name in ("tokens", "attention_mask", "completion_mask", "ref_logprobs",
               "behaviour_logprobs", "rewards", "group_ids", "prompt_ids", "versions"):
    np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)


def assert_same_state(a, b):
  assert sorted(a) == sorted(b)
  for k in a:
    np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    assert a[k].dtype == b[k].dtype, k


# -----------------------------------------------------------------------------
# Layout
# -----------------------------------------------------------------------------
@pytest.mark.parametrize("include_eos", [True, False])
def test_layout_left_pads_prompt_right_pads_completion_and_masks_eos(include_eos):
  buf = ReplayBuffer()
  buf.add(make_entry(3, [11, 12, 2], reward=1.5, version=4, eos=True, prompt=[50, 51, 52]))
  buf.add(make_entry(5, [21, 22, 23, 24], reward=-1.0, version=6, eos=False, prompt=[60]))
  batch, info = buf.sample(2, 1, 0.0, layout=Layout(5, 6, 9),
                           include_eos=include_eos)
  assert batch.tokens.shape == (2, 11) and batch.completion_mask.shape == (2, 6)
  assert batch.prompt_len == 5
  assert batch.tokens.dtype == np.int32 and batch.completion_mask.dtype == np.float32
  rows = {int(g): r for r, g in enumerate(batch.prompt_ids)}
  r3, r5 = rows[3], rows[5]
  np.testing.assert_array_equal(batch.tokens[r3], [9, 9, 50, 51, 52, 11, 12, 2, 9, 9, 9])
  np.testing.assert_array_equal(batch.attention_mask[r3], [0, 0, 1, 1, 1, 1, 1, 1, 0, 0, 0])
  np.testing.assert_array_equal(batch.tokens[r5], [9, 9, 9, 9, 60, 21, 22, 23, 24, 9, 9])
  np.testing.assert_array_equal(batch.attention_mask[r5], [0, 0, 0, 0, 1, 1, 1, 1, 1, 0, 0])
  # EOS ended: its own log-prob is dropped only when include_eos is off.
  eos_counted = [1, 1, 1, 0, 0, 0] if include_eos else [1, 1, 0, 0, 0, 0]
  np.testing.assert_array_equal(batch.completion_mask[r3], eos_counted)
  # Truncated sample: no EOS, every token counts either way.
  np.testing.assert_array_equal(batch.completion_mask[r5], [1, 1, 1, 1, 0, 0])
  for r in (r3, r5):  # log-probs only where counted, so a plain sum is the loss's log pi
    np.testing.assert_array_equal(batch.ref_logprobs[r] != 0, batch.completion_mask[r] > 0)
    np.testing.assert_array_equal(batch.behaviour_logprobs[r] != 0, batch.completion_mask[r] > 0)
  np.testing.assert_allclose(batch.ref_logprobs[r3, :2], [-0.1, -0.2], rtol=1e-6)
  np.testing.assert_allclose(batch.behaviour_logprobs[r5, :4], [-0.2, -0.4, -0.6, -0.8],
                             rtol=1e-6)
  assert batch.rewards[r3] == 1.5 and batch.versions[r3] == 4 and batch.versions[r5] == 6
  np.testing.assert_array_equal(info["versions"], batch.versions)


def test_rows_are_grouped_contiguously_by_prompt_slot_with_fixed_shapes():
  buf = ReplayBuffer()
  for pid in range(6):
    fill(buf, pid, 5)
  for _ in range(5):
    batch, info = buf.sample(4, 3, 0.0, **SIZES)
    assert batch.tokens.shape == (12, 14)
    np.testing.assert_array_equal(batch.group_ids, np.repeat(np.arange(4), 3))
    np.testing.assert_array_equal(batch.prompt_ids, np.repeat(info["prompt_ids"], 3))
    assert len(set(info["prompt_ids"].tolist())) == 4  # distinct prompts while possible


def test_a_prompt_in_two_slots_is_two_groups_of_k():
  """Fewer prompts than slots: a prompt fills two slots, and each slot is its own group
  (the authors' one-slot micro-batches), never one merged group of 2K."""
  buf = ReplayBuffer(seed=4)
  fill(buf, 0, 6)
  fill(buf, 1, 6, start=30)
  batch, info = buf.sample(3, 2, 0.0, **SIZES)
  assert sorted(set(info["prompt_ids"].tolist())) == [0, 1]  # one of them twice
  np.testing.assert_array_equal(batch.group_ids, [0, 0, 1, 1, 2, 2])
  np.testing.assert_array_equal(batch.prompt_ids, np.repeat(info["prompt_ids"], 2))


def test_oversize_prompt_or_completion_names_the_prompt_and_changes_nothing():
  buf = ReplayBuffer()
  buf.add(make_entry(7, [1, 2, 3, 4, 5, 2], prompt=[1, 2, 3]))
  buf.mark_sync()
  before = buf.state_dict()
  with pytest.raises(ValueError,
                     match=r"prompt id 7: completion has 6 tokens.*max_completion_len=5"):
    buf.sample(1, 1, 1.0, layout=Layout(3, 5, 0))
  with pytest.raises(ValueError, match=r"prompt id 7: prompt has 3 tokens.*max_prompt_len=2"):
    buf.sample(1, 1, 1.0, layout=Layout(2, 6, 0))
  assert_same_state(before, buf.state_dict())  # latest pool and RNG untouched by the failures
  with pytest.raises(ValueError, match="prompt id 7"):
    entries_lib.pack(buf.entries(), max_prompt_len=3, max_completion_len=5)


def test_sampling_an_empty_buffer_raises():
  with pytest.raises(ValueError, match="empty replay buffer"):
    ReplayBuffer().sample(1, 1, 0.5, **SIZES)


def test_bad_entries_and_conflicting_prompts_are_refused():
  buf = ReplayBuffer()
  buf.add(make_entry(1, [3, 2], prompt=[5, 6]))
  with pytest.raises(ValueError, match="prompt id 1: prompt tokens differ"):
    buf.add(make_entry(1, [4, 2], prompt=[5, 7]))
  bad = make_entry(2, [3, 2])
  with pytest.raises(ValueError, match="prompt id 2"):
    buf.add(Entry(**{**bad.__dict__, "ref_logprobs": np.zeros(3)}))
  with pytest.raises(ValueError, match="non-finite"):
    buf.add(Entry(**{**bad.__dict__, "reward": float("nan")}))
  assert len(buf) == 1


# -----------------------------------------------------------------------------
# The m rule
# -----------------------------------------------------------------------------
@pytest.mark.parametrize("m", [0.0, 0.5, 0.95, 1.0])
def test_fraction_of_slots_from_the_latest_sync_follows_m(m):
  buf = ReplayBuffer(seed=1)
  for pid in range(40):
    fill(buf, pid, 3, version=0)
  buf.mark_sync()
  for pid in range(1000, 4200):  # more latest prompts than slots, so the pool never runs dry
    fill(buf, pid, 1, version=1)
  buf.mark_sync()
  slots = latest = 0
  for _ in range(100):
    batch, info = buf.sample(32, 1, m, **SIZES)
    slots += 32
    latest += info["num_from_latest"]
    assert info["num_latest_fallback"] == 0
    fl = info["from_latest"]
    assert np.all(batch.versions[fl] == 1) and np.all(batch.prompt_ids[fl] >= 1000)
  assert binomial_ok(latest, slots, m), (latest, slots, m)


@pytest.mark.parametrize("reuse", [True, False])
def test_latest_prompts_are_taken_without_replacement_then_reused_or_fall_back(reuse):
  buf = ReplayBuffer(seed=2)
  for pid in range(10):
    fill(buf, pid, 3)
  buf.mark_sync()
  for pid in (20, 21, 22, 23, 24):
    fill(buf, pid, 6, version=1)
  assert buf.mark_sync() == 5
  sample = lambda n: buf.sample(n, 2, 1.0, reuse_latest=reuse, **SIZES)[1]
  info = sample(3)
  served = info["prompt_ids"].tolist()
  assert info["num_from_latest"] == 3 and info["num_latest_left"] == 2
  info = sample(3)
  served += info["prompt_ids"][:2].tolist()
  assert sorted(served) == [20, 21, 22, 23, 24]  # each latest prompt once in the first pass
  if reuse:  # the authors' sample_cid: a second pass over the prompts already drawn
    assert info["num_from_latest"] == 3 and info["num_latest_fallback"] == 0
    assert info["prompt_ids"][2] in served[:3] and len(set(info["prompt_ids"])) == 3
  else:
    assert info["num_from_latest"] == 2 and info["num_latest_fallback"] == 1
    assert info["prompt_ids"][2] < 10
  info = sample(3)
  assert info["num_from_latest"] == (3 if reuse else 0)
  assert info["num_latest_fallback"] == (0 if reuse else 3)
  assert set(info["prompt_ids"][info["from_latest"]]) <= {20, 21, 22, 23, 24}
  fill(buf, 3, 1, start=50)  # a new window: only prompt 3 was refreshed
  assert buf.mark_sync() == 1
  info = sample(2)  # one latest prompt: a batch holds it once, the other slot falls back
  assert info["from_latest"].tolist() == [True, False] and info["prompt_ids"][0] == 3
  assert info["num_latest_fallback"] == 1


def test_latest_branch_draws_k_uniformly_from_the_newest_generation():
  """The authors' CommentBuffer.get_batch: K at random among the n_online newest items
  (those of the latest merge), with replacement only when fewer than K exist; never older
  entries."""
  k, trials = 4, 1500
  buf = ReplayBuffer(seed=3)
  fill(buf, 0, 10, version=0, start=10)  # an older generation: tokens 10..19
  buf.mark_sync()
  fill(buf, 0, 8, version=2, start=30)   # the newest: tokens 30..37
  buf.mark_sync()
  counts = np.zeros(8)
  for _ in range(trials):
    batch, info = buf.sample(1, k, 1.0, **SIZES)
    drawn = batch.tokens[:, SIZES["layout"].prompt_len]
    assert info["from_latest"][0] and not info["with_replacement"][0]
    assert np.all(drawn >= 30) and len(set(drawn.tolist())) == k  # newest only, no repeats
    assert np.all(batch.versions == 2)
    np.add.at(counts, drawn - 30, 1)
  # Uniform inclusion: each of the 8 newest is in a draw with probability K / 8.
  for c in counts:
    assert binomial_ok(c, trials, k / 8), counts / trials
  # Fewer than K unique in the newest generation: all of them, the rest with replacement,
  # still never the 10 older entries.
  fill(buf, 0, 3, version=4, start=50)
  buf.mark_sync()
  for _ in range(50):
    batch, info = buf.sample(1, k, 1.0, **SIZES)
    drawn = batch.tokens[:, SIZES["layout"].prompt_len].tolist()
    assert info["with_replacement"][0] and set(drawn) == {50, 51, 52} and len(drawn) == k


def test_the_m_branch_draws_what_the_prompt_received_at_its_latest_sync():
  """A streamed group whose rows started under versions [3, 3, 4, 4] is one generation:
  K = 4 of it, without replacement (not the two version-4 rows, each twice); and a
  red-teaming prompt's generation is every batch merged at its latest sync, whatever
  searchers and versions sampled them (the authors' n_online items)."""
  buf = ReplayBuffer(seed=5)
  fill(buf, 0, 4, version=2)
  buf.mark_sync()
  buf.add_many([make_entry(0, [30 + j, 2], version=v, last_version=4)
                for j, v in enumerate([3, 3, 4, 4])])
  buf.mark_sync()
  for _ in range(20):
    batch, info = buf.sample(1, 4, 1.0, **SIZES)
    assert info["from_latest"][0] and not info["with_replacement"][0]
    assert sorted(batch.tokens[:, SIZES["layout"].prompt_len].tolist()) == [30, 31, 32, 33]
  for searcher, version in ((0, 5), (1, 6), (2, 5)):  # three batches of 2 in one merge
    buf.add_many([make_entry(0, [50 + 2 * searcher + j, 2], version=version, searcher=searcher)
                  for j in range(2)])
  buf.mark_sync()
  batch, info = buf.sample(1, 6, 1.0, **SIZES)
  assert not info["with_replacement"][0]
  assert sorted(batch.tokens[:, SIZES["layout"].prompt_len].tolist()) == list(range(50, 56))
  # A window that refreshed no prompt leaves each prompt's generation as it was.
  buf.mark_sync()
  batch, info = buf.sample(1, 7, 1.0, **SIZES)
  assert info["with_replacement"][0]  # 6 < K
  assert set(batch.tokens[:, SIZES["layout"].prompt_len].tolist()) == set(range(50, 56))


def test_mark_sync_windows_hold_the_prompts_refreshed_between_syncs():
  buf = ReplayBuffer(seed=4)
  fill(buf, 1, 2)
  fill(buf, 2, 2)
  assert buf.mark_sync() == 2
  fill(buf, 3, 2)  # arrives after the sync: not latest until the next one
  for _ in range(20):
    _, info = buf.sample(1, 1, 1.0, **SIZES)
    if info["from_latest"][0]:
      assert info["prompt_ids"][0] in (1, 2)
  assert buf.stats()["num_pending"] == 1 and buf.mark_sync() == 1
  _, info = buf.sample(1, 1, 1.0, **SIZES)
  assert info["prompt_ids"][0] == 3 and info["from_latest"][0]
  # Nothing new at this sync (slow searchers): the latest prompts stay the previous ones.
  assert buf.mark_sync() == 1
  _, info = buf.sample(3, 1, 1.0, **SIZES)
  assert info["prompt_ids"][0] == 3 and info["num_from_latest"] == 1
  assert info["num_latest_fallback"] == 2  # prompt 3 is in the batch once


def test_a_caller_rng_drives_sampling_and_leaves_the_buffer_rng_alone():
  buf = ReplayBuffer(seed=11)
  for pid in range(8):
    fill(buf, pid, 6, rewards=np.linspace(0, 1, 6))
  own = buf.state_dict()["rng_state"]
  b1, i1 = buf.sample(3, 4, 0.0, np.random.default_rng(5), reward_weight=0.5, **SIZES)
  b2, i2 = buf.sample(3, 4, 0.0, np.random.default_rng(5), reward_weight=0.5, **SIZES)
  assert_same_batch(b1, b2)
  np.testing.assert_array_equal(buf.state_dict()["rng_state"], own)
  b3, _ = buf.sample(3, 4, 0.0, np.random.default_rng(6), reward_weight=0.5, **SIZES)
  assert not np.array_equal(b1.tokens, b3.tokens)


# -----------------------------------------------------------------------------
# Entry draws
# -----------------------------------------------------------------------------
@pytest.mark.parametrize("m", [0.0, 1.0])
def test_with_replacement_only_below_k_unique_entries(m):
  k = 5
  buf = ReplayBuffer(seed=5)
  sizes = {0: k - 2, 1: k, 2: k + 3}
  for pid, n in sizes.items():
    fill(buf, pid, n)
  for _ in range(30):
    if m:  # re-adding the entries (de-dup replaces) makes them the latest merge again
      buf.add_many(buf.entries())
      buf.mark_sync()
    _, info = buf.sample(3, k, m, **SIZES)
    assert info["from_latest"].tolist() == [bool(m)] * 3
    for slot, pid in enumerate(info["prompt_ids"]):
      seqs = info["entry_seqs"][slot * k:(slot + 1) * k].tolist()
      assert info["with_replacement"][slot] == (sizes[pid] < k)
      # Without replacement when possible; below K every unique entry, repeats for the rest.
      assert len(set(seqs)) == min(sizes[pid], k)


def test_entry_draws_follow_the_reward_softmax_uniform_mixture():
  rewards = np.array([0.0, 1.0, 2.0, 3.0, -1.0])
  tau, w = 0.5, 0.7
  p = rb.entry_probs(rewards, tau, w)
  np.testing.assert_allclose(p, w * np.exp(rewards / tau) / np.exp(rewards / tau).sum()
                             + (1 - w) / 5)
  buf = ReplayBuffer(seed=6)
  for pid in range(40):
    fill(buf, pid, 5, rewards=rewards)
  first = np.zeros(5)
  pair = np.zeros(5)
  n = 0
  for _ in range(150):
    batch, _ = buf.sample(40, 2, 0.0, reward_tau=tau, reward_weight=w, **SIZES)
    idx = batch.tokens[:, SIZES["layout"].prompt_len].reshape(40, 2) - 10  # entry index per row
    np.add.at(first, idx[:, 0], 1)
    np.add.at(pair, idx.ravel(), 1)
    n += 40
  # First pick ~ p; membership of a without-replacement pair of 2 ~ p_i + sum_j p_j p_i/(1-p_j).
  incl = np.array([p[i] + sum(p[j] * p[i] / (1 - p[j]) for j in range(5) if j != i)
                   for i in range(5)])
  for i in range(5):
    assert binomial_ok(first[i], n, p[i]), (i, first / n, p)
    assert binomial_ok(pair[i], n, incl[i]), (i, pair / n, incl)
  assert not binomial_ok(first[3], n, 0.2)  # far from uniform: the test can fail


def test_default_entry_draws_are_uniform():
  buf = ReplayBuffer(seed=7)
  for pid in range(40):
    fill(buf, pid, 4, rewards=[0.0, 0.0, 5.0, 9.0])
  counts, n = np.zeros(4), 0
  for _ in range(100):
    batch, _ = buf.sample(40, 1, 0.0, **SIZES)
    np.add.at(counts, batch.tokens[:, SIZES["layout"].prompt_len] - 10, 1)
    n += 40
  assert all(binomial_ok(c, n, 0.25) for c in counts), counts / n


# -----------------------------------------------------------------------------
# De-duplication, caps, eviction
# -----------------------------------------------------------------------------
def test_duplicate_completion_is_replaced_by_the_newer_entry():
  buf = ReplayBuffer()
  buf.add(make_entry(1, [5, 6, 2], reward=0.0, version=1))
  buf.add(make_entry(1, [7, 2], reward=0.5, version=1))
  buf.add(make_entry(1, [5, 6, 2], reward=1.0, version=3))
  buf.add(make_entry(2, [5, 6, 2], reward=0.0, version=3))  # other prompt: not a duplicate
  assert len(buf) == 3 and buf.stats()["num_replaced"] == 1
  es = buf.entries(1)
  assert [e.completion.tolist() for e in es] == [[7, 2], [5, 6, 2]]  # the replacement is newest
  assert es[-1].reward == 1.0 and es[-1].version == 3


def test_without_dedup_identical_completions_stay_apart_and_only_fresh_ones_are_trained():
  k = 4
  buf = ReplayBuffer(max_per_prompt=k, dedup=False, seed=4)
  old = [make_entry(0, [5, 2], version=0) for _ in range(3)] + [make_entry(0, [6, 2], version=0)]
  buf.add_many(old)
  buf.mark_sync()
  # The next round samples the same completion as before (and twice): all four are kept,
  # the older round is gone, and the batch is exactly the fresh round.
  fresh = [make_entry(0, [5, 2], 1.0, version=1), make_entry(0, [5, 2], 1.0, version=1),
           make_entry(0, [7, 2], 0.0, version=1), make_entry(0, [6, 2], 0.0, version=1)]
  buf.add_many(fresh)
  buf.mark_sync()
  assert len(buf) == k and buf.stats()["num_replaced"] == 0
  batch, info = buf.sample(1, k, 1.0, **SIZES)
  assert info["versions"].tolist() == [1] * k and not info["with_replacement"][0]
  assert sorted(batch.tokens[:, SIZES["layout"].prompt_len].tolist()) == [5, 5, 6, 7]
  restored = ReplayBuffer(max_per_prompt=k, dedup=False)
  restored.load_state_dict(buf.state_dict())
  assert_same_entries(restored.entries(), buf.entries())
  # The default de-duplicates the same round down to three entries.
  dedup = ReplayBuffer(max_per_prompt=k)
  dedup.add_many(fresh)
  assert len(dedup) == 3


def test_per_prompt_cap_keeps_the_newest():
  buf = ReplayBuffer(max_per_prompt=3)
  fill(buf, 0, 5)
  fill(buf, 1, 2)
  assert [e.completion[0] for e in buf.entries(0)] == [12, 13, 14]
  assert len(buf.entries(1)) == 2 and buf.stats()["num_evicted"] == 2


def test_global_cap_evicts_the_oldest_and_forgets_empty_prompts():
  buf = ReplayBuffer(max_entries=4, eviction="oldest")
  buf.add(make_entry(0, [10, 2]))
  buf.add(make_entry(1, [11, 2]))
  for j in range(4):
    buf.add(make_entry(2, [20 + j, 2]))
  assert len(buf) == 4 and buf.stats()["num_prompts"] == 1
  assert [e.completion[0] for e in buf.entries()] == [20, 21, 22, 23]
  buf.add(make_entry(0, [10, 2], prompt=[0, 0]))  # prompt 0 was forgotten with its entries
  assert buf.entries(2)[0].completion[0] == 21


def test_global_cap_evicts_the_lowest_reward_oldest_first_on_ties():
  buf = ReplayBuffer(max_entries=4, eviction="lowest_reward")
  for j, r in enumerate([5.0, 1.0, 3.0, 1.0]):
    buf.add(make_entry(j % 2, [10 + j, 2], reward=r))
  buf.add(make_entry(0, [14, 2], reward=4.0))  # evicts the older of the two 1.0s (entry 11)
  assert sorted(e.completion[0] for e in buf.entries()) == [10, 12, 13, 14]
  buf.add(make_entry(1, [15, 2], reward=2.0))  # evicts the other 1.0 (entry 13)
  assert sorted(e.reward for e in buf.entries()) == [2.0, 3.0, 4.0, 5.0]
  buf.add(make_entry(1, [16, 2], reward=0.0))  # the newcomer itself is the lowest
  assert sorted(e.reward for e in buf.entries()) == [2.0, 3.0, 4.0, 5.0]
  buf.add(make_entry(0, [12, 2], reward=9.0))  # a replaced entry's old reward is not evicted
  assert sorted(e.reward for e in buf.entries()) == [2.0, 4.0, 5.0, 9.0]


# -----------------------------------------------------------------------------
# Threads
# -----------------------------------------------------------------------------
def test_concurrent_add_sample_sync_and_save_keep_invariants():
  buf = ReplayBuffer(max_per_prompt=5, max_entries=150, eviction="lowest_reward", seed=8)
  fill(buf, 0, 3)
  errors, stop = [], threading.Event()
  old_interval = sys.getswitchinterval()
  sys.setswitchinterval(1e-5)  # interleave threads finely so a missing lock shows up

  def guarded(fn):
    def run():
      try:
        fn()
      except BaseException as e:  # noqa: BLE001  (reported to the main thread)
        errors.append(e)
    return run

  def adder(t):
    rng = np.random.default_rng(t)
    for _ in range(1000):
      pid = int(rng.integers(40))
      buf.add_many([make_entry(pid, [int(rng.integers(10, 16)), 2], float(rng.random()), t)
                    for _ in range(2)])

  def sampler():
    while not stop.is_set():
      batch, info = buf.sample(4, 3, 0.5, **SIZES)
      assert batch.tokens.shape == (12, 14)
      np.testing.assert_array_equal(batch.prompt_ids, np.repeat(info["prompt_ids"], 3))
      assert np.all(batch.attention_mask[:, SIZES["layout"].prompt_len] == 1)

  def syncer():
    while not stop.is_set():
      buf.mark_sync()
      buf.stats()
      ReplayBuffer(max_per_prompt=5, max_entries=150).load_state_dict(buf.state_dict())
      buf.drain_new()

  adders = [threading.Thread(target=guarded(lambda t=t: adder(t))) for t in range(4)]
  others = [threading.Thread(target=guarded(f)) for f in (sampler, sampler, syncer)]
  try:
    for th in adders + others:
      th.start()
    for th in adders:
      th.join(timeout=60)
  finally:
    stop.set()
    for th in others:
      th.join(timeout=60)
    sys.setswitchinterval(old_interval)
  assert not errors, errors
  st = buf.stats()
  assert st["num_added"] == 3 + 4 * 1000 * 2
  assert st["num_entries"] == len(buf.entries()) <= 150
  assert st["num_entries"] == st["num_added"] - st["num_replaced"] - st["num_evicted"]
  by_prompt = [buf.entries(p) for p in range(40)]
  assert all(len(es) <= 5 for es in by_prompt)
  assert sum(len(es) for es in by_prompt) == st["num_entries"]
  assert np.isclose(st["mean_reward"], np.mean([e.reward for e in buf.entries()]))


# -----------------------------------------------------------------------------
# Save / restore, merging
# -----------------------------------------------------------------------------
def test_state_dict_restores_exactly_and_reproduces_future_samples():
  a = ReplayBuffer(max_per_prompt=4, max_entries=30, eviction="lowest_reward", seed=9)
  rng = np.random.default_rng(0)
  for pid in range(12):
    fill(a, pid, int(rng.integers(1, 7)), rewards=rng.random(7).tolist())
  a.mark_sync()
  for pid in (3, 5, 8, 13):
    fill(a, pid, 3, version=2, start=30, rewards=rng.random(3).tolist())
  a.drain_new()
  a.mark_sync()
  a.sample(2, 3, 0.9, reward_weight=0.5, **SIZES)  # advances the latest pool and the RNG
  fill(a, 14, 2, version=3, rewards=[2.0, 3.0])  # pending for the next sync, undrained
  assert a.stats()["num_pending"] == 1 and a.stats()["num_latest_left"] >= 1
  state = copy.deepcopy(a.state_dict())
  assert all(isinstance(v, np.ndarray) and v.size for v in state.values())  # orbax-safe
  b = ReplayBuffer(max_per_prompt=4, max_entries=30, eviction="lowest_reward", seed=123)
  b.load_state_dict(dict(sorted(state.items())))  # key order must not matter
  assert_same_state(a.state_dict(), b.state_dict())
  assert a.stats() == pytest.approx(b.stats())
  for buf in (a, b):  # identical futures: samples, evictions, drains, syncs
    buf.outputs = [buf.sample(3, 3, 0.9, reward_weight=0.5, **SIZES)]
    fill(buf, 15, 4, version=4, rewards=[0.1, 0.9, 0.0, 0.3])
    buf.outputs.append(buf.drain_new())
    buf.mark_sync()
    buf.outputs += [buf.sample(4, 5, 0.5, reward_weight=0.5, **SIZES) for _ in range(3)]
  for (ba, ia), (bb, ib) in [(a.outputs[0], b.outputs[0])] + list(zip(a.outputs[2:],
                                                                        b.outputs[2:])):
    assert_same_batch(ba, bb)
    np.testing.assert_array_equal(ia["entry_seqs"], ib["entry_seqs"])
  assert_same_entries(a.outputs[1], b.outputs[1])
  assert_same_state(a.state_dict(), b.state_dict())


def test_pack_unpack_round_trips_with_padding_rows():
  entries = [make_entry(4, [3, 2], 0.25, 7, True, prompt=[1, 2, 3], searcher=2, temperature=1.5),
             make_entry(9, [5, 6, 7, 8], -1.5, 8, False, prompt=[4], searcher=1),
             make_entry(4, [2], 1.0, 9, True, prompt=[1, 2, 3], last_version=12)]
  assert [e.last_version for e in entries] == [7, 8, 12]  # None: sampled under `version` alone
  arrays = entries_lib.pack(entries, max_prompt_len=3, max_completion_len=4, num_rows=5)
  assert int(arrays["count"]) == 3
  assert all(v.shape[:1] == (5,) for k, v in arrays.items() if k != "count")
  assert all(v.dtype.itemsize == 4 for v in arrays.values())  # survives an x32 all-gather
  assert not arrays["completion"][3:].any() and not arrays["ref_logprobs"][3:].any()
  assert_same_entries(entries_lib.unpack(arrays), entries)
  with pytest.raises(ValueError, match="num_rows=2"):
    entries_lib.pack(entries, max_prompt_len=3, max_completion_len=4, num_rows=2)
  # Checkpoints' unmerged entries saved before last_version existed.
  old = {k: v for k, v in arrays.items() if k != "last_version"}
  assert [e.last_version for e in entries_lib.unpack(old)] == [7, 8, 9]
  with pytest.raises(ValueError, match="last_version 2 < version 9"):
    entries_lib.normalized(make_entry(4, [2], version=9, last_version=2))


def test_merging_the_same_entries_in_the_same_order_gives_identical_buffers():
  searchers = [ReplayBuffer(seed=s) for s in range(2)]
  globals_ = [ReplayBuffer(max_per_prompt=3, max_entries=12, seed=0) for _ in range(2)]
  for rnd in range(3):
    for s, local in enumerate(searchers):
      for pid in range(s * 5, s * 5 + 5):
        fill(local, pid, 2, version=rnd, start=10 + rnd, rewards=[0.5 * s, rnd])
    drained = [local.drain_new() for local in searchers]
    assert [len(d) for d in drained] == [10, 10]  # only what arrived since the last drain
    width = max(len(d) for d in drained)  # size-first: every host packs to the same rows
    gathered = [entries_lib.pack(d, max_prompt_len=4, max_completion_len=4, num_rows=width)
                for d in drained]
    for g in globals_:
      for arrays in gathered:
        g.add_many(entries_lib.unpack(arrays))
      g.mark_sync()
  assert_same_state(globals_[0].state_dict(), globals_[1].state_dict())
  ba, ia = globals_[0].sample(3, 2, 0.5, **SIZES)
  bb, ib = globals_[1].sample(3, 2, 0.5, **SIZES)
  assert_same_batch(ba, bb)
  # The cap keeps the last 12 merged: prompt 4's two and prompts 5..9; prompts 0..3 lost all
  # their entries, so they are forgotten and are not latest.
  assert len(globals_[0]) == 12 and globals_[0].stats()["num_latest"] == 6


# -----------------------------------------------------------------------------
# Red-teaming's buffer: priorities, a frozen size, near duplicates
# -----------------------------------------------------------------------------
def test_log_target_priority_draws_by_softmax_of_ref_logprob_plus_reward_over_beta():
  beta = 0.5
  rewards, refs = np.array([-1.0, -0.2, -3.0]), np.array([-4.0, -9.0, -1.0])
  buf = ReplayBuffer(max_per_prompt=10, priority="log_target", priority_beta=beta, seed=3)
  buf.add_many([make_entry(0, [10 + j, 2], rewards[j], ref=refs[j]) for j in range(3)])
  counts, n = np.zeros(3), 3000
  for _ in range(n):
    batch, _ = buf.sample(1, 1, 0.0, reward_weight=1.0, **SIZES)
    counts[batch.tokens[0, SIZES["layout"].prompt_len] - 10] += 1
  scores = refs + rewards / beta  # -6, -9.4, -7
  p = np.exp(scores - scores.max()) / np.exp(scores - scores.max()).sum()
  assert all(binomial_ok(c, n, q) for c, q in zip(counts, p)), (counts / n, p)
  # On the reward alone the last entry would be the rarest, not the second.
  by_reward = ReplayBuffer(max_per_prompt=10, seed=3)
  by_reward.add_many(buf.entries())
  assert by_reward._score(buf.entries()[2]) < by_reward._score(buf.entries()[1])


def test_freeze_size_caps_the_buffer_evicting_the_oldest_and_survives_a_restore():
  buf = ReplayBuffer(max_per_prompt=100, max_entries=10, eviction="oldest")
  fill(buf, 0, 6)
  assert buf.freeze_size() == 6
  fill(buf, 0, 3, start=30)
  assert len(buf) == 6 and [e.completion[0] for e in buf.entries()] == [13, 14, 15, 30, 31, 32]
  restored = ReplayBuffer(max_per_prompt=100, max_entries=10, eviction="oldest")
  restored.load_state_dict(buf.state_dict())
  fill(restored, 0, 2, start=40)
  assert len(restored) == 6 and restored.entries()[0].completion[0] == 15
  # A full buffer keeps its cap; an uncapped one gets its size.
  full = ReplayBuffer(max_entries=4)
  fill(full, 0, 9)
  assert full.freeze_size() == 4
  lowest = ReplayBuffer(eviction="lowest_reward")
  fill(lowest, 0, 3, rewards=[2.0, 0.0, 1.0])
  lowest.freeze_size()
  lowest.add(make_entry(0, [40, 2], reward=5.0))
  assert sorted(e.reward for e in lowest.entries()) == [1.0, 2.0, 5.0]


def test_states_saved_before_temperature_last_version_windows_and_the_cap_existed_still_load():
  buf = ReplayBuffer(max_entries=8)
  buf.add_many([make_entry(0, [10, 2], 1.0, version=3, temperature=0.6, last_version=5),
                make_entry(1, [11, 2], 2.0)])
  buf.mark_sync()
  buf.add(make_entry(0, [12, 2], 1.0))
  buf.mark_sync()
  state = buf.state_dict()
  names = [n for n in buffer_state.STATE_ARRAYS]
  old_fields = ("temperature", "last_version", "windows")
  keep = [i for i, n in enumerate(names) if n not in old_fields]
  old = {k: v for k, v in state.items() if k not in old_fields + ("max_entries",)}
  old["sizes"] = state["sizes"][keep]
  restored = ReplayBuffer(max_entries=8)
  restored.load_state_dict(old)
  assert [e.reward for e in restored.entries()] == [1.0, 2.0, 1.0]
  assert [e.temperature for e in restored.entries()] == [1.0, 1.0, 1.0]  # the default
  assert [e.last_version for e in restored.entries()] == [3, 0, 0]  # = version
  assert restored.max_entries == 8
  # Without its windows the old state is one window: the m branch draws prompt 0's two
  # entries (the current state: only its newest window's one).
  for b, want in ((buf, [12]), (restored, [10, 12])):
    batch, _ = b.sample(1, len(want), 1.0, rng=np.random.default_rng(0), **SIZES)
    assert sorted(batch.tokens[:, SIZES["layout"].prompt_len].tolist()) == want


def test_near_duplicates_keep_the_higher_priority_one():
  buf = ReplayBuffer(max_per_prompt=100, near_duplicate=0.25)
  buf.add(make_entry(0, [10, 11, 12, 13, 2], reward=-1.0))
  # One substitution in 4 + 4 tokens (EOS left out): 1 < 0.25 x 8, a near duplicate.
  buf.add(make_entry(0, [10, 11, 99, 13, 2], reward=-2.0))  # lower: dropped
  assert [e.reward for e in buf.entries()] == [-1.0] and buf.stats()["num_near_duplicates"] == 1
  buf.add(make_entry(0, [10, 11, 99, 13, 2], reward=-0.5))  # higher: replaces it
  assert [e.completion.tolist() for e in buf.entries()] == [[10, 11, 99, 13, 2]]
  buf.add(make_entry(0, [10, 98, 97, 13, 2], reward=-3.0))  # two edits: 2 >= 2, kept
  buf.add(make_entry(1, [10, 11, 99, 13, 2], reward=-9.0))  # another prompt: kept
  assert len(buf) == 3
