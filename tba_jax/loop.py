"""The TBA runtime: searchers and a trainer on separate device slices.

  run(config, workdir, task=None)          # also writes WORKDIR/config.yaml (run_config)
  export_checkpoint(config, workdir, out)  # the newest checkpoint's policy (`tba export`)

Searcher threads sample completions with a lagging copy of the policy and put
scored, version-stamped entries in their local buffers. The trainer draws
batches from the global replay buffer (the m rule) and never waits for a
rollout except to pre-fill. Every k steps it publishes its weights to the
searchers (asynchronous copy; a searcher picks them up at its next batch) and
merges the searchers' new entries into the global buffer.

sync.mode = "alternate" runs the roles one after the other (search a round,
then k steps): what one device does, and with k=1, m=1, S=K and no reuse,
exactly synchronous on-policy training. The mode is fixed when the pool is
built (schedule.Schedule): the loop below reads the same in both, the pool's
prefill / before_step / sync doing what the mode asks.

Staleness enters at two places, both measured: a sample's version is the
mailbox version its searcher read at the start of its batch (with
sampler.num_slots > 0, streaming rows: the oldest version its row was decoded
under), and the trainer reports (its params version - sample version) for
every trained sample.

Long runs survive: a checkpoint holds the searchers' unmerged entries and
cursors as well as the global buffer (a resume loses nothing committed); a
searcher that raises is restarted (searcher_pool); SIGTERM or Ctrl-C on any
host makes every host checkpoint at the same step and return (interrupts); a
host lost without notice stops the others within the heartbeat timeout, naming
it (distributed).
"""
from __future__ import annotations

import json
import os
import time

import jax
import numpy as np
import tqdm

from tba_jax import config_checks, distributed, faults, hf_checkpoints, interrupts, lora, optim
from tba_jax import batch as batch_lib
from tba_jax import run_config, run_info, train_state, train_step
from tba_jax import config_builders as build
from tba_jax import verifiers, weight_sync
from tba_jax.checkpoint import Checkpointer
from tba_jax.errors import UserError
from tba_jax.metrics import LatestFractionWatch, MetricsWriter
from tba_jax.model import ModelConfig
from tba_jax.replay_buffer import ReplayBuffer
from tba_jax.run_checkpoints import RunCheckpoints, abstract, buffer_summary
from tba_jax.run_evaluation import RunEvaluation
from tba_jax.schedule import Schedule, due
from tba_jax.searcher_pool import SearcherError, SearcherPool
from tba_jax.tasks import Task

__all__ = ["run", "export_checkpoint", "build_trainer", "sample_batch", "SearcherError",
           "FINISHED_FILE"]


# Written to the workdir after the final evaluation and export: {"step", eval metrics}.
FINISHED_FILE = "finished.json"
# With LoRA, the export's subdirectory holding the adapter in PEFT's format.
ADAPTER_DIR = "adapter"
# After a stop request, how long the run waits for a searcher thread to see it.
_STOP_JOIN_S = 1.0


