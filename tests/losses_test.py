"""TB loss, baselines, schedules and masks against independent NumPy references."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tba_jax import losses, train_step
from tba_jax.batch import TrainBatch

# Ids are arbitrary (negative, large, non-contiguous); group sizes 1..5; the
# rows are shuffled so no group is contiguous.
GROUP_SIZES = {7: 3, -4: 1, 1000: 5, 42: 2, 3: 4}


def shuffled_groups(rng):
  ids = np.concatenate([np.full(n, g, np.int32) for g, n in GROUP_SIZES.items()])
  return rng.permutation(ids)


def random_inputs(seed):
  rng = np.random.default_rng(seed)
  ids = shuffled_groups(rng)
  n = len(ids)
  policy = rng.normal(-20, 5, n).astype(np.float32)
  ref = policy + rng.normal(0, 1, n).astype(np.float32)
  behaviour = policy + rng.normal(0, 2, n).astype(np.float32)
  rewards = rng.integers(0, 2, n).astype(np.float32) + rng.normal(0, 0.1, n).astype(np.float32)
  return policy, ref, behaviour, rewards, ids


def np_group_mean(x, ids):
  x = x.astype(np.float64)
  return np.array([x[ids == g].mean() for g in ids])


def np_tb(policy, ref, rewards, ids, beta, weights=None):
  d = policy.astype(np.float64) - ref - rewards / beta
  log_z = -np_group_mean(d, ids)
  res = log_z + d
  w = np.ones_like(res) if weights is None else weights
  return np.mean(w * res ** 2), log_z, res


def test_trajectory_balance_matches_numpy_with_shuffled_unequal_groups():
  policy, ref, _, rewards, ids = random_inputs(0)
  beta = 0.3
  want_loss, want_log_z, want_res = np_tb(policy, ref, rewards, ids, beta)
  loss, aux = jax.jit(losses.trajectory_balance)(policy, ref, rewards, ids, beta)
  np.testing.assert_allclose(loss, want_loss, rtol=1e-5)
  np.testing.assert_allclose(aux.log_z, want_log_z, rtol=1e-5, atol=1e-4)
  np.testing.assert_allclose(aux.residuals, want_res, rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(aux.kl, np.mean(policy - ref), rtol=1e-5)
  # The singleton group's residual is exactly zero (log Z absorbs it).
  assert abs(float(aux.residuals[ids == -4][0])) < 1e-5


def test_tb_gradient_is_scaled_residual_and_log_z_is_detached():
  policy, ref, _, rewards, ids = random_inputs(1)
  beta = 0.5
  _, _, res = np_tb(policy, ref, rewards, ids, beta)
  grad = jax.grad(lambda p: losses.trajectory_balance(p, ref, rewards, ids, beta)[0])(policy)
  np.testing.assert_allclose(grad, 2 * res / len(ids), rtol=1e-4, atol=1e-5)
  # Detached: log Z does not depend on the policy under differentiation.
  dlogz = jax.jacobian(lambda p: losses.trajectory_balance(p, ref, rewards, ids, beta)[1].log_z)(policy)
  assert np.all(np.asarray(dlogz) == 0)


def test_tb_loss_is_invariant_to_row_order():
  policy, ref, _, rewards, ids = random_inputs(2)
  perm = np.random.default_rng(3).permutation(len(ids))
  a, aux_a = losses.trajectory_balance(policy, ref, rewards, ids, 0.2)
  b, aux_b = losses.trajectory_balance(policy[perm], ref[perm], rewards[perm], ids[perm], 0.2)
  np.testing.assert_allclose(a, b, rtol=1e-6)
  np.testing.assert_allclose(np.asarray(aux_a.log_z)[perm], aux_b.log_z, rtol=1e-6)


def test_tb_grouping_is_by_id_not_by_position():
  # Same values, ids relabelled: a contiguous [P, R] reshape would disagree.
  policy, ref, _, rewards, ids = random_inputs(4)
  remap = {g: i * 13 + 5 for i, g in enumerate(GROUP_SIZES)}
  relabelled = np.array([remap[g] for g in ids], np.int32)
  a, _ = losses.trajectory_balance(policy, ref, rewards, ids, 0.2)
  b, _ = losses.trajectory_balance(policy, ref, rewards, relabelled, 0.2)
  np.testing.assert_allclose(a, b, rtol=1e-6)
  merged = np.where(ids == 7, 42, ids)  # merging two groups changes log Z
  c, _ = losses.trajectory_balance(policy, ref, rewards, merged, 0.2)
  assert abs(float(c) - float(a)) > 1e-3 * float(a)


def test_ratio_clip_weights_squared_residuals_without_gradient():
  policy, ref, behaviour, rewards, ids = random_inputs(5)
  beta, clip = 0.4, 2.0
  w = np.minimum(np.exp(policy.astype(np.float64) - behaviour), clip)
  assert (w == clip).any() and (w < clip).any()
  want, _, res = np_tb(policy, ref, rewards, ids, beta, weights=w)
  fn = lambda p: losses.trajectory_balance(p, ref, rewards, ids, beta, behaviour_logprobs=behaviour,
                                           switches=losses.TBSwitches(ratio_clip=clip))
  loss, aux = fn(policy)
  np.testing.assert_allclose(loss, want, rtol=1e-5)
  np.testing.assert_allclose(aux.weights, w, rtol=1e-5)
  # The weight is a constant: grad = (2/N) w * residual.
  grad = jax.grad(lambda p: fn(p)[0])(policy)
  np.testing.assert_allclose(grad, 2 * w * res / len(ids), rtol=1e-4, atol=1e-5)
  # Off by default, and the default equals an unreachable clip on-policy.
  off, aux_off = losses.trajectory_balance(policy, ref, rewards, ids, beta)
  on_policy, _ = losses.trajectory_balance(policy, ref, rewards, ids, beta,
                                           behaviour_logprobs=policy,
                                           switches=losses.TBSwitches(ratio_clip=8.0))
  np.testing.assert_allclose(off, on_policy, rtol=1e-6)
  assert np.all(np.asarray(aux_off.weights) == 1)
  with pytest.raises(ValueError, match="behaviour_logprobs"):
    losses.trajectory_balance(policy, ref, rewards, ids, beta,
                              switches=losses.TBSwitches(ratio_clip=clip))


def authors_beta(u, beta_0, beta_final, d, stop):
  return beta_final * (u - 1) / d + beta_0 * (1 - (u - 1) / d) if u < stop else beta_final


def np_huber_location(x, clip):
  """The m with sum clip(x - m, -clip, clip) = 0, by float64 bisection."""
  lo, hi = x.min() - clip, x.max() + clip
  for _ in range(200):
    mid = (lo + hi) / 2
    lo, hi = (mid, hi) if np.clip(x - mid, -clip, clip).sum() > 0 else (lo, mid)
  return (lo + hi) / 2


def test_residual_clip_is_huber_around_the_groups_huber_estimate_of_log_z():
  policy, ref, _, rewards, ids = random_inputs(6)
  beta, clip = 0.4, 1.5
  d = policy.astype(np.float64) - ref - rewards / beta
  log_z = -np.array([np_huber_location(d[ids == g], clip) for g in ids])
  res = log_z + d
  size = np.abs(res)
  assert (size > clip).any() and (size[size > 0] < clip).any()
  huber = np.where(size <= clip, res ** 2, 2 * clip * size - clip ** 2)
  switches = losses.TBSwitches(residual_clip=clip)
  fn = jax.jit(lambda p: losses.trajectory_balance(p, ref, rewards, ids, beta, switches=switches))
  loss, aux = fn(policy)
  np.testing.assert_allclose(aux.log_z, log_z, rtol=1e-5)
  np.testing.assert_allclose(loss, huber.mean(), rtol=1e-5)
  np.testing.assert_allclose(aux.residuals, res, rtol=1e-4, atol=1e-4)  # reported unclipped
  # log Z detached, each sequence's gradient is (2/N) clip(residual, -c, c).
  grad = jax.grad(lambda p: fn(p)[0])(policy)
  np.testing.assert_allclose(grad, 2 * np.clip(res, -clip, clip) / len(ids), rtol=1e-4, atol=1e-5)
  # A cap no residual reaches is the plain loss (the Huber estimate is then the mean).
  _, _, plain_res = np_tb(policy, ref, rewards, ids, beta)
  plain = losses.trajectory_balance(policy, ref, rewards, ids, beta)[0]
  wide = losses.trajectory_balance(policy, ref, rewards, ids, beta,
                                   switches=losses.TBSwitches(
                                       residual_clip=float(np.abs(plain_res).max()) + 1))[0]
  np.testing.assert_allclose(wide, plain, rtol=1e-6)


def test_huber_clipped_tb_gradient_sums_to_zero_per_prompt():
  """K = 8, seven right and one wrong, beta 0.05, c = 4: clipping residuals around the mean
  summed the group's gradient to -3.4 (a push up every log pi); around the Huber estimate
  of log Z it sums to 0, and the wrong sample's weight is still capped at 2c / N."""
  rng = np.random.default_rng(9)
  order = rng.permutation(16)
  ids = np.repeat(np.int32([4, 11]), 8)[order]
  rewards = np.tile(np.float32([0, 1, 1, 1, 1, 1, 1, 1]), 2)[order]
  policy = rng.normal(-20, 3, 16).astype(np.float32)
  ref = (policy + rng.normal(0, 1, 16)).astype(np.float32)
  grad = jax.jit(jax.grad(lambda p: losses.trajectory_balance(
      p, ref, rewards, ids, 0.05, switches=losses.TBSwitches(residual_clip=4.0))[0]))(policy)
  for g in (4, 11):
    assert abs(float(np.sum(grad[ids == g]))) < 1e-5
  wrong = rewards == 0
  np.testing.assert_allclose(grad[wrong], 2 * 4.0 / 16, rtol=1e-6)  # the cap binds on them
  assert np.all(np.abs(grad) <= 2 * 4.0 / 16 + 1e-6)


