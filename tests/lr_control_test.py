"""optim.lr_control="drift": the measured update_drift, the scale's moves and bounds, the
update without it unchanged, checkpoints, micro-batches, LoRA, a learned log Z, a run; and
optim.saturation_patience: the factor's cuts, the step it scales, with drift, a checkpoint,
the config checks, a run."""
import dataclasses
import functools

import jax
import numpy as np
import optax
import pytest

from tba_jax import checkpoint, config_checks, logprobs, lora, loop, model, optim, sharding, train_state
from tba_jax import train_step as ts
from tba_jax.errors import ConfigError

from lora_test import trained_adapters, with_lora
from loop_test import tiny_config, toy_task
from train_step_test import TB, TC, TEMPERATURE, equal_groups, make_batch, np_params

LR = 3e-3  # AdamW's first step moves every weight by ~LR: the tiny model's sequences by ~0.3 nats
CONTROL = optim.DriftControl(target=0.05, min_scale=0.01, gain=0.5)


def mesh_of(num_devices):
  return sharding.make_mesh("trainer", jax.devices()[:num_devices])


@functools.cache
def controlled(cfg, control=CONTROL, num_devices=1, num_microbatches=1, dropout=0.0,
               learned=False):
  """(update, optimizer, state shardings, LearnedLogZ or None), compiled once per case."""
  mesh, optimizer = mesh_of(num_devices), optim.make_optimizer(LR, 0.0, None)
  log_z = train_state.LearnedLogZ(optax.sgd(0.1), num_prompts=32) if learned else None
  update = ts.make_update(cfg, optimizer, TB, mesh,
                          forward=ts.Forward(num_microbatches=num_microbatches, dropout=dropout),
                          lr_schedule=LR, learned_log_z=log_z, drift_control=control)
  return update, optimizer, train_state.state_shardings(cfg, optimizer, mesh, log_z, control), log_z


def start(cfg, params, **kw):
  update, optimizer, shardings, log_z = controlled(cfg, **kw)
  return update, train_state.init_state(params, optimizer, shardings, log_z)


def sequence_logprobs(cfg, params, batch):
  lp = model.completion_token_logprobs(cfg, params, batch.tokens, batch.attention_mask, TC,
                                       TEMPERATURE)
  return np.asarray(logprobs.masked_sum(lp, batch.completion_mask), np.float64)


def assert_drift_measured(metrics, cfg, before, after, batch):
  """update_drift and its max against NumPy: log pi(y) of each row before and after."""
  change = np.abs(sequence_logprobs(cfg, after, batch) - sequence_logprobs(cfg, before, batch))
  assert change.mean() > 1e-2  # the update moved the policy
  np.testing.assert_allclose(float(metrics["update_drift"]), change.mean(), rtol=1e-4)
  np.testing.assert_allclose(float(metrics["update_drift_max"]), change.max(), rtol=1e-4)


def a_batch(cfg, seed=1):
  params = np_params(cfg, 0)
  return params, make_batch(cfg, seed, equal_groups(4, 4, seed), np_params(cfg, 1),
                            policy_params=params)


# ---------------------------------------------------------------------------
@pytest.mark.parametrize("devices,micro,dropout", [(1, 1, 0.0), (2, 2, 0.0), (1, 1, 0.1)],
                         ids=["plain", "sharded_microbatched", "dropout"])
def test_update_drift_is_the_mean_change_of_each_rows_log_pi(tiny_cfg, devices, micro, dropout):
  """pi_old the params before the update, pi_new after; with dropout both without it."""
  params, batch = a_batch(tiny_cfg)
  update, state = start(tiny_cfg, params, num_devices=devices, num_microbatches=micro,
                        dropout=dropout)
  state, metrics = update(state, batch)
  assert_drift_measured(metrics, tiny_cfg, params, jax.tree.map(np.asarray, state.params), batch)


def test_update_drift_does_not_depend_on_the_number_of_microbatches(tiny_cfg):
  params, batch = a_batch(tiny_cfg, seed=2)
  seen = []
  for m in (1, 4):  # (2 on 2 devices: above)
    update, state = start(tiny_cfg, params, num_microbatches=m)
    state, metrics = update(state, batch)
    seen.append((float(metrics["update_drift"]), float(metrics["update_drift_max"]),
                 float(state.lr_scale)))
  np.testing.assert_allclose(seen[1], seen[0], rtol=1e-4)


