"""The searcher pool with fake searchers: weights, rounds, merges, restarts, threads, snapshots."""
import threading
import time

import numpy as np
import pytest

from tba_jax.batch import Layout
from tba_jax.entries import Entry
from tba_jax.replay_buffer import ReplayBuffer
from tba_jax.schedule import Schedule
from tba_jax.searcher import PromptStream, SearchStats
from tba_jax.searcher_pool import SearcherError, SearcherPool
from tba_jax.weight_sync import Mailbox


class FakeSearcher:
  """What the pool uses of a Searcher: a batch of `num_prompts` prompts from its stream, one
  entry per prompt stamped with the mailbox version; `fail(prompts, batch)` decides whether
  a batch raises (after its prompts were taken, as a sampler or reward stage would)."""

  num_samples = 1

  def __init__(self, searcher_id, fail=lambda prompts, batch: False, num_prompts=2):
    self.id, self.num_prompts, self.fail = searcher_id, num_prompts, fail
    self.stream = PromptStream(range(10 * searcher_id, 10 * searcher_id + 10), seed=searcher_id)
    self.mailbox, self.buffer = Mailbox(0, None), ReplayBuffer(max_per_prompt=10**9, dedup=False)
    self.stats, self.reference, self.calls, self.batches = SearchStats(), None, 0, []
    self._in_flight = []

  def search_once(self):
    self.calls += 1
    version, _ = self.mailbox.get()
    self._in_flight = self.stream.take(self.num_prompts)
    if self.fail(self._in_flight, self.calls):
      raise RuntimeError(f"boom in searcher {self.id} on {self._in_flight}")
    self.buffer.add_many(Entry(prompt_id=p, prompt=np.array([1]), completion=np.array([4, 5]),
                               reward=1.0, ref_logprobs=np.zeros(2),
                               behaviour_logprobs=np.zeros(2), version=version,
                               searcher_id=self.id) for p in self._in_flight)
    self.batches.append(self._in_flight)
    self._in_flight = []
    self.stats.num_samples += self.num_prompts
    self.stats.reward_sum += self.num_prompts
    time.sleep(0.001)

  def in_flight(self):
    return list(self._in_flight)

  def restart(self):
    self.stream.requeue(self._in_flight)
    self._in_flight = []

  def set_reference(self, params):
    self.reference = params

  def snapshot(self):
    stream = self.stream.state_dict()
    stream["requeued"] = self._in_flight + stream["requeued"]
    return self.buffer.peek_new(), {"stream": stream, "calls": self.calls}

  def load_snapshot(self, entries, state):
    self.stream.load_state_dict(state["stream"])
    self.calls = state["calls"]
    self.buffer.add_many(entries)


def _pool(*searchers, max_restarts=0, schedule=Schedule()):
  placed = []

  def publish(params, i):
    placed.append(i)
    return (params, i)  # "on searcher i's devices"

  return SearcherPool(list(searchers), publish=publish, layout=Layout(4, 4),
                      max_restarts=max_restarts, schedule=schedule), placed


def _wait(condition, timeout=30):
  deadline = time.time() + timeout
  while not condition() and time.time() < deadline:
    time.sleep(0.01)
  return condition()


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
  assert pool.merge(buffer) == 8 and pool.merge(buffer) == 0
  want = [p for s in pool.searchers for batch in s.batches for p in batch]
  assert [e.prompt_id for e in buffer.entries()] == want
  assert pool.metrics()["searcher_samples"] == 8 and pool.metrics()["searcher_reward_mean"] == 1.0


@pytest.mark.parametrize("threads", [False, True])
def test_a_failed_batch_is_retried_after_a_restart_with_its_prompts_first(threads, capsys):
  pool, _ = _pool(FakeSearcher(0, fail=lambda prompts, batch: batch == 3), max_restarts=1)
  if threads:
    pool.start()
    assert _wait(lambda: len(pool.searchers[0].batches) >= 6)
    pool.stop()
  else:
    pool.search_round(12)  # 6 batches of 2: the failed one does not count
  s = pool.searchers[0]
  assert not pool.failed() and pool.metrics()["searcher_restarts"] == 1
  # The prompts committed are the stream's own order: none skipped, none repeated.
  fresh = PromptStream(range(10), seed=0)
  assert [p for b in s.batches for p in b] == fresh.take(2 * len(s.batches))
  err = capsys.readouterr().err
  assert "searcher 0 raised on prompt id(s)" in err and "restarted (1 of " in err
  assert "RuntimeError: boom in searcher 0" in err  # the traceback


def test_restarts_are_limited_per_searcher_and_the_run_stops_with_the_reasons():
  flaky = FakeSearcher(1, fail=lambda prompts, batch: batch in (2, 4, 6))  # different prompts
  pool, _ = _pool(FakeSearcher(0), flaky, max_restarts=2)
  pool.search_round(40)
  assert pool.failed() and pool.metrics()["searcher_restarts"] == 2
  assert pool.searchers[0].calls == 10  # the healthy searcher did its part of the round
  error = pool.error(7)
  assert isinstance(error, SearcherError)
  assert "step 7" in str(error) and "searcher 1: failed after 2 restart(s)" in str(error)
  assert "searcher.max_restarts=2" in str(error) and "RuntimeError: boom" in str(error)
  assert "searcher 0" not in str(error)


