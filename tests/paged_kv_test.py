"""The paged KV cache (tba_jax/paged_kv.py): a paged pool gives the static sampler's
outputs row for row, also when the pool is too small for every row at full length (rows
then wait for pages or give theirs back), with the XLA gather and the Pallas paged kernel;
the allocator's bookkeeping; the streaming searcher with pages."""
import dataclasses

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest

from continuous_test import EOS, _assert_same, _ragged
from tba_jax import continuous, model, paged_kv, sampler, sharding


@pytest.mark.parametrize("num_slots,kv_pages,impl", [
    pytest.param(4, 64, "xla", marks=pytest.mark.slow),  # room for every row at full length
    (6, 20, "xla"),    # 6 scratch + 14 pages of 4 slots: rows wait and are preempted
    pytest.param(4, 24, "pallas", marks=pytest.mark.slow),  # the shipped paged kernel (interpret)
], ids=["roomy", "tight", "pallas"])
def test_paged_pool_outputs_equal_static_on_a_ragged_batch(tiny_cfg, num_slots, kv_pages, impl):
  cfg = tiny_cfg.replace(attention_impl=impl)
  params, prompts = _ragged(cfg)
  options = sampler.SamplingOptions(max_new_tokens=24, eos_ids=EOS, pad_id=0, temperature=0.8)
  want = sampler.Sampler(cfg.replace(attention_impl="xla"), options)(
      params, prompts, jax.random.key(7))
  stream = continuous.Stream(sampler.Sampler(cfg, options), params, jax.random.key(7),
                             num_slots=num_slots, max_prompt_len=max(map(len, prompts)),
                             window_step=8, chunk_steps=6, kv_pages=kv_pages, page_size=4)
  stream.add(prompts, range(len(prompts)))
  got = {}
  while stream.busy():
    got.update({c.row_id: c for c in stream.step()})
    assert stream.pages.num_free + sum(map(len, stream.pages.rows)) == kv_pages - num_slots
  assert sorted(got) == list(range(len(prompts)))
  for i, c in got.items():
    n = want.lengths[i]
    np.testing.assert_array_equal(c.tokens, want.tokens[i, :n])
    np.testing.assert_allclose(c.logprobs, want.logprobs[i, :n], atol=2e-5, rtol=0)
  assert stream.pages.num_free == kv_pages - num_slots  # every page came back
  if kv_pages == 20:
    assert stream.stats.preempted > 0  # the small pool made rows give pages back


@pytest.mark.slow
def test_generate_with_pages_equals_static(tiny_cfg):
  params, prompts = _ragged(tiny_cfg)
  options = sampler.SamplingOptions(max_new_tokens=24, eos_ids=EOS, pad_id=0, greedy=True)
  want = sampler.Sampler(tiny_cfg, options)(params, prompts, jax.random.key(7))
  got = continuous.generate(sampler.Sampler(tiny_cfg, options), params, prompts,
                            jax.random.key(7), num_slots=4, window_step=16, kv_pages=40,
                            page_size=8)
  _assert_same(got, want)


def test_allocator_hands_out_and_takes_back_pages():
  a = paged_kv.PageAllocator(num_rows=2, row_size=16, num_pages=8, page_size=4)
  assert a.num_free == 6 and (a.table == [[0] * 4, [1] * 4]).all()  # scratch pages
  assert a.grow(0, 5) and a.rows[0] == [2, 3] and a.table[0].tolist() == [2, 3, 0, 0]
  assert a.grow(1, 16) and a.num_free == 0
  assert not a.grow(0, 9) and a.rows[0] == [2, 3]  # nothing taken when short
  a.release(1)
  assert a.grow(0, 100) and len(a.rows[0]) == 4  # at most a full row
  with pytest.raises(ValueError, match="kv_pages=5: a pool for 2 slots needs at least 6"):
    paged_kv.PageAllocator(num_rows=2, row_size=16, num_pages=5, page_size=4)


def test_auto_pages_follow_device_memory(tiny_cfg):
  class Device:
    def __init__(self, stats):
      self.stats = stats

    def memory_stats(self):
      return self.stats

  assert paged_kv.auto_num_pages(tiny_cfg, [Device(None)], 4, 64, 16) == 0  # CPU: full rows
  page = paged_kv.page_bytes(tiny_cfg, 16)
  assert page == 2 * 2 * 2 * 16 * 16 * 4
  small = Device({"bytes_limit": 100 * page, "bytes_in_use": 50 * page})
  assert paged_kv.auto_num_pages(tiny_cfg, [small], 4, 64, 16) == 4 + 4 * 4  # every row full
  assert paged_kv.auto_num_pages(tiny_cfg, [small], 30, 64, 16) == 40  # 80% of 50 free pages
  assert paged_kv.auto_num_pages(tiny_cfg, [small], 40, 64, 16) == 44  # the smallest pool


