"""Continuous batching: the same outputs as static batches, refills, shared prefill,
windows and compiles, the stream's weight swaps."""
import numpy as np
import jax
import pytest

from tba_jax import continuous, model, sampler, sharding, slot_programs

EOS = tuple(range(3, 12))  # 9 of 128 ids: rows end after 1 to 24 tokens at these settings


def _params(cfg, seed):
  """Random params with a scaled-up output head: peaked next-token distributions,
  so sampling is far from uniform and greedy ties are rare."""
  params = model.init_params(cfg, seed=seed)
  return {**params, "lm_head": params["lm_head"] * 4.0}


def _prompts(seed, lengths):
  rng = np.random.default_rng(seed)
  return [[int(t) for t in rng.integers(12, 128, n)] for n in lengths]


def _ragged(cfg):
  """12 rows whose completions end at very different lengths (1 .. 24)."""
  prompts = _prompts(0, [5, 11, 1, 8, 3, 9, 4, 7, 2, 12, 6, 10])
  return _params(cfg, seed=3), prompts


def _assert_same(got, want):
  np.testing.assert_array_equal(got.lengths, want.lengths)
  np.testing.assert_array_equal(got.tokens, want.tokens)
  np.testing.assert_allclose(got.logprobs, want.logprobs, atol=2e-5, rtol=0)
  np.testing.assert_allclose(got.tempered_logprobs, want.tempered_logprobs, atol=2e-5, rtol=0)
  assert got.num_decode_steps == want.num_decode_steps


@pytest.mark.parametrize("num_slots,kw", [
    (4, dict(greedy=True)),
    (4, dict(temperature=0.8)),
    # (top-k / top-p filtering is the sampler's own code, compared with static in sampler_test)
    pytest.param(4, dict(temperature=1.2, top_k=20, top_p=0.9), marks=pytest.mark.slow),
    (1, dict(temperature=0.8)),
    (4, dict(temperature=0.8, min_new_tokens=4, end_with_eos=True)),
], ids=["greedy", "sampled", "top_k_top_p", "one_slot", "min_tokens_end_with_eos"])
def test_outputs_with_num_slots_equal_static_on_a_ragged_batch(tiny_cfg, num_slots, kw):
  params, prompts = _ragged(tiny_cfg)
  options = sampler.SamplingOptions(max_new_tokens=24, eos_ids=EOS, pad_id=0, **kw)
  want = sampler.Sampler(tiny_cfg, options)(params, prompts, jax.random.key(7))
  # Rows end at very different lengths, some on EOS, some at the limit.
  assert want.lengths.min() <= kw.get("min_new_tokens", 2) + 1 and want.lengths.max() == 24
  assert 0 < (want.lengths == 24).sum() < len(prompts)
  # Windows of 8 slots: rows run under several window sizes (the cache has 36).
  s = sampler.Sampler(tiny_cfg, options)
  _assert_same(continuous.generate(s, params, prompts, jax.random.key(7), num_slots=num_slots,
                                   window_step=8, chunk_steps=6), want)


def test_eos_padding_and_lengths(tiny_cfg):
  params, prompts = _ragged(tiny_cfg)
  m = 24
  options = sampler.SamplingOptions(max_new_tokens=m, temperature=0.8, eos_ids=EOS, pad_id=0)
  out = continuous.generate(sampler.Sampler(tiny_cfg, options),
                            params, prompts, jax.random.key(7), num_slots=4)
  for row, n in zip(range(len(prompts)), out.lengths):
    body = out.tokens[row, :n]
    assert not np.isin(body[:-1], EOS).any()  # nothing after the first EOS
    assert np.isin(body[-1], EOS) or n == m  # ended on EOS or at the limit
    assert (out.tokens[row, n:] == 0).all()
    assert (out.logprobs[row, n:] == 0).all() and (out.tempered_logprobs[row, n:] == 0).all()
    assert (out.logprobs[row, :n] < 0).all()


