"""The distance to TB's target: the estimator against loops, exact KLs and its invariants; the
tokens it counts."""
import math

import numpy as np
import pytest

from tba_jax.target_distance import Rows, estimate


def _loop_estimate(pi, ref, r, ref_pi, ref_ref, ref_r, beta, w):
  """Module docstring's formulas, one problem and one sample at a time."""
  out = []
  for p in range(len(r)):
    a = lambda lref, rew: w * lref + rew / beta
    pooled = list(zip(ref_pi[p], ref_ref[p], ref_r[p])) + list(zip(pi[p], ref[p], r[p]))
    n_r, n_p = len(ref_r[p]), len(r[p])
    v = [math.exp(lr) / (n_r * math.exp(lr) + n_p * math.exp(lp)) for lp, lr, _ in pooled]
    u = [x / sum(v) for x in v]
    g = [a(lr, rew) - lr for _, lr, rew in pooled]
    z = sum(uk * math.exp(gk) for uk, gk in zip(u, g))
    d = [lp - a(lr, rew) for lp, lr, rew in zip(pi[p], ref[p], r[p])]
    mean_d = sum(d) / len(d)
    out.append({
        "policy_kl": sum(lp - lr for lp, lr in zip(pi[p], ref[p])) / n_p,
        "kl_to_target": mean_d + math.log(z),
        "target_kl": sum(uk * math.exp(gk) / z * gk for uk, gk in zip(u, g)) - math.log(z),
        "tb_residual_var": sum((x - mean_d) ** 2 for x in d) / len(d),
        "reference_no_pass": float(max(ref_r[p]) <= 0)})
  return {k: np.array([o[k] for o in out]) for k in out[0]}


@pytest.mark.parametrize("ref_weight", [1.0, 0.5])
def test_the_estimate_matches_a_loop_over_each_problems_samples(ref_weight):
  rng = np.random.default_rng(0)
  shape, ref_shape = (3, 4), (3, 5)  # more reference samples than the policy's
  lp = lambda s: rng.uniform(-12.0, -2.0, s)
  pi, ref, ref_pi, ref_ref = lp(shape), lp(shape), lp(ref_shape), lp(ref_shape)
  r, ref_r = rng.integers(0, 2, shape).astype(float), rng.integers(0, 2, ref_shape).astype(float)
  ref_r[1] = 0.0  # a problem the reference never solved
  got = estimate(pi, ref, r, ref_pi, ref_ref, ref_r, beta=0.5, ref_weight=ref_weight)
  want = _loop_estimate(pi, ref, r, ref_pi, ref_ref, ref_r, 0.5, ref_weight)
  assert set(got) == set(want)
  for k in want:
    np.testing.assert_allclose(got[k], want[k], rtol=1e-10, atol=1e-10, err_msg=k)
  assert got["reference_no_pass"].tolist() == [0.0, 1.0, 0.0]


def test_with_a_tiny_beta_nothing_overflows():
  """r / beta = 1000: exp of it overflows float64 (exp(709)); sums are taken in log space."""
  shape = (2, 3)
  r = np.ones(shape)
  out = estimate(np.full(shape, -5.0), np.full(shape, -5.0), r, np.full(shape, -5.0),
                 np.full(shape, -5.0), r, beta=1e-3)
  assert all(np.all(np.isfinite(v)) for v in out.values())
  np.testing.assert_allclose(out["kl_to_target"], 0.0, atol=1e-9)


def test_with_a_flat_reward_the_target_is_the_reference():
  """r constant and w = 1: the target is pi_ref, whatever beta: target_kl is 0 and
  kl_to_target is policy_kl's estimate (both 0 at the reference), self-normalised."""
  rng = np.random.default_rng(1)
  lp, ref_lp = rng.uniform(-9, -1, (4, 6)), rng.uniform(-9, -1, (4, 6))
  r = np.full((4, 6), 0.7)
  out = estimate(lp, lp, r, ref_lp, ref_lp, r, beta=0.05)
  for k in ("policy_kl", "kl_to_target", "target_kl"):
    np.testing.assert_allclose(out[k], 0.0, atol=1e-9, err_msg=k)
  np.testing.assert_allclose(out["tb_residual_var"], 0.0, atol=1e-20)  # residuals all -14
  pi = lp + rng.normal(0, 1, lp.shape)  # another policy: the KL to the target is its KL
  out = estimate(pi, lp, r, rng.uniform(-9, -1, lp.shape), ref_lp, r, beta=0.05)
  np.testing.assert_allclose(out["target_kl"], 0.0, atol=1e-9)
  np.testing.assert_allclose(out["kl_to_target"], out["policy_kl"], atol=1e-9)


