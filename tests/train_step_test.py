"""The sharded update: gradient identity, accumulation, sharding, learning, compiles."""
import collections
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from tba_jax import batch as batch_lib
from tba_jax import logprobs, losses, model, optim, sharding, train_state
from tba_jax import train_step as ts

TP, TC, TEMPERATURE = 6, 8, 0.7
BETA = 0.5
# Updates with the linear schedule see beta = 0.5, 0.4, 0.1, 0.1, ... (u = 1, 2, 3, 4).
SCHEDULES = {
    "constant": functools.partial(losses.constant_beta, beta=BETA),
    "linear": functools.partial(losses.linear_beta, beta_init=BETA, beta_final=0.1,
                                anneal_steps=4, stop_step=3),
}
# TB at the constant beta, the searchers' temperature: what most tests here train.
TB = ts.Objective(ts.tb_loss, SCHEDULES["constant"], TEMPERATURE)


def np_params(cfg, seed):
  return jax.tree.map(np.asarray, model.init_params(cfg, seed))


@functools.partial(jax.jit, static_argnums=0)
def token_logprobs(cfg, params, batch):
  return model.completion_token_logprobs(cfg, params, batch.tokens, batch.attention_mask, TC,
                                      TEMPERATURE)


def make_batch(cfg, seed, group_ids, ref_params, policy_params=None, rewards=None):
  """Left-padded prompts, right-padded completions of random lengths; reference
  (and, when given, behaviour) log-probs computed by the model as a searcher would."""
  rng = np.random.default_rng(seed)
  n = len(group_ids)
  tokens = rng.integers(1, cfg.vocab_size, (n, TP + TC)).astype(np.int32)
  prompt_lens = rng.integers(2, TP + 1, n)
  completion_lens = rng.integers(2, TC + 1, n)
  cols = np.arange(TP + TC)[None]
  attention = ((cols >= TP - prompt_lens[:, None]) & (cols < TP + completion_lens[:, None]))
  tokens = np.where(attention, tokens, 0).astype(np.int32)
  completion_mask = (np.arange(TC)[None] < completion_lens[:, None]).astype(np.float32)
  if rewards is None:
    rewards = rng.integers(0, 2, n).astype(np.float32)
  batch = ts.TrainBatch(
      tokens=tokens, attention_mask=attention.astype(np.int32), completion_mask=completion_mask,
      ref_logprobs=np.zeros((n, TC), np.float32), behaviour_logprobs=np.zeros((n, TC), np.float32),
      rewards=np.asarray(rewards, np.float32), group_ids=np.asarray(group_ids, np.int32),
      prompt_ids=np.asarray(group_ids, np.int32), versions=np.zeros(n, np.int32))
  ref = np.asarray(token_logprobs(cfg, ref_params, batch)) * completion_mask
  behaviour = ref if policy_params is None else (
      np.asarray(token_logprobs(cfg, policy_params, batch)) * completion_mask)
  return ts.TrainBatch(**{**vars(batch), "ref_logprobs": ref, "behaviour_logprobs": behaviour})


def permute(batch, perm):
  return jax.tree.map(lambda x: np.asarray(x)[perm], batch)


def equal_groups(num_prompts, samples, seed):
  """Ids [P*R] with non-contiguous values, rows shuffled (no group contiguous)."""
  ids = np.repeat(np.arange(num_prompts) * 7 + 3, samples)
  return np.random.default_rng(seed).permutation(ids)


def mesh_of(num_devices):
  return sharding.make_mesh("trainer", jax.devices()[:num_devices])


_UPDATES = {}
TRACES = collections.Counter()  # traces of each cached update's loss function


def cached_update(cfg, optimizer_name, num_devices, num_microbatches=1, remat=False,
                  loss_fn=ts.tb_loss, schedule="linear"):
  """Compiled updates shared between tests (each compile costs seconds on CPU)."""
  key = (cfg, optimizer_name, num_devices, num_microbatches, remat, loss_fn, schedule)
  if key not in _UPDATES:
    # SGD(1): the parameter change IS minus the gradient, for exact comparisons
    # (a smaller step would drown in the rounding of params ~1 in float32).
    # AdamW: the tiny model's loss is sharp, hence the small learning rate.
    optimizer = {"sgd": optax.sgd(1.0),
                 "adamw": optim.make_optimizer(3e-5, weight_decay=0.01, max_grad_norm=1.0)
                 }[optimizer_name]

    @functools.wraps(loss_fn)  # keeps its signature: make_update reads tokens_per_row in it
    def counted_loss(token_lp, batch, beta, **kw):
      TRACES[key] += 1
      return loss_fn(token_lp, batch, beta, **kw)

    mesh = mesh_of(num_devices)
    objective = ts.Objective(counted_loss, SCHEDULES[schedule], TEMPERATURE)
    update = ts.make_update(cfg, optimizer, objective, mesh,
                            forward=ts.Forward(num_microbatches=num_microbatches, remat=remat))
    _UPDATES[key] = (update, optimizer, train_state.state_shardings(cfg, optimizer, mesh))
  return _UPDATES[key]


