"""The compiled decode step's op counts (benchmarks/decode_ops.py) and the decode layout
(model.decode_layout) that brings them down, with its numerics: the same bits as the
stacked layers'."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks import decode_ops
from conftest import USER_LEVEL
from tba_jax import model
from tba_jax.kv_cache import KVCache
from tba_jax.layers import project
from tba_jax.model import ModelConfig


def test_the_op_counter_sees_a_scans_weight_slice_copies():
  """A layer scan over stacked weights copies each layer's slice before its matmul: the
  counter must see it, or its zero in the next test would mean nothing."""
  w = jax.ShapeDtypeStruct((3, 64, 64), jnp.float32)  # [L, D, D]
  x = jax.ShapeDtypeStruct((4, 64), jnp.float32)

  def step(w, x):
    layer = lambda i, h: jnp.tanh(h @ jax.lax.dynamic_index_in_dim(w, i, 0, keepdims=False))
    return jax.lax.fori_loop(0, 3, layer, x)

  comps, entry = decode_ops.parse_hlo(jax.jit(step).lower(w, x).compile().as_text())
  [body] = decode_ops._whiles(comps, entry)
  assert decode_ops.count(comps, body, {64 * 64})["weight_slice_copies"] == 1


@pytest.mark.parametrize("program", ["static", "pool"])
def test_the_decode_step_copies_no_weight_slice_and_fuses_its_projections(program):
  counts = decode_ops.measure(decode_ops.model_config("tiny"), batch=4, prompt_len=16,
                              new_tokens=8)[program]
  # Before the decode layout (2026-12-06): 7 weight-slice copies and 11 dynamic slices a
  # layer, 9 dots, 40 (static) / 45 (pool) instructions.
  assert counts["step"]["weight_slice_copies"] == 0
  assert counts["layer"]["dynamic_slices"] == 0
  # q/k/v one matmul, o, gate/up one, down, and attention's two.
  assert counts["layer"]["dots"] == 6
  assert counts["layer"]["instructions"] <= {"static": 30, "pool": 34}[program]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_decode_layout_forward_has_the_stacked_forwards_bits(dtype):
  cfg = ModelConfig(**dict(decode_ops.TINY, dtype=dtype))
  params = model.init_params(cfg, 1)
  cache = KVCache.init(cfg, 4, 16)
  fwd = jax.jit(lambda p, t, c: model.forward(cfg, p, t, t * 0 + 3, jnp.ones_like(t), c),
                compiler_options=USER_LEVEL)  # the bits users get
  prompt = jnp.arange(12).reshape(4, 3) + 3
  _, cache = fwd(params, prompt, cache)  # prefill, stacked
  token = jnp.arange(4)[:, None] + 7
  stacked, c1 = fwd(params, token, cache)
  layered, c2 = fwd(model.decode_layout(params), token, cache)
  np.testing.assert_array_equal(np.asarray(stacked, np.float32), np.asarray(layered, np.float32))
  np.testing.assert_array_equal(np.asarray(c1.k, np.float32), np.asarray(c2.k, np.float32))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_one_matmul_over_concatenated_kernels_has_the_separate_matmuls_bits(dtype):
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.normal(size=(8, 1, 256)), dtype)
  kernels = [jnp.asarray(rng.normal(size=s) / 16, dtype) for s in [(256, 8, 32), (256, 2, 32),
                                                                    (256, 2, 32)]]
  separate = jax.jit(lambda x, *k: project(x, *k), compiler_options=USER_LEVEL)(x, *kernels)
  fused = jax.jit(lambda x, *k: project(x, *k, concat=True),
                  compiler_options=USER_LEVEL)(x, *kernels)
  for a, b in zip(separate, fused):
    np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))
