"""Qwen3, Gemma 3 and sliding-window attention (Gemma 3, Mistral v0.1, Qwen2) against
transformers' PyTorch classes: logits, gradients, greedy generation (static and
streaming), export, sequence classification, sharding, bfloat16, refused configs."""
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hf_models import edit_config, hf_logits, hf_scores, left_padded_batch, make_model, padded_batch
from tba_jax import continuous, hf_checkpoints, logprobs, model, sampler, sharding

FAMILIES = ["qwen3", "gemma3", "mistral_sliding", "qwen2_sliding"]


def _load(name, tmp_path_factory, head="lm", seed=0, **overrides):
  hf = make_model(name, head, seed=seed, **overrides)
  path = str(tmp_path_factory.mktemp(f"{name}_{head}"))
  hf.save_pretrained(path)
  return hf, path


@pytest.fixture(scope="module", params=FAMILIES)
def family(request, tmp_path_factory):
  hf, path = _load(request.param, tmp_path_factory)
  return request.param, hf, path


def test_switches_read_from_config_json(family):
  name, _, path = family
  cfg = hf_checkpoints.read_config(path)
  assert cfg.qk_norm == (name in ("qwen3", "gemma3"))
  assert cfg.qkv_bias == (name == "qwen2_sliding")  # Qwen3 dropped Qwen2's q/k/v biases
  if name == "gemma3":
    assert (cfg.norm, cfg.post_norms, cfg.embed_scale, cfg.activation) == (
        "rms_plus_one", True, True, "gelu_tanh")
    assert cfg.attn_scale == pytest.approx(24 ** -0.5) and cfg.final_logit_softcap == 5.0
    assert (cfg.rope_theta, cfg.local_rope_theta, cfg.rope_scaling.kind) == (1e6, 1e4, "linear")
  want = {"qwen3": (0, ()), "gemma3": (3, (0, 2)), "mistral_sliding": (3, (0, 1)),
          "qwen2_sliding": (4, (1,))}[name]
  assert (cfg.sliding_window, cfg.sliding_layers) == want


def test_logits_match_transformers_left_and_right_padded(family):
  name, hf, path = family
  cfg, params = hf_checkpoints.load(path)
  for side in ("left", "right"):
    tokens, mask = padded_batch(np.random.default_rng(0), [11, 6, 1], side)
    ours = np.asarray(model.logits(cfg, params, tokens, mask))
    real = mask.astype(bool)
    np.testing.assert_allclose(ours[real], hf_logits(hf, tokens, mask)[real], atol=1e-4, rtol=0)
  if cfg.sliding_layers:  # the 11-token row is longer than the window: it is exercised
    wide = cfg.replace(sliding_window=64)
    assert np.abs(np.asarray(model.logits(wide, params, tokens, mask))[0] - ours[0]).max() > 1e-3


@pytest.mark.parametrize("name", ["qwen3", "gemma3"])
def test_training_gradients_match_transformers(name, tmp_path_factory):
  """The training forward (no cache, sliding masks on Gemma's local layers) and its
  backward: d(sum of next-token log-probs of a right-padded batch) / d(every weight)."""
  import torch
  hf, path = _load(name, tmp_path_factory, seed=2)
  cfg, params = hf_checkpoints.load(path)
  tokens, mask = padded_batch(np.random.default_rng(2), [9, 6], "right")
  counted = mask[:, 1:].astype(np.float32)

  def ours(params):
    positions = model.positions_from_mask(mask)
    hidden, _ = model.forward(cfg, params, tokens, positions, mask)
    logits = model.unembed(cfg, params, hidden[:, :-1])
    return jnp.sum(logprobs.token_logprobs(logits, tokens[:, 1:]) * counted)

  value, grads = jax.jit(jax.value_and_grad(ours))(params)
  hf.zero_grad()
  logits = hf(input_ids=torch.tensor(tokens), attention_mask=torch.tensor(mask),
              position_ids=torch.tensor(np.maximum(np.cumsum(mask, -1) - 1, 0))).logits
  lp = torch.log_softmax(logits[:, :-1], -1).gather(-1, torch.tensor(tokens[:, 1:, None]))[..., 0]
  want = (lp * torch.tensor(counted)).sum()
  want.backward()
  np.testing.assert_allclose(float(value), float(want.detach()), rtol=1e-5)
  torch_grads = {k: p.grad.numpy() for k, p in hf.named_parameters()}
  want_grads = hf_checkpoints.load_params(cfg, lambda k: torch_grads[k], "torch grads")
  for (path_, g), w in zip(jax.tree_util.tree_leaves_with_path(grads), jax.tree.leaves(want_grads)):
    scale = max(float(np.abs(w).max()), 1e-3)
    np.testing.assert_allclose(np.asarray(g), np.asarray(w), atol=2e-4 * scale, rtol=0,
                               err_msg=jax.tree_util.keystr(path_))