def test_the_scale_falls_above_the_target_rises_below_it_and_stays_in_its_bounds():
  control = optim.DriftControl(target=1.0, min_scale=0.01, gain=0.5)
  step = lambda scale, drift: float(control.next_scale(np.float32(scale), np.float32(drift)))
  assert step(1.0, 4.0) == pytest.approx(0.5)     # 4x the target: (1/4) ** 0.5
  assert step(0.2, 0.25) == pytest.approx(0.4)    # a quarter of it: up by 2
  assert step(0.8, 0.25) == 1.0                   # never above the schedule's lr
  assert step(0.02, 1e4) == pytest.approx(0.01)   # never below lr_min
  assert step(0.3, 0.0) == 1.0                    # an update that changed nothing
  assert step(0.3, np.nan) == step(0.3, np.inf) == pytest.approx(0.01)  # diverged: the floor
  assert optim.DriftControl(1.0, 0.01, gain=1.0).next_scale(np.float32(0.5), np.float32(2.0)) \
      == pytest.approx(0.25)  # gain 1: the scale that would have hit the target


@pytest.mark.slow  # 12-15 s on 2 cores (2026-12-05)
def test_the_scale_multiplies_the_optimizer_step_and_follows_the_measured_drift(tiny_cfg):
  params, batch = a_batch(tiny_cfg, seed=3)
  update, state = start(tiny_cfg, params)
  first, m1 = update(state, batch)
  assert float(m1["lr_scale"]) == 1.0 and float(m1["lr"]) == pytest.approx(LR)
  want = CONTROL.next_scale(np.float32(1.0), m1["update_drift"])
  assert float(m1["update_drift"]) > CONTROL.target and float(first.lr_scale) == float(want) < 1
  first_params = jax.tree.map(np.asarray, first.params)
  _, m2 = update(first, batch)  # the next update applies it and reports it (first: donated)
  assert float(m2["lr_scale"]) == float(want)
  assert float(m2["lr"]) == pytest.approx(LR * float(want))
  # Adam's step is linear in the lr: the first update at scale 0.25 moves each weight by a
  # quarter of the step at scale 1.
  _, state = start(tiny_cfg, params)
  quarter, _ = update(dataclasses.replace(state, lr_scale=np.float32(0.25)), batch)
  for a, b, p in zip(*map(jax.tree.leaves, (quarter.params, first_params, params))):
    np.testing.assert_allclose(np.asarray(a) - p, 0.25 * (np.asarray(b) - p), rtol=1e-4,
                               atol=1e-7)
  # A target the update stays under: the scale stays at its bound, 1.
  loose = optim.DriftControl(target=100.0, min_scale=0.01, gain=0.5)
  update, state = start(tiny_cfg, params, control=loose)
  state, _ = update(state, batch)
  assert float(state.lr_scale) == 1.0


