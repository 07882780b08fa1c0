"""The optimizer: torch's AdamW arithmetic on bfloat16 tensors, the lr schedules of the
1-based update u."""
import functools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import USER_LEVEL
from tba_jax import optim


@pytest.mark.parametrize("foreach", [False, True])
def test_rounded_adamw_is_torch_adamw_on_bfloat16_tensors_bit_for_bit(foreach):
  """The authors' optimizer: torch AdamW on bf16 params (no master copy), the scheduler
  stepped before each update; both torch code paths (CUDA uses foreach)."""
  import torch
  rng = np.random.default_rng(0)
  shapes = [(64, 32), (257,)]
  start = [rng.normal(0, 0.05, s).astype(np.float32) for s in shapes]
  grads = [[rng.normal(0, 1e-3 * (1 + k), s).astype(np.float32) for s in shapes]
           for k in range(12)]
  schedule = optim.warmup_stable_decay(1e-3, warmup_steps=4, stable_steps=3, decay_steps=8)
  params = [torch.nn.Parameter(torch.tensor(x).to(torch.bfloat16)) for x in start]
  torch_opt = torch.optim.AdamW(params, lr=1.0, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                                foreach=foreach)
  torch_lr = torch.optim.lr_scheduler.LambdaLR(torch_opt, lambda u: float(schedule(u)))
  optimizer = optim.make_optimizer(schedule, 0.0, None, moments_dtype="bfloat16")
  ours = [jnp.asarray(x, jnp.bfloat16) for x in start]
  state = optimizer.init(ours)

  @functools.partial(jax.jit, compiler_options=USER_LEVEL)  # users' bits
  def step(ours, state, g):
    g = [jnp.asarray(x, jnp.bfloat16).astype(jnp.float32) for x in g]  # bf16 gradients
    updates, state = optimizer.update(g, state, [p.astype(jnp.float32) for p in ours])
    return optim.apply_updates(ours, updates), state

  for g in grads:
    with warnings.catch_warnings():  # torch warns about this order; it is the authors'
      warnings.simplefilter("ignore")
      torch_lr.step()
    for p, x in zip(params, g):
      p.grad = torch.tensor(x).to(torch.bfloat16)
    torch_opt.step()
    ours, state = step(ours, state, g)
  for p, mine, mu, nu, x0 in zip(params, ours, state.mu, state.nu, start):
    np.testing.assert_array_equal(np.asarray(mine, np.float32), p.detach().float().numpy())
    np.testing.assert_array_equal(np.asarray(mu, np.float32),
                                  torch_opt.state[p]["exp_avg"].float().numpy())
    np.testing.assert_array_equal(np.asarray(nu, np.float32),
                                  torch_opt.state[p]["exp_avg_sq"].float().numpy())
    assert np.mean(p.detach().float().numpy() != np.asarray(jnp.asarray(x0, jnp.bfloat16),
                                                              np.float32)) > 0.9  # they moved


def test_learning_rate_schedules():
  # Functions of the 1-based update u; GSM8K's phase lengths 50 / 350 / 600.
  wsd = optim.warmup_stable_decay(1e-5, warmup_steps=50, stable_steps=350, decay_steps=600)
  lr = lambda s, u: float(s(u))
  assert lr(wsd, 1) == pytest.approx(0.02e-5)  # update 1 already moves (transformers' u / W)
  assert lr(wsd, 25) == pytest.approx(0.5e-5)
  assert lr(wsd, 50) == pytest.approx(1e-5)
  assert lr(wsd, 399) == pytest.approx(1e-5)
  assert lr(wsd, 400 + 300) == pytest.approx(0.5e-5)  # cosine midpoint: the last GSM8K update
  assert lr(wsd, 1000) == pytest.approx(0.0, abs=1e-12)
  assert lr(wsd, 2000) == pytest.approx(0.0, abs=1e-12)
  linear = optim.warmup_linear(1.0, warmup_steps=10, total_steps=110, final_lr=0.1)
  assert [lr(linear, c) for c in (0, 5, 10, 60, 110, 500)] == pytest.approx(
      [0.0, 0.5, 1.0, 0.55, 0.1, 0.1])
  cosine = optim.warmup_cosine(1.0, warmup_steps=10, total_steps=110)
  assert [lr(cosine, c) for c in (0, 10, 60, 110)] == pytest.approx([0.0, 1.0, 0.5, 0.0], abs=1e-6)
  # rsqrt: warmup to 4, constant to the knee at 4 + 6 = 10, then sqrt(10 / u), floored at 0.1
  rsqrt = optim.warmup_rsqrt(1.0, warmup_steps=4, stable_steps=6, final_lr=0.1)
  assert [lr(rsqrt, c) for c in (1, 4, 10, 40, 250, 1000, 10_000)] == pytest.approx(
      [0.25, 1.0, 1.0, 0.5, 0.2, 0.1, 0.1])
  # no horizon: the lr summed over updates keeps growing as sqrt(u)
  total = lambda n: sum(lr(optim.warmup_rsqrt(1.0, 0, 10), u) for u in range(1, n + 1))
  assert total(400) - total(100) == pytest.approx(2 * 10 ** 0.5 * (20 - 10), rel=0.01)