def test_huber_location_solves_its_estimating_equation_for_any_spread():
  """Heavy tails, ties, few inliers, a group of one: sum psi(x - m) = 0 to float rounding."""
  rng = np.random.default_rng(10)
  ids = rng.permutation(np.repeat(np.int32([0, 1, 2, 3, 4]), [1, 3, 8, 20, 8]))
  cases = [(rng.standard_cauchy(40) * 300 - 50, 4.0), (rng.normal(0, 1, 40), 20.0),
           (np.where(rng.random(40) < 0.6, -20.0, 0.0) + rng.normal(0, 0.01, 40), 0.5)]
  solve = jax.jit(losses.huber_location)
  for x, clip in cases:
    x = x.astype(np.float32)
    m = np.asarray(solve(x, ids, clip), np.float64)
    for g in range(5):
      sel = ids == g
      rounding = sel.sum() * np.spacing(np.float32(np.abs(x[sel]).max() + clip))
      assert abs(np.clip(x[sel] - m[sel][0], -clip, clip).sum()) <= 2 * rounding, (clip, g)


def _token_batch(rng, identical: bool):
  """Two groups of 3 rows x 5 completion columns (the last rows shorter), per-token log-probs."""
  n, t = 6, 5
  mask = np.ones((n, t), np.float32)
  mask[[2, 5], 3:] = 0.0
  ref = rng.normal(-1.5, 0.7, (n, t)).astype(np.float32)
  policy = np.where(mask > 0, rng.normal(-0.4, 0.3, (n, t)), 0.0).astype(np.float32)
  if identical:  # each group's three samples are one completion, with one reward
    ref, policy, mask = (np.repeat(x[::3], 3, axis=0) for x in (ref, policy, mask))
  rewards = np.float32([1, 1, 1, 0, 0, 0] if identical else [1, 0, 1, 0, 0, 0])
  ints = np.zeros((n, 8), np.int32)
  batch = TrainBatch(tokens=ints, attention_mask=ints, completion_mask=mask, ref_logprobs=ref,
                     behaviour_logprobs=policy, rewards=rewards,
                     group_ids=np.repeat(np.int32([5, 9]), 3), prompt_ids=np.zeros(n, np.int32),
                     versions=np.zeros(n, np.int32))
  return policy, batch


