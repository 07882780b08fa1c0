"""Weight publishing: values, dtypes, real copies, and one compile per (dtype, shardings)."""
import contextlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tba_jax import sharding, weight_sync
from tba_jax.model import init_params

LOWERING = "/jax/core/compile/jaxpr_to_mlir_module_duration"  # one per program compiled


@contextlib.contextmanager
def count_compiles():
  seen = []
  listener = lambda event, duration, **kw: seen.append(kw.get("fun_name")) if event == LOWERING \
      else None
  jax.monitoring.register_event_duration_secs_listener(listener)
  try:
    yield seen
  finally:
    jax.monitoring.unregister_event_duration_listener(listener)


@pytest.fixture
def setup(tiny_cfg):
  devices = jax.devices()
  trainer_mesh = sharding.make_mesh("trainer", devices[:2])
  searcher_mesh = sharding.make_mesh("searcher", devices[2:4])
  params = init_params(tiny_cfg, 0, sharding.param_shardings(tiny_cfg, "trainer", trainer_mesh))
  # Several versions of the weights, made before counting (making them compiles too).
  versions = [jax.tree.map(lambda x, i=i: x + i, params) for i in range(5)]
  jax.block_until_ready(versions)
  return (trainer_mesh, sharding.param_shardings(tiny_cfg, "searcher", searcher_mesh),
          versions)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32", None])
def test_publish_compiles_once_per_dtype_and_shardings(setup, dtype):
  trainer_mesh, searcher_sh, versions = setup
  with count_compiles() as compiles:
    first = weight_sync.publish(versions[0], searcher_sh, dtype=dtype)
    jax.block_until_ready(first)
    after_first = len(compiles)
    published = [weight_sync.publish(p, searcher_sh, dtype=dtype) for p in versions[1:]]
    jax.block_until_ready(published)
  assert len(compiles) == after_first, compiles  # every later sync reuses the program
  # float32 -> float32 and None cast nothing: no program at all.
  assert after_first == (1 if dtype == "bfloat16" else 0), compiles
  for i, p in enumerate([first] + published):
    for leaf, src, sh in zip(jax.tree.leaves(p), jax.tree.leaves(versions[i]),
                             jax.tree.leaves(searcher_sh)):
      assert leaf.dtype == jnp.dtype(dtype or src.dtype) and leaf.sharding == sh
      np.testing.assert_array_equal(np.asarray(leaf), np.asarray(src.astype(leaf.dtype)))


def test_multihost_gather_and_snapshot_compile_once(setup):
  trainer_mesh, _, versions = setup
  with count_compiles() as compiles:
    for p in versions:
      full = weight_sync._gather_and_cast(p, "bfloat16", trainer_mesh)
      snap = weight_sync.snapshot(p, "bfloat16")
    jax.block_until_ready((full, snap))
  assert len(compiles) == 2, compiles  # the gather and the snapshot, once each
  leaf = jax.tree.leaves(full)[0]
  assert leaf.dtype == jnp.bfloat16 and leaf.sharding.is_fully_replicated
  assert jax.tree.leaves(snap)[0].sharding == jax.tree.leaves(versions[-1])[0].sharding


def test_published_and_snapshot_weights_survive_the_trainers_donation(setup):
  _, searcher_sh, versions = setup
  src = jax.tree.map(jnp.copy, versions[1])
  want = jax.tree.map(np.asarray, src)
  published = weight_sync.publish(src, searcher_sh)  # same dtype: a device_put copy
  snap = weight_sync.snapshot(src, "float32")        # same dtype: still a copy, not an alias
  for leaf in jax.tree.leaves(src):
    leaf.delete()  # what the donated train state's buffers undergo
  for copy in (published, snap):
    for a, b in zip(jax.tree.leaves(copy), jax.tree.leaves(want)):
      np.testing.assert_array_equal(np.asarray(a), b)
