"""One token per row from logits: the nucleus found without a sort is the sorted rule, top-k
keeps ties, the draw follows what is kept and never leaves it, log-probs at the token.

(The sampler's tests check the same functions through its decode loop, against transformers.)
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tba_jax import categorical


def _nucleus_by_sorting(x, top_p):
  """transformers' top-p rule: down the sorted vocabulary a token is kept while the mass
  before it is < top_p; the tokens tied with a kept one are kept with it."""
  probs = np.exp(x.astype(np.float64) - x.max())
  probs /= probs.sum()
  order = np.argsort(-x, kind="stable")
  before = np.cumsum(probs[order]) - probs[order]
  return x >= x[order[before < top_p]].min()


@pytest.mark.parametrize("top_p", [0.05, 0.3, 0.9, 0.999])
def test_the_nucleus_found_by_bisection_is_the_sorted_rule(top_p):
  x = np.random.default_rng(0).normal(size=(6, 50)).astype(np.float32) * 2
  x[0, :10] = x[0, 0]  # ties stay together
  x[1, 5:] = -np.inf  # a row truncated before (top-k comes first)
  kept = np.asarray(categorical.truncate(jnp.asarray(x), 0, top_p)) > -np.inf
  np.testing.assert_array_equal(kept, np.stack([_nucleus_by_sorting(r, top_p) for r in x]))


def test_top_k_keeps_the_k_largest_and_their_ties():
  x = jnp.asarray([[3.0, 1.0, 2.0, 2.0, 0.0], [0.0, 1.0, 2.0, 3.0, 4.0]])
  kept = np.asarray(categorical.truncate(x, 2, 1.0)) > -np.inf
  np.testing.assert_array_equal(kept, [[1, 0, 1, 1, 0], [0, 0, 0, 1, 1]])


def test_the_draw_follows_softmax_of_what_is_kept_and_never_leaves_it():
  rows = 20000
  kept = jnp.broadcast_to(jnp.log(jnp.asarray([0.5, 0.3, 0.2, 0.0])), (rows, 4))
  tokens = np.asarray(categorical.draw(kept, jax.random.split(jax.random.key(0), rows)))
  counts = np.bincount(tokens, minlength=4)
  assert counts[3] == 0
  np.testing.assert_allclose(counts[:3] / rows, [0.5, 0.3, 0.2], atol=0.015)


def test_log_prob_of_is_the_log_softmax_at_the_token():
  x = jax.random.normal(jax.random.key(1), (3, 7))
  token = jnp.asarray([0, 6, 3])
  want = jax.nn.log_softmax(x)[jnp.arange(3), token]
  np.testing.assert_allclose(categorical.log_prob_of(x, token), want, atol=1e-6)
