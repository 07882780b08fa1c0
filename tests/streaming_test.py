"""The streaming searcher: the static searcher's entries, version ranges, lossless restarts."""
import jax
import numpy as np
import pytest

from tba_jax import faults, sharding, weight_sync
from tba_jax.batch import Layout
from tba_jax.model import init_params
from tba_jax.replay_buffer import ReplayBuffer
from tba_jax.sampler import Sampler, SamplingOptions
from tba_jax.rows import StaticRows
from tba_jax.searcher import PromptShard, PromptStream, Scoring, Searcher
from tba_jax.streaming import StreamingRows
from tba_jax.tasks import Problem

# 20 prompts of 1-3 tokens (ids 5..24). EOS: 20 of the 128 ids, so rows end at ragged lengths.
EOS = tuple(range(30, 50))
PROMPTS = {i: [5 + i, 5 + (3 * i) % 20, 5 + (7 * i) % 20][:1 + i % 3] for i in range(20)}


class SwitchingMailbox(weight_sync.Mailbox):
  """Publishes `later` (as version 4) when the searcher reads the mailbox for the
  `at`-th time: between two of its decode chunks, with rows in flight."""

  def __init__(self, params, later, at):
    super().__init__(3, params)
    self.later, self.at, self.reads = later, at, 0

  def get(self):
    self.reads += 1
    if self.reads == self.at:
      self.put(4, self.later)
    return super().get()


def _searcher(cfg, *, num_slots=None, reward=None, mailbox=None, num_prompts=2, num_samples=2,
              chunk_steps=32, in_flight_updates=True, ids=tuple(PROMPTS), kv_pages=0):
  mesh = sharding.make_mesh("searcher", jax.local_devices()[:1])
  place = lambda p: weight_sync.publish(p, sharding.param_shardings(cfg, "searcher", mesh))
  reference, policy = place(init_params(cfg, 0)), place(init_params(cfg, 1))
  sampler = Sampler(cfg, SamplingOptions(max_new_tokens=6, temperature=0.8, eos_ids=EOS), mesh=mesh)
  rows = (StreamingRows(sampler, num_slots=num_slots, chunk_steps=chunk_steps,
                        in_flight_updates=in_flight_updates, kv_pages=kv_pages) if num_slots else
          StaticRows(sampler))
  problems = {i: Problem(i, {"question": f"q{i}"}, float(i)) for i in PROMPTS}
  reward = reward or (lambda batch: np.array([len(c) / 10 for c in batch.completions]))
  return Searcher(
      0, rows=rows, mailbox=mailbox or weight_sync.Mailbox(3, policy),
      prompts=PromptShard(list(ids), PROMPTS, problems, max_len=4),
      scoring=Scoring(reward, lambda t: " ".join(map(str, t)), reference),
      num_prompts=num_prompts, num_samples=num_samples, seed=0)


def _groups(entries, s):
  """Entries by prompt id, each prompt's S samples in row order (one group each)."""
  out = {}
  for e in entries:
    out.setdefault(e.prompt_id, []).append(e)
  assert all(len(g) == s for g in out.values()), "a prompt committed twice or in part"
  return out


# kv_pages 5: 3 scratch pages and 2 of 16 slots (a row's whole cache): at most 2 rows of
# the 3 slots in flight, the others wait for pages (paged_kv.py).
@pytest.mark.parametrize("kv_pages", [0, pytest.param(5, marks=pytest.mark.slow)],  # paged: ~8 s,
                         ids=["full_rows", "paged"])  # paged_kv_test compares it with static
def test_entries_equal_the_static_searchers_when_weights_do_not_change(tiny_cfg, kv_pages):
  # The stream is one endless batch 0: group g samples rows g*S.. with the batch-0 key, so
  # the first P groups are the static searcher's first batch, row for row (module doc).
  static = _searcher(tiny_cfg, num_prompts=4, num_samples=3)
  static.search_once()
  want = _groups(static.buffer.drain_new(), 3)
  # 3 slots for 4 x 3 rows: slots are refilled mid-batch, with rows of other prompts.
  streaming = _searcher(tiny_cfg, num_slots=3, num_prompts=1, num_samples=3, kv_pages=kv_pages)
  got = {}
  for _ in range(20):
    streaming.search_once()
    got.update(_groups(streaming.buffer.drain_new(), 3))
    if set(want) <= set(got):
      break
  assert streaming.rows._slots.stats.refills >= 4  # 3 slots, 12 rows
  assert (streaming.rows._slots.pages is not None) == bool(kv_pages)
  assert len({e.length for es in want.values() for e in es}) > 2  # rows ended at ragged lengths
  for pid, entries in want.items():
    for a, b in zip(entries, got[pid]):
      np.testing.assert_array_equal(a.completion, b.completion)
      np.testing.assert_array_equal(a.prompt, b.prompt)
      assert (a.reward, a.ended_with_eos, a.temperature) == (b.reward, b.ended_with_eos,
                                                              b.temperature)
      assert (b.version, b.last_version, b.searcher_id) == (3, 3, 0)
      np.testing.assert_allclose(a.ref_logprobs, b.ref_logprobs, atol=1e-5)
      np.testing.assert_allclose(a.behaviour_logprobs, b.behaviour_logprobs, atol=1e-5)


