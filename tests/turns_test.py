"""Multi-turn sampling (turns.py): replies appended to each row's cache, the trajectory the
model saw, masks, and the searcher's entries."""
import threading
import time

import jax
import numpy as np
import pytest

from tba_jax import batch as batch_lib
from tba_jax import model as model_lib
from tba_jax import continuous, sharding, weight_sync
from tba_jax.model import init_params
from tba_jax.replies import Replies
from tba_jax.sampler import Sampler, SamplingOptions
from tba_jax.searcher import PromptShard, Scoring, Searcher
from tba_jax.tasks import Problem
from tba_jax.tasks.environment import SCORES, Environment, Reply
from tba_jax.tasks.tools import SandboxUnavailable
from tba_jax.turns import TurnRows, TurnSampler

EOS = 3
# Token ids 32..127 are ASCII characters (the tiny model's vocabulary is 128).
encode = lambda text: [ord(c) for c in text]
decode = lambda ids: "".join(chr(i) for i in ids if 32 <= i < 128)
STOPS = tuple("!#$%&*+,-./:;=?@")  # common enough that a random model calls often


def _sampler(cfg, max_new_tokens=40, **kw):
  mesh = sharding.make_mesh("searcher", jax.local_devices()[:1])
  return Sampler(cfg, SamplingOptions(max_new_tokens=max_new_tokens, temperature=1.0,
                                      eos_ids=(EOS,), **kw), mesh=mesh)


def _env(reply=lambda problem, text: "<ok>", **kw):
  return Environment(reply=reply, stop=STOPS, **{"max_turns": 4, "max_turn_tokens": 12,
                                                 "max_reply_tokens": 8, **kw})


def _teacher_forced(cfg, params, prompts, out, temperature=1.0):
  layout = batch_lib.Layout(max(map(len, prompts)), out.tokens.shape[1], 0)
  tokens, mask = batch_lib.token_rows(prompts, [out.tokens[i, :out.lengths[i]]
                                                for i in range(len(prompts))], layout)
  return np.asarray(model_lib.completion_token_logprobs(
      cfg, params, tokens, mask, layout.completion_len, temperature))


@pytest.mark.slow  # ~14 s on 2 cores (2026-12-04): out of the default suite
def test_the_model_saw_exactly_the_trajectory_tokens(tiny_cfg):
  """Sampler log-probs of every model token equal a full forward of prompt + trajectory
  (model turns and replies as recorded): the cache held those tokens at those positions,
  with no decode / re-encode drift."""
  params = init_params(tiny_cfg, 1)
  prompts = [[5, 6, 7], [8, 9], [10, 40, 41, 42]]
  turns = TurnSampler(_sampler(tiny_cfg), _env(), encode, decode)
  out = turns(params, prompts, jax.random.key(0))
  assert out.turns.max() > 1 and out.tool_calls.sum() > 0  # replies were appended
  tf = _teacher_forced(tiny_cfg, params, prompts, out)
  for i in range(len(prompts)):
    n, mask = out.lengths[i], out.model_mask[i, :out.lengths[i]] > 0
    np.testing.assert_allclose(out.tempered_logprobs[i, :n][mask], tf[i, :n][mask], atol=2e-5)
    assert np.all(out.tempered_logprobs[i, :n][~mask] == 0)
    text = decode(out.tokens[i, :n])
    assert text.count("<ok>") == out.tool_calls[i] == out.turns[i] - 1
    # Each reply's tokens are encode(reply) exactly, where the mask says they are.
    np.testing.assert_array_equal(out.tokens[i, :n][~mask], encode("<ok>") * out.tool_calls[i])


def test_each_reply_follows_a_stop_and_turns_are_bounded(tiny_cfg):
  params = init_params(tiny_cfg, 2)
  seen = []
  env = _env(lambda problem, text: seen.append(text) or "<r>", max_turns=3)
  out = TurnSampler(_sampler(tiny_cfg), env, encode, decode)(params, [[5, 6]] * 6,
                                                              jax.random.key(1))
  assert out.turns.max() <= 3 and all(text[-1] in STOPS for text in seen)
  for i in range(6):
    mask = out.model_mask[i, :out.lengths[i]]
    # Every model turn is at most max_turn_tokens long.
    runs = np.diff(np.flatnonzero(np.diff(np.concatenate([[0], mask, [0]]))))[::2]
    assert runs.max() <= 12


def test_done_and_errors_and_seconds_are_counted(tiny_cfg):
  params = init_params(tiny_cfg, 1)
  calls = []

  def reply(problem, text):
    calls.append(problem)
    return None if len(calls) > 2 else Reply("<e>", error=True)

  out = TurnSampler(_sampler(tiny_cfg), _env(reply), encode, decode)(
      params, [[5, 6, 7]] * 2, jax.random.key(0), problems=["a", "b"])
  assert set(calls) <= {"a", "b"} and out.tool_errors.sum() == out.tool_calls.sum() <= 2
  assert (out.tool_seconds >= 0).all()