def run(cfg, params, batches, optimizer_name="sgd", num_devices=4, **kw):
  """(final params as NumPy, per-step metrics) from a fresh state at `params`."""
  update, optimizer, shardings = cached_update(cfg, optimizer_name, num_devices, **kw)
  state = train_state.init_state(params, optimizer, shardings)
  history = []
  for batch in batches:
    state, metrics = update(state, batch)
    history.append(jax.tree.map(float, metrics))
  return jax.tree.map(np.asarray, state.params), history


def assert_same_change(a, b, start, rel):
  """Parameter changes a - start and b - start agree to rel * max |b - start|."""
  delta_a = jax.tree.map(lambda x, s: x.astype(np.float64) - s, a, start)
  delta_b = jax.tree.map(lambda x, s: x.astype(np.float64) - s, b, start)
  scale = max(float(np.max(np.abs(d))) for d in jax.tree.leaves(delta_b))
  assert scale > 1e-6  # the update moved the parameters
  worst = max(float(np.max(np.abs(x - y)))
              for x, y in zip(jax.tree.leaves(delta_a), jax.tree.leaves(delta_b)))
  assert worst <= rel * scale, (worst, scale)


# ---------------------------------------------------------------------------
def test_tb_gradient_equals_kl_penalised_reinforce(tiny_cfg):
  """Paper appendix A: grad L_TB = -(2/(beta N)) grad sum_j sg(A_j) log pi(y_j)."""
  params, ref_params = np_params(tiny_cfg, 0), np_params(tiny_cfg, 1)
  ids = np.random.default_rng(0).permutation(np.repeat([9, 2, 40, 5], [1, 3, 5, 7]))
  batch = make_batch(tiny_cfg, 0, ids, ref_params)
  n, beta = len(ids), 0.3

  def seq_logprobs(p):
    return logprobs.masked_sum(token_logprobs(tiny_cfg, p, batch), batch.completion_mask)

  # A_j in NumPy: KL-penalised reward minus its per-prompt mean, at these params.
  lp = np.asarray(seq_logprobs(params), np.float64)
  shaped = batch.rewards - beta * (lp - batch.ref_logprobs.sum(1))
  adv = (shaped - np.array([shaped[ids == g].mean() for g in ids])).astype(np.float32)

  @jax.jit
  def both_gradients(p):
    tb = jax.grad(lambda p: ts.tb_loss(token_logprobs(tiny_cfg, p, batch), batch,
                                       jnp.float32(beta))[0])(p)
    pg = jax.grad(lambda p: jnp.sum(adv * seq_logprobs(p)))(p)
    return tb, pg

  tb_grad, pg_grad = both_gradients(params)
  scale = max(float(np.max(np.abs(g))) for g in jax.tree.leaves(tb_grad))
  assert scale > 1e-2  # a real gradient, not zeros
  for got, pg in zip(jax.tree.leaves(tb_grad), jax.tree.leaves(pg_grad)):
    np.testing.assert_allclose(got, -2.0 / (beta * n) * np.asarray(pg), rtol=0, atol=1e-5 * scale)


# TB over M = 1, 2, 8 (remat on for M = 2); the baselines over M = 1, 4, RLOO and GRPO
# slow-marked (~10 s each): they share the accumulation with TB's. The ratio loss is a mean
# over tokens, whose whole-batch count the update hands each micro-batch: its own case.
MICROBATCH_CASES = [(ts.tb_loss, (1, 2, 8)),
                    pytest.param(ts.rloo_loss, (1, 4), marks=pytest.mark.slow),
                    pytest.param(ts.grpo_loss, (1, 4), marks=pytest.mark.slow),
                    (ts.ratio_loss, (1, 4))]


@pytest.mark.parametrize("loss_fn,counts", MICROBATCH_CASES,
                         ids=["tb", "rloo", "grpo", "ratio"])
