"""Sampler: parity with transformers and teacher forcing, distributions, EOS, meshes, buckets.

The core (prefill / decode) is tested against fake logits functions, so those
tests pin its bookkeeping without any model; the rest run the real model.
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hf_models import make_hf_model
from tba_jax import hf_checkpoints, model, sampler, sharding

# float32 log-probs from two paths (cached decode; one forward over the whole sequence): on an
# AVX-512 machine XLA's kernels put them 1.3e-5 apart at -2.2 (within 1e-5 on AVX2).
TWO_PATHS = 3e-5

# ---------------------------------------------------------------------------
# Helpers.
# ---------------------------------------------------------------------------


def _random_prompts(rng, lengths, vocab=128):
  return [[int(t) for t in rng.integers(3, vocab, n)] for n in lengths]


@functools.lru_cache(maxsize=None)
def _hf_checkpoint(variant):
  import tempfile
  hf = make_hf_model(variant)
  path = tempfile.mkdtemp(prefix=f"sampler_{variant}_")
  hf.save_pretrained(path)
  return hf, path


def _peaked_params(cfg, seed):
  """Random params with a scaled-up output head (logits of std ~4, not ~1): uneven
  next-token distributions make the sampling and log-prob checks sharper."""
  params = model.init_params(cfg, seed=seed)
  return {**params, "lm_head": params["lm_head"] * 4.0}


def _run_core(logits_fn, prompt_tokens, prompt_mask, options, cache, seed=0, row_valid=None):
  """The core without the shell: jit(prefill -> decode) over a fake model."""
  b = prompt_tokens.shape[0]
  row_valid = np.ones(b, bool) if row_valid is None else row_valid

  @jax.jit
  def run(prompt_tokens, prompt_mask, cache, key, row_valid):
    batch = sampler.PrefillBatch(prompt_tokens, prompt_mask, jnp.arange(b), row_valid)
    state = sampler.prefill(logits_fn, None, batch, cache, key, options)
    return sampler.decode(logits_fn, None, state, options)

  return jax.device_get(run(prompt_tokens, prompt_mask, cache, jax.random.key(seed), row_valid))


def _fixed_logits_fn(logits):
  """A fake model whose next-token logits [V] never change."""
  def logits_fn(params, tokens, positions, token_mask, cache):
    return jnp.broadcast_to(logits, (tokens.shape[0], logits.shape[-1])), cache
  return logits_fn


def _teacher_forced_logits(cfg, params, prompts, completions, lengths):
  """model.logits on [left-padded prompt | completion]; row i, column j predicts token j."""
  t = max(map(len, prompts))
  n = completions.shape[1]
  tokens = np.zeros((len(prompts), t + n), np.int32)
  mask = np.zeros_like(tokens)
  for i, p in enumerate(prompts):
    tokens[i, t - len(p):t] = p
    mask[i, t - len(p):t] = 1
  tokens[:, t:] = completions
  mask[:, t:] = np.arange(n)[None] < lengths[:, None]
  out = np.asarray(model.logits(cfg, params, tokens, mask), np.float64)
  return out[:, t - 1:t + n - 1]  # [B, N, V]


def _log_softmax(x):
  x = x - x.max(-1, keepdims=True)
  return x - np.log(np.exp(x).sum(-1, keepdims=True))


# ---------------------------------------------------------------------------
# Parity with transformers and with the training forward.
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("variant", ["llama", "qwen2"])
def test_greedy_matches_transformers_generate_left_padded(variant):
  import torch
  hf, path = _hf_checkpoint(variant)
  cfg, params = hf_checkpoints.load(path)
  prompts = _random_prompts(np.random.default_rng(0), [7, 2, 13, 4])
  n = 12
  out = sampler.generate(cfg, params, prompts, sampler.SamplingOptions(
      max_new_tokens=n, greedy=True, eos_ids=[2], pad_id=0))

  t = max(map(len, prompts))
  ids = np.zeros((len(prompts), t), np.int64)
  mask = np.zeros_like(ids)
  for i, p in enumerate(prompts):
    ids[i, t - len(p):], mask[i, t - len(p):] = p, 1
  with torch.no_grad():
    ref = hf.generate(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                      do_sample=False, max_new_tokens=n, eos_token_id=2, pad_token_id=0,
                      return_dict_in_generate=True, output_logits=True)
  want = ref.sequences[:, t:].numpy()
  want = np.pad(want, ((0, 0), (0, n - want.shape[1])))  # transformers stops when all rows did
  np.testing.assert_array_equal(out.tokens, want)
  # Greedy log-probs are log_softmax(logits) (T = 1) of the chosen tokens.
  hf_logp = _log_softmax(np.stack([l.numpy() for l in ref.logits], 1).astype(np.float64))
  hf_logp = np.take_along_axis(hf_logp, want[:, :hf_logp.shape[1], None], -1)[..., 0]
  real = np.arange(hf_logp.shape[1])[None] < out.lengths[:, None]
  np.testing.assert_allclose(out.tempered_logprobs[:, :hf_logp.shape[1]][real], hf_logp[real],
                             atol=1e-4)
  np.testing.assert_array_equal(out.logprobs, out.tempered_logprobs)


@pytest.mark.parametrize("temperature,top_k,top_p", [(0.7, 0, 1.0), (1.3, 12, 0.8)])
def test_sampled_logprobs_match_teacher_forcing(tiny_cfg, temperature, top_k, top_p):
  params = _peaked_params(tiny_cfg, seed=3)
  prompts = _random_prompts(np.random.default_rng(1), [5, 11, 1, 8, 3, 9])
  eos = list(range(3, 24))  # a sixth of the vocab: rows stop early, at different steps
  out = sampler.generate(tiny_cfg, params, prompts, sampler.SamplingOptions(
      max_new_tokens=10, temperature=temperature, top_k=top_k, top_p=top_p, eos_ids=eos, pad_id=0),
      seed=7)
  steps = np.arange(10)[None]
  real = steps < out.lengths[:, None]
  assert 0 < real.sum() < real.size, "with this seed some rows should stop early"

  scaled = _teacher_forced_logits(tiny_cfg, params, prompts, out.tokens, out.lengths) / temperature
  tempered = np.take_along_axis(_log_softmax(scaled), out.tokens[..., None], -1)[..., 0]
  np.testing.assert_allclose(out.tempered_logprobs[real], tempered[real], atol=TWO_PATHS, rtol=0)
  # The truncated distribution, rebuilt independently: top-k by rank, then the
  # smallest descending prefix holding top_p of the (renormalised) mass.
  keep = np.ones(scaled.shape, bool)
  order = np.argsort(-scaled, axis=-1)
  if top_k:
    ranks = np.argsort(order, axis=-1)
    keep &= ranks < top_k
  if top_p < 1:
    kept = np.where(keep, scaled, -np.inf)
    probs = np.exp(_log_softmax(np.take_along_axis(kept, order, -1)))
    before = np.cumsum(probs, -1) - probs
    keep_sorted = before < top_p
    np.put_along_axis(keep, order, keep_sorted & np.take_along_axis(keep, order, -1), -1)
  assert np.take_along_axis(keep, out.tokens[..., None], -1)[..., 0][real].all()
  truncated = np.take_along_axis(_log_softmax(np.where(keep, scaled, -np.inf)),
                                 out.tokens[..., None], -1)[..., 0]
  np.testing.assert_allclose(out.logprobs[real], truncated[real], atol=TWO_PATHS, rtol=0)
  if top_k or top_p < 1:  # renormalising over the kept set raises the log-probs
    assert (out.logprobs[real] > out.tempered_logprobs[real] + 1e-3).any()
  else:
    np.testing.assert_array_equal(out.logprobs, out.tempered_logprobs)
  # Padding after EOS carries pad tokens and zero log-probs.
  assert (out.tokens[~real] == 0).all()
  assert (out.logprobs[~real] == 0).all() and (out.tempered_logprobs[~real] == 0).all()


# ---------------------------------------------------------------------------
# The distribution actually sampled (core, fake model).
# ---------------------------------------------------------------------------
LOGITS = np.array([2.0, 1.5, 1.2, 1.0, 0.7, 0.5, 0.2, 0.0, -0.3, -0.5, -0.8, -1.0, -1.5, -2.0,
                   -2.5, -3.0], np.float32)
CHI2_CRITICAL_DF15_P001 = 37.697  # chi-square quantile: df = 16 - 1, p = 0.001


def _chi2(counts, probs):
  expected = counts.sum() * probs
  return float(((counts - expected) ** 2 / expected).sum())


def test_first_token_follows_tempered_softmax_chi_square():
  temperature, rows, seeds = 0.8, 1000, 8
  options = sampler.SamplingOptions(max_new_tokens=1, temperature=temperature)
  prompt = np.ones((rows, 1), np.int32)
  tokens = np.concatenate([
      _run_core(_fixed_logits_fn(jnp.asarray(LOGITS)), prompt, prompt, options, None, seed=s).tokens
      for s in range(seeds)])
  counts = np.bincount(tokens[:, 0], minlength=len(LOGITS))
  want = np.exp(_log_softmax(LOGITS.astype(np.float64) / temperature))
  assert _chi2(counts, want) < CHI2_CRITICAL_DF15_P001
  # The test has power: sampling at T = 1 instead of 0.8 would be rejected.
  assert _chi2(counts, np.exp(_log_softmax(LOGITS.astype(np.float64)))) > 3 * CHI2_CRITICAL_DF15_P001


@pytest.mark.parametrize("top_k,top_p,kept", [
    (4, 1.0, {0, 1, 2, 3}),
    (0, 0.8, {0, 1, 2, 3, 4, 5}),  # softmax mass before token 5: 0.753 < 0.8; before 6: 0.816
    (8, 0.8, {0, 1, 2, 3, 4}),  # renormalised over the top 8 first: before 4: 0.752; 5: 0.837
])
def test_top_k_top_p_never_leave_the_kept_set(top_k, top_p, kept):
  temperature, rows = 1.0, 3000
  probs = np.exp(_log_softmax(LOGITS.astype(np.float64) / temperature))
  options = sampler.SamplingOptions(max_new_tokens=3, temperature=temperature, top_k=top_k,
                                    top_p=top_p)
  prompt = np.ones((rows, 1), np.int32)
  out = _run_core(_fixed_logits_fn(jnp.asarray(LOGITS)), prompt, prompt, options, None, seed=1)
  seen = set(np.unique(out.tokens).tolist())
  assert seen == kept  # never outside, and every kept token does occur
  # Log-probs are under the renormalised kept distribution; tempered ones are not truncated.
  idx = sorted(kept)
  renorm = np.full(len(LOGITS), -np.inf)
  renorm[idx] = np.log(probs[idx] / probs[idx].sum())
  np.testing.assert_allclose(out.logprobs, renorm[out.tokens], atol=1e-5)
  np.testing.assert_allclose(out.tempered_logprobs, np.log(probs)[out.tokens], atol=1e-5)


# ---------------------------------------------------------------------------
# EOS, padding, lengths, early exit, feedback loop (core, scripted fake model).
# ---------------------------------------------------------------------------
def _scripted_model(script):
  """A fake model emitting script[b, j] at sampling step j; its cache records
    (calls, the token and the position fed at each call)."""
  script = jnp.asarray(script)
  b, n = script.shape

  def logits_fn(params, tokens, positions, token_mask, cache):
    calls, fed_tokens, fed_positions = cache
    fed_tokens = fed_tokens.at[:, calls].set(tokens[:, -1])
    fed_positions = fed_positions.at[:, calls].set(positions[:, -1])
    logits = 10.0 * jax.nn.one_hot(script[:, jnp.minimum(calls, n - 1)], 16)
    return logits, (calls + 1, fed_tokens, fed_positions)

  cache = (jnp.zeros((), jnp.int32), jnp.full((b, n + 1), -1), jnp.full((b, n + 1), -1))
  return logits_fn, cache


def test_eos_padding_lengths_and_early_exit():
  n, pad = 10, 15
  # Rows stop at steps 2, 5, 0 and 3 on either EOS id (13 or 14); row 4 is a
  # padding row of the batch bucket and must not hold the loop open.
  script = np.tile(np.arange(3, 3 + n), (5, 1))
  script[0, 2], script[1, 5], script[2, 0], script[3, 3] = 13, 14, 13, 14
  script[4] = 5  # never emits EOS
  logits_fn, cache = _scripted_model(script)
  lengths = [3, 2, 1, 4, 1]
  prompt = np.zeros((5, 4), np.int32)
  mask = np.zeros((5, 4), np.int32)
  for i, p in enumerate(lengths):
    prompt[i, 4 - p:] = 100 + i
    mask[i, 4 - p:] = 1
  options = sampler.SamplingOptions(max_new_tokens=n, greedy=True, eos_ids=(13, 14), pad_id=pad)
  out = _run_core(logits_fn, prompt, mask, options, cache,
                  row_valid=np.array([True, True, True, True, False]))

  want_lengths = np.array([3, 6, 1, 4, 0])
  np.testing.assert_array_equal(out.lengths, want_lengths)
  for i, length in enumerate(want_lengths):
    np.testing.assert_array_equal(out.tokens[i, :length], script[i, :length])
    assert (out.tokens[i, length:] == pad).all()
    assert (out.logprobs[i, length:] == 0).all()
  # Early exit: 6 sampling steps (the longest row), i.e. one prefill call and
  # 5 decode iterations, not max_new_tokens.
  assert int(out.step) == 6 < n
  calls, fed_tokens, fed_positions = out.cache
  assert int(calls) == 6
  # The loop feeds back each sampled token at the next position of its row.
  live = np.arange(1, 6)[None] < np.maximum(want_lengths, 1)[:, None]
  np.testing.assert_array_equal(fed_tokens[:, 1:6][live], out.tokens[:, :5][live])
  np.testing.assert_array_equal(fed_positions[:, 1:6][live],
                                (np.array(lengths)[:, None] + np.arange(5)[None])[live])


def test_without_eos_every_row_runs_max_new_tokens(tiny_cfg):
  params = _peaked_params(tiny_cfg, seed=4)
  out = sampler.generate(tiny_cfg, params, [[5, 6, 7], [8]],
                         sampler.SamplingOptions(max_new_tokens=9), seed=1)
  assert out.num_decode_steps == 9
  np.testing.assert_array_equal(out.lengths, [9, 9])
  assert out.tokens.dtype == np.int32 and out.logprobs.dtype == np.float32
  assert out.tokens.shape == out.logprobs.shape == out.tempered_logprobs.shape == (2, 9)
  assert (out.logprobs < 0).all()


# ---------------------------------------------------------------------------
# Determinism across meshes and batches; compiles per bucket.
# ---------------------------------------------------------------------------
@pytest.mark.slow  # ~13 s on 2 cores (2026-12-04): out of the default suite
def test_same_tokens_on_one_device_and_on_a_four_device_mesh(tiny_cfg):
  params = _peaked_params(tiny_cfg, seed=5)
  prompts = _random_prompts(np.random.default_rng(2), [6, 2, 9, 4, 7, 1])
  options = sampler.SamplingOptions(max_new_tokens=8, temperature=1.0, top_p=0.95, eos_ids=[3])
  one = sampler.generate(tiny_cfg, params, prompts, options, seed=11)
  for tensor in (1, 2):
    mesh = sharding.make_mesh("searcher", jax.devices()[4:], tensor=tensor)
    placed = jax.device_put(params, sharding.param_shardings(tiny_cfg, "searcher", mesh))
    four = sampler.generate(tiny_cfg, placed, prompts, options, seed=11, mesh=mesh)
    np.testing.assert_array_equal(four.tokens, one.tokens)
    np.testing.assert_array_equal(four.lengths, one.lengths)
    np.testing.assert_allclose(four.logprobs, one.logprobs, atol=1e-5)
  assert len(set(map(tuple, one.tokens))) > 1  # rows really sample differently


def test_a_rows_tokens_do_not_depend_on_the_rest_of_the_batch(tiny_cfg):
  params = _peaked_params(tiny_cfg, seed=6)
  prompts = _random_prompts(np.random.default_rng(3), [3, 8, 5])
  options = sampler.SamplingOptions(max_new_tokens=6, temperature=1.0)
  three = sampler.generate(tiny_cfg, params, prompts, options, seed=2)  # batch bucket 4
  two = sampler.generate(tiny_cfg, params, prompts[:2], options, seed=2)  # batch bucket 2
  np.testing.assert_array_equal(two.tokens, three.tokens[:2])
  other_seed = sampler.generate(tiny_cfg, params, prompts[:2], options, seed=3)
  assert (other_seed.tokens != two.tokens).any()


def test_rows_sharing_a_prompt_prefill_it_once_and_sample_as_if_each_had(tiny_cfg, monkeypatch):
  prefilled = []
  core = sampler.prefill
  monkeypatch.setattr(sampler, "prefill", lambda logits_fn, params, batch, *a, **k:
                      prefilled.append(batch.tokens.shape[0]) or
                      core(logits_fn, params, batch, *a, **k))
  params = _peaked_params(tiny_cfg, seed=9)
  p, q, r = _random_prompts(np.random.default_rng(5), [4, 7, 2])
  prompts = [p, p, p, q, q, q, r]  # a searcher's layout: a prompt's samples adjacent
  options = sampler.SamplingOptions(max_new_tokens=6, temperature=1.0, top_p=0.9, eos_ids=[3])
  shared = sampler.Sampler(tiny_cfg, options)(params, prompts, jax.random.key(4))
  whole = sampler.Sampler(tiny_cfg, options, share_prompts=False)(params, prompts,
                                                                  jax.random.key(4))
  assert prefilled == [4, 8]  # 3 distinct prompts in a bucket of 4, then all 7 rows in one of 8
  np.testing.assert_array_equal(shared.tokens, whole.tokens)
  np.testing.assert_array_equal(shared.lengths, whole.lengths)
  np.testing.assert_allclose(shared.logprobs, whole.logprobs, atol=1e-5)
  np.testing.assert_allclose(shared.tempered_logprobs, whole.tempered_logprobs, atol=1e-5)
  assert len(set(map(tuple, shared.tokens[:3]))) > 1  # a prompt's rows still sample apart


@pytest.mark.slow  # ~11 s on 2 cores (2026-12-04): out of the default suite
def test_decode_compiles_once_per_bucket(tiny_cfg, monkeypatch):
  traces = {"prefill": 0, "decode": 0}

  def counting(name, fn):
    def wrapped(*args, **kwargs):
      traces[name] += 1  # runs only while jax traces a new program
      return fn(*args, **kwargs)
    return wrapped

  monkeypatch.setattr(sampler, "prefill", counting("prefill", sampler.prefill))
  monkeypatch.setattr(sampler, "decode", counting("decode", sampler.decode))
  params = model.init_params(tiny_cfg, seed=7)
  # max_new_tokens=5 is used by no other test, so no earlier program is reused.
  s = sampler.Sampler(tiny_cfg, sampler.SamplingOptions(max_new_tokens=5, eos_ids=[2]),
                      buckets=sampler.Buckets(prompt=(16, 32), batch=(2, 4, 8)))
  rng = np.random.default_rng(4)
  for lengths in ([3, 9, 5], [1, 16, 2, 7], [12, 4, 4]):  # batch bucket 4, prompt bucket 16
    s(params, _random_prompts(rng, lengths), jax.random.key(0))
  assert traces == {"prefill": 1, "decode": 1}
  s(params, _random_prompts(rng, [3] * 5), jax.random.key(1))  # batch bucket 8
  s(params, _random_prompts(rng, [20, 3]), jax.random.key(1))  # prompt bucket 32
  assert traces == {"prefill": 3, "decode": 3}
  with pytest.raises(ValueError, match="largest bucket"):
    s(params, _random_prompts(rng, [40]), jax.random.key(1))


def test_a_call_temperature_reuses_the_programs_and_samples_at_that_temperature(tiny_cfg,
                                                                              monkeypatch):
  traces = []
  monkeypatch.setattr(sampler, "prefill", lambda *a, **k: traces.append(1) or _PREFILL(*a, **k))
  params = _peaked_params(tiny_cfg, seed=8)
  prompts = _random_prompts(np.random.default_rng(6), [4, 7, 2])
  # max_new_tokens=7 is used by no other test, so no earlier program is reused.
  s = sampler.Sampler(tiny_cfg, sampler.SamplingOptions(max_new_tokens=7, eos_ids=[3]))
  for temperature in (0.5, 1.0, 2.5):
    out = s(params, prompts, jax.random.key(0), temperature=temperature)
    real = np.arange(7)[None] < out.lengths[:, None]
    scaled = _teacher_forced_logits(tiny_cfg, params, prompts, out.tokens, out.lengths)
    want = np.take_along_axis(_log_softmax(scaled / temperature), out.tokens[..., None], -1)[..., 0]
    np.testing.assert_allclose(out.tempered_logprobs[real], want[real], atol=TWO_PATHS, rtol=0)
  assert len(traces) == 1  # one prefill program for the three temperatures
  with pytest.raises(ValueError, match="temperature"):
    s(params, prompts, jax.random.key(0), temperature=0.0)


_PREFILL = sampler.prefill


def test_min_new_tokens_masks_eos_and_end_with_eos_puts_it_last():
  # A fake model that always prefers EOS (token 13) and never emits token 14 by itself.
  logits = np.linspace(0.0, 1.0, 16).astype(np.float32)
  logits[13], logits[14] = 8.0, -30.0
  rows, n = 400, 6
  prompt = np.ones((rows, 1), np.int32)
  base = dict(max_new_tokens=n, temperature=1.0, eos_ids=(13, 14), pad_id=15)
  out = _run_core(_fixed_logits_fn(jnp.asarray(logits)), prompt, prompt,
                  sampler.SamplingOptions(**base, min_new_tokens=4), None)
  # EOS is likely at every step, so rows end right after the masked steps.
  assert out.lengths.min() == 5 and (out.lengths == 5).mean() > 0.9
  assert not np.isin(out.tokens[:, :4], (13, 14)).any()
  # The masked distribution is the one sampled from (and logged).
  no_eos = logits.astype(np.float64)
  no_eos[[13, 14]] = -np.inf
  np.testing.assert_allclose(out.tempered_logprobs[:, :4], _log_softmax(no_eos)[out.tokens[:, :4]],
                             atol=1e-5)
  # end_with_eos: EOS masked everywhere but the last column, which holds eos_ids[0].
  out = _run_core(_fixed_logits_fn(jnp.asarray(logits)), prompt, prompt,
                  sampler.SamplingOptions(**base, min_new_tokens=n - 1, end_with_eos=True), None)
  np.testing.assert_array_equal(out.lengths, n)
  np.testing.assert_array_equal(out.tokens[:, -1], 13)
  np.testing.assert_array_equal(out.tempered_logprobs[:, -1], 0.0)  # the only token allowed
  with pytest.raises(ValueError, match="no column"):
    sampler.SamplingOptions(**base, min_new_tokens=n, end_with_eos=True)


def test_bad_arguments_are_refused(tiny_cfg):
  params = model.init_params(tiny_cfg)
  with pytest.raises(ValueError, match="temperature"):
    sampler.generate(tiny_cfg, params, [[1]],
                     sampler.SamplingOptions(max_new_tokens=2, temperature=0.0))
  with pytest.raises(ValueError, match="top_p"):
    sampler.generate(tiny_cfg, params, [[1]], sampler.SamplingOptions(max_new_tokens=2, top_p=0.0))
  with pytest.raises(ValueError, match="at least one token"):
    sampler.generate(tiny_cfg, params, [[1], []], sampler.SamplingOptions(max_new_tokens=2))


# ---------------------------------------------------------------------------
# The real SmolLM2-135M-Instruct.
# ---------------------------------------------------------------------------
@pytest.mark.slow
def test_smollm2_batched_greedy_matches_transformers_on_gsm8k():
  import json
  import os

  import torch
  import transformers
  from tba_jax import tokenizer as tokenizer_lib
  path = hf_checkpoints.smollm2_gguf_path()
  tok = tokenizer_lib.from_gguf(path)
  here = os.path.dirname(__file__)
  with open(os.path.join(here, "data", "gsm8k_test.jsonl")) as f:
    questions = [json.loads(line)["question"] for line in f][:3]
  prompts = [tok.encode(tok.chat_prompt(q)) for q in questions]
  assert len(set(map(len, prompts))) == 3
  n = 64
  cfg, params = hf_checkpoints.load(path)
  out = sampler.generate(cfg, params, prompts, sampler.SamplingOptions(
      max_new_tokens=n, greedy=True, eos_ids=tok.eos_ids, pad_id=tok.pad_id))

  hf = transformers.AutoModelForCausalLM.from_pretrained(
      os.path.dirname(path), gguf_file=os.path.basename(path), dtype=torch.float32).eval()
  t = max(map(len, prompts))
  ids = torch.full((3, t), tok.pad_id, dtype=torch.long)
  mask = torch.zeros((3, t), dtype=torch.long)
  for i, p in enumerate(prompts):
    ids[i, t - len(p):], mask[i, t - len(p):] = torch.tensor(p), 1
  with torch.no_grad():
    ref = hf.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=n,
                      eos_token_id=list(tok.eos_ids), pad_token_id=tok.pad_id)
  want = ref[:, t:].numpy()
  want = np.pad(want, ((0, 0), (0, n - want.shape[1])), constant_values=tok.pad_id)
  np.testing.assert_array_equal(out.tokens, want)
  assert "".join(tok.decode(r) for r in out.tokens).strip()  # real text came out
