"""The run's setup as printed and recorded: schedules at the steps where they bend."""
import pytest

from configs import gsm8k as gsm8k_config
from tba_jax import config_builders, run_info


def _schedules(variant, steps=None, **optim):
  c = gsm8k_config.get_config(variant)
  c.num_train_steps = steps or c.num_train_steps
  c.optim.update(optim)
  beta = config_builders.beta_schedule(c.loss)
  lr = config_builders.lr_schedule(c.optim, c.num_train_steps)
  return run_info.schedules(c, lambda u: float(beta(u)), lambda u: float(lr(u)))


def test_a_constant_schedule_is_one_value():
  assert _schedules("cpu", schedule="constant", learning_rate=1e-5) == {
      "beta": "0.05 at every step (tb)", "lr": "1e-05 at every step (constant)"}
  # the recipe's own: a cosine over 40 steps to 5e-7, cut off at its 8th (the default run)
  # or its 30th
  assert _schedules("cpu")["lr"] == "1.498e-05 @1 -> 1.465e-05 @4 -> 1.362e-05 @8 (cosine)"
  assert _schedules("cpu", steps=30)["lr"] == \
      "1.498e-05 @1 -> 1.052e-05 @15 -> 7.75e-06 @20 -> 2.623e-06 @30 (cosine)"


def test_an_annealed_schedule_is_given_where_it_bends():
  # rho1b: beta_u = 0.004 (u-1)/500 + 0.014 (1 - (u-1)/500) for u < 500, then 0.004.
  beta = lambda u: 0.004 * (u - 1) / 500 + 0.014 * (1 - (u - 1) / 500) if u < 500 else 0.004
  text = _schedules("rho1b")["beta"]
  assert text.endswith(" (tb)")
  points = [p.split(" @") for p in text[:-len(" (tb)")].split(" -> ")]
  assert [int(s) for _, s in points] == [1, 250, 499, 500, 700]
  for value, step in points:
    assert float(value) == pytest.approx(beta(int(step)), rel=1e-3)


def test_a_cosine_lr_is_given_where_it_ends_not_at_the_wsd_phases():
  c = gsm8k_config.get_config("cpu")
  c.optim.update(schedule="cosine", learning_rate=1e-5, warmup_steps=0, decay_steps=40,
                 final_lr=0.0)
  c.num_train_steps = 100
  lr = config_builders.lr_schedule(c.optim, c.num_train_steps)
  assert run_info.schedules(c, lambda u: 0.05, lambda u: float(lr(u)))["lr"] == \
      "9.985e-06 @1 -> 5e-06 @20 -> 0 @40 -> 0 @50 -> 0 @100 (cosine)"


def test_rsqrt_is_given_at_its_knee_and_where_it_halves_and_quarters_the_peak():
  c = gsm8k_config.get_config("cpu")
  c.optim.update(schedule="rsqrt", learning_rate=2e-5, warmup_steps=0, stable_steps=10,
                 final_lr=5e-7)
  c.num_train_steps = 50_000
  lr = config_builders.lr_schedule(c.optim, c.num_train_steps)
  assert run_info.schedules(c, lambda u: 0.05, lambda u: float(lr(u)))["lr"] == \
      "2e-05 @1 -> 2e-05 @10 -> 1e-05 @40 -> 5e-06 @160 -> 5e-07 @25000 -> 5e-07 @50000 (rsqrt)"


@pytest.mark.parametrize("schedule", ["cosine", "linear", "wsd"])
def test_every_decay_ends_at_optim_final_lr_and_stays_there(schedule):
  c = gsm8k_config.get_config("cpu")
  c.optim.update(schedule=schedule, learning_rate=1e-5, warmup_steps=0, stable_steps=0,
                 decay_steps=40, linear_decay_steps=40, final_lr=1e-6)
  lr = config_builders.lr_schedule(c.optim, 100)
  assert float(lr(20)) == pytest.approx(5.5e-6)  # halfway: (1e-5 + 1e-6) / 2
  assert [float(lr(u)) for u in (40, 41, 100, 10_000)] == pytest.approx([1e-6] * 4)
  assert all(float(lr(u)) > float(lr(u + 1)) for u in range(1, 40))


@pytest.mark.parametrize("n,text", [(7, "7"), (41_912, "41.9K"), (103_488, "103K"),
                                    (999_999, "1M"), (4_882_432, "4.88M"),
                                    (134_515_008, "135M"), (1_235_814_400, "1.24B")])
def test_parameter_counts_read_in_three_digits_never_as_0_0m(n, text):
  assert run_info.count(n) == text