def test_loss_and_gradient_do_not_depend_on_the_number_of_microbatches(tiny_cfg, loss_fn, counts):
  """8 groups (slots) of 2, rows shuffled, slots 0 and 1 the same prompt, completions of
  ragged lengths (2-8 tokens): every count of micro-batches that divides the 8 groups gives
  the whole batch's loss and gradient."""
  params = np_params(tiny_cfg, 0)
  slots = np.random.default_rng(1).permutation(np.repeat(np.arange(8), 2))
  batch = make_batch(tiny_cfg, 1, slots, np_params(tiny_cfg, 1), policy_params=params)
  batch = ts.TrainBatch(**{**vars(batch), "prompt_ids": np.maximum(slots, 1).astype(np.int32)})
  # 2 devices: micro-batches down to 2 rows still split over them.
  big, [m_big] = run(tiny_cfg, params, [batch], loss_fn=loss_fn, num_devices=2)
  for m in counts[1:]:
    micro, [m_micro] = run(tiny_cfg, params, [batch], loss_fn=loss_fn, num_devices=2,
                           num_microbatches=m, remat=m == 2)
    assert_same_change(micro, big, params, 1e-5)  # SGD: the change is -lr * gradient
    for key in ("loss", "grad_norm", "reward_mean", "num_tokens"):
      np.testing.assert_allclose(m_micro[key], m_big[key], rtol=1e-5, err_msg=(m, key))


def test_microbatches_that_do_not_split_the_batch_evenly_are_refused(tiny_cfg):
  batch = make_batch(tiny_cfg, 1, equal_groups(4, 4, seed=1), np_params(tiny_cfg, 1))
  for m, devices in ((3, 1), (8, 4)):  # 16 rows: not in 3; 8 x 2 rows not over 4 devices
    update, optimizer, shardings = cached_update(tiny_cfg, "sgd", devices, num_microbatches=m)
    with pytest.raises(ValueError, match=f"num_microbatches={m} equal micro-batches of a "
                       f"multiple of the trainer's {devices} fsdp devices"):
      update(train_state.init_state(np_params(tiny_cfg, 0), optimizer, shardings), batch)


@pytest.mark.slow  # ~11 s on 2 cores (2026-12-04): out of the default suite
def test_update_is_invariant_to_row_order(tiny_cfg):
  params = np_params(tiny_cfg, 0)
  batch = make_batch(tiny_cfg, 2, equal_groups(4, 4, seed=2), np_params(tiny_cfg, 1))
  shuffled = permute(batch, np.random.default_rng(3).permutation(16))
  a, [ma] = run(tiny_cfg, params, [batch])
  b, [mb] = run(tiny_cfg, params, [shuffled])
  np.testing.assert_allclose(ma["loss"], mb["loss"], rtol=1e-6)
  assert_same_change(a, b, params, 1e-6)


def test_sharded_update_equals_single_device(tiny_cfg):
  params = np_params(tiny_cfg, 0)
  batch = make_batch(tiny_cfg, 4, equal_groups(4, 4, seed=4), np_params(tiny_cfg, 1))
  one, [m1] = run(tiny_cfg, params, [batch], num_devices=1)
  four, [m4] = run(tiny_cfg, params, [batch], num_devices=4)
  # Sharded reductions sum in a different order: float32 round-off only.
  assert_same_change(four, one, params, 1e-5)
  for key in ("loss", "grad_norm", "log_z_mean", "kl"):
    np.testing.assert_allclose(m1[key], m4[key], rtol=1e-5, err_msg=key)


def test_trimmed_completion_columns_change_no_update(tiny_cfg):
  """batch.trim_completions drops padding only: a batch padded to 2 TC completion columns is
  cut back to TC, and the update on the wide batch is the update on the cut one."""
  params = np_params(tiny_cfg, 0)
  narrow = make_batch(tiny_cfg, 5, equal_groups(4, 4, seed=5), np_params(tiny_cfg, 1))
  widen = lambda x: np.pad(x, ((0, 0), (0, TC)))
  wide = ts.TrainBatch(**{**vars(narrow), **{k: widen(getattr(narrow, k)) for k in (
      "tokens", "attention_mask", "completion_mask", "ref_logprobs", "behaviour_logprobs")}})
  assert batch_lib.trim_completions(wide, 1) is wide  # one width: always the full layout
  cut = batch_lib.trim_completions(wide, 2)
  for name, x in vars(cut).items():
    np.testing.assert_array_equal(x, getattr(narrow, name), err_msg=name)
  a, [ma] = run(tiny_cfg, params, [wide], num_devices=1)
  b, [mb] = run(tiny_cfg, params, [cut], num_devices=1)
  assert_same_change(a, b, params, 1e-5)
  for key in ("loss", "grad_norm", "kl", "entropy", "num_tokens"):
    np.testing.assert_allclose(ma[key], mb[key], rtol=1e-5, err_msg=key)