def _version_run(cfg, in_flight_updates, num_samples=2):
  policy = init_params(cfg, 1)
  mesh = sharding.make_mesh("searcher", jax.local_devices()[:1])
  later = weight_sync.publish(init_params(cfg, 2), sharding.param_shardings(cfg, "searcher", mesh))
  # Chunks of 2 steps: a 6-token row spans 3 chunks; new weights after the first.
  mailbox = SwitchingMailbox(
      weight_sync.publish(policy, sharding.param_shardings(cfg, "searcher", mesh)), later, at=2)
  searcher = _searcher(cfg, num_slots=4, mailbox=mailbox, chunk_steps=2, num_prompts=4,
                       num_samples=num_samples, in_flight_updates=in_flight_updates)
  entries = []
  for _ in range(3):
    searcher.search_once()
    entries += searcher.buffer.drain_new()
  assert searcher.rows._slots.version == 4
  return entries


@pytest.mark.slow  # ~20 s on 2 cores (2026-12-04): out of the default suite
def test_rows_in_flight_take_new_weights_and_record_both_versions(tiny_cfg):
  entries = _version_run(tiny_cfg, in_flight_updates=True)
  spans = {(e.version, e.last_version) for e in entries}
  assert (3, 4) in spans and (4, 4) in spans  # rows in flight kept going under version 4
  assert spans <= {(3, 3), (3, 4), (4, 4)}


@pytest.mark.slow  # ~18 s on 2 cores (2026-12-04): out of the default suite
def test_a_streamed_group_spanning_two_versions_is_one_generation_for_the_m_branch(tiny_cfg):
  """A prompt's S rows placed before and after a weight swap start under two versions; the
  buffer's m branch draws all S of them, without replacement (it used to keep the newest
  version's rows and fill K with repeats). 3 samples per prompt in 4 slots: the second
  prompt's first row is placed with the first prompt's, its other two after the swap."""
  entries = _version_run(tiny_cfg, in_flight_updates=True, num_samples=3)
  groups = _groups(entries, 3)
  split = [pid for pid, es in groups.items() if len({e.version for e in es}) == 2]
  assert split, "no prompt's rows started under two versions"
  buf = ReplayBuffer(dedup=False)
  buf.add_many(entries)  # one merge: one sync window
  buf.mark_sync()
  batch, info = buf.sample(len(groups), 3, 1.0, layout=Layout(4, 6, 0))
  assert info["from_latest"].all() and not info["with_replacement"].any()
  slot = list(info["prompt_ids"]).index(split[0])
  assert sorted(batch.versions[3 * slot:3 * slot + 3].tolist()) == \
      sorted(e.version for e in groups[split[0]])


@pytest.mark.slow  # ~14 s on 2 cores (2026-12-04): out of the default suite
def test_without_in_flight_updates_every_entry_has_one_version(tiny_cfg):
  entries = _version_run(tiny_cfg, in_flight_updates=False)
  assert all(e.version == e.last_version for e in entries)
  assert {e.version for e in entries} == {3, 4}  # the slots drained, then took version 4


def _taken_exactly_once(committed, requeued, position, ids, seed=0):
  """Every prompt of the first epoch is committed, re-queued or still ahead, once."""
  order = PromptStream(list(ids), seed=seed).take(len(ids))
  assert sorted(committed + requeued + order[position:]) == sorted(ids)


@pytest.mark.slow  # ~13 s on 2 cores (2026-12-04): out of the default suite
def test_a_snapshot_requeues_unfinished_groups_and_a_resume_samples_them_first(tiny_cfg):
  searcher = _searcher(tiny_cfg, num_slots=4, num_prompts=2)
  searcher.search_once()
  in_flight = searcher.in_flight()
  entries, state = searcher.snapshot()
  assert in_flight and state["stream"]["requeued"] == in_flight
  committed = list(_groups(entries, 2))
  _taken_exactly_once(committed, in_flight, state["stream"]["position"], PROMPTS)
  assert state["num_groups"] == len(committed) + len(in_flight)

  resumed = _searcher(tiny_cfg, num_slots=4, num_prompts=2)
  resumed.load_snapshot(entries, state)
  back = resumed.buffer.drain_new()
  assert [(e.prompt_id, e.completion.tolist()) for e in back] == \
      [(e.prompt_id, e.completion.tolist()) for e in entries]
  assert resumed.rows.num_groups == state["num_groups"]
  resumed.search_once()
  later = resumed.buffer.drain_new()
  after = list(_groups(later, 2))
  # The re-queued prompts were taken first: each is committed now or still in flight.
  assert set(in_flight) <= set(after) | set(resumed.in_flight())
  _, state2 = resumed.snapshot()
  _taken_exactly_once(committed + after, state2["stream"]["requeued"],
                      state2["stream"]["position"], PROMPTS)