def test_without_control_the_update_is_unchanged_and_at_scale_1_bit_identical(tiny_cfg):
  """lr_control="none": no lr_scale in the state, no extra metrics; the controlled update's
  first step (scale 1) gives the same weights, bit for bit, and the same metrics."""
  params, batch = a_batch(tiny_cfg, seed=4)
  mesh, optimizer = mesh_of(1), optim.make_optimizer(LR, 0.0, None)
  plain = ts.make_update(tiny_cfg, optimizer, TB, mesh, lr_schedule=LR)
  state = train_state.init_state(params, optimizer, train_state.state_shardings(tiny_cfg, optimizer, mesh))
  assert state.lr_scale is None
  state, m_plain = plain(state, batch)
  update, controlled_state = start(tiny_cfg, params)
  controlled_state, m_controlled = update(controlled_state, batch)
  assert set(m_controlled) - set(m_plain) == {"lr_scale", "update_drift", "update_drift_max"}
  assert {k: float(v) for k, v in m_plain.items()} == \
      {k: float(m_controlled[k]) for k in m_plain}
  for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(controlled_state.params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  jax.tree.map(np.testing.assert_array_equal, state.opt_state, controlled_state.opt_state)


def test_the_lr_scale_round_trips_through_a_checkpoint_and_a_resume_without_it_is_refused(
    tiny_cfg, tmp_path):
  params, batch = a_batch(tiny_cfg, seed=5)
  update, state = start(tiny_cfg, params)
  state, _ = update(state, batch)
  assert 0.01 < float(state.lr_scale) < 1
  config = {"optim": {"lr_control": "drift", "drift_target": 0.05}}
  saves = checkpoint.Checkpointer(str(tmp_path / "checkpoints"))
  saves.save(1, state, {"x": np.arange(2)}, {"step": 1}, config)
  abstract = jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), start(tiny_cfg, params)[1])
  restored = saves.restore(abstract, config).train_state
  assert float(restored.lr_scale) == float(state.lr_scale)
  jax.tree.map(np.testing.assert_array_equal, restored, state)
  # A run saved without the controller (or before it existed) does not resume under it: the
  # state it saved has no scale, and the config check names the key first.
  for saved in ("none", None):
    other = checkpoint.Checkpointer(str(tmp_path / f"without_{saved}"))
    other.save(1, state, {"x": np.arange(2)}, {"step": 1},
               {"optim": {} if saved is None else {"lr_control": saved}})
    absent = "'<absent>'" if saved is None else "'none'"
    with pytest.raises(checkpoint.ConfigMismatchError,
                       match=f"optim.lr_control: {absent} -> 'drift'"):
      other.restore(abstract, {"optim": {"lr_control": "drift"}})
    other.close()
  saves.close()


@pytest.mark.slow  # 12-15 s on 2 cores (2026-12-05)
def test_lora_adapters_train_under_control_and_their_drift_is_the_merged_policys(tiny_cfg):
  cfg = with_lora(tiny_cfg)
  base, batch = a_batch(tiny_cfg, seed=6)
  adapters = jax.tree.map(np.asarray, trained_adapters(cfg))
  mesh, optimizer = mesh_of(1), optim.make_optimizer(LR, 0.0, None)
  update = ts.make_update(cfg, optimizer, TB, mesh, drift_control=CONTROL)
  state = train_state.init_state(adapters, optimizer, train_state.state_shardings(cfg, optimizer, mesh,
                                                                drift_control=CONTROL))
  frozen = jax.device_put(base, lora.frozen(cfg, sharding.param_shardings(cfg, "trainer", mesh)))
  state, metrics = update(state, batch, frozen)
  assert jax.tree.structure(state.params) == jax.tree.structure(adapters)
  assert_drift_measured(metrics, cfg, lora.combine(base, adapters),
                        lora.combine(base, jax.tree.map(np.asarray, state.params)), batch)
  assert float(state.lr_scale) < 1


def test_a_learned_log_z_trains_beside_the_controlled_policy(tiny_cfg):
  """The scale is the policy's: log Z's own optimizer is not scaled."""
  params, batch = a_batch(tiny_cfg, seed=7)
  update, state = start(tiny_cfg, params, learned=True)
  state, metrics = update(state, batch)
  assert_drift_measured(metrics, tiny_cfg, params, jax.tree.map(np.asarray, state.params), batch)
  moved = np.asarray(state.log_z)[np.unique(batch.prompt_ids)]
  assert np.all(moved != 0) and float(state.lr_scale) < 1


def test_config_checks_name_the_controller_keys():
  c = tiny_config(optim=dict(lr_control="drift", lr_min=1.0))
  with pytest.raises(ConfigError, match=r"optim.lr_min=1.0: must be in \(0, "
                     r"optim.learning_rate=0.001\] with optim.lr_control='drift'"):
    config_checks.validate(c)
  c = tiny_config(optim=dict(lr_control="drfit", drift_gain=1.5))
  with pytest.raises(ConfigError, match=r"(?s)optim.lr_control='drfit': must be one of 'none', "
                     r"'drift' \(did you mean 'drift'\?\).*optim.drift_gain=1.5: must be in \(0, 1\]"):
    config_checks.validate(c)
  config_checks.validate(tiny_config(optim=dict(lr_min=1.0)))  # no control: lr_min unread