def test_a_slow_tool_does_not_stall_the_other_rows(tiny_cfg):
  """Row 0's every call sleeps; the others finish their decoding meanwhile: the whole
  batch takes about one sleep per turn of row 0, not one per call of every row."""
  params = init_params(tiny_cfg, 1)
  slept = threading.Event()

  def reply(problem, text):
    if problem == 0:
      slept.set()
      time.sleep(1.0)
    return "<ok>"

  turns = TurnSampler(_sampler(tiny_cfg), _env(reply, max_turns=2, num_workers=8), encode, decode)
  prompts = [[5, 6, 7]] * 8
  turns(params, prompts, jax.random.key(0), problems=list(range(8)))  # compiles
  start = time.perf_counter()
  out = turns(params, prompts, jax.random.key(0), problems=list(range(8)))
  elapsed = time.perf_counter() - start
  calls = int(out.tool_calls.sum())
  assert slept.is_set() and calls > 2
  assert elapsed < 1.0 * out.tool_calls[0] + 1.0, (elapsed, out.tool_calls)


def test_turn_rows_make_entries_with_model_masks(tiny_cfg):
  mesh = sharding.make_mesh("searcher", jax.local_devices()[:1])
  params = weight_sync.publish(init_params(tiny_cfg, 1),
                               sharding.param_shardings(tiny_cfg, "searcher", mesh))
  prompts = {0: [5, 6, 7], 1: [8, 9]}
  problems = {i: Problem(i, {}, float(i)) for i in prompts}
  seen = []
  searcher = Searcher(
      0, rows=TurnRows(TurnSampler(_sampler(tiny_cfg), _env(), encode, decode)),
      mailbox=weight_sync.Mailbox(0, params),
      prompts=PromptShard(list(prompts), prompts, problems, max_len=4),
      scoring=Scoring(lambda batch: seen.append(batch) or np.array(
          ["<ok>" in t for t in batch.texts], np.float32), decode, params),
      num_prompts=2, num_samples=2, seed=0)
  assert searcher.search_once() == 4
  entries = searcher.buffer.drain_new()
  assert any((e.model_mask == 0).any() for e in entries)
  for e, text in zip(entries, seen[0].texts):
    # The reward stage reads the model's last turn (Environment.score's default).
    assert text == decode(e.completion[SCORES["last_turn"](e.model_mask) > 0])
    assert (e.behaviour_logprobs[e.model_mask == 0] == 0).all()
  assert searcher.stats.turns >= 4 and searcher.stats.tool_calls > 0


def test_streaming_rows_with_turns_refill_slots_and_keep_the_trajectory_exact(tiny_cfg):
  """A pool of 4 slots for 3 prompts x 2 samples: rows start as slots free up, replies land in
  their rows' caches, and every model token's sampler log-prob is the full forward's."""
  from tba_jax.streaming import StreamingRows
  mesh = sharding.make_mesh("searcher", jax.local_devices()[:1])
  params = weight_sync.publish(init_params(tiny_cfg, 1),
                               sharding.param_shardings(tiny_cfg, "searcher", mesh))
  prompts = {0: [5, 6, 7], 1: [8, 9], 2: [10]}
  searcher = Searcher(
      0, rows=StreamingRows(_sampler(tiny_cfg), num_slots=4, turns=(_env(), encode, decode)),
      mailbox=weight_sync.Mailbox(0, params),
      prompts=PromptShard(list(prompts), prompts, {i: Problem(i, {}, 0.0) for i in prompts}, 4),
      scoring=Scoring(lambda batch: np.zeros(len(batch), np.float32), decode, params),
      num_prompts=3, num_samples=2, seed=0)
  assert searcher.search_once() >= 6
  entries = searcher.buffer.drain_new()
  assert any((e.model_mask == 0).any() for e in entries) and searcher.stats.tool_calls > 0
  out = type("Out", (), {})()
  m = 40
  out.tokens = np.array([np.pad(e.completion, (0, m - e.length)) for e in entries])
  out.lengths = np.array([e.length for e in entries])
  tf = _teacher_forced(tiny_cfg, params, [list(e.prompt) for e in entries], out)
  for i, e in enumerate(entries):
    own = e.model_mask > 0
    np.testing.assert_allclose(e.behaviour_logprobs[own], tf[i, :e.length][own], atol=2e-5)
    np.testing.assert_allclose(e.ref_logprobs[own], tf[i, :e.length][own], atol=2e-5)