# ---------------------------------------------------------------------------
# The run.
# ---------------------------------------------------------------------------
def run(config, workdir: str, task: Task | None = None,
        fault_plan: faults.Plan | None = None) -> dict:
  """Trains per `config` in `workdir`, resuming from its newest checkpoint; a finished run
  (FINISHED_FILE) only says so, unless num_train_steps grew. `fault_plan`: failures on
  purpose (a testing aid, tba_jax/faults.py)."""
  c = config
  # Nothing is loaded or written before the config is known to be runnable.
  config_checks.validate(c)
  build.use_cpu_devices(c.mesh.num_cpu_devices)
  config_dict = c.to_dict()
  is_main = jax.process_index() == 0
  checkpoints = os.path.join(workdir, "checkpoints")
  finished = _finished(c, workdir, config_dict)
  if finished is not None:
    return finished
  build.check_model_path(c.model)

  # ----- Devices, model, task -----------------------------------------------
  trainer_mesh, searcher_meshes, mode = build.meshes(c.mesh, c.sync.mode)
  tokenizer = build.load_tokenizer(c.model)
  task = task or build.build_task(c.task, tokenizer)
  task.check(c.eval.split)
  model_cfg, params, base = _load_policy(c, tokenizer, trainer_mesh)
  # Searchers (and evaluation) run in the published dtype, not the float32 of master
  # weights: their activations and KV cache are bfloat16 on accelerators.
  searcher_dtype = c.sync.weights_dtype or c.model.dtype
  searcher_cfg = model_cfg.replace(dtype=searcher_dtype)
  # Evaluation runs on this process's trainer devices (idle meanwhile) or searcher 0's.
  eval_mesh = build.evaluation_mesh(c.eval.devices, trainer_mesh, searcher_meshes,
                                    c.mesh.trainer_tensor)
  meshes = searcher_meshes if eval_mesh in searcher_meshes else [*searcher_meshes, eval_mesh]
  publish = build.publisher(model_cfg, base, meshes, searcher_dtype, trainer_mesh)

  # ----- Trainer, buffer, searchers, evaluation -------------------------------------
  state, update, beta, lr = build_trainer(c, model_cfg, params, base, task, trainer_mesh)
  del params
  b = c.buffer
  global_buffer = build.replay_buffer(b, priority_beta=c.loss.beta_end, seed=c.seed)
  # With reference resets the reference in use is part of the run state: a copy on the
  # trainer mesh (in the searchers' dtype), saved with every checkpoint; else None.
  reference = (weight_sync.snapshot(state.params, searcher_dtype)
               if c.loss.ref_reset_every else None)
  pool = build.searcher_pool(
      c, task, tokenizer, searcher_cfg, searcher_meshes, publish=publish, params=state.params,
      reference=reference, fault_plan=fault_plan,
      schedule=Schedule.of(mode, c.sync.every, b.num_prompts, b.m, c.sync.paced))
  evaluator = build.evaluator(c.eval, c.sampler, task, tokenizer, searcher_cfg, eval_mesh,
                              c.task.max_prompt_len, progress=is_main,
                              include_eos=c.loss.include_eos)
  # Golds the task's verifier can never match (their completions all score 0): said now, and
  # recorded with the run's setup.
  unparseable = verifiers.check_golds(task.reward, {"train": task.train,
                                                    c.eval.split: evaluator.problems})

  # ----- Resume -------------------------------------------------------------------
  saves = RunCheckpoints(Checkpointer(checkpoints, c.checkpoint.max_to_keep), config_dict, pool,
                         global_buffer)
  start_step, elapsed, state, reference = saves.resume(state, reference)
  if is_main:  # the config the workdir's checkpoints accepted, for `--config W/config.yaml`
    run_config.write(workdir, config_dict)

  # ----- Run state: metrics, evaluation, checkpoints, stop requests ----------------------
  setup = run_info.describe(
      c, trainer_mesh=trainer_mesh, searcher_meshes=searcher_meshes, mode=mode,
      model_config=model_cfg, task=task, num_eval_problems=len(evaluator.problems),
      start_step=start_step, beta_at=lambda done: float(beta(done)),
      lr_at=lambda done: float(lr(done)))
  if unparseable:
    setup["task"]["unparseable_golds"] = unparseable
  writer = MetricsWriter(workdir, tensorboard=c.log.tensorboard,
                         wandb_project=c.log.wandb_project or None, config_dict=config_dict,
                         enabled=is_main, elapsed=elapsed)
  if is_main:
    print(run_info.banner(setup, workdir), flush=True)
  writer.start_segment(start_step, setup)
  saves.writer = writer  # its clock is saved with every checkpoint
  evaluate = RunEvaluation(c, workdir, task, evaluator, pool, publish, meshes.index(eval_mesh),
                           eval_mesh, writer, is_main)
  stop = interrupts.StopRequest(saves.checkpointer.directory).install()
  stopping = lambda: bool(stop.signum)  # this process's request, for the evaluator
  stop_here = fault_plan and fault_plan.process_stop(jax.process_index())  # a testing aid
  training = start_step < c.num_train_steps  # else only the final evaluation is left

  try:
    # ----- Evaluate the starting policy --------------------------------------------
    # A stop request abandons an evaluation (on every process at once, evaluation.py): the
    # run saves now, without waiting for it. A rerun evaluates step 0 again.
    if start_step == 0:
      if evaluate(state.params, 0, wall_time=0.0, should_stop=stopping) is None:
        return saves.preempted(0, distributed.broadcast_max(stop.signum)[0], state, reference)

    # ----- Pre-fill the buffer (a resumed run has its buffer back) ------------------
    if training:
      pool.begin()
    while start_step == 0 and len(global_buffer) < b.prefill:
      if pool.prefill(global_buffer):
        raise saves.gave_up(state, reference)
      signum, = distributed.broadcast_max(stop.signum)
      if signum:
        return saves.preempted(0, signum, state, reference)  # a resume goes on pre-filling
    if start_step == 0:
      global_buffer.mark_sync()

    # ----- Train: sample, update, sync, log, evaluate, save ---------------------------
    bar = tqdm.tqdm(total=c.num_train_steps, initial=start_step, disable=not is_main,
                    desc="train", dynamic_ncols=True)
    train_start = last_eval = time.perf_counter()
    last, busy, eval_spent = max(c.num_train_steps, start_step), 0.0, 0.0
    watch = LatestFractionWatch(b.m)
    batch_shardings = train_state.batch_shardings(trainer_mesh)
    for step in range(start_step, c.num_train_steps):
      done = step + 1
      if pool.before_step(step, global_buffer):  # alternate: a window's round
        raise saves.gave_up(state, reference)
      t0 = time.perf_counter()
      batch, info = sample_batch(global_buffer, c, pool.layout)
      # Staleness enters here: the trainer's version minus each sample's.
      staleness = int(state.step) - batch.versions
      state, m = update(state, _to_global(batch, batch_shardings))
      m = jax.device_get(m)  # the trainer's one host sync per step
      dt = time.perf_counter() - t0
      busy += dt
      if not np.isfinite(m["loss"]):
        raise saves.diverged(m, done)
      if stop_here:
        stop_here(done)

      # Sync: weights to the searchers (async mode: their new entries into the buffer).
      if pool.sync(done, state.params, global_buffer):
        raise saves.gave_up(state, reference)
      if reference is not None and due(done, c.loss.ref_reset_every):
        reference = _reset_reference(done, state.params, searcher_dtype, pool, global_buffer,
                                     is_main)

      # Log.
      if done == b.freeze_step:  # the cap is saved with the buffer, so a resume keeps it
        global_buffer.freeze_size()
      row = _metrics_row(m, batch, info, staleness, dt, busy, b.num_prompts, pool,
                         global_buffer)
      if due(done, c.log.every):
        writer.write(done, row)
      warning = watch(done, row["fraction_from_latest"])
      if warning and is_main:
        tqdm.tqdm.write(warning)
      bar.set_postfix(reward=f"{row['reward_mean']:.2f}", loss=f"{row['loss']:.3g}",
                      stale=f"{row['staleness_mean']:.1f}")
      bar.update(1)

      # Evaluate, save. One collective for the flags: every process evaluates / stops at
      # the same step.
      now = time.perf_counter()
      out_of_time = 0 < c.max_train_seconds < now - train_start - eval_spent  # evals aside
      eval_due = due(done, c.eval.every) or bool(
          c.eval.every_seconds and now - last_eval >= c.eval.every_seconds)
      signum, out_of_time, eval_due = distributed.broadcast_max(stop.signum, out_of_time,
                                                                eval_due)
      last_step = done == c.num_train_steps or out_of_time
      if eval_due and not last_step and not signum:
        evaluate(state.params, done, should_stop=stopping)  # None: abandoned for a stop
        last_eval = time.perf_counter()
        eval_spent += last_eval - now
        # A request during the evaluation stops the run here, before another update.
        signum, = distributed.broadcast_max(stop.signum)
      if signum:
        bar.close()  # the message on a line of its own
        return saves.preempted(done, signum, state, reference)
      if due(done, c.checkpoint.every) or last_step:
        saves.save(done, state, reference)
      if out_of_time:
        last = done
        break
    bar.close()

    # ----- Finish: final evaluation and export -------------------------------------------
    # The last step is saved: a signal now only says so (a second Ctrl-C stops at once, and
    # the rerun evaluates and exports).
    stop.finishing = True
    final = evaluate(state.params, last, final=True)
    if c.export:
      _export(model_cfg.replace(dtype=c.model.dtype), state.params, tokenizer,
              os.path.join(workdir, "export"), is_main, base=base, base_model=_base_model(c))
    if is_main:
      _write_json(os.path.join(workdir, FINISHED_FILE), {"step": last, **final})
      print(f"Finished at step {last}: {evaluate.summary(final)}")
    return {"step": last, **final, **buffer_summary(global_buffer)}
  except (SearcherError, FloatingPointError):
    raise  # raised by every process at the same step
  except Exception as e:
    lost = distributed.lost_process_error(e)  # None unless another process is gone
    if lost is None:
      raise
    raise lost from e
  finally:
    stop.restore()
    # After a stop request the searchers' batches in flight are not waited for (they are
    # sampled again on resume; the threads are daemons, so they do not hold up the exit).
    pool.stop(timeout=_STOP_JOIN_S if stop.signum else 60.0)
    writer.close()
    saves.checkpointer.close()