@pytest.mark.slow  # 12-15 s on 2 cores (2026-12-05)
def test_a_controlled_run_logs_each_updates_scale_and_drift(tmp_path):
  c = tiny_config(num_train_steps=4, mesh=dict(num_devices=1),
                  optim=dict(lr_control="drift", drift_target=0.05, lr_min=1e-5))
  loop.run(c, str(tmp_path), task=toy_task(c))
  from tba_jax.metrics import read_jsonl
  rows = [r for r in read_jsonl(str(tmp_path / "metrics.jsonl")) if "loss" in r]
  assert [r["step"] for r in rows] == [1, 2, 3, 4] and rows[0]["lr_scale"] == 1.0
  control = optim.DriftControl(0.05, 1e-5 / c.optim.learning_rate, c.optim.drift_gain)
  for r, after in zip(rows, rows[1:]):
    assert r["lr"] == pytest.approx(c.optim.learning_rate * r["lr_scale"])
    assert after["lr_scale"] == pytest.approx(
        float(control.next_scale(np.float32(r["lr_scale"]), np.float32(r["update_drift"]))))
  assert any(r["lr_scale"] < 1 for r in rows)


# ---------------------------------------------------------------------------
# optim.saturation_patience > 0: the lr cut when the reward stops rising.
SATURATION = optim.SaturationDecay(patience=1, factor=0.5, smoothing=0.0, min_gain=0.01,
                                   min_scale=0.1)


def saturation_states(decay, rewards):
  """The state after each reward: SaturationDecay.next_state from its init."""
  state, seen = decay.init(), []
  for u, r in enumerate(rewards):
    state = decay.next_state(state, np.float32(r), np.bool_(u == 0))
    seen.append(np.asarray(state))
  return np.array(seen)


def test_the_saturation_factor_is_cut_after_patience_updates_without_a_new_best():
  decay = optim.SaturationDecay(patience=2, factor=0.5, smoothing=0.0, min_gain=0.01,
                                min_scale=0.2)
  rewards = [0.5, 0.5, 0.505, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6]
  states = saturation_states(decay, rewards)
  # 0.505 is no new best (not 0.01 above 0.5): the second update without one cuts; 0.6 is
  # one, then every second update cuts, down to min_scale and no further.
  np.testing.assert_allclose(states[:, 3], [1, 1, .5, .5, .5, .25, .25, .2, .2, .2])
  np.testing.assert_allclose(states[:, 2], [0, 1, 0, 0, 1, 0, 1, 0, 1, 0])
  np.testing.assert_allclose(states[:, 1], [.5, .5, .5, .6, .6, .6, .6, .6, .6, .6])
  # A rising reward never cuts; the average weighs its past by `smoothing`.
  rising = optim.SaturationDecay(3, 0.5, 0.9, 0.01, 0.01)
  states = saturation_states(rising, [0.1 * u for u in range(10)])
  assert np.all(states[:, 3] == 1) and np.all(states[:, 2] == 0)
  np.testing.assert_allclose(saturation_states(rising, [1.0, 0.0])[:, 0], [1.0, 0.9])
  # A non-finite reward leaves the state as it was.
  state = saturation_states(decay, [0.5, 0.5])[-1]
  for bad in (np.nan, np.inf):
    np.testing.assert_array_equal(decay.next_state(state, np.float32(bad), np.bool_(False)),
                                  state)


@functools.cache
def saturating(cfg, drift=None):
  """(update, optimizer, state shardings) with SATURATION (and a DriftControl), once per case."""
  mesh, optimizer = mesh_of(1), optim.make_optimizer(LR, 0.0, None)
  update = ts.make_update(cfg, optimizer, TB, mesh, lr_schedule=LR, drift_control=drift,
                          saturation=SATURATION)
  return update, optimizer, train_state.state_shardings(cfg, optimizer, mesh, drift_control=drift,
                                               saturation=SATURATION)


