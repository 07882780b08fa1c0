"""The paged KV cache (tba_jax/paged_kv.py): a paged pool gives the static sampler's
outputs row for row, also when the pool is too small for every row at full length (rows
then wait for pages or give theirs back), with the XLA gather and the Pallas paged kernel;
the allocator's bookkeeping; the streaming searcher with pages."""
import jax
import numpy as np
import pytest

from continuous_test import EOS, _assert_same, _ragged
from tba_jax import continuous, paged_kv, sampler


@pytest.mark.parametrize("num_slots,kv_pages,impl", [
    pytest.param(4, 64, "xla", marks=pytest.mark.slow),  # room for every row at full length
    (6, 20, "xla"),    # 6 scratch + 14 pages of 4 slots: rows wait and are preempted
    pytest.param(4, 24, "pallas", marks=pytest.mark.slow),  # the shipped paged kernel (interpret)
], ids=["roomy", "tight", "pallas"])
def test_paged_pool_outputs_equal_static_on_a_ragged_batch(tiny_cfg, num_slots, kv_pages, impl):
  cfg = tiny_cfg.replace(attention_impl=impl)
  params, prompts = _ragged(cfg)
  options = dict(max_new_tokens=24, eos_ids=EOS, pad_id=0, temperature=0.8)
  want = sampler.Sampler(cfg.replace(attention_impl="xla"), **options)(
      params, prompts, jax.random.key(7))
  stream = continuous.Stream(sampler.Sampler(cfg, **options), params, jax.random.key(7),
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
  options = dict(max_new_tokens=24, eos_ids=EOS, pad_id=0, greedy=True)
  want = sampler.Sampler(tiny_cfg, **options)(params, prompts, jax.random.key(7))
  got = continuous.generate(sampler.Sampler(tiny_cfg, **options), params, prompts,
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