@pytest.mark.parametrize("score", ["last_turn", "transcript"])
def test_the_reward_mask_is_the_last_model_turn_or_the_whole_transcript(tiny_cfg, score):
  params = init_params(tiny_cfg, 1)
  out = TurnSampler(_sampler(tiny_cfg), _env(score=score), encode, decode)(
      params, [[5, 6, 7]] * 4, jax.random.key(0))
  assert out.tool_calls.sum() > 0
  for i in range(4):
    n, own, read = out.lengths[i], out.model_mask[i], out.reward_mask[i]
    assert not read[n:].any()
    if score == "transcript":
      assert read[:n].all()
      continue
    last_reply = max(np.flatnonzero(own[:n] == 0), default=-1)  # the turn starts after it
    np.testing.assert_array_equal(np.flatnonzero(read), np.arange(last_reply + 1, n))


def test_a_reply_function_that_raises_answers_with_an_error_reply_and_is_counted(tiny_cfg):
  """The model's turn broke the reply function (e.g. a NUL in its code): the row reads an
  error reply and goes on, and the failure is counted, instead of the batch failing."""
  params = init_params(tiny_cfg, 1)
  calls = []

  def reply(problem, text):
    calls.append(text)
    if len(calls) % 2:
      raise ValueError("embedded null byte")
    return "<ok>"

  out = TurnSampler(_sampler(tiny_cfg, max_new_tokens=64), _env(reply, max_reply_tokens=40),
                    encode, decode)(params, [[5, 6, 7]] * 4, jax.random.key(0))
  failures = int(out.reply_failures.sum())
  assert failures > 0 and out.tool_errors.sum() >= failures
  texts = [decode(out.tokens[i, :out.lengths[i]]) for i in range(4)]
  assert sum(t.count("error: ValueError: embedded null byte") for t in texts) == failures


def test_an_unavailable_sandbox_ends_the_rollout_instead_of_becoming_a_reply(tiny_cfg):
  def reply(problem, text):
    raise SandboxUnavailable("no namespaces here")

  turns = TurnSampler(_sampler(tiny_cfg), _env(reply), encode, decode)
  with pytest.raises(SandboxUnavailable, match="no namespaces"):
    turns(init_params(tiny_cfg, 1), [[5, 6, 7]] * 4, jax.random.key(0))


def test_calls_count_only_replies_that_entered_the_context(tiny_cfg):
  """A reply with no room left in its row ends the row: it is counted in replies_dropped,
  not in the calls, errors and seconds of the replies the model read."""
  params = init_params(tiny_cfg, 1)
  called = []

  def reply(problem, text):
    called.append(problem)
    return Reply("<errorr>", error=True)  # 8 tokens, all of them kept (max_reply_tokens)

  out = TurnSampler(_sampler(tiny_cfg, max_new_tokens=20), _env(reply, max_turns=8), encode,
                    decode)(params, [[5, 6, 7]] * 8, jax.random.key(0), problems=list(range(8)))
  assert out.replies_dropped.sum() > 0
  assert len(called) == out.tool_calls.sum() + out.replies_dropped.sum()
  for i in range(8):
    replies = int((out.model_mask[i, :out.lengths[i]] == 0).sum())
    assert replies == 8 * out.tool_calls[i] == 8 * out.tool_errors[i]
    assert out.tool_seconds[i] == 0 or out.tool_calls[i] > 0


@pytest.mark.parametrize("kv_pages", [40, 14], ids=["pages", "few_pages"])
def test_multi_turn_rows_with_kv_pages_give_the_tokens_of_full_rows(tiny_cfg, kv_pages):
  """sampler.kv_pages holds for multi-turn rows too (the turn pool used to ignore it): the
  same trajectories, token for token, whether each row's cache is a full row or pages, and
  with so few pages (4 scratch pages and 10 of 8 slots for rows of 64) that rows wait for
  pages and give theirs back."""
  params = init_params(tiny_cfg, 1)
  prompts = [[5, 6, 7], [8, 9], [10, 40, 41, 42], [11]] * 2
  replies = Replies(_env(), encode, decode)

  def run(kv_pages):
    stream = continuous.Stream(_sampler(tiny_cfg), params, jax.random.key(0), num_slots=4,
                               max_prompt_len=4, chunk_steps=8, window_step=16,
                               kv_pages=kv_pages, page_size=8, replies=replies)
    stream.add(prompts, range(len(prompts)), problems=list(range(len(prompts))))
    return continuous.drain(stream), stream

  full, _ = run(0)
  paged, stream = run(kv_pages)
  assert stream.pages is not None and sorted(paged) == sorted(full)
  assert (stream.stats.preempted > 0) == (kv_pages == 14)  # rows restarted, turns and all
  assert sum(c.turn_stats.tool_calls for c in full.values()) > 0  # replies were appended
  for r, want in full.items():
    got = paged[r]
    np.testing.assert_array_equal(got.tokens, want.tokens)
    np.testing.assert_array_equal(got.turn_stats.model_mask, want.turn_stats.model_mask)
    np.testing.assert_allclose(got.tempered_logprobs, want.tempered_logprobs, atol=2e-5)
