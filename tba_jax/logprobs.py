"""Log-probabilities of tokens under logits: the tempered log-softmax picked at the
tokens, its entropy in the same pass, and sums over a completion's counted tokens.

Pure functions of arrays (imports nothing of tba_jax), the lowest layer of the log-probs:
the model's completion log-probs (model.completion_token_logprobs), the losses and the
update all read them from here, so none of them imports another for a log-softmax.
Shapes: logits [N, T, V], tokens and masks [N, T]; logits[:, t] is the distribution of
tokens[:, t].
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

Array = jax.Array


def token_logprobs(logits: Array, tokens: Array, temperature: float = 1.0) -> Array:
  """log softmax(logits / T)[tokens]: [N, T] from logits [N, T, V], tokens [N, T].

  logits[:, t] is the distribution of tokens[:, t]. Computed in float32 as
  logit - logsumexp, which never materialises a second [N, T, V] array.
  """
  logits = logits.astype(jnp.float32) / temperature
  picked = jnp.take_along_axis(logits, tokens[..., None].astype(jnp.int32), axis=-1)[..., 0]
  return picked - jax.nn.logsumexp(logits, axis=-1)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def token_logprobs_and_entropy(logits: Array, tokens: Array,
                               temperature: float = 1.0) -> tuple[Array, Array]:
  """(token_logprobs, token_entropy) of the same logits in two passes over [N, T, V].

  What the trainer needs of its completion logits: token_logprobs above and the
  per-token entropy H = logsumexp(z) - sum_v softmax(z)_v z_v of z = logits / T (a
  diagnostic of how spread out the tempered policy is where the completions were
  sampled), in one max and one exp pass forward and one exp pass backward, where
  autodiff of the two formulas spends three exp passes and materialises z (SmolLM2-135M
  on 32 x 56 tokens, 2-core CPU: 12.9 -> 11.8 s an update; LAB_LOG.md, "Trainer step").
  The entropy is not differentiated (its cotangent is ignored); the log-probs' gradient
  w.r.t. the logits is (onehot(tokens) - softmax(z)) / T.
  """
  return _logprobs_entropy_fwd(logits, tokens, temperature)[0]


def _logprobs_entropy_fwd(logits, tokens, temperature):
  z = logits.astype(jnp.float32) / temperature
  top = jnp.max(z, axis=-1, keepdims=True)
  e = jnp.exp(z - top)
  total = jnp.sum(e, axis=-1)
  lse = top[..., 0] + jnp.log(total)
  picked = jnp.take_along_axis(z, tokens[..., None].astype(jnp.int32), axis=-1)[..., 0]
  entropy = lse - jnp.sum(e * z, axis=-1) / total
  return (picked - lse, entropy), (logits, tokens, lse)


def _logprobs_entropy_bwd(temperature, residuals, cotangents):
  logits, tokens, lse = residuals
  g = cotangents[0] / temperature  # the entropy's cotangent is ignored (a diagnostic)
  z = logits.astype(jnp.float32) / temperature
  onehot = jnp.arange(logits.shape[-1]) == tokens[..., None]
  d_logits = g[..., None] * (onehot - jnp.exp(z - lse[..., None]))
  return d_logits.astype(logits.dtype), None  # tokens: integers, no cotangent


token_logprobs_and_entropy.defvjp(_logprobs_entropy_fwd, _logprobs_entropy_bwd)


def sequence_logprobs(logits: Array, tokens: Array, mask: Array,
                      temperature: float = 1.0) -> Array:
  """Summed (not length-normalised) log-probs [N] of the tokens where mask > 0."""
  return masked_sum(token_logprobs(logits, tokens, temperature), mask)


def masked_sum(per_token: Array, mask: Array) -> Array:
  """Sum over the last axis of the entries where mask > 0 ([N, T] -> [N])."""
  return jnp.sum(jnp.where(mask > 0, per_token, 0.0), axis=-1)


def completion_mask(lengths: Array, ended: Array, num_columns: int,
                    include_eos: bool = True) -> Array:
  """[N, num_columns] float32 mask of the completion tokens counted in log pi.

  lengths [N]: generated tokens per row, the EOS token included when the row
  ended with one (ended [N] bool; False = cut off at the length limit).
  include_eos=False drops the EOS token itself (the authors' pad == eos case: their
  code drops it, a clean setup counts it). Tokens after the first EOS are never counted.
  """
  lengths = jnp.asarray(lengths, jnp.int32)
  drop_eos = jnp.logical_and(jnp.asarray(ended, bool), not include_eos)
  counted = lengths - drop_eos.astype(jnp.int32)
  return (jnp.arange(num_columns)[None, :] < counted[:, None]).astype(jnp.float32)