def test_token_kl_adds_the_k3_penalty_and_pulls_identical_groups_to_the_reference():
  beta, c = 0.05, 0.03
  policy, batch = _token_batch(np.random.default_rng(7), identical=False)
  mask, ref = batch.completion_mask, batch.ref_logprobs
  k3 = np.where(mask > 0, np.exp(ref - policy) - (ref - policy) - 1, 0.0)
  assert (k3 >= 0).all() and (k3[mask > 0] > 0).all()
  np.testing.assert_allclose(losses.token_k3(policy, ref, mask), k3, rtol=1e-5, atol=1e-6)
  plain = lambda p: train_step.tb_loss(p, batch, beta)[0]
  fn = lambda p: train_step.tb_loss(p, batch, beta, token_kl_coef=c)
  loss, metrics = fn(policy)
  np.testing.assert_allclose(loss, plain(policy) + 2 / beta * c * k3.sum(1).mean(), rtol=1e-5)
  np.testing.assert_allclose(metrics["token_k3"], k3.sum() / mask.sum(), rtol=1e-5)
  # d k3 / d log pi = 1 - pi_ref / pi at each counted token, scaled as TB's (2 / (beta N)).
  extra = np.where(mask > 0, 2 / beta * c / len(mask) * (1 - np.exp(ref - policy)), 0.0)
  np.testing.assert_allclose(jax.grad(lambda p: fn(p)[0])(policy) - jax.grad(plain)(policy),
                             extra, rtol=1e-4, atol=1e-6)
  # Identical samples in each group: VarGrad's residuals are all 0, so plain TB has no gradient
  # at all; with the penalty every token moves toward the reference (down where pi > pi_ref).
  policy, batch = _token_batch(np.random.default_rng(8), identical=True)
  assert not np.asarray(jax.grad(plain)(policy)).any()
  grad = np.asarray(jax.grad(lambda p: fn(p)[0])(policy))
  above = (batch.completion_mask > 0) & (policy > batch.ref_logprobs)
  assert above.any() and (grad[above] > 0).all()
  assert (grad[batch.completion_mask == 0] == 0).all()


