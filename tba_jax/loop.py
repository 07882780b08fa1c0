"""The TBA runtime: searchers and a trainer on separate device slices.

  run(config, workdir, task=None)

Searcher threads sample completions with a lagging copy of the policy and put
scored, version-stamped entries in their local buffers. The trainer draws
batches from the global replay buffer (the m rule) and never waits for a
rollout except to pre-fill. Every k steps it publishes its weights to the
searchers (asynchronous copy; a searcher picks them up at its next batch) and
merges the searchers' new entries into the global buffer.

sync.mode = "alternate" runs the roles one after the other (search a round,
then k steps): what one device does, and with k=1, m=1, S=K and no reuse,
exactly synchronous on-policy training.

Staleness enters at two places, both measured: a sample's version is the
mailbox version its searcher read at the start of its batch (a streaming
searcher's, sampler.num_slots > 0: the oldest version its row was decoded
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

import dataclasses
import json
import math
import os
import time

import jax
import numpy as np
import tqdm

from tba_jax import config_checks, distributed, faults, hf_checkpoints, interrupts, lora, model
from tba_jax import batch as batch_lib
from tba_jax import metrics, run_info, sharding, train_step
from tba_jax import config_builders as build
from tba_jax import weight_sync
from tba_jax.checkpoint import Checkpointer
from tba_jax.metrics import LatestFractionWatch, MetricsWriter, PeakWatch
from tba_jax.model import ModelConfig
from tba_jax.replay_buffer import ReplayBuffer
from tba_jax.searcher_pool import SearcherError
from tba_jax.tasks import Task

__all__ = ["run", "SearcherError", "FINISHED_FILE"]


# Written to the workdir after the final evaluation and export: {"step", eval metrics}.
FINISHED_FILE = "finished.json"
# With LoRA, the export's subdirectory holding the adapter in PEFT's format.
ADAPTER_DIR = "adapter"
# eval.save_samples: every evaluation's completions, WORKDIR/eval_samples/step_NNNNNN.jsonl.
SAMPLES_DIR = "eval_samples"



@dataclasses.dataclass
class _Clock:
  """Trainer busy / waiting time, for the idle fractions."""
  busy: float = 0.0
  waiting: float = 0.0
  sync: float = 0.0


# ---------------------------------------------------------------------------
# The run.
# ---------------------------------------------------------------------------
def run(config, workdir: str, task: Task | None = None) -> dict:
  """Trains per `config` in `workdir` (resuming from its newest checkpoint).

  A run that already finished (FINISHED_FILE) only says so; one with more
  num_train_steps than it finished with trains on.
  """
  c = config
  # Nothing is loaded or written before the config is known to be runnable.
  config_checks.validate(c)
  build.use_cpu_devices(c.mesh.num_cpu_devices)
  config_dict = c.to_dict()
  is_main = jax.process_index() == 0
  finished = _finished(workdir)
  if finished is not None and finished["step"] >= c.num_train_steps:
    # Refuses as a resume would when the config changed what the run computes.
    Checkpointer(os.path.join(workdir, "checkpoints"), c.checkpoint.max_to_keep).check_config(
        config_dict)
    print(f"{workdir}: this run finished at step {finished['step']} (final evaluation"
          f"{' and export' if c.export else ''} done); nothing to do. Raise num_train_steps "
          "to train on.")
    return finished
  build.check_model_path(c.model)

  # ----- Devices, model, task -----------------------------------------------
  trainer_mesh, searcher_meshes, mode = build.meshes(c.mesh, c.sync.mode)
  tokenizer = build.load_tokenizer(c.model)
  task = task or build.build_task(c.task, tokenizer)
  task.check()
  master32 = c.optim.master_weights_fp32 and c.model.dtype == "bfloat16"
  # params: what the trainer trains (the whole model, or LoRA adapters over the frozen base).
  model_cfg, params, base = build.load_policy(c.model, tokenizer,
                                              "float32" if master32 else c.model.dtype,
                                              trainer_mesh, c.seed)
  # Ids are per split (the replay buffer's prompt ids are train ids).
  prompt_tokens = build.encode_prompts(task.train, task, tokenizer, c.task.max_prompt_len)
  tp, tc = c.task.max_prompt_len, c.sampler.max_new_tokens
  searcher_dtype = c.sync.weights_dtype or c.model.dtype
  # Searchers (and evaluation) run in the published dtype, not the float32 of master
  # weights: their activations and KV cache are bfloat16 on accelerators.
  searcher_cfg = model_cfg.replace(dtype=searcher_dtype)
  # Evaluation runs on this process's trainer devices (idle meanwhile) or searcher 0's.
  eval_mesh = build.evaluation_mesh(c.eval.devices, trainer_mesh, searcher_meshes,
                                    c.mesh.trainer_tensor)
  meshes = searcher_meshes if eval_mesh in searcher_meshes else [*searcher_meshes, eval_mesh]
  eval_index = meshes.index(eval_mesh)
  publish = build.publisher(model_cfg, base, meshes, searcher_dtype, trainer_mesh)

  # ----- Trainer --------------------------------------------------------------
  o = c.optim
  lr = build.lr_schedule(o, c.num_train_steps)
  lr_at = lambda done: float(lr(done))  # the lr of update `done` (1-based, as the authors)
  optimizer = train_step.make_optimizer(lr, o.weight_decay, o.grad_clip_norm or None, o.b1, o.b2,
                                        moments_dtype=o.moments_dtype)
  log_z = build.learned_log_z(c.loss, task)
  state = train_step.init_state(
      params, optimizer, train_step.state_shardings(model_cfg, optimizer, trainer_mesh, log_z),
      log_z)
  del params
  num_params = model.count_params(lora.base_config(model_cfg))
  beta = build.beta_schedule(c.loss)
  train = train_step.make_update(
      model_cfg, optimizer, build.loss_fn(c.loss), beta, trainer_mesh,
      temperature=c.sampler.temperature, compute_dtype=c.model.dtype,
      num_microbatches=o.num_microbatches, remat=c.model.remat, lr_schedule=lr,
      ref_weight_schedule=build.ref_weight_schedule(c.loss), learned_log_z=log_z,
      dropout=c.model.dropout, dropout_seed=c.seed)
  # LoRA: every update also reads the frozen base (never donated, never rebound).
  update = (lambda state, batch: train(state, batch, base)) if base else train
  batch_sharding = train_step.batch_shardings(trainer_mesh)
  global_buffer = ReplayBuffer(c.buffer.max_per_prompt, c.buffer.max_entries or None,
                               c.buffer.eviction, seed=c.seed, dedup=c.buffer.dedup,
                               priority=c.buffer.priority, priority_beta=c.loss.beta_end,
                               near_duplicate=c.buffer.near_duplicate)

  # ----- Searchers and evaluation ---------------------------------------------------
  # With reference resets the reference in use is part of the run state: a copy on the
  # trainer mesh (in the searchers' dtype), saved with every checkpoint.
  resets = c.loss.ref_reset_every > 0
  reference = weight_sync.snapshot(state.params, searcher_dtype) if resets else None
  pool = build.searcher_pool(c.sampler, task, tokenizer, searcher_cfg, searcher_meshes,
                             publish=publish, params=state.params, reference=reference,
                             prompt_tokens=prompt_tokens, max_prompt_len=tp, seed=c.seed,
                             max_restarts=c.searcher.max_restarts, fault_cfg=c.fault,
                             in_flight_updates=c.sync.in_flight_updates,
                             mismatch_every=c.searcher.mismatch_every)
  evaluator = build.evaluator(c.eval, c.sampler, task, tokenizer, searcher_cfg, eval_mesh, tp,
                              progress=is_main)

  def evaluate(params, step, wall_time=None):
    """Evaluates `params`, writes the scores and the evaluation's time; returns the scores."""
    start = time.perf_counter()
    reference = reference_config = None
    if task.evaluation is not None:  # a task's metrics may read the reference searcher 0 uses
      sr = pool.searchers[0]
      reference_config = sr.ref_model_config  # with LoRA the base's, not the policy's
      reference = sr.ref_params if eval_index == 0 else jax.device_put(
          sr.ref_params, sharding.param_shardings(reference_config, "searcher", eval_mesh))
    scores = evaluator(publish(params, eval_index),
                       jax.random.fold_in(jax.random.key(c.seed + 1), step), reference=reference,
                       reference_config=reference_config)
    metrics_writer.write(step, {**scores, "eval_seconds": time.perf_counter() - start},
                         wall_time=wall_time)
    if is_main and c.eval.save_samples:
      _write_samples(os.path.join(workdir, SAMPLES_DIR, f"step_{step:06d}.jsonl"),
                     evaluator.samples)
    if peak_watch is not None and headline[0] in scores:
      warning = peak_watch(step, scores[headline[0]], scores.get(headline[0] + "_se", 0.0))
      if warning and is_main:
        tqdm.tqdm.write(warning)
    return scores

  # ----- Resume -------------------------------------------------------------------
  checkpointer = Checkpointer(os.path.join(workdir, "checkpoints"), c.checkpoint.max_to_keep)
  # With resets the checkpointed tree is (train state, reference); loss.ref_reset_every is
  # part of the config a resume must match, so the structure always fits.
  run_state = lambda state, reference: (state, reference) if resets else state
  restored = checkpointer.restore(jax.tree.map(_abstract, run_state(state, reference)),
                                  config_dict)
  start_step, elapsed = 0, 0.0
  if restored is not None:
    start_step, meta = restored.step, restored.meta
    state, reference = restored.train_state if resets else (restored.train_state, None)
    global_buffer.load_state_dict(restored.buffer)
    # The searchers' unmerged entries go back to their local buffers: the next sync merges
    # them, as it would have without the interruption.
    pool.load_snapshot(restored.unmerged, meta["searchers"])
    pool.publish(start_step, state.params)
    if resets:
      pool.set_reference(reference)
    elapsed = meta.get("wall_time", 0.0)  # absent in checkpoints of older versions
    print(f"Resumed from step {start_step} ({len(global_buffer)} buffer entries, "
          f"{len(restored.unmerged)} searcher entries not merged yet).")

  def save(step, state, reference):
    # Every process takes part: orbax writes the global arrays collectively. The searchers
    # keep sampling: the snapshot copies their committed entries and cursors.
    unmerged, searchers = pool.snapshot()
    checkpointer.save(step, run_state(state, reference), global_buffer.state_dict(),
                      {"step": step, "searchers": searchers,
                       "wall_time": metrics_writer.elapsed()}, config_dict, unmerged=unmerged)

  def preempted(step, signum, state, reference):
    """SIGTERM or Ctrl-C on any process: every process saves this step and returns."""
    save(step, state, reference)
    print(interrupts.saved_message(signum, step, checkpointer.directory, jax.process_count()),
          flush=True)
    return {"step": step, "terminated": True, "signal": interrupts.NAMES[signum],
            **_buffer_summary(global_buffer)}

  def stop_if_a_searcher_failed(state, reference):
    if pool.failed():
      save(int(state.step), state, reference)
      raise pool.error(int(state.step))

  def search_round(num_prompts, state, reference):
    """Alternate mode: the searchers sample `num_prompts` prompts; the trainer waits."""
    t0 = time.perf_counter()
    pool.search_round(num_prompts)
    stop_if_a_searcher_failed(state, reference)
    clock.waiting += time.perf_counter() - t0

  setup = run_info.describe(
      c, trainer_mesh=trainer_mesh, searcher_meshes=searcher_meshes, mode=mode,
      model_config=model_cfg, num_params=num_params, task=task,
      num_eval_problems=len(evaluator.problems), start_step=start_step,
      beta_at=lambda done: float(beta(done)), lr_at=lr_at)
  metrics_writer = MetricsWriter(workdir, tensorboard=c.log.tensorboard,
                                 wandb_project=c.log.wandb_project or None,
                                 config_dict=config_dict, enabled=is_main, elapsed=elapsed)
  if is_main:
    print(run_info.banner(setup, workdir), flush=True)
  metrics_writer.start_segment(start_step, setup)
  headline = [m.key for m in task.headline]
  # Every later evaluation is shown against the starting policy's (step 0, maybe logged by
  # an earlier segment of this run).
  first_scores = metrics.evaluation(metrics_writer.path, 0) if is_main else {}
  # A warning when the first headline metric (higher is better) falls well below its peak.
  peak_watch = PeakWatch(f"held-out {headline[0]}") if headline else None
  training = start_step < c.num_train_steps  # else only the final evaluation is left
  stop = interrupts.StopRequest(checkpointer.directory).install()
  fault = c.fault  # a testing aid (faults.py); None unless it asks this process to stop
  stop_here = (faults.ProcessStop(fault.stop_at_step, fault.stop_signal)
               if fault.stop_at_step and fault.stop_process == jax.process_index() else None)
  clock = _Clock()

  try:
    # ----- Evaluate the starting policy --------------------------------------------
    if start_step == 0:
      first_scores = evaluate(state.params, 0, wall_time=0.0)
      if is_main:
        print(f"step 0: {metrics.summary(headline, {}, first_scores)}", flush=True)

    # ----- Pre-fill the buffer (a resumed run has its buffer back) ------------------
    if mode == "async" and training:
      pool.start()
    t0 = time.perf_counter()
    while start_step == 0 and len(global_buffer) < c.buffer.prefill:
      if mode == "async":
        time.sleep(0.1)
        stop_if_a_searcher_failed(state, reference)
      else:
        search_round(c.buffer.num_prompts, state, reference)
      pool.merge(global_buffer)
      signum, = distributed.broadcast_max(stop.signum)
      if signum:
        return preempted(0, signum, state, reference)  # a resume goes on pre-filling
    if start_step == 0:
      global_buffer.mark_sync()
    if mode == "async":
      clock.waiting += time.perf_counter() - t0

    # ----- Train ------------------------------------------------------------------------
    bar = tqdm.tqdm(total=c.num_train_steps, initial=start_step, disable=not is_main,
                    desc="train", dynamic_ncols=True)
    b = c.buffer
    train_start = last_eval = time.perf_counter()
    last = max(c.num_train_steps, start_step)
    # Alternate mode: a round searches what a window of k steps wants from the latest sync
    # (k x B x m prompts; at least B).
    window_prompts = max(b.num_prompts, math.ceil(c.sync.every * b.num_prompts * b.m))
    watch = LatestFractionWatch(b.m)
    for step in range(start_step, c.num_train_steps):
      # Step 0's round was the pre-fill; a resumed run searches at its first step as the
      # uninterrupted run did (its checkpoint was saved after the publish, before the round).
      if mode == "alternate" and step > 0 and step % c.sync.every == 0:
        search_round(window_prompts, state, reference)
        pool.merge(global_buffer)
        global_buffer.mark_sync()
      t0 = time.perf_counter()
      batch, info = global_buffer.sample(
          b.num_prompts, b.samples_per_prompt, b.m, layout=pool.layout,
          include_eos=c.loss.include_eos, reward_tau=b.reward_tau,
          reward_weight=b.reward_weight, reuse_latest=b.reuse_latest)
      version = int(state.step)
      staleness = version - info["versions"]
      distinct = batch_lib.distinct_fraction(batch)
      state, m = update(state, _to_global(batch, batch_sharding))
      m = jax.device_get(m)  # the trainer's one host sync per step
      dt = time.perf_counter() - t0
      clock.busy += dt
      if not np.isfinite(m["loss"]):
        raise FloatingPointError(
            f"loss is {m['loss']} at step {step + 1} (grad_norm={m['grad_norm']}); stopping "
            f"without saving. The checkpoints in {checkpointer.directory} are intact.")
      if stop_here:
        stop_here(step + 1)

      # Sync: weights to the searchers, their new entries into the global buffer.
      # (Alternate mode merges at its next search round.)
      if (step + 1) % c.sync.every == 0:
        t1 = time.perf_counter()
        pool.publish(step + 1, state.params)
        if mode == "async":
          pool.merge(global_buffer)
          global_buffer.mark_sync()
          clock.sync += time.perf_counter() - t1
          stop_if_a_searcher_failed(state, reference)
      if resets and (step + 1) % c.loss.ref_reset_every == 0:
        # Entries already sampled keep the reference log-probs they were scored with; a
        # batch group can mix them with entries scored under the new reference (docs/configs.md).
        reference = weight_sync.snapshot(state.params, searcher_dtype)
        pool.set_reference(reference)
        if is_main:
          tqdm.tqdm.write(f"step {step + 1}: reference reset; {len(global_buffer)} buffer "
                          "entries keep log-probs of the previous reference")

      # Metrics, evaluation, checkpoints.
      done = step + 1
      if done == b.freeze_step:  # the cap is saved with the buffer, so a resume keeps it
        global_buffer.freeze_size()
      row = {k: float(v) for k, v in m.items()}
      fl = info["from_latest"]  # the m branch's slots; some drawn with replacement?
      row.update(step_seconds=dt, tokens_per_second=m["num_tokens"] / dt,
                 distinct_completions=distinct,
                 staleness_mean=float(staleness.mean()), staleness_max=int(staleness.max()),
                 staleness_hist=np.bincount(np.minimum(staleness, 16)).tolist(),
                 fraction_from_latest=info["num_from_latest"] / b.num_prompts,
                 m_draws_with_replacement=float(info["with_replacement"][fl].mean())
                 if fl.any() else 0.0,
                 trainer_idle_fraction=clock.waiting / max(clock.waiting + clock.busy, 1e-9),
                 sync_seconds=clock.sync, buffer_entries=len(global_buffer),
                 buffer_prompts=global_buffer.stats()["num_prompts"],
                 **pool.metrics())
      if done % c.log.every == 0:
        metrics_writer.write(done, row)
      warning = watch(done, row["fraction_from_latest"])
      if warning and is_main:
        tqdm.tqdm.write(warning)
      bar.set_postfix(reward=f"{row['reward_mean']:.2f}", loss=f"{row['loss']:.3g}",
                      stale=f"{row['staleness_mean']:.1f}")
      bar.update(1)
      out_of_time = bool(c.max_train_seconds) and \
          time.perf_counter() - train_start > c.max_train_seconds
      due = (c.eval.every and done % c.eval.every == 0) or \
          (c.eval.every_seconds and time.perf_counter() - last_eval >= c.eval.every_seconds)
      # One collective for the flags: every process evaluates / stops at the same step.
      signum, out_of_time, due = distributed.broadcast_max(stop.signum, out_of_time, due)
      last_step = done == c.num_train_steps or out_of_time
      if due and not last_step:
        scores = evaluate(state.params, done)
        last_eval = time.perf_counter()
        if is_main:  # whether the run learns: the headline metrics since step 0
          tqdm.tqdm.write(f"step {done}: {metrics.summary(headline, first_scores, scores)}")
      if signum:
        bar.close()  # the message on a line of its own
        return preempted(done, signum, state, reference)
      if done % c.checkpoint.every == 0 or last_step:
        save(done, state, reference)
      if out_of_time:
        last = done
        break
    bar.close()

    # ----- Finish: final evaluation and export -------------------------------------------
    # The last step is saved: a signal now only says so (a second Ctrl-C stops at once, and
    # the rerun evaluates and exports).
    stop.finishing = True
    final = evaluate(state.params, last)
    if c.export:
      _export(model_cfg.replace(dtype=c.model.dtype), state.params, tokenizer,
              os.path.join(workdir, "export"), is_main, base=base,
              base_model=None if c.model.path == "random" else build.model_path(c.model.path))
    if is_main:
      _write_json(os.path.join(workdir, FINISHED_FILE), {"step": last, **final})
      print(f"Finished at step {last}: {metrics.summary(headline, first_scores, final)}")
    return {"step": last, **final, **_buffer_summary(global_buffer)}
  except (SearcherError, FloatingPointError):
    raise  # raised by every process at the same step
  except Exception as e:
    lost = distributed.lost_process_error(e)  # None unless another process is gone
    if lost is None:
      raise
    raise lost from e
  finally:
    stop.restore()
    pool.stop()
    metrics_writer.close()
    checkpointer.close()