# ---------------------------------------------------------------------------
# The run's parts.
# ---------------------------------------------------------------------------
def build_trainer(c, model_cfg: ModelConfig, params, base, task: Task, trainer_mesh):
  """(train state, update(state, batch), beta(u), lr(u)) from the config's optim and loss."""
  o = c.optim
  lr = build.lr_schedule(o, c.num_train_steps)  # the lr of update u (1-based, as the authors)
  optimizer = optim.make_optimizer(lr, o.weight_decay, o.grad_clip_norm or None, o.b1, o.b2,
                                   moments_dtype=o.moments_dtype)
  log_z = build.learned_log_z(c.loss, task)
  control = build.LR_CONTROLS[o.lr_control](o)  # None, or a DriftControl
  saturation = build.saturation_decay(o)  # None, or a SaturationDecay
  state = train_state.init_state(
      params, optimizer,
      train_state.state_shardings(model_cfg, optimizer, trainer_mesh, log_z, control, saturation),
      log_z)
  beta = build.beta_schedule(c.loss)
  objective = train_step.Objective(build.loss_fn(c.loss), beta, c.sampler.temperature,
                                   build.ref_weight_schedule(c.loss))
  forward = train_step.Forward(
      dtype=c.model.dtype, num_microbatches=o.num_microbatches, remat=c.model.remat,
      prompt_group=c.buffer.samples_per_prompt, dropout=c.model.dropout, dropout_seed=c.seed)
  train = train_step.make_update(model_cfg, optimizer, objective, trainer_mesh, forward=forward,
                                 lr_schedule=lr, learned_log_z=log_z, drift_control=control,
                                 saturation=saturation)
  # LoRA: every update also reads the frozen base (never donated, never rebound).
  update = (lambda state, batch: train(state, batch, base)) if base else train
  return state, update, beta, lr