@pytest.mark.parametrize("name", ["qwen3", "gemma3", "mistral_sliding", "llama3_scaling"])
def test_greedy_generation_static_and_streaming_matches_transformers(name, tmp_path_factory):
  """Prompts longer than the window and 8 new tokens: sliding layers drop slots in the
  prefill and in decode, in static batches and in continuous batching's slots (2
  slots for 3 prompts: a row refills a freed slot). llama3_scaling: Llama 3.1 / 3.2's
  rope scaling (which predates this file)."""
  import torch
  # Untied: a tiny Gemma's scaled, tied embedding makes greedy repeat the last token.
  hf, path = _load(name, tmp_path_factory, seed=3, tie_word_embeddings=False)
  cfg, params = hf_checkpoints.load(path)
  prompts = [[5, 9, 17, 33, 4, 8, 60], [7, 11, 3], [99]]
  options = sampler.SamplingOptions(max_new_tokens=8, greedy=True)
  static = sampler.generate(cfg, params, prompts, options)
  streaming = continuous.generate(
      sampler.Sampler(cfg, options), params,
      prompts, jax.random.key(0), num_slots=2, window_step=4, chunk_steps=3)
  tokens, mask = left_padded_batch(np.random.default_rng(0), [len(p) for p in prompts])
  for i, p in enumerate(prompts):
    tokens[i, tokens.shape[1] - len(p):] = p
  hf.generation_config.eos_token_id = None  # all 8 steps
  with torch.no_grad():
    want = hf.generate(input_ids=torch.tensor(tokens), attention_mask=torch.tensor(mask),
                       max_new_tokens=8, do_sample=False, pad_token_id=0).numpy()
  want = want[:, tokens.shape[1]:]
  np.testing.assert_array_equal(static.tokens, want)
  np.testing.assert_array_equal(streaming.tokens, want)
  assert len(set(want.ravel().tolist())) > 8  # context-dependent, not one repeated token


