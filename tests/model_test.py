"""Model parity with transformers, cached decode, sharding, shapes."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hf_models import VARIANTS, hf_logits, left_padded_batch, make_hf_model
from tba_jax import hf_checkpoints, model, sharding
from tba_jax.model import KVCache, ModelConfig


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def hf_checkpoint(request, tmp_path_factory):
  hf = make_hf_model(request.param)
  path = str(tmp_path_factory.mktemp(request.param))
  hf.save_pretrained(path)
  return request.param, hf, path


def test_logits_match_transformers_left_padded(hf_checkpoint):
  variant, hf, path = hf_checkpoint
  cfg, params = hf_checkpoints.load(path)
  assert cfg.qkv_bias == (variant == "qwen2")
  tokens, mask = left_padded_batch(np.random.default_rng(0), [11, 6, 1])
  ref = hf_logits(hf, tokens, mask)
  ours = np.asarray(model.logits(cfg, params, tokens, mask))
  assert ours.dtype == np.float32
  real = mask.astype(bool)
  np.testing.assert_allclose(ours[real], ref[real], atol=1e-4, rtol=0)
  # Left padding changes nothing for the real tokens of a row.
  alone = np.asarray(model.logits(cfg, params, tokens[1:2, -6:]))
  np.testing.assert_allclose(alone[0], ours[1, -6:], atol=1e-5, rtol=0)


def test_cached_decode_matches_full_forward(tiny_cfg):
  params = model.init_params(tiny_cfg, seed=1)
  tokens, mask = left_padded_batch(np.random.default_rng(1), [9, 5, 7])
  full = np.asarray(model.logits(tiny_cfg, params, tokens, mask))
  prefill, steps = 4, tokens.shape[1] - 4
  positions = np.asarray(model.positions_from_mask(mask))

  @jax.jit
  def run(params, cache, tok, pos, m):
    hidden, cache = model.forward(tiny_cfg, params, tok, pos, m, cache)
    return model.unembed(tiny_cfg, params, hidden), cache

  cache = KVCache.init(tiny_cfg, batch=3, size=16)
  out, cache = run(params, cache, tokens[:, :prefill], positions[:, :prefill], mask[:, :prefill])
  got = [np.asarray(out)]
  for i in range(prefill, prefill + steps):
    out, cache = run(params, cache, tokens[:, i:i + 1], positions[:, i:i + 1], mask[:, i:i + 1])
    got.append(np.asarray(out))
  got = np.concatenate(got, axis=1)
  real = mask.astype(bool)
  np.testing.assert_allclose(got[real], full[real], atol=1e-5, rtol=0)
  assert int(cache.index) == tokens.shape[1]


def test_fsdp_sharded_logits_equal_single_device(tiny_cfg):
  assert len(jax.devices()) == 8
  params = model.init_params(tiny_cfg, seed=2)
  tokens, mask = left_padded_batch(np.random.default_rng(2), [8, 8, 3, 5])
  ref = np.asarray(model.logits(tiny_cfg, params, tokens, mask))
  mesh = sharding.make_mesh("trainer", jax.devices()[4:])  # 4 of the 8 devices
  shardings = sharding.param_shardings(tiny_cfg, "trainer", mesh)
  sharded = jax.device_put(params, shardings)
  assert sharded["layers"]["attn"]["q"].sharding.spec == jax.sharding.PartitionSpec(
      None, "fsdp", None, None)
  assert len(sharded["embed"].addressable_shards) == 4
  tok = jax.device_put(tokens, sharding.batch_sharding("trainer", mesh))
  m = jax.device_put(mask, sharding.batch_sharding("trainer", mesh))
  out = np.asarray(model.logits(tiny_cfg, sharded, tok, m))
  np.testing.assert_allclose(out, ref, atol=1e-5, rtol=0)


def test_init_params_lands_on_target_sharding(tiny_cfg):
  mesh = sharding.make_mesh("searcher", jax.devices()[:4], tensor=2)
  shardings = sharding.param_shardings(tiny_cfg, "searcher", mesh)
  params = model.init_params(tiny_cfg, seed=0, shardings=shardings)
  assert params["layers"]["attn"]["k"].sharding == shardings["layers"]["attn"]["k"]
  assert shardings["layers"]["attn"]["k"].spec == jax.sharding.PartitionSpec(
      None, None, "tensor", None)


def test_eval_shape_counts_1b_params_without_allocating():
  # RhoMath-1B / TinyLlama-1.1B shape.
  cfg = ModelConfig(vocab_size=32000, dim=2048, mlp_dim=5632, num_layers=22, num_heads=32,
                    num_kv_heads=4, head_dim=64, dtype="bfloat16")
  shapes = model.param_shapes(cfg)
  assert all(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(shapes))
  assert model.count_params(cfg) == 1_100_048_384  # TinyLlama-1.1B's published count
  assert shapes["layers"]["attn"]["q"].shape == (22, 2048, 32, 64)
  assert shapes["layers"]["attn"]["q"].dtype == jnp.bfloat16


def test_bfloat16_params_give_float32_logits(tiny_cfg):
  cfg = tiny_cfg.replace(dtype="bfloat16")
  params = model.init_params(cfg)
  assert params["layers"]["mlp"]["up"].dtype == jnp.bfloat16
  out = model.logits(cfg, params, np.array([[3, 4, 5]]))
  assert out.dtype == jnp.float32
  ref = model.logits(tiny_cfg, jax.tree.map(lambda x: x.astype(jnp.float32), params),
                     np.array([[3, 4, 5]]))
  np.testing.assert_allclose(np.asarray(out), np.asarray(ref), atol=0.1)


def test_bad_model_configs_are_refused():
  with pytest.raises(ValueError, match="num_kv_heads"):
    ModelConfig(vocab_size=8, dim=8, mlp_dim=8, num_layers=1, num_heads=3, num_kv_heads=2,
                head_dim=4)
  with pytest.raises(ValueError, match="dtype"):
    ModelConfig(vocab_size=8, dim=8, mlp_dim=8, num_layers=1, num_heads=2, num_kv_heads=2,
                head_dim=4, dtype="float16")