def test_a_restart_drops_the_slots_and_requeues_their_prompts_in_order(tiny_cfg):
  fail = {"next": False}

  def fails_once(batch):
    if fail["next"]:
      fail["next"] = False
      raise RuntimeError("reward crashed")
    return np.zeros(len(batch.completions))

  searcher = _searcher(tiny_cfg, num_slots=4, num_prompts=1, reward=fails_once)
  searcher.search_once()
  fail["next"] = True
  with pytest.raises(RuntimeError, match="reward crashed"):
    searcher.search_once()
  failed = searcher.in_flight()
  searcher.restart()
  assert searcher.in_flight() == [] and searcher.stream.requeued == failed
  searcher.search_once()
  assert searcher.stream.requeued == []
  committed = list(_groups(searcher.buffer.drain_new(), 2))
  assert set(failed) <= set(committed) | set(searcher.in_flight())
  _, state = searcher.snapshot()
  _taken_exactly_once(committed, state["stream"]["requeued"], state["stream"]["position"],
                      PROMPTS)


def test_a_streaming_searcher_needs_slots(tiny_cfg):
  with pytest.raises(ValueError, match="num_slots"):
    StreamingRows(Sampler(tiny_cfg, SamplingOptions(max_new_tokens=2)), num_slots=0)


@pytest.mark.parametrize("num_devices,in_flight", [  # async; alternate (slow: ~10 s)
    (2, True), pytest.param(1, False, marks=pytest.mark.slow)])
def test_a_streaming_run_trains_to_the_end_through_a_restart_and_checkpoints(
    tmp_path, capsys, num_devices, in_flight):
  from loop_test import tiny_config, toy_task
  from tba_jax import loop
  from tba_jax.metrics import read_jsonl
  c = tiny_config(num_train_steps=8, max_train_seconds=120.0,
                  mesh=dict(num_devices=num_devices, num_trainer_devices=1),
                  sampler=dict(num_slots=8), sync=dict(mode="async", every=2,
                                                       in_flight_updates=in_flight),
                  buffer=dict(prefill=8), searcher=dict(max_restarts=2))
  plan = faults.Plan(searcher_fail_at=3)
  assert loop.run(c, str(tmp_path), task=toy_task(c), fault_plan=plan)["step"] == 8
  out = capsys.readouterr()
  assert "searchers keep 8 rows in flight (continuous batching" in out.out
  assert "restarted (1 of searcher.max_restarts=2)" in out.err
  rows = [r for r in read_jsonl(str(tmp_path / "metrics.jsonl")) if "loss" in r]
  assert [r["step"] for r in rows] == list(range(1, 9))
  assert rows[-1]["searcher_restarts"] == 1 and rows[-1]["searcher_samples"] > 0
  assert all(r["staleness_max"] >= 0 for r in rows)


def test_the_config_builds_streaming_searchers_and_names_a_slot_count_that_cannot_split(
    tiny_cfg):
  from loop_test import tiny_config, toy_task
  from tba_jax import config_builders
  from tba_jax import tokenizer as tokenizer_lib
  from tba_jax.config_checks import ConfigError
  tok = tokenizer_lib.byte_tokenizer()
  mesh = sharding.make_mesh("searcher", jax.local_devices()[:2])  # a data axis of 2
  params = init_params(tiny_cfg, 0)

  def pool(num_slots, in_flight):
    c = tiny_config(sampler=dict(num_slots=num_slots), sync=dict(in_flight_updates=in_flight))
    return config_builders.searcher_pool(c, toy_task(c), tok, tiny_cfg, [mesh],
                                         publish=lambda p, i: p, params=params)

  (searcher,) = pool(4, False).searchers
  assert isinstance(searcher.rows, StreamingRows) and not searcher.rows.in_flight_updates
  assert searcher.rows.num_slots == 4
  assert type(pool(0, True).searchers[0].rows) is StaticRows
  with pytest.raises(ConfigError, match="sampler.num_slots=3: .*multiple of the mesh's data"):
    pool(3, True)