def test_the_saturation_factor_multiplies_the_step_and_follows_the_batch_reward(tiny_cfg):
  params, batch = a_batch(tiny_cfg, seed=8)
  update, optimizer, shardings = saturating(tiny_cfg)
  state = train_state.init_state(params, optimizer, shardings)
  assert state.lr_scale is None
  reward = float(np.mean(batch.rewards))
  first, m1 = update(state, batch)
  assert float(m1["saturation_factor"]) == 1.0 and float(m1["lr"]) == pytest.approx(LR)
  np.testing.assert_allclose(np.asarray(first.saturation), [reward, reward, 0, 1], rtol=1e-6)
  first_params = jax.tree.map(np.asarray, first.params)
  second, _ = update(first, batch)  # the same reward: no new best, patience 1 -> cut
  np.testing.assert_allclose(np.asarray(second.saturation), [reward, reward, 0, 0.5], rtol=1e-6)
  _, m3 = update(second, batch)
  assert float(m3["saturation_factor"]) == 0.5 and float(m3["lr"]) == pytest.approx(LR / 2)
  # The factor scales the step: the first update at factor 0.5 moves each weight by half.
  state = train_state.init_state(params, optimizer, shardings)
  half, _ = update(dataclasses.replace(state, saturation=np.float32([0, -np.inf, 0, 0.5])),
                   batch)
  for a, b, p in zip(*map(jax.tree.leaves, (half.params, first_params, params))):
    np.testing.assert_allclose(np.asarray(a) - p, 0.5 * (np.asarray(b) - p), rtol=1e-4,
                               atol=1e-7)


def test_saturation_and_drift_multiply_and_the_state_round_trips_a_checkpoint(tiny_cfg,
                                                                              tmp_path):
  params, batch = a_batch(tiny_cfg, seed=9)
  update, optimizer, shardings = saturating(tiny_cfg, CONTROL)
  state = train_state.init_state(params, optimizer, shardings)
  state = dataclasses.replace(state, saturation=np.float32([0, -np.inf, 0, 0.5]))
  state, metrics = update(state, batch)
  assert float(metrics["lr"]) == pytest.approx(LR * 0.5)  # drift's scale 1 x saturation's 0.5
  state, metrics = update(state, batch)
  assert 0.01 < float(metrics["lr_scale"]) < 1
  assert float(metrics["lr"]) == pytest.approx(
      LR * float(metrics["lr_scale"]) * float(metrics["saturation_factor"]))
  config = {"optim": {"lr_control": "drift", "saturation_patience": 1}}
  saves = checkpoint.Checkpointer(str(tmp_path / "checkpoints"))
  saves.save(2, state, {"x": np.arange(2)}, {"step": 2}, config)
  abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
                          train_state.init_state(params, optimizer, shardings))
  restored = saves.restore(abstract, config).train_state
  jax.tree.map(np.testing.assert_array_equal, restored, state)
  with pytest.raises(checkpoint.ConfigMismatchError, match="optim.saturation_patience: 1 -> 0"):
    saves.restore(abstract, {"optim": {"lr_control": "drift", "saturation_patience": 0}})
  saves.close()


def test_config_checks_name_the_saturation_keys():
  c = tiny_config(optim=dict(saturation_patience=4, lr_min=1.0))
  with pytest.raises(ConfigError, match=r"optim.lr_min=1.0: must be in \(0, optim.learning_rate="
                     r"0.001\] with optim.saturation_patience=4"):
    config_checks.validate(c)
  with pytest.raises(ConfigError, match=r"optim.saturation_factor=1.0: must be in \(0, 1\)"):
    config_checks.validate(tiny_config(optim=dict(saturation_patience=4, saturation_factor=1.0)))
  from tba_jax import config_builders
  assert config_builders.saturation_decay(tiny_config().optim) is None
  assert config_builders.saturation_decay(tiny_config(optim=dict(
      saturation_patience=4, lr_min=1e-5)).optim) == optim.SaturationDecay(4, 0.5, 0.9, 0.01, 0.01)


@pytest.mark.slow  # a 4-step run
def test_a_run_with_saturation_logs_its_factor_and_reward_average(tmp_path):
  c = tiny_config(num_train_steps=4, mesh=dict(num_devices=1),
                  optim=dict(saturation_patience=1, saturation_smoothing=0.0, lr_min=1e-5))
  loop.run(c, str(tmp_path), task=toy_task(c))
  from tba_jax.metrics import read_jsonl
  rows = [r for r in read_jsonl(str(tmp_path / "metrics.jsonl")) if "loss" in r]
  assert [r["step"] for r in rows] == [1, 2, 3, 4] and rows[0]["saturation_factor"] == 1.0
  for r in rows:
    assert r["lr"] == pytest.approx(c.optim.learning_rate * r["saturation_factor"])
    assert r["reward_average"] == pytest.approx(r["reward_mean"])  # smoothing 0