def _reset_reference(done: int, params, dtype: str, pool: SearcherPool, buffer: ReplayBuffer,
                     is_main: bool):
  """Reference reset (loss.ref_reset_every): the trainer's params become the reference.

  Entries already sampled keep the reference log-probs they were scored with; a batch
  group can mix them with entries scored under the new reference (docs/configs.md)."""
  reference = weight_sync.snapshot(params, dtype)
  pool.set_reference(reference)
  if is_main:
    tqdm.tqdm.write(f"step {done}: reference reset; {len(buffer)} buffer entries keep "
                    "log-probs of the previous reference")
  return reference


def _metrics_row(m: dict, batch, info: dict, staleness: np.ndarray, dt: float, busy: float,
                 num_prompts: int, pool: SearcherPool, buffer: ReplayBuffer) -> dict:
  """One step's metrics.jsonl row: the update's metrics and what the trainer sampled."""
  fl = info["from_latest"]  # the m branch's slots; some drawn with replacement?
  waiting = pool.waiting_seconds
  return {**{k: float(v) for k, v in m.items()},
          "step_seconds": dt, "tokens_per_second": m["num_tokens"] / dt,
          "completion_columns": batch.completion_mask.shape[1],
          "distinct_completions": batch_lib.distinct_fraction(batch),
          "staleness_mean": float(staleness.mean()), "staleness_max": int(staleness.max()),
          "staleness_hist": np.bincount(np.minimum(staleness, 16)).tolist(),
          "fraction_from_latest": info["num_from_latest"] / num_prompts,
          "m_draws_with_replacement": float(info["with_replacement"][fl].mean())
                                      if fl.any() else 0.0,
          "trainer_idle_fraction": waiting / max(waiting + busy, 1e-9),
          "sync_seconds": pool.sync_seconds, "buffer_entries": len(buffer),
          "buffer_prompts": buffer.stats()["num_prompts"], **pool.metrics()}


# ---------------------------------------------------------------------------
# Helpers.
# ---------------------------------------------------------------------------
def _to_global(batch, shardings):
  """The same numpy batch on every process -> global arrays on the trainer mesh."""
  return jax.tree.map(lambda x, s: jax.make_array_from_callback(x.shape, s, lambda i: x[i]),
                      batch, shardings)


def _finished(c, workdir: str, config_dict: dict) -> dict | None:
  """The finished run's FINISHED_FILE, said, when it reached num_train_steps; else None.
  A changed config is refused as a resume would refuse it."""
  path = os.path.join(workdir, FINISHED_FILE)
  if not os.path.exists(path):
    return None
  with open(path) as f:
    finished = json.load(f)
  if finished["step"] < c.num_train_steps:
    return None
  checkpoints = os.path.join(workdir, "checkpoints")
  Checkpointer(checkpoints, c.checkpoint.max_to_keep).check_config(config_dict)
  print(f"{workdir}: this run finished at step {finished['step']} (final evaluation"
        f"{' and export' if c.export else ''} done); nothing to do. Raise num_train_steps "
        "to train on.")
  return finished


