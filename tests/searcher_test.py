"""A searcher: prompt shards, the reward stage on whole batches, reference log-probs."""
import dataclasses

import jax
import numpy as np
import pytest

from tba_jax import sharding, weight_sync
from tba_jax.model import init_params
from tba_jax.sampler import Sampler, SamplingOptions
from tba_jax.rows import StaticRows
from tba_jax.searcher import PromptShard, PromptStream, Scoring, Searcher
from tba_jax.tasks import Problem

PROMPTS = {0: [5, 6, 7], 1: [8, 9], 2: [10]}


def _searcher(cfg, reward, policy_seed=1, reference_seed=0, num_prompts=2, num_samples=2):
  mesh = sharding.make_mesh("searcher", jax.local_devices()[:1])
  place = lambda p: weight_sync.publish(p, sharding.param_shardings(cfg, "searcher", mesh))
  reference, policy = place(init_params(cfg, reference_seed)), place(init_params(cfg, policy_seed))
  options = SamplingOptions(max_new_tokens=6, temperature=0.8, eos_ids=(3,))
  problems = {i: Problem(i, {"question": f"q{i}"}, float(i)) for i in PROMPTS}
  searcher = Searcher(
      0, rows=StaticRows(Sampler(cfg, options, mesh=mesh)), mailbox=weight_sync.Mailbox(3, policy),
      prompts=PromptShard(list(PROMPTS), PROMPTS, problems, max_len=4),
      scoring=Scoring(reward, lambda ids: " ".join(map(str, ids)), reference),
      num_prompts=num_prompts, num_samples=num_samples, seed=0)
  return searcher, policy


def test_prompt_stream_visits_every_prompt_once_per_epoch_and_resumes_exactly():
  stream = PromptStream(range(10), seed=3)
  first = stream.take(4) + stream.take(6)
  assert sorted(first) == list(range(10))
  saved = stream.state_dict()
  ahead = stream.take(7)
  stream.load_state_dict(saved)
  assert stream.take(7) == ahead and sorted(ahead + stream.take(3)) == list(range(10))


def test_the_reward_stage_scores_each_batch_once_with_all_its_rows(tiny_cfg):
  calls = []

  def stage(batch):
    calls.append(batch)
    return np.arange(len(batch), dtype=np.float32) / 10

  searcher, _ = _searcher(tiny_cfg, stage, num_prompts=2, num_samples=3)
  assert searcher.search_once() == 6
  (batch,) = calls
  entries = searcher.buffer.drain_new()
  # Prompt-major rows: S samples of each prompt, problems and prompts matching the ids.
  ids = [e.prompt_id for e in entries]
  assert ids[0] == ids[1] == ids[2] and ids[3] == ids[4] == ids[5] and ids[0] != ids[3]
  assert [p.id for p in batch.problems] == ids
  assert [list(p) for p in batch.prompts] == [PROMPTS[i] for i in ids]
  for r, e in enumerate(entries):
    np.testing.assert_array_equal(batch.completions[r], e.completion)
    assert batch.texts[r] == " ".join(map(str, e.completion))
    assert bool(batch.ended_with_eos[r]) == e.ended_with_eos == (e.completion[-1] == 3)
    assert e.reward == pytest.approx(r / 10) and e.version == 3


@pytest.mark.slow  # ~11 s on 2 cores (2026-12-04): out of the default suite
def test_a_reward_stage_returning_the_wrong_shape_is_named(tiny_cfg):
  searcher, _ = _searcher(tiny_cfg, lambda batch: np.zeros(len(batch) + 1))
  with pytest.raises(ValueError, match="one reward per completion"):
    searcher.search_once()


def test_reference_reset_scores_later_samples_against_the_new_reference(tiny_cfg):
  # loss.ref_reset_every calls Searcher.set_reference with the trainer's current params.
  searcher, policy = _searcher(tiny_cfg, lambda batch: np.zeros(len(batch)))

  def gap():
    searcher.search_once()
    entries = searcher.buffer.drain_new()
    assert len(entries) == 4 and all(e.version == 3 for e in entries)
    return max(np.abs(e.ref_logprobs - e.behaviour_logprobs).max() for e in entries)

  assert gap() > 1e-2  # scored against the initial reference, not the sampling policy
  searcher.set_reference(policy)
  assert gap() < 1e-5  # the reference is now the policy that sampled


def test_requeued_prompts_come_first_and_survive_a_state_round_trip():
  stream = PromptStream(range(10), seed=3)
  taken = stream.take(4)
  ahead = PromptStream(range(10), seed=3)
  ahead.take(4)
  stream.requeue(taken[2:])
  saved = stream.state_dict()
  assert saved["requeued"] == taken[2:]
  again = PromptStream(range(10), seed=3)
  again.load_state_dict(saved)
  assert again.take(3) == taken[2:] + ahead.take(1)
  again.load_state_dict({"epoch": 0, "position": 4})  # a checkpoint of an older version
  assert again.requeued == []