def favour_one_per_prompt(ids):
  """Reward 1 for the first row of each prompt, 0 elsewhere; and those rows."""
  favoured = np.array([np.flatnonzero(ids == g)[0] for g in np.unique(ids)])
  rewards = np.zeros(len(ids), np.float32)
  rewards[favoured] = 1.0
  return rewards, favoured


def test_loss_decreases_and_rewarded_completion_gains_probability(tiny_cfg):
  params = np_params(tiny_cfg, 0)
  ids = equal_groups(4, 4, seed=6)
  rewards, favoured = favour_one_per_prompt(ids)
  batch = make_batch(tiny_cfg, 6, ids, params, rewards=rewards)  # reference = initial policy

  def seq_lp(p):
    return np.asarray(logprobs.masked_sum(token_logprobs(tiny_cfg, p, batch),
                                          batch.completion_mask))

  after, history = run(tiny_cfg, params, [batch] * 5, optimizer_name="adamw",
                       schedule="constant")
  seen = [m["loss"] for m in history]
  assert all(b < a for a, b in zip(seen, seen[1:])), seen
  assert seen[-1] < 0.25 * seen[0], seen
  gain = seq_lp(after) - seq_lp(params)
  others = np.setdiff1d(np.arange(len(ids)), favoured)
  assert gain[favoured].min() > 0.5, gain[favoured]
  assert gain[favoured].min() > gain[others].max(), gain
  # The AdamW moments live on the same FSDP sharding as the parameters.
  _, optimizer, shardings = cached_update(tiny_cfg, "adamw", 4, schedule="constant")
  state = train_state.init_state(params, optimizer, shardings)
  mu = state.opt_state[1][0].mu  # chain(clip, adamw(scale_by_adam, ...))
  spec = state.params["layers"]["mlp"]["up"].sharding.spec
  assert spec == sharding.P(None, "fsdp", None)
  assert mu["layers"]["mlp"]["up"].sharding.spec == spec


def test_update_compiles_once_for_fixed_batch_shape(tiny_cfg):
  params = np_params(tiny_cfg, 0)
  update, optimizer, shardings = cached_update(tiny_cfg, "sgd", 4)
  state = train_state.init_state(params, optimizer, shardings)
  betas = []
  for seed in range(4):  # new values every step, beta changes every step
    batch = make_batch(tiny_cfg, 10 + seed, equal_groups(4, 4, seed), params)
    state, metrics = update(state, batch)
    betas.append(float(metrics["beta"]))
  np.testing.assert_allclose(betas, [0.5, 0.4, 0.1, 0.1], rtol=1e-6)
  assert int(state.step) == 4
  assert TRACES[(tiny_cfg, "sgd", 4, 1, False, ts.tb_loss, "linear")] == 1


@pytest.mark.parametrize("loss_fn", [ts.rloo_loss, ts.grpo_loss, ts.ratio_loss])
def test_baselines_train_through_the_same_update(tiny_cfg, loss_fn):
  params = np_params(tiny_cfg, 0)
  ids = equal_groups(4, 4, seed=7)
  rewards, favoured = favour_one_per_prompt(ids)
  batch = make_batch(tiny_cfg, 7, ids, params, policy_params=params, rewards=rewards)
  new, history = run(tiny_cfg, params, [batch] * 3, optimizer_name="adamw", loss_fn=loss_fn,
                     schedule="constant")
  assert all(np.isfinite(m["loss"]) and m["grad_norm"] > 0 for m in history)
  seq = lambda p: np.asarray(logprobs.masked_sum(token_logprobs(tiny_cfg, p, batch),
                                                 batch.completion_mask))
  gain = seq(new) - seq(params)
  others = np.setdiff1d(np.arange(len(ids)), favoured)
  assert gain[favoured].min() > gain[others].max(), gain