@pytest.mark.parametrize("beta_0,beta_final,d,stop", [(0.014, 0.004, 500, 500),
                                                      (1.0, 0.05, 128, 32)])
def test_linear_beta_matches_authors_schedule(beta_0, beta_final, d, stop):
  schedule = jax.jit(lambda u: losses.linear_beta(u, beta_0, beta_final, d, stop))
  for u in [1, 2, 31, 32, 33, 250, 499, 500, 501, 700]:
    np.testing.assert_allclose(schedule(u), authors_beta(u, beta_0, beta_final, d, stop),
                               rtol=1e-6, err_msg=f"u={u}")
  assert float(schedule(1)) == pytest.approx(beta_0)


def test_linear_beta_known_values():
  gsm8k = lambda u: float(losses.linear_beta(u, 0.014, 0.004, 500, 500))
  assert gsm8k(1) == pytest.approx(0.014)
  assert gsm8k(251) == pytest.approx(0.009)       # halfway: (u-1)/D = 0.5
  assert gsm8k(499) == pytest.approx(0.004 + 0.01 * 2 / 500)
  assert gsm8k(500) == pytest.approx(0.004)       # u = stop: beta_final from here on
  assert gsm8k(501) == pytest.approx(0.004)
  tldr = lambda u: float(losses.linear_beta(u, 1.0, 0.05, 128, 32))
  assert tldr(31) == pytest.approx(0.05 * 30 / 128 + 1.0 * 98 / 128)  # ~0.777
  assert tldr(32) == pytest.approx(0.05)          # the intentional jump
  assert float(losses.constant_beta(17, 0.05)) == pytest.approx(0.05)