def _run_stream(stream):
  """Step `stream` to the end: {row id: Completion}, and the most rows in flight."""
  out, most = {}, 0
  while stream.busy():
    for c in stream.step():
      assert c.row_id not in out
      out[c.row_id] = c
    most = max(most, stream.num_in_flight)
  return out, most


def test_refills_keep_at_most_num_slots_in_flight_and_share_prompt_prefills(tiny_cfg):
  params, distinct = _ragged(tiny_cfg)
  distinct = distinct[:5]
  # 4 samples of each prompt, interleaved (identical prompts not adjacent).
  prompts = [distinct[i % 5] for i in range(20)]
  options = sampler.SamplingOptions(max_new_tokens=16, temperature=1.0, eos_ids=EOS, pad_id=0)
  stream = continuous.Stream(sampler.Sampler(tiny_cfg, options), params, jax.random.key(5),
                             num_slots=4, chunk_steps=8, max_prompt_len=12)
  stream.add(prompts, range(20))
  got, most = _run_stream(stream)
  assert sorted(got) == list(range(20)) and most == 4
  st = stream.stats
  assert st.rows_started == st.rows_finished == 20
  assert st.refills > 5  # slots were refilled as rows ended, not once per 4 rows
  assert st.prefilled_prompts == 5  # each prompt once, shared by its 4 samples
  want = sampler.Sampler(tiny_cfg, options)(params, prompts, jax.random.key(5))
  for r, c in got.items():
    np.testing.assert_array_equal(c.tokens, want.tokens[r, :want.lengths[r]])
  assert len({tuple(c.tokens) for c in got.values()}) > 5  # samples of a prompt differ


def test_rows_at_their_own_temperatures_equal_static_calls_at_each(tiny_cfg):
  """Red-teaming's searchers draw a temperature per batch: rows of two batches, queued
  at two temperatures, share the pool (one compiled program) and each equals a static
  call at its own temperature."""
  params, prompts = _ragged(tiny_cfg)
  options = sampler.SamplingOptions(max_new_tokens=16, eos_ids=EOS, pad_id=0)
  stream = continuous.Stream(sampler.Sampler(tiny_cfg, options), params, jax.random.key(5),
                             num_slots=4, chunk_steps=8, max_prompt_len=12)
  stream.add(prompts[:6], range(6), temperature=0.5)
  stream.add(prompts[6:], range(6, 12), temperature=2.0)
  got, _ = _run_stream(stream)
  static = sampler.Sampler(tiny_cfg, options)
  low = static(params, prompts, jax.random.key(5), temperature=0.5)
  high = static(params, prompts, jax.random.key(5), temperature=2.0)
  for r, c in got.items():
    want = low if r < 6 else high
    np.testing.assert_array_equal(c.tokens, want.tokens[r, :want.lengths[r]])
    np.testing.assert_allclose(c.tempered_logprobs, want.tempered_logprobs[r, :want.lengths[r]],
                               atol=2e-5)
  assert any(not np.array_equal(low.tokens[r], high.tokens[r]) for r in range(6, 12))


def test_rows_fed_while_the_stream_runs_equal_static(tiny_cfg):
  """A searcher's pattern: queue more rows between steps, as slots come free."""
  params, prompts = _ragged(tiny_cfg)
  options = sampler.SamplingOptions(max_new_tokens=16, temperature=1.0, eos_ids=EOS, pad_id=0)
  stream = continuous.Stream(sampler.Sampler(tiny_cfg, options), params, jax.random.key(5),
                             num_slots=4, chunk_steps=8, max_prompt_len=12)
  got, fed = {}, 0
  while fed < len(prompts) or stream.busy():
    if fed < len(prompts) and stream.num_queued + stream.num_in_flight < 4:
      stream.add(prompts[fed:fed + 2], [fed, fed + 1])
      fed += 2
    got.update((c.row_id, c) for c in stream.step())
  want = sampler.Sampler(tiny_cfg, options)(params, prompts, jax.random.key(5))
  assert sorted(got) == list(range(len(prompts)))
  for r, c in got.items():
    np.testing.assert_array_equal(c.tokens, want.tokens[r, :want.lengths[r]])
    np.testing.assert_allclose(c.tempered_logprobs, want.tempered_logprobs[r, :want.lengths[r]],
                               atol=2e-5)