def test_a_failure_that_follows_its_prompt_stops_without_looping():
  bad = PromptStream(range(10, 20), seed=1).take(6)[4]  # in the third batch
  pool, _ = _pool(FakeSearcher(1, fail=lambda prompts, batch: bad in prompts), max_restarts=5)
  pool.start()
  assert _wait(pool.failed)
  pool.stop()
  s = pool.searchers[0]
  assert s.calls == 4 and pool.metrics()["searcher_restarts"] == 1  # one retry, not five
  third = PromptStream(range(10, 20), seed=1).take(6)[4:]
  assert f"prompt id(s) {sorted(third)} failed again after a restart" in str(pool.error(3))


def test_the_retried_prompts_clear_once_they_go_through():
  # A later, unrelated failure on a prompt seen before (the next epoch) is restarted again.
  first = PromptStream(range(10), seed=0).take(2)
  seen = {"n": 0}

  def fail(prompts, batch):
    hit = first[0] in prompts
    seen["n"] += hit
    return hit and seen["n"] in (1, 3)  # the first and the third time it comes up

  pool, _ = _pool(FakeSearcher(0, fail=fail), max_restarts=3)
  pool.search_round(2 * 14)  # a little more than two epochs of 10 prompts
  assert not pool.failed() and pool.metrics()["searcher_restarts"] == 2


def test_snapshot_holds_unmerged_entries_and_requeues_prompts_in_flight():
  a, b = FakeSearcher(0), FakeSearcher(1)
  pool, _ = _pool(a, b, max_restarts=1)
  pool.search_round(8)
  buffer = ReplayBuffer()
  pool.merge(buffer)
  pool.search_round(4)  # one more batch each, not merged
  a._in_flight = a.stream.take(2)  # a batch under way when the checkpoint is taken
  in_flight = list(a._in_flight)
  entries, states = pool.snapshot()
  assert [e.prompt_id for e in entries] == a.batches[-1] + b.batches[-1]
  assert states[0][0]["searcher"]["stream"]["requeued"] == in_flight
  assert states[0][0]["restarts"] == 0
  resumed, _ = _pool(FakeSearcher(0), FakeSearcher(1), max_restarts=1)
  resumed.load_snapshot(entries, states)
  assert resumed.merge(ReplayBuffer()) == 4  # merged at the next sync
  ra = resumed.searchers[0]
  ra.search_once()
  assert ra.batches == [in_flight]  # the batch in flight is sampled again first
  assert a.stream.take(2) == ra.stream.take(2)  # then the stream goes on where it was


def test_a_snapshot_from_another_topology_is_refused():
  pool, _ = _pool(FakeSearcher(0))
  _, states = pool.snapshot()
  other, _ = _pool(FakeSearcher(0), FakeSearcher(1))
  with pytest.raises(ValueError, match=r"searchers \[1\] per process; this run has 2"):
    other.load_snapshot([], states)


def test_threads_sample_until_stopped():
  pool, _ = _pool(FakeSearcher(0), FakeSearcher(1))
  pool.start()
  assert _wait(lambda: min(s.calls for s in pool.searchers) >= 3)
  pool.stop()
  assert not pool.failed()
  assert not any(t.name.startswith("searcher-") for t in threading.enumerate())


@pytest.mark.parametrize("num_prompts", [1, 4, 9])
def test_a_round_never_samples_fewer_prompts_than_asked(num_prompts):
  pool, _ = _pool(FakeSearcher(0), FakeSearcher(1), FakeSearcher(2))
  pool.search_round(num_prompts)
  assert sum(s.calls * s.num_prompts for s in pool.searchers) >= num_prompts


def test_a_paced_searcher_samples_a_windows_prompts_then_waits_for_the_merge():
  # k x B x m = 2 x 3 x 1 = 6 prompts a window over 2 searchers: 3 each, 2 prompts a batch.
  pool, _ = _pool(FakeSearcher(0), FakeSearcher(1), schedule=Schedule.of("async", 2, 3, 1.0,
                                                                         paced=True))
  pool.start()
  assert _wait(lambda: all(s.calls == 2 for s in pool.searchers))
  time.sleep(0.3)  # unpaced, a fake searcher runs a batch every millisecond
  assert [s.calls for s in pool.searchers] == [2, 2]
  buffer = ReplayBuffer(max_per_prompt=10**9, dedup=False)
  assert not pool.sync(2, "params", buffer) and len(buffer) == 8  # merged: each may go on
  assert _wait(lambda: all(s.calls == 4 for s in pool.searchers))
  time.sleep(0.3)
  assert [s.calls for s in pool.searchers] == [4, 4]
  assert {e.version for s in pool.searchers for e in s.buffer.peek_new()} == {2}
  pool.stop()


def test_the_schedule_decides_when_rounds_run_and_when_a_sync_merges():
  alternate, _ = _pool(FakeSearcher(0), schedule=Schedule.of("alternate", 2, 2, 1.0))
  buffer = ReplayBuffer()
  assert not alternate.prefill(buffer) and len(buffer) == 2  # one round of B = 2 prompts
  rounds = []
  for step in range(5):
    before = len(buffer)
    assert not alternate.before_step(step, buffer)
    rounds.append(len(buffer) - before)
    assert not alternate.sync(step + 1, "params", buffer)  # publishes, never merges
  assert rounds == [0, 0, 4, 0, 4]  # at steps 2 and 4: k x B x m = 4 prompts
  assert alternate.searchers[0].mailbox.version == 4
  asynchronous, _ = _pool(FakeSearcher(1))
  asynchronous.start()
  assert _wait(lambda: asynchronous.searchers[0].stats.num_samples >= 4)
  buffer = ReplayBuffer()
  assert not asynchronous.before_step(2, buffer) and len(buffer) == 0  # no rounds
  assert not asynchronous.sync(1, "params", buffer) and len(buffer) > 0  # k = 1: merged
  asynchronous.stop()