def test_a_snapshot_during_a_batch_waits_for_no_sampling_and_requeues_its_prompts(tiny_cfg):
  import threading
  entered, release = threading.Event(), threading.Event()

  def slow(batch):
    entered.set()
    assert release.wait(60)
    return np.zeros(len(batch), np.float32)

  searcher, _ = _searcher(tiny_cfg, slow)
  worker = threading.Thread(target=searcher.search_once)
  worker.start()
  assert entered.wait(120)  # the batch is being scored
  entries, state = searcher.snapshot()  # returns while the batch is still under way
  in_flight = searcher.in_flight()
  release.set()
  worker.join()
  assert entries == [] and len(in_flight) == 2 and state["num_batches"] == 0
  assert state["stream"]["requeued"] == in_flight
  entries, state = searcher.snapshot()  # now committed: its entries, nothing in flight
  assert sorted({e.prompt_id for e in entries}) == sorted(in_flight)
  assert state["stream"]["requeued"] == [] and state["num_batches"] == 1


def test_a_restarted_batch_is_the_batch_that_failed(tiny_cfg):
  calls = {"n": 0}

  def fails_once(batch):
    calls["n"] += 1
    if calls["n"] == 1:
      raise RuntimeError("reward crashed")
    return np.ones(len(batch), np.float32)

  flaky, _ = _searcher(tiny_cfg, fails_once)
  with pytest.raises(RuntimeError, match="reward crashed"):
    flaky.search_once()
  failed = flaky.in_flight()
  flaky.restart()
  assert flaky.in_flight() == [] and flaky.stream.requeued == failed
  flaky.search_once()
  healthy, _ = _searcher(tiny_cfg, lambda batch: np.ones(len(batch), np.float32))
  healthy.search_once()
  got, want = flaky.buffer.drain_new(), healthy.buffer.drain_new()
  assert [e.prompt_id for e in got] == [e.prompt_id for e in want]
  assert sorted({e.prompt_id for e in got}) == sorted(failed)
  for a, b in zip(got, want):  # same prompts, same key, same weights: the same samples
    np.testing.assert_array_equal(a.completion, b.completion)


def test_load_snapshot_returns_the_entries_to_the_next_drain(tiny_cfg):
  searcher, _ = _searcher(tiny_cfg, lambda batch: np.zeros(len(batch), np.float32))
  searcher.search_once()
  entries, state = searcher.snapshot()
  other, _ = _searcher(tiny_cfg, lambda batch: np.zeros(len(batch), np.float32))
  other.load_snapshot(entries, state)
  assert [e.prompt_id for e in other.buffer.drain_new()] == [e.prompt_id for e in entries]
  assert other.stats.num_samples == 4 and other.rows.num_batches == 1
  assert other.stream.take(2) == searcher.stream.take(2)


def test_sampler_mismatch_recomputes_the_samples_log_probs_as_the_trainer_would(tiny_cfg):
  # Same weights, the trainer's teacher-forced function: the sampler's numbers agree to
  # float32 rounding. (A cache or position bug would show here, as nats per sequence.)
  searcher, _ = _searcher(tiny_cfg, lambda batch: np.zeros(len(batch)), num_samples=3)
  searcher.mismatch_every = 1
  assert np.isnan(searcher.stats.mismatch)
  searcher.search_once()
  assert 0 <= searcher.stats.mismatch < 1e-4
  entries = searcher.buffer.drain_new()
  assert max(np.abs(e.behaviour_logprobs).sum() for e in entries) > 1.0  # real log-probs


def test_scoring_in_a_length_bucket_gives_the_full_layouts_log_probs(tiny_cfg):
  """sampler.length_buckets cuts the scoring pass's completion columns (24 -> 8 here):
  the reference log-probs of every completion are those of the full layout."""
  searcher, _ = _searcher(tiny_cfg, lambda batch: np.zeros(len(batch)))
  sampler = searcher.rows.sampler
  sampler.options = dataclasses.replace(sampler.options, max_new_tokens=24)
  rng = np.random.default_rng(0)
  completions = [rng.integers(4, tiny_cfg.vocab_size, n).astype(np.int32) for n in (2, 5, 7)]
  prompts = [PROMPTS[i] for i in (0, 1, 2)]
  full = searcher._teacher_forced(tiny_cfg, searcher.ref_params, prompts, completions)
  sampler.length_buckets = 3
  cut = searcher._teacher_forced(tiny_cfg, searcher.ref_params, prompts, completions)
  assert full.shape == (3, 24) and cut.shape == (3, 8)
  np.testing.assert_allclose(cut, full[:, :8], rtol=1e-5, atol=1e-5)
  assert not full[:, 8:].any() and np.abs(cut).sum() > 1.0