@pytest.mark.slow  # ~20 s on 2 cores (2026-12-04): out of the default suite
def test_one_compile_per_slot_count_prompt_bucket_and_window(tiny_cfg, monkeypatch):
  """Each program traces once per shape key: decode per window (the slot count
  and cache size fixed here), prefill per (prefill batch bucket, prompt bucket),
  insert per prefilled batch shape."""
  traced = {"decode": [], "prefill": [], "insert": []}

  def recording(name, fn, key):
    def wrapped(*args):
      traced[name].append(key(*args))  # runs only while jax traces a new program
      return fn(*args)
    return wrapped

  monkeypatch.setattr(slot_programs, "decode_chunk", recording(
      "decode", slot_programs.decode_chunk, lambda *a: (a[2].tokens.shape, a[5])))
  monkeypatch.setattr(slot_programs, "prefill_prompts", recording(
      "prefill", slot_programs.prefill_prompts, lambda *a: a[2].shape))
  monkeypatch.setattr(slot_programs, "insert_rows", recording(
      "insert", slot_programs.insert_rows, lambda *a: (a[0].tokens.shape, a[1].k.shape)))
  params, prompts = _ragged(tiny_cfg)
  # max_new_tokens=21 is used by no other test, so no earlier program is reused.
  s = sampler.Sampler(tiny_cfg, sampler.SamplingOptions(max_new_tokens=21, eos_ids=EOS),
                      buckets=sampler.Buckets(prompt=(16, 32)))
  run = lambda prompts, key: continuous.generate(s, params, prompts, key, num_slots=4,
                                                 window_step=8)
  run(prompts, jax.random.key(0))
  windows = [w for _, w in traced["decode"]]
  # The window grows with the longest live row: several sizes, within the
  # cache (prompt bucket 16 + 21 slots).
  assert len(windows) > 1 and max(windows) <= 37
  # Other prompts of the same bucket, other keys: only keys not seen before trace.
  run([p[::-1] for p in prompts], jax.random.key(1))
  run(prompts, jax.random.key(2))
  for name, keys in traced.items():
    assert len(keys) == len(set(keys)), f"{name} traced twice for one shape: {keys}"
  assert {w for _, w in traced["decode"]} >= set(windows)
  # A longer prompt: a new prompt bucket, so a new cache size and new programs.
  before = {name: len(keys) for name, keys in traced.items()}
  run(prompts + [[20] * 20], jax.random.key(0))
  assert all(len(traced[name]) > before[name] for name in traced)


@pytest.mark.slow  # ~14 s on 2 cores (2026-12-04): out of the default suite
def test_rows_placed_after_a_weight_swap_decode_under_the_new_weights(tiny_cfg):
  old, prompts = _ragged(tiny_cfg)
  new = _params(tiny_cfg, seed=9)
  options = sampler.SamplingOptions(max_new_tokens=16, temperature=0.9, eos_ids=EOS, pad_id=0)
  stream = continuous.Stream(sampler.Sampler(tiny_cfg, options), old, jax.random.key(3),
                             num_slots=4, chunk_steps=4, max_prompt_len=12)
  stream.set_params(old, version=0)
  stream.add(prompts, range(len(prompts)))
  got = {c.row_id: c for c in stream.step()}
  before = {j: stream.slots[j].row_id for j in range(4) if stream.slots[j] is not None}
  stream.set_params(new, version=1)
  rest, _ = _run_stream(stream)
  got.update(rest)
  assert sorted(got) == list(range(len(prompts)))
  static = sampler.Sampler(tiny_cfg, options)
  want_new = static(new, prompts, jax.random.key(3))
  spanning = set(before.values())
  for r, c in got.items():
    if r in spanning:  # in flight across the swap: prefilled under 0, ended under 1
      assert (c.first_version, c.last_version) == (0, 1)
    elif c.first_version == 1:  # started after the swap: entirely the new weights
      np.testing.assert_array_equal(c.tokens, want_new.tokens[r, :want_new.lengths[r]])
  assert sum(c.first_version == 0 for c in got.values()) == 4  # the first fill