def _exact(ref, pi, r, beta, w):
  t = ref ** w * np.exp(r / beta)
  t /= t.sum()
  kl = lambda p, q: float(np.sum(p * np.log(p / q)))
  return {"policy_kl": kl(pi, ref), "kl_to_target": kl(pi, t), "target_kl": kl(t, ref)}


@pytest.mark.parametrize("ref_weight", [1.0, 0.5])
def test_the_estimates_converge_to_the_exact_kls_on_a_finite_space(ref_weight):
  """Six completions, two of them right: with many samples of each policy the estimates
  are the KLs computed from the distributions themselves."""
  ref = np.array([0.40, 0.25, 0.15, 0.10, 0.06, 0.04])
  pi = np.array([0.02, 0.03, 0.05, 0.10, 0.50, 0.30])  # overshoots onto the rare right ones
  reward = np.array([0, 0, 0, 0, 1, 1], float)
  beta, n = 0.5, 200_000
  rng = np.random.default_rng(2)
  ys, ys_ref = rng.choice(6, n, p=pi), rng.choice(6, n, p=ref)
  row = lambda x: x[None, :]
  got = estimate(row(np.log(pi[ys])), row(np.log(ref[ys])), row(reward[ys]),
                 row(np.log(pi[ys_ref])), row(np.log(ref[ys_ref])), row(reward[ys_ref]),
                 beta=beta, ref_weight=ref_weight)
  for k, v in _exact(ref, pi, reward, beta, ref_weight).items():
    assert got[k][0] == pytest.approx(v, abs=0.02), k


def test_a_problem_the_reference_never_solved_takes_its_log_z_from_the_policys_samples():
  """No reference sample right, every policy sample right: log Z is no longer the
  reference's log mean exp(0) = 0 (which would put kl_to_target near -1 / beta = -20)."""
  rng = np.random.default_rng(3)
  shape = (1, 8)
  pi, ref = rng.uniform(-3, -1, shape), rng.uniform(-9, -6, shape)  # pi >> pi_ref there
  ref_pi, ref_ref = rng.uniform(-12, -9, shape), rng.uniform(-3, -1, shape)
  out = estimate(pi, ref, np.ones(shape), ref_pi, ref_ref, np.zeros(shape), beta=0.05)
  # Then log Z ~ 1 / beta + log mean(pi_ref / pi) over the policy's samples, and
  # kl_to_target ~ mean(x) + log mean(exp(-x)) >= 0 for x = log pi - log pi_ref (Jensen).
  assert 0.0 <= out["kl_to_target"][0] <= out["policy_kl"][0]
  assert out["reference_no_pass"][0] == 1.0


def test_rows_count_what_the_loss_counts():
  """Every completion token; less the EOS token with include_eos=False (only where the row
  ended with it); of a multi-turn row only the model's own tokens."""
  completions = [np.array([4, 5, 3]), np.array([4, 5, 6]), np.array([4, 9, 9, 5, 3])]
  ended = np.array([True, False, True])
  masks = [None, None, np.array([1, 0, 0, 1, 1, 0, 0])]  # a reply, then the model; padded
  counted = lambda include_eos: [k.tolist() for k in Rows.of(
      [[1]] * 3, completions, ended, masks, include_eos).counted]
  assert counted(True) == [[1, 1, 1], [1, 1, 1], [1, 0, 0, 1, 1]]
  assert counted(False) == [[1, 1, 0], [1, 1, 1], [1, 0, 0, 1, 0]]