# ---------------------------------------------------------------------------
# Helpers.
# ---------------------------------------------------------------------------
def _buffer_summary(buffer: ReplayBuffer) -> dict:
  """A digest of the buffer's state (equal on every host) and versions per searcher."""
  import hashlib
  state = buffer.state_dict()
  digest = hashlib.sha256()
  for k in sorted(state):
    digest.update(k.encode() + np.ascontiguousarray(state[k]).tobytes())
  versions = {}
  for e in buffer.entries():
    versions[e.searcher_id] = max(versions.get(e.searcher_id, 0), e.version)
  return {"buffer_digest": digest.hexdigest(), "max_version_by_searcher": versions}


def _abstract(x):
  return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)


def _to_global(batch, shardings):
  """The same numpy batch on every process -> global arrays on the trainer mesh."""
  return jax.tree.map(lambda x, s: jax.make_array_from_callback(x.shape, s, lambda i: x[i]),
                      batch, shardings)


def _finished(workdir: str) -> dict | None:
  path = os.path.join(workdir, FINISHED_FILE)
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)


def _write_samples(path: str, rows: list[dict]) -> None:
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path + ".tmp", "w") as f:
    for row in rows:
      f.write(json.dumps(row) + "\n")
  os.replace(path + ".tmp", path)


def _write_json(path: str, value: dict) -> None:
  with open(path + ".tmp", "w") as f:
    json.dump(value, f)
  os.replace(path + ".tmp", path)  # whole or absent, never half-written


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
