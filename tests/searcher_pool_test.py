"""The searcher pool with fake searchers: weights, rounds, merges, failures, threads, state."""
import threading
import time
import traceback

import numpy as np
import pytest

from tba_jax.entries import Entry
from tba_jax.replay_buffer import ReplayBuffer
from tba_jax.searcher import SearchStats
from tba_jax.searcher_pool import SearcherError, SearcherPool
from tba_jax.weight_sync import Mailbox


class FakeSearcher:
  """What the pool uses of a Searcher: one entry per search_once, stamped with its version."""

  def __init__(self, searcher_id, fail_at=None):
    self.id, self.num_prompts, self.fail_at = searcher_id, 2, fail_at
    self.mailbox, self.buffer = Mailbox(0, None), ReplayBuffer(max_per_prompt=10**9, dedup=False)
    self.stats, self.error, self.reference, self.calls = SearchStats(), None, None, 0

  def search_once(self):
    self.calls += 1
    if self.calls == self.fail_at:
      raise RuntimeError(f"boom in searcher {self.id}")
    version, _ = self.mailbox.get()
    self.buffer.add(Entry(prompt_id=10 * self.id + self.calls, prompt=np.array([1]),
                          completion=np.array([4, 5]), reward=1.0, ref_logprobs=np.zeros(2),
                          behaviour_logprobs=np.zeros(2), version=version,
                          searcher_id=self.id))
    self.stats.num_samples += 1
    self.stats.reward_sum += 1.0

  def run(self, stop):
    try:
      while not stop.is_set():
        self.search_once()
        time.sleep(0.001)
    except BaseException:
      self.error = traceback.format_exc()
      stop.set()

  def set_reference(self, params):
    self.reference = params

  def state_dict(self):
    return {"calls": self.calls}

  def load_state_dict(self, state):
    self.calls = state["calls"]


def _pool(*searchers):
  placed = []

  def publish(params, i):
    placed.append(i)
    return (params, i)  # "on searcher i's devices"

  return SearcherPool(list(searchers), publish=publish, max_prompt_len=4,
                      max_completion_len=4), placed


def test_publish_places_the_weights_on_every_searcher_with_the_version():
  pool, placed = _pool(FakeSearcher(0), FakeSearcher(1))
  pool.publish(6, "w")
  assert [s.mailbox.get() for s in pool.searchers] == [(6, ("w", 0)), (6, ("w", 1))]
  pool.set_reference("r")
  assert [s.reference for s in pool.searchers] == [("r", 0), ("r", 1)]
  assert placed == [0, 1, 0, 1]


def test_a_round_covers_the_prompts_and_merge_moves_new_entries_once_in_searcher_order():
  pool, _ = _pool(FakeSearcher(0), FakeSearcher(1))
  pool.search_round(5)  # 2 searchers x 2 prompts a batch: ceil(5 / 4) = 2 batches each
  assert [s.calls for s in pool.searchers] == [2, 2]
  buffer = ReplayBuffer()
  assert pool.merge(buffer) == 4 and pool.merge(buffer) == 0
  assert [e.prompt_id for e in buffer.entries()] == [1, 2, 11, 12]
  assert pool.metrics()["searcher_samples"] == 4 and pool.metrics()["searcher_reward_mean"] == 1.0


def test_a_failure_in_a_round_is_reported_with_its_traceback_and_step():
  pool, _ = _pool(FakeSearcher(0), FakeSearcher(1, fail_at=2))
  assert not pool.failed()
  pool.search_round(8)
  assert pool.failed() and pool.searchers[0].error is None
  error = pool.error(7)
  assert isinstance(error, SearcherError)
  assert "step 7" in str(error) and "searcher 1" in str(error)
  assert "RuntimeError: boom in searcher 1" in str(error)


def test_threads_sample_until_stopped_and_a_thread_failure_is_seen():
  pool, _ = _pool(FakeSearcher(0), FakeSearcher(1))
  pool.start()
  deadline = time.time() + 30
  while min(s.calls for s in pool.searchers) < 3 and time.time() < deadline:
    time.sleep(0.01)
  pool.stop()
  assert all(s.calls >= 3 for s in pool.searchers) and not pool.failed()
  assert not any(t.name.startswith("searcher-") for t in threading.enumerate())
  failing, _ = _pool(FakeSearcher(0, fail_at=2))
  failing.start()
  deadline = time.time() + 30
  while not failing.failed() and time.time() < deadline:
    time.sleep(0.01)
  failing.stop()
  assert failing.failed() and "boom in searcher 0" in failing.searchers[0].error


def test_state_round_trips_per_process_and_searcher():
  pool, _ = _pool(FakeSearcher(0), FakeSearcher(1))
  pool.search_round(4)
  states = pool.state_dict()
  assert states == [[{"calls": 1}, {"calls": 1}]]  # [process][searcher]
  fresh, _ = _pool(FakeSearcher(0), FakeSearcher(1))
  fresh.load_state_dict(states)
  assert [s.calls for s in fresh.searchers] == [1, 1]


@pytest.mark.parametrize("num_prompts", [1, 4, 9])
def test_a_round_never_samples_fewer_prompts_than_asked(num_prompts):
  pool, _ = _pool(FakeSearcher(0), FakeSearcher(1), FakeSearcher(2))
  pool.search_round(num_prompts)
  assert sum(s.calls * s.num_prompts for s in pool.searchers) >= num_prompts
