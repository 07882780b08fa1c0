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
mailbox version its searcher read at the start of its batch, and the trainer
reports (its params version - sample version) for every trained sample.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import signal
import threading
import time

import jax
import numpy as np
import tqdm

from tba_jax import config_checks, distributed, hf_checkpoints, run_info, sharding, train_step
from tba_jax import config_builders as build
from tba_jax import weight_sync
from tba_jax.checkpoint import Checkpointer
from tba_jax.evaluation import Evaluator
from tba_jax.metrics import LatestFractionWatch, MetricsWriter
from tba_jax.model import ModelConfig
from tba_jax.replay_buffer import ReplayBuffer
from tba_jax.sampler import Sampler
from tba_jax.searcher import PromptStream, Searcher
from tba_jax.tasks import Task


# Written to the workdir after the final evaluation and export: {"step", eval metrics}.
FINISHED_FILE = "finished.json"


class SearcherError(RuntimeError):
  pass



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
  master32 = c.optim.master_weights_fp32 and c.model.dtype == "bfloat16"
  model_cfg, params = build.load_model(c.model, tokenizer,
                                       "float32" if master32 else c.model.dtype, trainer_mesh,
                                       c.seed)
  # Ids are per split (the replay buffer's prompt ids are train ids).
  prompt_tokens = build.encode_prompts(task.train, task, tokenizer, c.task.max_prompt_len)
  tp, tc = c.task.max_prompt_len, c.sampler.max_new_tokens
  searcher_dtype = c.sync.weights_dtype or c.model.dtype
  # Searchers (and evaluation) run in the published dtype, not the float32 of master
  # weights: their activations and KV cache are bfloat16 on accelerators.
  searcher_cfg = model_cfg.replace(dtype=searcher_dtype)
  searcher_shardings = [sharding.param_shardings(model_cfg, "searcher", m) for m in searcher_meshes]
  publish = lambda p, i: weight_sync.publish(p, searcher_shardings[i], dtype=searcher_dtype,
                                             trainer_mesh=trainer_mesh)

  # ----- Trainer --------------------------------------------------------------
  o = c.optim
  lr = build.lr_schedule(o, c.num_train_steps)
  lr_at = lambda done: float(lr(done))  # the lr of update `done` (1-based, as the authors)
  optimizer = train_step.make_optimizer(lr, o.weight_decay, o.grad_clip_norm or None, o.b1, o.b2,
                                        moments_dtype=o.moments_dtype)
  state = train_step.init_state(params, optimizer,
                                train_step.state_shardings(model_cfg, optimizer, trainer_mesh))
  del params
  num_params = sum(x.size for x in jax.tree.leaves(state.params))
  beta = build.beta_schedule(c.loss)
  update = train_step.make_update(
      model_cfg, optimizer, build.loss_fn(c.loss), beta, trainer_mesh,
      temperature=c.sampler.temperature, compute_dtype=c.model.dtype,
      num_microbatches=o.num_microbatches, remat=c.model.remat, lr_schedule=lr)
  batch_sharding = train_step.batch_shardings(trainer_mesh)
  global_buffer = ReplayBuffer(c.buffer.max_per_prompt, c.buffer.max_entries or None,
                               c.buffer.eviction, seed=c.seed, dedup=c.buffer.dedup)

  # ----- Searchers --------------------------------------------------------------
  s = c.sampler
  train_ids = [p.id for p in task.train]
  golds = {p.id: p.gold for p in task.train}
  num_shards = len(searcher_meshes) * jax.process_count()
  # With reference resets the reference in use is part of the run state: a copy on the
  # trainer mesh (in the searchers' dtype), saved with every checkpoint.
  resets = c.loss.ref_reset_every > 0
  reference = weight_sync.snapshot(state.params, searcher_dtype) if resets else None
  searchers = []
  for i, mesh in enumerate(searcher_meshes):
    shard = i + len(searcher_meshes) * jax.process_index()  # this searcher's global index
    sampler = Sampler(searcher_cfg, max_new_tokens=tc, temperature=s.temperature, top_k=s.top_k,
                      top_p=s.top_p, eos_ids=tokenizer.eos_ids, pad_id=tokenizer.pad_id,
                      mesh=mesh)
    first = publish(state.params, i)
    searchers.append(Searcher(
        shard, model_config=searcher_cfg, sampler=sampler, mesh=mesh,
        ref_params=publish(reference, i) if resets else first,
        mailbox=weight_sync.Mailbox(0, first), stream=PromptStream(train_ids[shard::num_shards],
                                                                   seed=c.seed + shard),
        prompt_tokens=prompt_tokens, golds=golds, decode=tokenizer.decode, reward=task.reward,
        num_prompts=s.num_prompts_per_batch, num_samples=s.num_samples_per_prompt,
        max_prompt_len=tp, temperature=s.temperature, pad_id=tokenizer.pad_id, seed=c.seed))

  e = c.eval
  eval_problems = task.test[:e.num_problems] if e.num_problems else task.test
  eval_mesh = searcher_meshes[0]
  make_eval_sampler = lambda **kw: Sampler(
      searcher_cfg, max_new_tokens=e.max_new_tokens, eos_ids=tokenizer.eos_ids,
      pad_id=tokenizer.pad_id, mesh=eval_mesh, **kw)
  evaluator = Evaluator(
      problems=eval_problems,
      prompt_tokens=list(build.encode_prompts(eval_problems, task, tokenizer, tp).values()),
      decode=tokenizer.decode, reward=task.reward, batch_size=e.batch_size,
      greedy=make_eval_sampler(greedy=True) if e.greedy else None,
      sampled=make_eval_sampler(temperature=s.temperature, top_k=s.top_k, top_p=s.top_p)
      if e.num_samples else None, num_samples=e.num_samples, progress=is_main)
  evaluate = lambda step: evaluator(publish(state.params, 0),
                                    jax.random.fold_in(jax.random.key(c.seed + 1), step))

  # ----- Resume -------------------------------------------------------------------
  checkpointer = Checkpointer(os.path.join(workdir, "checkpoints"), c.checkpoint.max_to_keep)
  # With resets the checkpointed tree is (train state, reference); loss.ref_reset_every is
  # part of the config a resume must match, so the structure always fits.
  run_state = lambda: (state, reference) if resets else state
  restored = checkpointer.restore(jax.tree.map(_abstract, run_state()), config_dict)
  start_step, elapsed = 0, 0.0
  if restored is not None:
    start_step, saved, buffer_state, meta = restored
    state, reference = saved if resets else (saved, None)
    global_buffer.load_state_dict(buffer_state)
    for searcher, st in zip(searchers, meta["searchers"][jax.process_index()]):
      searcher.load_state_dict(st)
    for i, searcher in enumerate(searchers):
      searcher.mailbox.put(start_step, publish(state.params, i))
      if resets:
        searcher.set_reference(publish(reference, i))
    elapsed = meta.get("wall_time", 0.0)  # absent in checkpoints of older versions
    print(f"Resumed from step {start_step} ({len(global_buffer)} buffer entries).")

  def save(step):
    # Every process takes part: orbax writes the global arrays collectively.
    states = [sr.state_dict() for sr in searchers]
    searcher_states = _gather_json(states) if jax.process_count() > 1 else [states]
    checkpointer.save(step, run_state(), global_buffer.state_dict(),
                      {"step": step, "searchers": searcher_states,
                       "wall_time": metrics_writer.elapsed()}, config_dict)

  setup = run_info.describe(
      c, trainer_mesh=trainer_mesh, searcher_meshes=searcher_meshes, mode=mode,
      model_config=model_cfg, num_params=num_params, task=task,
      num_eval_problems=len(eval_problems), start_step=start_step,
      beta_at=lambda done: float(beta(done)), lr_at=lr_at)
  metrics_writer = MetricsWriter(workdir, tensorboard=c.log.tensorboard,
                                 wandb_project=c.log.wandb_project or None,
                                 config_dict=config_dict, enabled=is_main, elapsed=elapsed)
  if is_main:
    print(run_info.banner(setup, workdir), flush=True)
  metrics_writer.start_segment(start_step, setup)
  training = start_step < c.num_train_steps  # else only the final evaluation is left
  stop = threading.Event()
  terminated = threading.Event()
  previous_handler = _install_sigterm(terminated)
  clock = _Clock()
  threads = []

  def merge():
    """Searchers' new entries into the global buffer (same order on every host)."""
    new = [entry for sr in searchers for entry in sr.buffer.drain_new()]
    new = distributed.all_gather_entries(new, max_prompt_len=tp, max_completion_len=tc)
    global_buffer.add_many(new)
    return len(new)

  def check_searchers():
    failed = [sr for sr in searchers if sr.error is not None]
    if distributed.broadcast_flags(bool(failed))[0]:
      save(int(state.step))
      raise SearcherError(
          "a searcher failed; the run stopped after saving a checkpoint at step "
          f"{int(state.step)}.\n" + "\n".join(f"searcher {sr.id}:\n{sr.error}" for sr in failed))

  def search_round(num_prompts):
    """Alternate mode: every searcher samples at least `num_prompts` / #searchers prompts."""
    per = math.ceil(num_prompts / (len(searchers) * jax.process_count() *
                                   s.num_prompts_per_batch))
    t0 = time.perf_counter()
    for sr in searchers:
      for _ in range(per):
        try:
          sr.search_once()
        except Exception:  # reported like a thread's failure
          import traceback
          sr.error = traceback.format_exc()
          break
    check_searchers()
    clock.waiting += time.perf_counter() - t0

  try:
    # ----- Evaluate the starting policy --------------------------------------------
    if start_step == 0:
      metrics_writer.write(0, evaluate(0), wall_time=0.0)

    # ----- Pre-fill the buffer (a resumed run has its buffer back) ------------------
    if mode == "async" and training:
      threads = [threading.Thread(target=sr.run, args=(stop,), name=f"searcher-{sr.id}",
                                  daemon=True) for sr in searchers]
      for t in threads:
        t.start()
    t0 = search_start = time.perf_counter()
    while start_step == 0 and len(global_buffer) < c.buffer.prefill:
      if mode == "async":
        time.sleep(0.05)
        check_searchers()
      else:
        search_round(c.buffer.num_prompts)
      merge()
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
        search_round(window_prompts)
        merge()
        global_buffer.mark_sync()
      t0 = time.perf_counter()
      batch, info = global_buffer.sample(
          b.num_prompts, b.samples_per_prompt, b.m, max_prompt_len=tp, max_completion_len=tc,
          pad_id=tokenizer.pad_id, include_eos=c.loss.include_eos, reward_tau=b.reward_tau,
          reward_weight=b.reward_weight, reuse_latest=b.reuse_latest)
      version = int(state.step)
      staleness = version - info["versions"]
      state, m = update(state, _to_global(batch, batch_sharding))
      m = jax.device_get(m)  # the trainer's one host sync per step
      dt = time.perf_counter() - t0
      clock.busy += dt
      if not np.isfinite(m["loss"]):
        raise FloatingPointError(
            f"loss is {m['loss']} at step {step + 1} (grad_norm={m['grad_norm']}); stopping "
            f"without saving. The checkpoints in {checkpointer.directory} are intact.")

      # Sync: weights to the searchers, their new entries into the global buffer.
      if mode == "async" and (step + 1) % c.sync.every == 0:
        t1 = time.perf_counter()
        for i, sr in enumerate(searchers):
          sr.mailbox.put(step + 1, publish(state.params, i))
        merge()
        global_buffer.mark_sync()
        clock.sync += time.perf_counter() - t1
        check_searchers()
      if mode == "alternate" and (step + 1) % c.sync.every == 0:
        for i, sr in enumerate(searchers):
          sr.mailbox.put(step + 1, publish(state.params, i))
      if resets and (step + 1) % c.loss.ref_reset_every == 0:
        # Entries already sampled keep the reference log-probs they were scored with; a
        # batch group can mix them with entries scored under the new reference (README).
        reference = weight_sync.snapshot(state.params, searcher_dtype)
        for i, sr in enumerate(searchers):
          sr.set_reference(publish(reference, i))
        if is_main:
          tqdm.tqdm.write(f"step {step + 1}: reference reset; {len(global_buffer)} buffer "
                          "entries keep log-probs of the previous reference")

      # Metrics, evaluation, checkpoints.
      done = step + 1
      row = {k: float(v) for k, v in m.items()}
      row.update(step_seconds=dt, tokens_per_second=m["num_tokens"] / dt,
                 staleness_mean=float(staleness.mean()), staleness_max=int(staleness.max()),
                 staleness_hist=np.bincount(np.minimum(staleness, 16)).tolist(),
                 fraction_from_latest=info["num_from_latest"] / b.num_prompts,
                 trainer_idle_fraction=clock.waiting / max(clock.waiting + clock.busy, 1e-9),
                 sync_seconds=clock.sync, buffer_entries=len(global_buffer),
                 buffer_prompts=global_buffer.stats()["num_prompts"],
                 **_searcher_metrics(searchers, time.perf_counter() - search_start))
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
      terminate, out_of_time, due = distributed.broadcast_flags(terminated.is_set(), out_of_time,
                                                                due)
      last_step = done == c.num_train_steps or out_of_time
      if due and not last_step:
        metrics_writer.write(done, evaluate(done))
        last_eval = time.perf_counter()
      if done % c.checkpoint.every == 0 or last_step or terminate:
        save(done)
      if terminate:
        print(f"SIGTERM: saved a checkpoint at step {done}; rerun to resume.")
        return {"step": done, "terminated": True}
      if out_of_time:
        last = done
        break
    bar.close()

    # ----- Finish: final evaluation and export -------------------------------------------
    final = evaluate(last)
    metrics_writer.write(last, final)
    if c.export:
      _export(model_cfg.replace(dtype=c.model.dtype), state.params, tokenizer,
              os.path.join(workdir, "export"), is_main)
    if is_main:
      _write_json(os.path.join(workdir, FINISHED_FILE), {"step": last, **final})
      print(f"Finished at step {last}: " + ", ".join(f"{k} {v:.3f}" for k, v in final.items()))
    return {"step": last, **final, **_buffer_summary(global_buffer)}
  finally:
    stop.set()
    for t in threads:
      t.join(timeout=60)
    if previous_handler is not None:
      signal.signal(signal.SIGTERM, previous_handler)
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