@pytest.mark.parametrize("name", FAMILIES)
def test_save_hf_round_trip_through_transformers(name, tmp_path):
  import transformers
  hf = make_model(name, "lm", seed=5)
  hf.save_pretrained(str(tmp_path / "src"))
  cfg, params = hf_checkpoints.load(str(tmp_path / "src"))
  out = str(tmp_path / "export")
  hf_checkpoints.save_hf(cfg, params, out)
  assert hf_checkpoints.read_config(out) == cfg
  reloaded = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
  assert type(reloaded) is type(hf)
  with open(os.path.join(out, "config.json")) as f:
    assert json.load(f)["architectures"] == [type(hf).__name__]
  tokens, mask = padded_batch(np.random.default_rng(5), [9, 3], "left")
  np.testing.assert_allclose(hf_logits(reloaded, tokens, mask), hf_logits(hf, tokens, mask),
                             atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", ["qwen3", "gemma3"])
def test_scores_match_transformers_sequence_classification(name, tmp_path_factory):
  hf, path = _load(name, tmp_path_factory, head="classifier", seed=1)
  cfg, params = hf_checkpoints.load(path)
  assert cfg.num_labels == 3 and "lm_head" not in params
  for side in ("left", "right"):
    tokens, mask = padded_batch(np.random.default_rng(1), [9, 4, 1], side)
    np.testing.assert_allclose(np.asarray(model.scores(cfg, params, tokens, mask)),
                               hf_scores(hf, tokens, mask), atol=1e-4, rtol=0)


@pytest.mark.parametrize("role,tensor", [("trainer", 2), ("searcher", 2)])
def test_every_leaf_has_a_rule_and_sharded_logits_are_equal(family, role, tensor):
  name, _, path = family
  cfg, ref = hf_checkpoints.load(path)
  mesh = sharding.make_mesh(role, jax.devices()[:4], tensor=tensor)
  _, params = hf_checkpoints.load(path, mesh=mesh, role=role)
  assert jax.tree.map(lambda x: x.sharding, params) == sharding.param_shardings(cfg, role, mesh)
  tokens, mask = left_padded_batch(np.random.default_rng(2), [8, 3, 5, 6])
  rows = sharding.batch_sharding(role, mesh)
  got = model.logits(cfg, params, jax.device_put(tokens, rows), jax.device_put(mask, rows))
  np.testing.assert_allclose(np.asarray(got), np.asarray(model.logits(cfg, ref, tokens, mask)),
                             atol=1e-5, rtol=0)


def test_gemma3_bfloat16_stays_close_to_float32(tmp_path_factory):
  _, path = _load("gemma3", tmp_path_factory)
  cfg, params = hf_checkpoints.load(path, dtype="bfloat16")
  ref_cfg, ref = hf_checkpoints.load(path)
  assert params["layers"]["attn"]["q_norm"]["scale"].dtype == jnp.bfloat16
  tokens = np.array([[3, 4, 5, 6, 7, 8]])
  out = model.logits(cfg, params, tokens)
  assert out.dtype == jnp.float32
  np.testing.assert_allclose(np.asarray(out), np.asarray(model.logits(ref_cfg, ref, tokens)),
                             atol=0.15)


def test_eval_shape_counts_published_parameter_totals():
  # Qwen/Qwen3-0.6B and google/gemma-3-1b-it config.json values (tied embeddings).
  qwen3 = model.ModelConfig(vocab_size=151936, dim=1024, mlp_dim=3072, num_layers=28,
                            num_heads=16, num_kv_heads=8, head_dim=128, tie_embeddings=True,
                            qk_norm=True, model_type="qwen3")
  gemma = model.ModelConfig(vocab_size=262144, dim=1152, mlp_dim=6912, num_layers=26, num_heads=4,
                            num_kv_heads=1, head_dim=256, tie_embeddings=True, qk_norm=True,
                            post_norms=True, norm="rms_plus_one", model_type="gemma3_text")
  assert model.count_params(qwen3) == 596_049_920  # transformers' Qwen3ForCausalLM count
  assert model.count_params(gemma) == 999_885_952  # transformers' Gemma3ForCausalLM count


def test_unsupported_gemma3_configs_are_named(tmp_path_factory, tmp_path):
  _, path = _load("gemma3", tmp_path_factory)
  cases = [(dict(model_type="gemma3", architectures=["Gemma3ForConditionalGeneration"]),
            "multimodal Gemma 3"),
           (dict(use_bidirectional_attention=True), "use_bidirectional_attention"),
           (dict(attn_logit_softcapping=50.0), "attn_logit_softcapping"),
           (dict(layer_types=["sliding_attention", "chunked_attention"] * 2), "layer_types")]
  for changes, match in cases:
    with pytest.raises(ValueError, match=match):
      hf_checkpoints.read_config(edit_config(path, tmp_path, **changes))
    import shutil
    shutil.rmtree(tmp_path / "edited")


def test_gemma3_config_json_of_older_transformers_reads_the_same(tmp_path_factory, tmp_path):
  """Files written before transformers 5 say rope_theta / rope_local_base_freq /
  rope_scaling and sliding_window_pattern instead of per-type rope_parameters and
  layer_types (google/gemma-3-1b-it's config.json)."""
  _, path = _load("gemma3", tmp_path_factory)
  new = hf_checkpoints.read_config(path)
  c = json.loads(open(os.path.join(path, "config.json")).read())
  for key in ("rope_parameters", "layer_types", "tie_word_embeddings"):
    c.pop(key)
  c.update(rope_theta=1e6, rope_local_base_freq=1e4, sliding_window_pattern=2,
           rope_scaling={"rope_type": "linear", "factor": 4.0})
  os.makedirs(tmp_path / "old")
  (tmp_path / "old" / "config.json").write_text(json.dumps(c))
  assert hf_checkpoints.read_config(str(tmp_path / "old")) == new
