"""Token log-probs, their fused entropy and the completion mask against NumPy in float64."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tba_jax import logprobs


def test_completion_mask_eos_switch():
  lengths = np.array([3, 5, 2, 0])
  ended = np.array([True, False, True, False])  # row 1 was cut at the length limit
  with_eos = np.asarray(logprobs.completion_mask(lengths, ended, 5))
  without = np.asarray(logprobs.completion_mask(lengths, ended, 5, include_eos=False))
  np.testing.assert_array_equal(with_eos, [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1],
                                           [1, 1, 0, 0, 0], [0, 0, 0, 0, 0]])
  np.testing.assert_array_equal(without, [[1, 1, 0, 0, 0], [1, 1, 1, 1, 1],
                                          [1, 0, 0, 0, 0], [0, 0, 0, 0, 0]])
  # The switch changes log pi by exactly the EOS token's log-prob.
  rng = np.random.default_rng(6)
  logits = rng.normal(size=(4, 5, 11)).astype(np.float32)
  tokens = rng.integers(0, 11, (4, 5))
  lp = np.asarray(logprobs.token_logprobs(logits, tokens))
  diff = (logprobs.sequence_logprobs(logits, tokens, with_eos)
          - logprobs.sequence_logprobs(logits, tokens, without))
  np.testing.assert_allclose(diff, [lp[0, 2], 0, lp[2, 1], 0], rtol=1e-6)


def test_token_and_sequence_logprobs_are_tempered_log_softmax():
  rng = np.random.default_rng(7)
  logits = rng.normal(0, 3, (3, 6, 17)).astype(np.float32)
  tokens = rng.integers(0, 17, (3, 6))
  mask = (rng.random((3, 6)) < 0.7).astype(np.float32)
  t = 0.7
  z = logits.astype(np.float64) / t
  log_softmax = z - np.log(np.exp(z - z.max(-1, keepdims=True)).sum(-1, keepdims=True)) - z.max(-1, keepdims=True)
  want = np.take_along_axis(log_softmax, tokens[..., None], -1)[..., 0]
  np.testing.assert_allclose(logprobs.token_logprobs(logits, tokens, t), want, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(logprobs.sequence_logprobs(logits, tokens, mask, t),
                             (want * mask).sum(-1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [np.float32, jnp.bfloat16])
def test_fused_logprobs_and_entropy_match_float64_and_their_gradient_is_analytic(dtype):
  """token_logprobs_and_entropy: the tempered log-softmax at the tokens and the entropy
  of softmax(logits / T), as NumPy computes them in float64; its gradient (a custom VJP)
  is g (onehot - softmax) / T from the log-probs' cotangent g alone (the entropy is a
  diagnostic), in the logits' dtype."""
  rng = np.random.default_rng(8)
  logits = jnp.asarray(rng.normal(0, 3, (3, 6, 17)), dtype)
  tokens = rng.integers(0, 17, (3, 6))
  g = rng.normal(size=(3, 6))
  t = 0.7
  z = np.asarray(logits, np.float64) / t
  log_softmax = z - z.max(-1, keepdims=True)
  log_softmax -= np.log(np.exp(log_softmax).sum(-1, keepdims=True))
  p = np.exp(log_softmax)
  lp, entropy = logprobs.token_logprobs_and_entropy(logits, tokens, t)
  np.testing.assert_allclose(lp, np.take_along_axis(log_softmax, tokens[..., None], -1)[..., 0],
                             rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(entropy, -(p * log_softmax).sum(-1), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(lp, logprobs.token_logprobs(logits, tokens, t), rtol=1e-6, atol=1e-6)

  def objective(x):  # the entropy enters too: its gradient must not
    lp, entropy = logprobs.token_logprobs_and_entropy(x, tokens, t)
    return jnp.sum(g * lp) + 5.0 * jnp.sum(entropy)

  grad = jax.grad(objective)(logits)
  assert grad.dtype == logits.dtype
  want = g[..., None] * (np.eye(17)[tokens] - p) / t
  tol = 1e-5 if dtype == np.float32 else 2e-2
  np.testing.assert_allclose(np.asarray(grad, np.float64), want, rtol=tol, atol=tol)