def np_rloo_advantages(sampler, ref, rewards, ids, beta):
  shaped = rewards - beta * (sampler.astype(np.float64) - ref)
  adv = np.zeros_like(shaped)
  for i, g in enumerate(ids):
    others = [j for j in range(len(ids)) if ids[j] == g and j != i]
    adv[i] = shaped[i] - shaped[others].mean() if others else 0.0
  return adv


def test_rloo_matches_numpy():
  policy, ref, behaviour, rewards, ids = random_inputs(8)
  beta = 0.05
  # The shaped reward uses the sampling policy's log-probs (fixed when sampled).
  adv = np_rloo_advantages(behaviour, ref, rewards, ids, beta)
  fn = lambda p: losses.rloo(p, ref, rewards, ids, beta, behaviour_logprobs=behaviour)
  loss, aux = fn(policy)
  np.testing.assert_allclose(aux.advantages, adv, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(loss, -np.mean(adv * policy), rtol=1e-4)
  assert float(aux.advantages[ids == -4][0]) == 0.0  # singleton: no baseline
  # REINFORCE: the gradient w.r.t. log pi is -A / N, advantages held fixed.
  np.testing.assert_allclose(jax.grad(lambda p: fn(p)[0])(policy), -adv / len(ids),
                             rtol=1e-4, atol=1e-6)
  # No behaviour log-probs: shaped with the current policy, detached.
  _, aux = losses.rloo(policy, ref, rewards, ids, beta)
  np.testing.assert_allclose(aux.advantages, np_rloo_advantages(policy, ref, rewards, ids, beta),
                             rtol=1e-4, atol=1e-5)


def test_proximal_rloo_matches_numpy_ppo_clip_on_the_sequence_ratio():
  """The paper's Eq. 6: rho_j A_j grad log pi where PPO's clip is inactive, 0 where active."""
  policy, ref, _, rewards, ids = random_inputs(10)
  rng = np.random.default_rng(10)
  behaviour = (policy + rng.normal(0, 0.3, len(ids))).astype(np.float32)  # rho in and out
  beta, eps = 0.05, 0.2
  adv = np_rloo_advantages(behaviour, ref, rewards, ids, beta)
  rho = np.exp(policy.astype(np.float64) - behaviour)
  unclipped, clipped = rho * adv, np.clip(rho, 1 - eps, 1 + eps) * adv
  want_loss = -np.mean(np.minimum(unclipped, clipped))
  active = unclipped <= clipped  # the min takes the unclipped term: gradient flows
  want_grad = -np.where(active, rho * adv, 0.0) / len(ids)
  fn = lambda p: losses.rloo(p, ref, rewards, ids, beta, behaviour_logprobs=behaviour,
                             ratio_clip=eps)
  loss, aux = jax.jit(fn)(policy)
  np.testing.assert_allclose(loss, want_loss, rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(aux.ratios, rho, rtol=1e-4)
  np.testing.assert_allclose(jax.grad(lambda p: fn(p)[0])(policy), want_grad, rtol=1e-4,
                             atol=1e-7)
  np.testing.assert_allclose(aux.clip_fraction, np.mean(clipped < unclipped), rtol=1e-6)
  assert 0 < float(aux.clip_fraction) < 1  # both cases occur in this batch
  # On-policy (rho = 1) it is plain RLOO.
  on = lambda p: losses.rloo(p, ref, rewards, ids, beta, behaviour_logprobs=policy,
                             ratio_clip=eps)[0]
  plain = lambda p: losses.rloo(p, ref, rewards, ids, beta, behaviour_logprobs=policy)[0]
  np.testing.assert_allclose(jax.grad(on)(policy), jax.grad(plain)(policy), rtol=1e-5, atol=1e-8)


def np_grpo(lp, behaviour, ref, mask, rewards, ids, beta, clip_eps, std_eps=1e-4):
  lp = lp.astype(np.float64)
  mean = np_group_mean(rewards, ids)
  # TRL's GRPOTrainer: the sample std of the group (torch.std / nanstd, Bessel's n - 1).
  std = np.array([np.std(rewards[ids == g], ddof=1) if (ids == g).sum() > 1 else np.nan
                  for g in ids])
  adv = np.where(np.isnan(std), 0.0, (rewards - mean) / (std + std_eps))[:, None]
  ratio = np.exp(lp - behaviour)
  surrogate = np.minimum(ratio * adv, np.clip(ratio, 1 - clip_eps, 1 + clip_eps) * adv)
  kl = np.exp(ref - lp) - (ref - lp) - 1
  per_token = -(surrogate - beta * kl)
  per_seq = (per_token * mask).sum(1) / mask.sum(1)
  return per_seq.mean(), adv[:, 0], (kl * mask).sum() / mask.sum()


def test_grpo_matches_numpy():
  rng = np.random.default_rng(9)
  ids = shuffled_groups(rng)
  n, t = len(ids), 7
  lp = rng.normal(-2, 1, (n, t)).astype(np.float32)
  behaviour = lp + rng.normal(0, 0.3, (n, t)).astype(np.float32)  # ratios in and out of the clip
  ref = lp + rng.normal(0, 0.5, (n, t)).astype(np.float32)
  mask = (np.arange(t)[None] < rng.integers(1, t + 1, n)[:, None]).astype(np.float32)
  rewards = rng.integers(0, 2, n).astype(np.float32)
  beta, clip_eps = 0.04, 0.2
  want, adv, kl = np_grpo(lp, behaviour, ref, mask, rewards, ids, beta, clip_eps)
  loss, aux = jax.jit(losses.grpo)(lp, behaviour, ref, mask, rewards, ids, beta, clip_eps)
  np.testing.assert_allclose(loss, want, rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(aux.advantages, adv, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(aux.kl, kl, rtol=1e-4)
  ratio = np.exp(lp.astype(np.float64) - behaviour)
  outside = ((ratio < 1 - clip_eps) | (ratio > 1 + clip_eps)) & (mask > 0)
  assert 0 < float(aux.clip_fraction) < 1
  np.testing.assert_allclose(aux.clip_fraction, outside.sum() / mask.sum(), rtol=1e-6)
  # Padding does not leak in: changing masked-out log-probs changes nothing.
  lp2 = np.where(mask > 0, lp, lp - 100.0)
  np.testing.assert_allclose(losses.grpo(lp2, behaviour, ref, mask, rewards, ids, beta)[0],
                             loss, rtol=1e-6)
  grad = jax.grad(lambda x: losses.grpo(x, behaviour, ref, mask, rewards, ids, beta)[0])(lp2)
  assert np.all(np.isfinite(grad)) and np.all(np.asarray(grad)[mask == 0] == 0)


# ---------------------------------------------------------------------------
# TBA-prime: log Z from the behaviour policy, the per-token ratio loss.
# ---------------------------------------------------------------------------
def test_log_z_from_behaviour_is_the_sampling_policys_estimate():
  rng = np.random.default_rng(7)
  ids = jnp.array([3, 3, 3, 9, 9])
  policy, behaviour, ref = (jnp.asarray(rng.normal(size=5), jnp.float32) for _ in range(3))
  rewards, beta = jnp.array([1.0, 0.0, 1.0, 0.0, 0.0]), 0.5
  from_behaviour = losses.TBSwitches(log_z_from_behaviour=True)
  loss, aux = losses.trajectory_balance(policy, ref, rewards, ids, beta,
                                        behaviour_logprobs=behaviour,
                                        switches=from_behaviour)
  d_b = np.asarray(behaviour - ref - rewards / beta)
  want_z = -np.array([d_b[:3].mean()] * 3 + [d_b[3:].mean()] * 2)
  np.testing.assert_allclose(aux.log_z, want_z, rtol=1e-6)
  d = np.asarray(policy - ref - rewards / beta)
  np.testing.assert_allclose(loss, np.mean((want_z + d) ** 2), rtol=1e-6)
  # Its gradient: 2 (log Z_b + d_j) / N per sequence (log Z_b is a constant).
  grad = jax.grad(lambda p: losses.trajectory_balance(
      p, ref, rewards, ids, beta, behaviour_logprobs=behaviour, switches=from_behaviour)[0])(policy)
  np.testing.assert_allclose(grad, 2 * (want_z + d) / 5, rtol=1e-5)
  # On-policy it is VarGrad's own estimate.
  on = losses.trajectory_balance(policy, ref, rewards, ids, beta, behaviour_logprobs=policy,
                                 switches=from_behaviour)[0]
  np.testing.assert_allclose(on, losses.trajectory_balance(policy, ref, rewards, ids, beta)[0],
                             rtol=1e-6)


def _ratio_reference(lp, lp_b, mask, rewards, group_ids, clip):
  """TBA-prime's grpo_loss_ratio (loss.py L193-229) with their dr_grpo advantages
  (rewards.py L167-168), in numpy, the token sum divided by the counted tokens."""
  adv = rewards - np.array([rewards[group_ids == g].mean() for g in group_ids])
  ratio = np.clip(np.exp(lp - lp_b), 0, clip)
  return np.sum(-ratio * adv[:, None] * mask) / mask.sum()


def test_ratio_loss_is_tba_primes_per_token_ratio_loss():
  rng = np.random.default_rng(8)
  n, t = 6, 5
  lp = rng.normal(-1.0, 1.0, (n, t)).astype(np.float32)
  lp_b = (lp + rng.normal(0, 1.5, (n, t))).astype(np.float32)  # some ratios above the cap
  mask = (np.arange(t)[None] < rng.integers(1, t + 1, n)[:, None]).astype(np.float32)
  rewards = np.array([1, 0, 0, 1, 1, 0], np.float32)
  ids = np.array([0, 0, 0, 5, 5, 5])
  ref = np.zeros((n, t), np.float32)
  clip = 2.0
  loss, aux = losses.ratio(lp, lp_b, ref, mask, rewards, ids, 0.0, ratio_clip=clip)
  np.testing.assert_allclose(loss, _ratio_reference(lp, lp_b, mask, rewards, ids, clip), rtol=1e-5)
  # Gradient: -rho_t A_j / T below the cap, 0 above it and at padding.
  grad = jax.grad(lambda x: losses.ratio(x, lp_b, ref, mask, rewards, ids, 0.0, clip)[0])(lp)
  rho = np.exp(lp - lp_b)
  adv = np.asarray(aux.advantages)
  want = np.where((rho < clip) & (mask > 0), -rho * adv[:, None], 0.0) / mask.sum()
  np.testing.assert_allclose(grad, want, rtol=1e-4, atol=1e-7)
  above = (rho > clip) & (mask > 0)
  assert 0 < above.sum() and float(aux.clip_fraction) == pytest.approx(above.sum() / mask.sum())
  # beta shapes the reward by the KL the sample was drawn with before centring.
  ref = rng.normal(-1.0, 1.0, (n, t)).astype(np.float32)
  _, shaped = losses.ratio(lp, lp_b, ref, mask, rewards, ids, 0.5, clip)
  r = rewards - 0.5 * ((lp_b - ref) * mask).sum(1)
  np.testing.assert_allclose(shaped.advantages,
                             r - np.array([r[ids == g].mean() for g in ids]), rtol=1e-5)


def test_ratio_loss_overflowing_log_ratios_give_finite_gradients():
  lp = jnp.array([[0.0, 200.0]])
  grad = jax.grad(lambda x: losses.ratio(x, jnp.zeros((1, 2)), jnp.zeros((1, 2)),
                                         jnp.array([[1.0, 0.0]]), jnp.array([1.0]),
                                         jnp.array([0]), 0.0)[0])(lp)
  assert np.all(np.isfinite(grad))
