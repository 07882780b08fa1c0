"""Shared building blocks against their PyTorch / transformers counterparts."""
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tba_jax import layers


def test_layer_norm_matches_torch():
  import torch
  rng = np.random.default_rng(0)
  x = rng.normal(size=(2, 3, 16)).astype(np.float32) * 3 + 1
  norm = layers.Norm(16, "layer", 1e-5, jnp.float32, nnx.Rngs(0))
  norm.scale[...] = rng.normal(size=16).astype(np.float32)
  norm.bias[...] = rng.normal(size=16).astype(np.float32)
  ref = torch.nn.LayerNorm(16, eps=1e-5)
  with torch.no_grad():
    ref.weight.copy_(torch.tensor(np.asarray(norm.scale[...])))
    ref.bias.copy_(torch.tensor(np.asarray(norm.bias[...])))
    want = ref(torch.tensor(x)).numpy()
  np.testing.assert_allclose(np.asarray(norm(jnp.asarray(x))), want, atol=1e-5)


def test_rms_norm_has_no_bias_and_matches_its_formula():
  x = np.random.default_rng(1).normal(size=(2, 8)).astype(np.float32)
  norm = layers.Norm(8, "rms", 1e-6, jnp.float32, nnx.Rngs(0))
  assert not hasattr(norm, "bias")
  want = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + 1e-6)
  np.testing.assert_allclose(np.asarray(norm(jnp.asarray(x))), want, atol=1e-6)


@pytest.mark.parametrize("ours,theirs", [("silu", "silu"), ("gelu", "gelu"),
                                         ("gelu_tanh", "gelu_new")])
def test_activations_match_transformers(ours, theirs):
  import torch
  from transformers.activations import ACT2FN
  x = np.linspace(-6, 6, 101, dtype=np.float32)
  want = ACT2FN[theirs](torch.tensor(x)).numpy()
  np.testing.assert_allclose(np.asarray(layers.ACTIVATION_FNS[ours](jnp.asarray(x))), want,
                             atol=1e-6)


def test_partial_rotary_matches_gpt_neox_and_leaves_the_rest():
  import torch
  from transformers.models.gpt_neox import modeling_gpt_neox as neox

  class Cfg:  # the fields rope_inv_freq reads
    rotary_dim, rope_theta, rope_scaling = 4, 10000.0, None

  rng = np.random.default_rng(2)
  q = rng.normal(size=(2, 5, 3, 16)).astype(np.float32)  # [B,T,N,H]
  positions = np.array([[0, 0, 1, 2, 3], [0, 1, 2, 3, 4]])
  inv_freq = layers.rope_inv_freq(Cfg)
  got = np.asarray(layers.apply_rope(jnp.asarray(q), jnp.asarray(positions), inv_freq))
  freqs = positions[..., None] * inv_freq
  emb = torch.tensor(np.concatenate([freqs, freqs], -1), dtype=torch.float32)
  qt = torch.tensor(q).transpose(1, 2)  # transformers' [B,N,T,H]
  want, _ = neox.apply_rotary_pos_emb(qt, qt, emb.cos(), emb.sin())
  np.testing.assert_allclose(got, want.transpose(1, 2).numpy(), atol=1e-6)
  np.testing.assert_array_equal(got[..., 4:], q[..., 4:])


def test_mean_pool_normalized_ignores_padding():
  hidden = np.random.default_rng(3).normal(size=(2, 4, 6)).astype(np.float32)
  mask = np.array([[1, 1, 0, 0], [0, 1, 1, 1]])
  got = np.asarray(layers.mean_pool_normalized(jnp.asarray(hidden), jnp.asarray(mask)))
  for row, m in zip(range(2), mask.astype(bool)):
    mean = hidden[row, m].mean(0)
    np.testing.assert_allclose(got[row], mean / np.linalg.norm(mean), atol=1e-6)


# -----------------------------------------------------------------------------
# Dropout (model.dropout: the trainer's forward)
# -----------------------------------------------------------------------------
def test_dropout_zeroes_a_rate_of_units_and_scales_the_rest_reproducibly():
  import jax
  drop = layers.Dropout(jax.random.key(0), 0.1)
  x = jnp.ones((200, 500), jnp.float32)
  y = np.asarray(drop(x, 0))
  zeroed = np.mean(y == 0)
  assert abs(zeroed - 0.1) < 5 * np.sqrt(0.1 * 0.9 / y.size), zeroed
  np.testing.assert_array_equal(y[y != 0], np.float32(1 / 0.9))  # torch's inverted dropout
  np.testing.assert_array_equal(np.asarray(drop(x, 0)), y)  # same key and site: same mask
  assert np.mean(np.asarray(drop(x, 1)) != y) > 0.1  # another site: another mask
  assert layers.dropped(x, None, 0) is x  # off: not even an operation


GPT2_SHAPED = dict(vocab_size=64, dim=32, mlp_dim=64, num_layers=2, num_heads=2, num_kv_heads=2,
                   head_dim=16, norm="layer", position_embedding="learned",
                   activation="gelu_tanh", gated_mlp=False, qkv_bias=True, bias=True,
                   tie_embeddings=True, model_type="gpt2", max_position_embeddings=64)


@pytest.mark.parametrize("parallel", [False, True], ids=["gpt2", "neox_parallel"])
def test_the_forward_with_dropout_is_the_plain_one_when_nothing_is_dropped(parallel):
  """Dropout's path (an explicit attention that can drop probabilities) computes the
  plain forward's function: with a rate that drops nothing the two agree; with 0.1 the
  hidden states change, the same key reproducing them and another key not."""
  import jax
  from tba_jax import model
  cfg = model.ModelConfig(**GPT2_SHAPED, parallel_residual=parallel)
  params = model.init_params(cfg, 0)
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, 64, (3, 7)), jnp.int32)
  mask = jnp.asarray([[1] * 7, [0, 0] + [1] * 5, [0] * 6 + [1]], jnp.int32)
  positions = model.positions_from_mask(mask)
  forward = jax.jit(lambda key, rate: model.forward(
      cfg, params, tokens, positions, mask, dropout=layers.Dropout(key, rate))[0],
      static_argnums=1)
  plain = np.asarray(model.forward(cfg, params, tokens, positions, mask)[0])
  real = np.asarray(mask, bool)
  np.testing.assert_allclose(np.asarray(forward(jax.random.key(0), 1e-12))[real], plain[real],
                             atol=2e-5)
  dropped = np.asarray(forward(jax.random.key(0), 0.1))
  assert np.max(np.abs(dropped - plain)[real]) > 1e-2
  np.testing.assert_array_equal(np.asarray(forward(jax.random.key(0), 0.1)), dropped)
  assert np.max(np.abs(np.asarray(forward(jax.random.key(1), 0.1)) - dropped)[real]) > 1e-2