class _Device:
  """A device that reports `stats` as its memory_stats()."""

  def __init__(self, stats):
    self.stats = stats

  def memory_stats(self):
    return self.stats


def test_auto_pages_are_what_fits_on_one_device_of_the_replicated_pool(tiny_cfg):
  # The pool is whole on every device of the data axis: d devices hold d copies, not a
  # pool d times as large.
  page = paged_kv.page_bytes(tiny_cfg, 16)
  dev = lambda free: _Device({"bytes_limit": 100 * page, "bytes_in_use": (100 - free) * page})
  one = paged_kv.auto_num_pages(tiny_cfg, [dev(50)], 30, 64, 16)
  assert one == 40  # 80% of 50 free pages
  assert paged_kv.auto_num_pages(tiny_cfg, [dev(50), dev(50)], 30, 64, 16) == one
  assert paged_kv.auto_num_pages(tiny_cfg, [dev(50), dev(45)], 30, 64, 16) == 36  # the least
  # Kv heads split over a tensor axis of 2: a device holds half of each page.
  assert paged_kv.auto_num_pages(tiny_cfg, [dev(50)] * 2, 30, 64, 16, kv_shards=2) == 80


@pytest.mark.parametrize("num_devices", [1, 2])
def test_an_auto_stream_takes_the_same_pages_on_one_or_two_data_devices(
    tiny_cfg, monkeypatch, num_devices):
  page = paged_kv.page_bytes(tiny_cfg, 16)
  # 6.25 free pages a device: 80% is 5 pages, between the smallest pool (2 scratch pages and
  # one row of 2) and every row at full length (2 + 2 x 2).
  monkeypatch.setattr(type(jax.devices()[0]), "memory_stats",
                      lambda self: {"bytes_limit": 25 * page // 4, "bytes_in_use": 0})
  mesh = sharding.make_mesh("searcher", jax.devices()[:num_devices])
  s = sampler.Sampler(tiny_cfg, sampler.SamplingOptions(max_new_tokens=16, eos_ids=EOS, pad_id=0),
                      mesh=mesh)
  stream = continuous.Stream(s, model.init_params(tiny_cfg, 0), jax.random.key(0), num_slots=2,
                             max_prompt_len=8, kv_pages=None, page_size=16)
  assert stream.pages.num_free + 2 == 5


def test_the_pool_leaves_the_update_room_where_the_trainer_shares_its_devices(tiny_cfg):
  from loop_test import tiny_config, toy_task
  from tba_jax import config_builders
  from tba_jax import tokenizer as tokenizer_lib
  page = paged_kv.page_bytes(tiny_cfg, 16)
  free = _Device({"bytes_limit": 1000 * page, "bytes_in_use": 0})
  shared = paged_kv.auto_num_pages(tiny_cfg, [free], 100, 1024, 16,
                                   memory_fraction=paged_kv.SHARED_MEMORY_FRACTION)
  assert shared == 1000 * paged_kv.SHARED_MEMORY_FRACTION <= 1000 / 4  # 3/4 kept for the update
  # The config's auto pool (sampler.kv_pages=0) takes that share on a device the trainer's
  # params live on (one device: alternate), the larger one on a searcher's own devices.
  tok = tokenizer_lib.byte_tokenizer()
  c = tiny_config(sampler=dict(num_slots=2, kv_pages=0))
  task = toy_task(c)
  searcher_mesh = sharding.make_mesh("searcher", jax.devices()[:1])

  def fraction(trainer_device):
    params = jax.device_put(model.init_params(tiny_cfg, 0), trainer_device)
    (searcher,) = config_builders.searcher_pool(c, task, tok, tiny_cfg, [searcher_mesh],
                                                publish=lambda p, i: p, params=params).searchers
    return searcher.rows.kv_pages.memory_fraction

  assert fraction(jax.devices()[0]) == paged_kv.SHARED_MEMORY_FRACTION
  assert fraction(jax.devices()[1]) == paged_kv.AUTO_MEMORY_FRACTION


def _unique_index_checks(fn, *args) -> list[bool]:
  """Runs fn(*args) equation by equation (a jaxpr interpreter): for every scatter that
  promises unique indices, whether its indices were unique."""
  checks = []

  def run(jaxpr, consts, *values):
    env = dict(zip(jaxpr.constvars, consts)) | dict(zip(jaxpr.invars, values))
    read = lambda v: v.val if isinstance(v, jax.extend.core.Literal) else env[v]
    for eqn in jaxpr.eqns:
      ins = [read(v) for v in eqn.invars]
      if "jaxpr" in eqn.params and eqn.primitive.name in ("pjit", "jit"):
        sub = eqn.params["jaxpr"]
        outs = run(sub.jaxpr, sub.consts, *ins)
      else:
        if eqn.primitive.name.startswith("scatter") and eqn.params["unique_indices"]:
          idx = np.asarray(ins[1]).reshape(-1, np.shape(ins[1])[-1])
          checks.append(len(np.unique(idx, axis=0)) == len(idx))
        outs = eqn.primitive.bind(*ins, **eqn.params)
        outs = outs if eqn.primitive.multiple_results else [outs]
      env.update(zip(eqn.outvars, outs))
    return [read(v) for v in jaxpr.outvars]

  closed = jax.make_jaxpr(fn)(*args)
  run(closed.jaxpr, closed.consts, *jax.tree.leaves(args))
  return checks


def test_a_prompt_insert_writes_only_the_prompts_pages_under_its_uniqueness_promise(tiny_cfg):
  # Row 1 holds 2 pages of 4 slots (a 5-token prompt and a chunk of 3); the prompt bucket of
  # 16 slots reaches 2 pages past them: before, those slots all landed on the row's scratch
  # page, two bucket slots per scratch slot, in a scatter promised unique indices.
  alloc = paged_kv.PageAllocator(num_rows=2, row_size=16, num_pages=8, page_size=4)
  assert alloc.grow(1, 5 + 3)
  cache = paged_kv.PagedKVCache.init(tiny_cfg, 2, 16, 8, 4)
  cache = dataclasses.replace(cache, page_table=jnp.asarray(alloc.table))
  shape = (tiny_cfg.num_layers, tiny_cfg.num_kv_heads, 16, tiny_cfg.head_dim)
  k = jax.random.normal(jax.random.key(0), shape)
  v = jax.random.normal(jax.random.key(1), shape)
  put = lambda cache, k, v, slot, length: cache.put_row(slot, k, v, length)
  checks = _unique_index_checks(put, cache, k, v, jnp.int32(1), jnp.int32(5))
  assert checks and all(checks)
  out = put(cache, k, v, 1, 5)
  written = out.k[:, :, alloc.rows[1]].reshape(*shape[:2], 8, -1)  # [L,K,8,H]: the row's slots
  np.testing.assert_array_equal(written[:, :, :5], k[:, :, :5])  # the prompt, in its pages
  assert not np.asarray(out.k[:, :, [0, 1, 4, 5, 6, 7]]).any()  # nothing else written
  assert out.mask[1].tolist() == [True] * 5 + [False] * 11 and int(out.index[1]) == 5


def test_live_rows_reserve_their_next_chunk_before_a_new_row_takes_the_pages(tiny_cfg):
  # 8 pages of 4 slots (one full row). Row 0 (a 4-token prompt, 16 tokens, 4 a chunk)
  # holds 4 pages after 3 chunks and wants a 5th for its 4th; row 1 (12 tokens of prompt
  # and a chunk: 4 pages) arrives then. Taking its pages first and handing them back at
  # once (a preemption, its prefill wasted) is the thrash; row 1 waits instead.
  params, _ = _ragged(tiny_cfg)
  prompts = [[12, 13, 14, 15], list(range(20, 32))]
  options = sampler.SamplingOptions(max_new_tokens=16, min_new_tokens=16, eos_ids=EOS, pad_id=0,
                                    temperature=0.8)
  want = sampler.Sampler(tiny_cfg, options)(params, prompts, jax.random.key(3))
  stream = continuous.Stream(sampler.Sampler(tiny_cfg, options), params, jax.random.key(3),
                             num_slots=2, max_prompt_len=16, chunk_steps=4, window_step=4,
                             kv_pages=2 + 8, page_size=4)
  got = {}
  stream.add(prompts[:1], [0])
  for _ in range(3):
    assert not stream.step()
  assert stream.pages.rows[0] and len(stream.pages.rows[0]) == 4
  stream.add(prompts[1:], [1])
  while stream.busy():
    got.update({c.row_id: c for c in stream.step()})
  assert stream.stats.preempted == 0 and stream.stats.prefilled_prompts == 2
  for i, c in got.items():
    np.testing.assert_array_equal(c.tokens, want.tokens[i])
    np.testing.assert_allclose(c.logprobs, want.logprobs[i], atol=2e-5, rtol=0)