def _searcher_metrics(searchers, elapsed: float) -> dict:
  busy = sum(sr.stats.busy_seconds for sr in searchers) / len(searchers)
  samples = sum(sr.stats.num_samples for sr in searchers)
  return {"searcher_busy_fraction": min(busy / max(elapsed, 1e-9), 1.0),
          "searcher_samples": samples,
          "searcher_reward_mean": sum(sr.stats.reward_sum for sr in searchers) / max(samples, 1)}


def _gather_json(states):
  import json
  from jax.experimental import multihost_utils
  raw = np.frombuffer(json.dumps(states).encode(), np.uint8)
  sizes = np.asarray(multihost_utils.process_allgather(np.int32(raw.size)))
  padded = np.zeros(int(sizes.max()), np.uint8)
  padded[:raw.size] = raw
  allp = np.asarray(multihost_utils.process_allgather(padded))
  return [json.loads(bytes(allp[i, :sizes[i]]).decode()) for i in range(len(sizes))]


def _install_sigterm(flag: threading.Event):
  if threading.current_thread() is not threading.main_thread():
    return None
  return signal.signal(signal.SIGTERM, lambda *_: flag.set())


def _finished(workdir: str) -> dict | None:
  path = os.path.join(workdir, FINISHED_FILE)
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)


def _write_json(path: str, value: dict) -> None:
  with open(path + ".tmp", "w") as f:
    json.dump(value, f)
  os.replace(path + ".tmp", path)  # whole or absent, never half-written


def _export(cfg: ModelConfig, params, tokenizer, out_dir: str, is_main: bool) -> None:
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils
    params = multihost_utils.process_allgather(params, tiled=True)
  if is_main:
    hf_checkpoints.save_hf(cfg, jax.tree.map(lambda x: np.asarray(x).astype(cfg.jnp_dtype), params),
                        out_dir)
    tokenizer.save_pretrained(out_dir)  # tokenizer files + generation_config.json (EOS ids)
    print(f"Exported the policy to {out_dir} (Hugging Face format).")