def _load_policy(c, tokenizer, trainer_mesh):
  """(model config, params, base) on the trainer mesh: params what the trainer trains (the
  whole model, or LoRA adapters over the frozen base), float32 masters of a bfloat16 model
  with optim.master_weights_fp32."""
  master32 = c.optim.master_weights_fp32 and c.model.dtype == "bfloat16"
  return build.load_policy(c.model, tokenizer, "float32" if master32 else c.model.dtype,
                           trainer_mesh, c.seed)


def sample_batch(buffer: ReplayBuffer, c, layout: batch_lib.Layout):
  """(batch, info) of the step: the buffer's draw (the m rule), its completion columns cut
  to their length bucket (sampler.length_buckets)."""
  b = c.buffer
  batch, info = buffer.sample(b.num_prompts, b.samples_per_prompt, b.m, layout=layout,
                              include_eos=c.loss.include_eos, reward_tau=b.reward_tau,
                              reward_weight=b.reward_weight, reuse_latest=b.reuse_latest)
  batch = batch_lib.trim_completions(batch, c.sampler.length_buckets)
  if b.samples_per_prompt > 1 and not batch_lib.shares_prompts(
      batch.tokens, batch.attention_mask, batch.prompt_len, b.samples_per_prompt):
    raise AssertionError("a batch slot's rows do not share their prompt (the update "
                         "runs each slot's prompt once)")
  return batch, info


def _base_model(c) -> str | None:
  """The export's LoRA base for PEFT: the model's path (None: a random model)."""
  return None if c.model.path == "random" else build.model_path(c.model.path)


def _write_json(path: str, value: dict) -> None:
  with open(path + ".tmp", "w") as f:
    json.dump(value, f)
  os.replace(path + ".tmp", path)  # whole or absent, never half-written


def export_checkpoint(config, workdir: str, out_dir: str) -> int:
  """The policy of `workdir`'s newest checkpoint written to `out_dir` as a run's end exports
  it (`tba export`: a run stopped before its end); returns the checkpoint's step. The
  checkpoint is restored as a resume restores it (its config checked against `config`)."""
  c = config
  config_checks.validate(c)
  checkpoints = os.path.join(workdir, "checkpoints")
  if not os.path.isdir(checkpoints):
    raise UserError(f"{workdir} holds no checkpoints/ to export (is it a run's workdir?)")
  trainer_mesh, _, _ = build.meshes(c.mesh, c.sync.mode)
  tokenizer = build.load_tokenizer(c.model)
  model_cfg, params, base = _load_policy(c, tokenizer, trainer_mesh)
  task = build.build_task(c.task, tokenizer)
  state, _, _, _ = build_trainer(c, model_cfg, params, base, task, trainer_mesh)
  tree = state if not c.loss.ref_reset_every else (
      state, weight_sync.snapshot(state.params, c.sync.weights_dtype or c.model.dtype))
  checkpointer = Checkpointer(checkpoints, c.checkpoint.max_to_keep)
  restored = checkpointer.restore(jax.tree.map(abstract, tree), c.to_dict())
  checkpointer.close()
  if restored is None:
    raise UserError(f"{checkpoints} holds no checkpoint that restores")
  state = restored.train_state if not c.loss.ref_reset_every else restored.train_state[0]
  _export(model_cfg.replace(dtype=c.model.dtype), state.params, tokenizer, out_dir,
          jax.process_index() == 0, base=base, base_model=_base_model(c))
  return restored.step


def _export(cfg: ModelConfig, params, tokenizer, out_dir: str, is_main: bool, base=None,
            base_model: str | None = None) -> None:
  """The policy in HF format; with LoRA merged into the base, and the adapters beside it
  in PEFT's format (out_dir/adapter, for peft onto `base_model`)."""
  adapters = None
  if cfg.lora is not None:
    adapters, params = params, lora.merge(cfg, lora.combine(base, params))
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils
    params, adapters = multihost_utils.process_allgather((params, adapters), tiled=True)
  if is_main:
    hf_checkpoints.save_hf(lora.base_config(cfg),
                           jax.tree.map(lambda x: np.asarray(x).astype(cfg.jnp_dtype), params),
                           out_dir)
    tokenizer.save_pretrained(out_dir)  # tokenizer files + generation_config.json (EOS ids)
    if adapters is not None:
      hf_checkpoints.save_peft(cfg, adapters, os.path.join(out_dir, ADAPTER_DIR), base_model)
    print(f"Exported the policy to {out_dir} (Hugging Face format"
          f"{f'; its LoRA adapter in PEFT format in {ADAPTER_DIR}/' if adapters else ''}).")