@pytest.mark.slow  # ~30 s on 2 cores (2026-12-04): out of the default suite
def test_precision_modes(tiny_cfg):
  """Master weights stay float32 under bfloat16 compute; bfloat16 params stay bfloat16 with
  float32 moments, or bfloat16 moments under adamw_rounded; all track the float32 loss."""
  params = np_params(tiny_cfg, 0)
  batch = make_batch(tiny_cfg, 8, equal_groups(4, 4, seed=8), np_params(tiny_cfg, 1))
  _, [reference] = run(tiny_cfg, params, [batch])  # float32; beta(u=1) = BETA
  mesh = mesh_of(4)
  for param_dtype, moments in (("float32", "float32"), ("bfloat16", "float32"),
                               ("bfloat16", "bfloat16")):
    optimizer = optim.make_optimizer(1e-3, weight_decay=0.0, max_grad_norm=None,
                                  moments_dtype=moments)
    cfg = tiny_cfg.replace(dtype=param_dtype)
    start = jax.tree.map(lambda x: jnp.asarray(x, cfg.jnp_dtype), params)
    update = ts.make_update(cfg, optimizer, TB, mesh, forward=ts.Forward(dtype="bfloat16"))
    state = train_state.init_state(start, optimizer, train_state.state_shardings(cfg, optimizer, mesh))
    state, metrics = update(state, batch)
    assert {x.dtype for x in jax.tree.leaves(state.params)} == {jnp.dtype(param_dtype)}
    mu = state.opt_state.mu if moments == "bfloat16" else state.opt_state[0].mu
    assert {x.dtype for x in jax.tree.leaves(mu)} == {jnp.dtype(moments)}
    assert float(metrics["loss"]) == pytest.approx(reference["loss"], rel=0.05)
    moved = jax.tree.map(lambda a, b: np.mean(np.asarray(a, np.float32) != b), state.params, start)
    assert max(jax.tree.leaves(moved)) > 0.5  # lr 1e-3 is visible even in bfloat16


@pytest.mark.slow  # ~13 s on 2 cores (2026-12-04): out of the default suite
def test_update_u_applies_and_reports_lr_of_u(tiny_cfg):
  """The authors step the scheduler before each update: update 1 of a warmup uses lr(1) > 0,
  and the reported lr is the one applied (Adam's first step moves each weight by ~lr)."""
  params = np_params(tiny_cfg, 0)
  schedule = optim.warmup_stable_decay(1e-3, warmup_steps=4, stable_steps=10, decay_steps=10)
  optimizer = optim.make_optimizer(schedule, 0.0, None)
  mesh = mesh_of(1)
  update = ts.make_update(tiny_cfg, optimizer, TB, mesh, lr_schedule=schedule)
  state = train_state.init_state(params, optimizer, train_state.state_shardings(tiny_cfg, optimizer, mesh))
  batch = make_batch(tiny_cfg, 9, equal_groups(4, 4, seed=9), np_params(tiny_cfg, 1))
  reported = []
  for u in (1, 2):
    before = jax.tree.map(np.asarray, state.params)
    state, metrics = update(state, batch)
    reported.append(float(metrics["lr"]))
    if u == 1:  # m = g, v = g^2 after bias correction: |step| = lr |g| / (|g| + eps) ~ lr
      moved = max(float(np.max(np.abs(np.asarray(a, np.float64) - b)))
                  for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(before)))
      assert moved == pytest.approx(reported[0], rel=1e-3)
  assert reported == pytest.approx([0.25e-3, 0.5e-3])


@pytest.mark.slow  # ~15 s on 2 cores (2026-12-04): out of the default suite
def test_a_learned_log_z_descends_to_each_prompts_vargrad_value(tiny_cfg):
  """loss.log_z="learned": with the policy frozen, TB's gradient in log Z(x) is
  2 (log Z(x) + mean_j d_j) n_x / N, so plain SGD drives each prompt's entry of the table
  to its minimiser, -mean_j d_j: VarGrad's estimate for that prompt. The table is indexed
  by prompt id, not by group: prompt 1 fills two slots."""
  params, ref_params = np_params(tiny_cfg, 0), np_params(tiny_cfg, 1)
  ids = np.array([1, 0, 1, 1, 0, 1, 0, 1])  # prompt 0: 3 rows, prompt 1: 5
  slots = np.array([2, 0, 2, 3, 0, 3, 0, 3])  # prompt 1 in slots 2 and 3
  batch = make_batch(tiny_cfg, 3, slots, ref_params)
  batch = ts.TrainBatch(**{**vars(batch), "prompt_ids": ids.astype(np.int32)})
  _, want = losses.trajectory_balance(
      jnp.sum(token_logprobs(tiny_cfg, params, batch) * batch.completion_mask, -1),
      jnp.sum(batch.ref_logprobs, -1), batch.rewards, ids, BETA)  # VarGrad per prompt
  mesh = mesh_of(2)
  learned = train_state.LearnedLogZ(optax.sgd(0.4), num_prompts=3)  # id 2 never trains
  optimizer = optax.sgd(0.0)
  update = ts.make_update(tiny_cfg, optimizer, TB, mesh, learned_log_z=learned)
  state = train_state.init_state(params, optimizer, train_state.state_shardings(tiny_cfg, optimizer, mesh, learned),
                        learned)
  for _ in range(60):
    state, metrics = update(state, batch)
  vargrad = {int(i): float(z) for i, z in zip(ids, np.asarray(want.log_z))}
  np.testing.assert_allclose(np.asarray(state.log_z), [vargrad[0], vargrad[1], 0.0], rtol=1e-4)
  assert metrics["log_z_mean"] == pytest.approx(np.mean([vargrad[i] for i in ids]), rel=1e-4)
  jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.asarray, state.params), params)