@pytest.mark.slow  # ~11 s; the static sampler's four-device test stays default
def test_same_outputs_on_a_four_device_mesh(tiny_cfg):
  params, prompts = _ragged(tiny_cfg)
  options = sampler.SamplingOptions(max_new_tokens=12, temperature=1.0, top_p=0.95, eos_ids=EOS)
  want = sampler.generate(tiny_cfg, params, prompts, options, seed=11)
  mesh = sharding.make_mesh("searcher", jax.devices()[4:], tensor=2)  # data 2 x tensor 2
  placed = jax.device_put(params, sharding.param_shardings(tiny_cfg, "searcher", mesh))
  got = continuous.generate(sampler.Sampler(tiny_cfg, options, mesh=mesh), placed, prompts,
                            jax.random.key(11), num_slots=4)
  _assert_same(got, want)


def test_bad_arguments_are_refused(tiny_cfg):
  params = model.init_params(tiny_cfg)
  mesh = sharding.make_mesh("searcher", jax.devices()[:2])
  key = jax.random.key(0)
  options = sampler.SamplingOptions(max_new_tokens=4)
  with pytest.raises(ValueError, match="num_slots=3 must be a positive multiple"):
    continuous.Stream(sampler.Sampler(tiny_cfg, options, mesh=mesh), params, key,
                      num_slots=3, max_prompt_len=4)
  with pytest.raises(ValueError, match="chunk_steps"):
    continuous.Stream(sampler.Sampler(tiny_cfg, options), params, key, num_slots=2,
                      chunk_steps=0, max_prompt_len=4)
  stream = continuous.Stream(sampler.Sampler(tiny_cfg, options), params, key,
                             num_slots=2, max_prompt_len=4)
  with pytest.raises(ValueError, match="exceeds this stream's max_prompt_len"):
    stream.add([[1] * 40], [0])
  with pytest.raises(ValueError, match="at least one token"):
    stream.add([[]], [0])
  with pytest.raises(ValueError, match="num_slots=0 must be a positive multiple"):
    continuous.Stream(sampler.Sampler(tiny_cfg, options), params, key, num_slots=0,
                      max_prompt_len=4)


@pytest.mark.slow
def test_smollm2_gsm8k_samples_with_num_slots_equal_static():
  import json
  import os
  from tba_jax import hf_checkpoints, tokenizer as tokenizer_lib
  path = hf_checkpoints.smollm2_gguf_path()
  tok = tokenizer_lib.from_gguf(path)
  with open(os.path.join(os.path.dirname(__file__), "data", "gsm8k_test.jsonl")) as f:
    questions = [json.loads(line)["question"] for line in f][:3]
  rows = [tok.encode(tok.chat_prompt(q)) for q in questions for _ in range(3)]
  cfg, params = hf_checkpoints.load(path)
  options = sampler.SamplingOptions(max_new_tokens=48, temperature=0.7, eos_ids=tok.eos_ids,
                                    pad_id=tok.pad_id)
  want = sampler.generate(cfg, params, rows, options, seed=1)
  got = continuous.generate(sampler.Sampler(cfg, options), params, rows, jax.random.key(1),
                            num_slots=4)
  assert len(set(want.lengths.tolist())) > 1  # ragged
  np.testing.assert_array_equal(got.tokens, want.tokens)
  np.testing.assert_array_equal(got.lengths, want.lengths)
  np.testing.assert_allclose(got.tempered_logprobs, want.tempered_logprobs, atol=1e-3)
