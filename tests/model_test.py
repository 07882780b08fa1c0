"""Model parity with transformers (Llama family, GPT-NeoX, GPT-2; LM and sequence-
classification heads), cached decode and greedy generation, sharding, shapes."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hf_models import (VARIANTS, hf_logits, hf_scores, left_padded_batch, make_hf_model, make_model,
                       padded_batch)
from tba_jax import hf_checkpoints, model, sharding
from tba_jax.kv_cache import KVCache
from tba_jax.model import ModelConfig


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


@pytest.mark.parametrize("variant", ["llama", "sliding_qk_norm_bias"])
def test_a_prompt_shared_by_k_rows_runs_once_with_the_same_logits_and_gradients(tiny_cfg, variant):
  """completion_logits(prompt_group=K) on runs of K rows that share a left-padded prompt
  (completions of different lengths, right-padded) equals the row-by-row forward in its
  logits and in the gradient of every weight; a batch that is not whole runs is refused."""
  cfg = tiny_cfg if variant == "llama" else tiny_cfg.replace(
      sliding_window=3, sliding_layers=(0,), qk_norm=True, qkv_bias=True)
  params = model.init_params(cfg, seed=3)
  rng = np.random.default_rng(3)
  groups, k, tp, tc = 3, 4, 6, 5
  prompts, prompt_mask = left_padded_batch(rng, [6, 4, 5])
  tokens = np.concatenate([np.repeat(prompts, k, 0), rng.integers(3, cfg.vocab_size,
                                                                  (groups * k, tc))], 1)
  mask = np.concatenate([np.repeat(prompt_mask, k, 0), np.ones((groups * k, tc), np.int32)], 1)
  for row, length in [(1, 3), (5, 1), (10, 4)]:  # shorter completions, right-padded
    mask[row, tp + length:], tokens[row, tp + length:] = 0, 0
  weights = rng.normal(size=(groups * k, tc, cfg.vocab_size)).astype(np.float32)
  logits = jax.jit(lambda p, group: model.completion_logits(cfg, p, tokens, mask, tc,
                                                            prompt_group=group), static_argnums=1)
  grad = jax.jit(jax.grad(lambda p, group: jnp.sum(weights * logits(p, group))), static_argnums=1)
  np.testing.assert_allclose(logits(params, k), logits(params, 1), atol=1e-5, rtol=0)
  shared, plain = grad(params, k), grad(params, 1)
  for a, b in zip(jax.tree.leaves(shared), jax.tree.leaves(plain)):
    np.testing.assert_allclose(a, b, atol=1e-4 * float(np.abs(b).max()) + 1e-6, rtol=0)
  with pytest.raises(ValueError, match="not whole runs"):
    model.completion_logits(cfg, params, tokens[:-1], mask[:-1], tc, prompt_group=k)


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


# ---------------------------------------------------------------------------
# GPT-NeoX, GPT-2 and sequence-classification heads on decoders.
# ---------------------------------------------------------------------------
def _load(name, head, tmp_path_factory, seed=0):
  hf = make_model(name, head, seed=seed)
  path = str(tmp_path_factory.mktemp(f"{name}_{head}"))
  hf.save_pretrained(path)
  return hf, path


@pytest.mark.parametrize("name", ["gpt_neox", "gpt_neox_sequential", "gpt2"])
def test_gpt_neox_and_gpt2_logits_match_transformers_left_and_right_padded(name, tmp_path_factory):
  hf, path = _load(name, "lm", tmp_path_factory)
  cfg, params = hf_checkpoints.load(path)
  if name.startswith("gpt_neox"):  # the switches the checkpoint must set
    assert (cfg.rotary_dim, cfg.norm, cfg.activation) == (4, "layer", "gelu")
    assert cfg.parallel_residual == (name == "gpt_neox") and not cfg.tie_embeddings
  else:
    assert (cfg.position_embedding, cfg.activation, cfg.tie_embeddings) == ("learned", "gelu_tanh", True)
  for side in ("left", "right"):
    tokens, mask = padded_batch(np.random.default_rng(0), [11, 6, 1], side)
    ours = np.asarray(model.logits(cfg, params, tokens, mask))
    real = mask.astype(bool)
    np.testing.assert_allclose(ours[real], hf_logits(hf, tokens, mask)[real], atol=1e-4, rtol=0)


@pytest.mark.parametrize("name", ["llama", "qwen2", "gpt_neox", "gpt2"])
def test_decoder_scores_match_transformers_sequence_classification(name, tmp_path_factory):
  import torch
  hf, path = _load(name, "classifier", tmp_path_factory)
  cfg, params = hf_checkpoints.load(path)
  assert cfg.num_labels == 3 and "score" in params and "lm_head" not in params
  for side in ("left", "right"):
    tokens, mask = padded_batch(np.random.default_rng(1), [9, 4, 1], side)
    ours = np.asarray(model.scores(cfg, params, tokens, mask))
    assert ours.shape == (3, 3) and ours.dtype == np.float32
    np.testing.assert_allclose(ours, hf_scores(hf, tokens, mask), atol=1e-4, rtol=0)
  # No mask: transformers attends every token and reads at the last non-pad id.
  with torch.no_grad():
    want = hf(input_ids=torch.tensor(tokens)).logits.numpy()
  np.testing.assert_allclose(np.asarray(model.scores(cfg, params, tokens)), want, atol=1e-4, rtol=0)
  with pytest.raises(ValueError, match="without an LM head: use model.scores"):
    model.logits(cfg, params, tokens, mask)


def test_scores_of_a_causal_lm_are_refused(tiny_cfg):
  with pytest.raises(ValueError, match="no sequence-classification head"):
    model.scores(tiny_cfg, model.init_params(tiny_cfg), np.array([[3, 4]]))


@pytest.mark.parametrize("name", ["gpt_neox", "gpt2"])
def test_greedy_generate_matches_transformers(name, tmp_path_factory):
  import torch
  from tba_jax import sampler
  hf, path = _load(name, "lm", tmp_path_factory, seed=3)
  cfg, params = hf_checkpoints.load(path)
  prompts = [[5, 9, 17, 33, 4, 8, 60], [7, 11, 3], [99]]
  out = sampler.generate(cfg, params, prompts,
                         sampler.SamplingOptions(max_new_tokens=8, greedy=True))
  # transformers, left-padded like ours (it derives positions from the mask).
  tokens, mask = left_padded_batch(np.random.default_rng(0), [len(p) for p in prompts])
  for i, p in enumerate(prompts):
    tokens[i, tokens.shape[1] - len(p):] = p
  hf.generation_config.eos_token_id = None  # both run all 8 steps
  with torch.no_grad():
    want = hf.generate(input_ids=torch.tensor(tokens), attention_mask=torch.tensor(mask),
                       max_new_tokens=8, do_sample=False, pad_token_id=0).numpy()
  np.testing.assert_array_equal(out.tokens, want[:, tokens.shape[1]:])
  assert len(set(out.tokens.ravel().tolist())) > 8


@pytest.mark.parametrize("name,head", [("gpt_neox", "lm"), ("gpt2", "classifier")])
def test_gpt_neox_and_gpt2_shard_on_a_searcher_mesh_with_equal_outputs(name, head, tmp_path_factory):
  _, path = _load(name, head, tmp_path_factory)
  cfg, ref_params = hf_checkpoints.load(path)
  mesh = sharding.make_mesh("searcher", jax.devices()[:4], tensor=2)
  _, params = hf_checkpoints.load(path, mesh=mesh, role="searcher")
  want = sharding.param_shardings(cfg, "searcher", mesh)
  assert jax.tree.map(lambda x: x.sharding, params) == want
  assert want["layers"]["mlp"]["up_bias"].spec == jax.sharding.PartitionSpec(None, "tensor")
  tokens, mask = left_padded_batch(np.random.default_rng(2), [8, 3, 5, 6])
  rows = sharding.batch_sharding("searcher", mesh)
  fn = model.logits if head == "lm" else model.scores
  got = fn(cfg, params, jax.device_put(tokens, rows), jax.device_put(mask, rows))
  np.testing.assert_allclose(np.asarray(got), np.asarray(fn(cfg, ref_params, tokens, mask)),
                             atol=1e-5, rtol=0)


def test_decoder_embed_is_the_normalised_mean_of_real_hidden_states(tiny_cfg):
  params = model.init_params(tiny_cfg, seed=4)
  tokens, mask = left_padded_batch(np.random.default_rng(3), [6, 2])
  got = np.asarray(model.embed(tiny_cfg, params, tokens, mask))
  positions = model.positions_from_mask(mask)
  hidden, _ = jax.jit(model.forward, static_argnums=0)(tiny_cfg, params, tokens, positions, mask)
  mean = (np.asarray(hidden) * mask[..., None]).sum(1) / mask.sum(1, keepdims=True)
  np.testing.assert_allclose(got, mean / np.linalg.norm(mean, axis=-1, keepdims=True), atol=1e-5)


def test_eval_shape_counts_pythia_160m_and_gpt2_small_params():
  pythia = ModelConfig(vocab_size=50304, dim=768, mlp_dim=3072, num_layers=12, num_heads=12,
                       num_kv_heads=12, head_dim=64, norm="layer", parallel_residual=True,
                       rotary_fraction=0.25, activation="gelu", gated_mlp=False, qkv_bias=True,
                       bias=True, model_type="gpt_neox")
  gpt2 = ModelConfig(vocab_size=50257, dim=768, mlp_dim=3072, num_layers=12, num_heads=12,
                     num_kv_heads=12, head_dim=64, norm="layer", position_embedding="learned",
                     max_position_embeddings=1024, activation="gelu_tanh", gated_mlp=False,
                     qkv_bias=True, bias=True, tie_embeddings=True, model_type="gpt2")
  assert model.count_params(pythia) == 162_322_944  # EleutherAI's published total
  assert model.count_params(gpt2) == 124_439_808  # transformers' GPT2LMHeadModel count


@pytest.mark.parametrize("name", ["gpt_neox", "gpt2"])
def test_bfloat16_layer_norm_models_stay_close_to_float32(name, tmp_path_factory):
  _, path = _load(name, "lm", tmp_path_factory)
  cfg, params = hf_checkpoints.load(path, dtype="bfloat16")
  ref_cfg, ref = hf_checkpoints.load(path)
  assert params["layers"]["attn_norm"]["bias"].dtype == jnp.bfloat16
  tokens = np.array([[3, 4, 5, 6, 7]])
  out = model.logits(cfg, params, tokens)
  assert out.dtype == jnp.float32
  np.testing.assert_allclose(np.asarray(out), np.asarray(model.logits(ref_cfg, ref, tokens)),
                             atol=0.15)