def test_entropy_and_policy_drift_diagnostics(tiny_cfg):
  """The update reports the policy's mean per-token entropy on the batch (NumPy's, from
  the same logits) and |log pi_theta - log pi_behaviour| per sequence: 0 for samples of
  the current policy, the exact gap for samples of another."""
  params, other = np_params(tiny_cfg, 0), np_params(tiny_cfg, 1)
  ids = equal_groups(2, 4, seed=4)
  fresh = make_batch(tiny_cfg, 4, ids, other, policy_params=params)  # sampled by `params`
  stale = make_batch(tiny_cfg, 4, ids, other, policy_params=other)   # sampled by another
  _, [m_fresh] = run(tiny_cfg, params, [fresh], num_devices=1)
  _, [m_stale] = run(tiny_cfg, params, [stale], num_devices=1)
  assert m_fresh["policy_drift"] < 1e-5
  mask = fresh.completion_mask
  gap = ((np.asarray(token_logprobs(tiny_cfg, params, stale)) - stale.behaviour_logprobs)
         * mask).sum(1)
  assert gap.std() > 0.1 and m_stale["policy_drift"] == pytest.approx(np.abs(gap).mean(),
                                                                         rel=1e-4)
  logits = jax.jit(model.completion_logits, static_argnums=(0, 4))(
      tiny_cfg, params, fresh.tokens, fresh.attention_mask, TC)
  z = np.asarray(logits, np.float64) / TEMPERATURE
  p = np.exp(z - z.max(-1, keepdims=True))
  p /= p.sum(-1, keepdims=True)
  entropy = -(p * np.log(p)).sum(-1)
  expected = ((entropy * mask).sum(1) / mask.sum(1)).mean()
  assert m_fresh["entropy"] == m_stale["entropy"] == pytest.approx(expected, rel=1e-5)


@pytest.mark.slow  # ~20 s; dropout is off in every recipe
def test_dropout_changes_the_update_only_when_enabled_and_reproducibly(tiny_cfg):
  """model.dropout = 0 (every recipe but red-teaming's GPT-2) compiles the update without
  a random number; 0.1 changes the loss, the same (seed, step) giving the same masks."""
  params = np_params(tiny_cfg, 0)
  batch = make_batch(tiny_cfg, 9, equal_groups(4, 4, seed=9), np_params(tiny_cfg, 1))
  mesh, optimizer = mesh_of(2), optax.sgd(1.0)
  shardings = train_state.state_shardings(tiny_cfg, optimizer, mesh)

  def update(rate, seed=0):
    return ts.make_update(tiny_cfg, optimizer, TB, mesh,
                          forward=ts.Forward(dropout=rate, dropout_seed=seed))

  def loss(update, steps=1):
    state = train_state.init_state(params, optimizer, shardings)
    for _ in range(steps):
      state, metrics = update(state, batch)
    return float(metrics["loss"])

  plain, dropped = update(0.0), update(0.1)
  state = train_state.init_state(params, optimizer, shardings)
  assert "threefry" not in plain.lower(state, batch).as_text()
  assert "threefry" in dropped.lower(state, batch).as_text()
  with_dropout = loss(dropped)
  assert abs(with_dropout - loss(plain)) > 1e-3 * loss(plain)
  assert loss(dropped) == with_dropout  # the same seed and step: the same masks
  assert loss(update(0.1, seed=1)) != with_dropout
