r"""Asynchronous TBA with each role on its own core, against synchronous training on both.

  python -m benchmarks.async_pinned --minutes 25 --out /tmp/async_pinned
  python -m benchmarks.async_pinned --arms pinned --set sync.every=4 --out /tmp/p_k4  # a sweep point
  python -m benchmarks.async_pinned --tiny --minutes 0.2 --out /tmp/p   # the test's (random model)

Two arms of the `cpu` recipe (configs/gsm8k.py:cpu; --tiny: its `tiny` variant), one after
the other, each in fresh processes with no compilation cache, the same seed, training budget
and evaluation:

  pinned  two processes of one multi-controller JAX run (jax.distributed over gloo on
          loopback, one CPU device each), as two hosts of a pod would be: process 0 pinned
          to one core only trains, process 1 pinned to the other only searches, its searcher
          thread free-running (sync.paced=False; S, k, m, B, K as the recipe sets them).
          Every k updates process 0's weights reach process 1 by a collective broadcast
          (multihost_utils.broadcast_one_to_all, whole in the searchers' dtype) and process
          1's new entries reach the trainer's buffer by distributed.all_gather_entries, the
          exchange the runtime's multi-host runs use.
  sync    one process with both cores and one device: sync.mode=alternate, k=1, m=1, S=K,
          no de-duplication (benchmarks/async_speedup.py's overrides): every update trains
          on B x K samples drawn under the current weights, all of the machine doing each
          phase in turn (the runtime's loop.run).

Evaluation (both): sampled pass@1 on every problem of the recipe's evaluation split
(validation) x --eval_samples samples, before the first update, after the last, and at the
first sync after --eval_seconds of training since the previous one (benchmarks.trl_grpo's
grid); the pinned arm's two processes each evaluate half the problems (the runtime's
multi-process evaluator), its searcher paused meanwhile. Clocks count training only:
compilation and the pre-fill count, evaluations do not; the budget (--minutes) counts from
the pre-fill's end, as max_train_seconds does. --set KEY=VALUE changes the pinned arm only
(a sweep over S, k, m: run it with --arms pinned).

Prints and writes --out/summary.json: per arm, time to --target, start / best / final
accuracy, samples produced and trained per second, mean staleness, seconds per update
(training clock / updates, and the update alone), the pinned arm's seconds per weight
broadcast + merge, and each process's CPU affinity (os.sched_getaffinity, recorded by the
process itself).

What the pinned arm is not: the runtime's loop. It is this file's loop over the runtime's
parts (loop.build_trainer, loop.sample_batch, config_builders' searcher pool, replay buffer
and evaluator, distributed's exchange), because loop.run splits each host's devices between
the roles and cannot yet give a whole process to one role (docs/architecture.md, "Roles per
process"). It leaves out what a measurement does not need: checkpoints, resume, stop
signals, searcher restarts after a failure (a failure stops the run), the distance to TB's
target (eval.target_distance=False in both arms), LoRA. Decisions (evaluate, stop, pre-fill
done) are process 0's, sent at every sync; the budget is checked at syncs (every k updates).
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ACC = "eval/sampled_pass@1"
ARMS = ("pinned", "sync")


# ----- The arms' configs ---------------------------------------------------------------------
def common_overrides(budget_s: float, eval_seconds: float, eval_samples: int,
                     seed: int) -> list[str]:
  """Both arms: a budget instead of a step count, the evaluation grid (benchmarks.trl_grpo's
  defaults: every validation problem x 8 samples, every 150 s), nothing saved."""
  return [f"seed={seed}", "num_train_steps=100000", f"max_train_seconds={budget_s}",
          "eval.every=0", f"eval.every_seconds={eval_seconds}", "eval.greedy=False",
          "eval.num_problems=0", f"eval.num_samples={eval_samples}",
          "eval.target_distance=False", "checkpoint.every=100000", "export=False"]


def arm_overrides(arm: str, c) -> list[str]:
  """The arm's own overrides of config `c` (the recipe's B, K)."""
  if arm == "pinned":  # one device per process; the searcher runs free
    return ["mesh.num_cpu_devices=1", "sync.mode=async", "sync.paced=False"]
  b, k = c.buffer.num_prompts, c.buffer.samples_per_prompt
  return ["mesh.num_cpu_devices=1", "sync.mode=alternate", "sync.every=1", "buffer.m=1.0",
          f"sampler.num_samples_per_prompt={k}", f"sampler.num_prompts_per_batch={b}",
          f"buffer.prefill={b * k}", "buffer.dedup=False", f"buffer.max_per_prompt={k}"]


def load(spec: str, overrides):
  from benchmarks.trl_grpo import load_config
  return load_config(spec, overrides)


# ----- Launching ---------------------------------------------------------------------------
def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def run_arm(arm: str, spec: str, overrides: list[str], cores: list[int], workdir: str,
            timeout_s: float, cache: str = "") -> None:
  """The arm's process(es), each told its cores; output in workdir/<role>.log. One that
  fails (or the timeout) ends the other."""
  os.makedirs(workdir, exist_ok=True)
  roles = {"pinned": [("trainer", [cores[0]]), ("searcher", [cores[1]])],
           "sync": [("sync", cores[:2])]}[arm]
  ports = f"{_free_port()},{_free_port()}"  # JAX's coordinator; the sync signal (pinned_run)
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  env.update(PYTHONUNBUFFERED="1", JAX_PLATFORMS="cpu")
  procs = []
  for role, mine in roles:
    log = open(os.path.join(workdir, f"{role}.log"), "w")
    cmd = [sys.executable, "-m", "benchmarks.async_pinned", "--worker", role,
           f"--cores={','.join(map(str, mine))}", f"--ports={ports}", f"--config={spec}",
           f"--out={workdir}", f"--compilation_cache={cache}",
           *[f"--override={o}" for o in overrides]]
    procs.append((subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log,
                                   stderr=subprocess.STDOUT), log))
  print(f"[{arm}] {len(procs)} process(es), logs in {workdir}", flush=True)
  deadline = time.time() + timeout_s
  try:
    while time.time() < deadline and any(p.poll() is None for p, _ in procs):
      if any(p.poll() for p, _ in procs):  # one failed: the other would wait for it
        break
      time.sleep(0.5)
  finally:
    for p, log in procs:  # never leave a process behind
      if p.poll() is None:
        p.kill()
        p.wait()
      log.close()
  failed = [(role, p.returncode) for (role, _), (p, _) in zip(roles, procs) if p.returncode]
  if failed:
    raise RuntimeError(f"{arm}: process(es) failed or timed out {failed}; see {workdir}/*.log")


# ----- The worker processes --------------------------------------------------------------------
def worker(role: str, cores: list[int], ports: list[int], spec: str, overrides: list[str],
           workdir: str, cache: str) -> None:
  """One process of an arm, pinned to `cores` before JAX starts (its thread pools see them)."""
  os.sched_setaffinity(0, cores)
  import jax
  if cache:  # one per arm: a 2-process program must not be read back by a 1-process run
    jax.config.update("jax_compilation_cache_dir", os.path.join(cache, f"async_pinned_{role}"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
  from tba_jax import distributed
  from tba_jax import config_builders as build
  c = load(spec, overrides)
  build.use_cpu_devices(c.mesh.num_cpu_devices)
  if role != "sync":
    distributed.initialize(f"127.0.0.1:{ports[0]}", 2, 0 if role == "trainer" else 1)
  info = {"role": role, "pid": os.getpid(), "affinity": sorted(os.sched_getaffinity(0)),
          "devices": [str(d) for d in jax.local_devices()]}
  if role == "sync":
    from tba_jax import loop
    loop.run(c, workdir)
  else:
    info.update(pinned_run(c, workdir, trainer=role == "trainer", signal_port=ports[1]))
  with open(os.path.join(workdir, f"{role}.json"), "w") as f:
    json.dump(info, f)


class _Gated:
  """A searcher whose next batch waits while `gate` is clear (paused for evaluations)."""

  def __init__(self, searcher, gate: threading.Event):
    self._searcher, self._gate = searcher, gate

  def search_once(self) -> int:
    self._gate.wait()
    return self._searcher.search_once()

  def __getattr__(self, name):
    return getattr(self._searcher, name)


def _signal_channel(trainer: bool, port: int):
  """A host connection between the two processes (multiprocessing.connection on loopback).

  Process 1's main thread waits here for the trainer's call to each sync, not inside a
  JAX collective: a CPU collective that waits for its peer occupies the device's one
  thread (the process is pinned to one core), so the searcher sharing that device would
  stop until the trainer came (measured: 448 samples where 32k were due).
  """
  from multiprocessing.connection import Client, Listener
  key = b"tba_jax async_pinned"
  if trainer:
    with Listener(("127.0.0.1", port), authkey=key) as listener:
      return listener.accept()
  for _ in range(600):
    try:
      return Client(("127.0.0.1", port), authkey=key)
    except ConnectionRefusedError:
      time.sleep(0.1)
  raise RuntimeError(f"no trainer listening on port {port}")


def pinned_run(c, workdir: str, trainer: bool, signal_port: int) -> dict:
  """The pinned arm's loop: process 0 trains, process 1 searches; every collective is called
  by both in the same order (module docstring). Returns this process's figures."""
  import jax
  from jax.experimental import multihost_utils
  from tba_jax import config_checks, distributed, loop, sharding, train_state
  from tba_jax import config_builders as build
  from tba_jax.batch import Layout
  from tba_jax.metrics import MetricsWriter
  from tba_jax.schedule import Schedule

  config_checks.validate(c)
  if c.model.lora.rank:
    raise ValueError("the pinned arm publishes whole weights: no LoRA")
  tokenizer = build.load_tokenizer(c.model)
  task = build.build_task(c.task, tokenizer)
  device = jax.local_devices()[0]  # this process's only device: its role's
  trainer_mesh = sharding.make_mesh("trainer", [device])
  searcher_mesh = sharding.make_mesh("searcher", [device])
  master32 = c.optim.master_weights_fp32 and c.model.dtype == "bfloat16"
  model_cfg, params, base = build.load_policy(c.model, tokenizer,
                                              "float32" if master32 else c.model.dtype,
                                              trainer_mesh, c.seed)
  dtype = c.sync.weights_dtype or c.model.dtype
  searcher_cfg = model_cfg.replace(dtype=dtype)
  shardings = sharding.param_shardings(searcher_cfg, "searcher", searcher_mesh)
  # Local copies only: weight_sync.publish would gather across processes (a collective the
  # other process does not call here); weights cross processes in `broadcast` below.
  cast = lambda p: jax.tree.map(lambda x: x.astype(dtype), p)
  to_searcher = lambda p, i=0: jax.device_put(cast(p), shardings, may_alias=False)
  evaluator = build.evaluator(c.eval, c.sampler, task, tokenizer, searcher_cfg, searcher_mesh,
                              c.task.max_prompt_len, progress=False,
                              include_eos=c.loss.include_eos)
  buffer = build.replay_buffer(c.buffer, priority_beta=c.loss.beta_end, seed=c.seed)
  layout = Layout(c.task.max_prompt_len, c.sampler.max_new_tokens, tokenizer.pad_id)
  k, b = c.sync.every, c.buffer
  pool, gate = None, threading.Event()
  if trainer:
    state, update, _, _ = loop.build_trainer(c, model_cfg, params, base, task, trainer_mesh)
    del params
    batch_shardings = train_state.batch_shardings(trainer_mesh)
  else:
    pool = build.searcher_pool(
        c, task, tokenizer, searcher_cfg, [searcher_mesh], publish=to_searcher, params=params,
        schedule=Schedule.of("async", k, b.num_prompts, b.m, paced=False), hosts=(0, 1))
    pool.searchers[:] = [_Gated(s, gate) for s in pool.searchers]
    template = cast(params)  # the broadcast's shapes; process 0's values replace its zeros
    del params

  # ----- The collectives, in the same order on both processes -----------------------------
  channel = _signal_channel(trainer, signal_port)

  def decide(*values: int) -> tuple[int, ...]:
    """Process 0's `values` on both, and process 1's samples produced so far last: the call
    to a sync point, on the host connection (_signal_channel); collectives follow at once."""
    if trainer:
      channel.send(tuple(int(v) for v in values))
      return (*values, channel.recv())
    values = channel.recv()
    channel.send(pool.metrics()["searcher_samples"])
    return (*values, 0)

  def broadcast():
    """Process 0's weights, in the searchers' dtype, as host arrays on both."""
    return multihost_utils.broadcast_one_to_all(
        cast(state.params) if trainer else template)

  def exchange() -> None:
    """Process 1's new entries into both processes' buffers (identical, in process order)."""
    if pool is not None:
      pool.merge(buffer)
    else:
      buffer.add_many(distributed.all_gather_entries(
          [], max_prompt_len=layout.prompt_len, max_completion_len=layout.completion_len))

  def evaluate(step: int, wall_time=None) -> None:
    """Both processes evaluate their half of the problems under process 0's weights."""
    gate.clear()  # the searcher's next batch waits (its batch in flight finishes)
    start = time.perf_counter()
    weights = broadcast()
    params = to_searcher(state.params) if trainer else to_searcher(weights)
    key = jax.random.fold_in(jax.random.key(c.seed + 1), step)  # as RunEvaluation's
    scores = evaluator(params, key)
    writer.write(step, {**scores, "eval_seconds": time.perf_counter() - start},
                 wall_time=wall_time)
    gate.set()

  writer = MetricsWriter(workdir, tensorboard=False, wandb_project=None,
                         config_dict=c.to_dict(), enabled=trainer)
  evaluate(0, wall_time=0.0)  # as loop.run's: its seconds are taken off the clock
  if pool is not None:
    pool.begin()
  # ----- Pre-fill: process 1 samples; process 0 waits for B entries' worth ---------------------
  while True:
    time.sleep(0.2)
    ready, _ = decide(len(buffer) >= b.prefill)
    if ready:
      break
    exchange()
  buffer.mark_sync()

  # ----- Train (process 0) / wait for the next sync (process 1) -------------------------------
  train_start = last_eval = time.perf_counter()
  steps, samples, evals_s, sync_s, syncs, busy = 0, 0, 0.0, 0.0, 0, 0.0
  while True:
    if trainer:
      for _ in range(k):  # k updates between syncs
        t0 = time.perf_counter()
        batch, _ = loop.sample_batch(buffer, c, layout)
        staleness = int(state.step) - batch.versions  # staleness enters here
        state, m = update(state, jax.device_put(batch, batch_shardings))
        m = jax.device_get(m)  # the trainer's one host sync per step
        dt = time.perf_counter() - t0
        busy += dt
        steps += 1
        writer.write(steps, {**{key: float(v) for key, v in m.items()}, "step_seconds": dt,
                             "staleness_mean": float(staleness.mean()),
                             "staleness_max": int(staleness.max()),
                             "searcher_samples": samples})  # as of the latest sync
    now = time.perf_counter()
    out_of_time = now - train_start - evals_s > c.max_train_seconds
    eval_due = 0 < c.eval.every_seconds <= now - last_eval
    steps, stop, eval_due, samples = decide(steps, out_of_time, eval_due)
    weights = broadcast()  # the sync: weights (version = updates done), then entries
    if pool is not None:
      pool.publish(steps, weights)
    del weights
    exchange()
    buffer.mark_sync()
    sync_s += time.perf_counter() - now
    syncs += 1
    if stop:
      break
    if eval_due:
      start = time.perf_counter()
      evaluate(steps)
      last_eval = time.perf_counter()
      evals_s += last_eval - start
  evaluate(steps)
  if pool is not None:
    pool.stop()
  writer.close()
  mine = {"update_seconds_total": busy} if trainer else pool.metrics()
  return {"steps": steps, "syncs": syncs, "sync_seconds_mean": sync_s / max(syncs, 1),
          "searcher_samples": samples, **mine}


# ----- Reading the runs --------------------------------------------------------------------------
def summarize(workdir: str, arm: str, target: float, trained_per_update: int) -> dict:
  """An arm's figures from its metrics.jsonl and its processes' JSON (module docstring)."""
  from tba_jax.metrics import read_jsonl
  rows = read_jsonl(os.path.join(workdir, "metrics.jsonl"))
  evals, train, spent = [], [], 0.0
  for r in rows:  # the training clock: wall-clock less the evaluations so far
    if ACC in r:
      spent += r.get("eval_seconds", 0.0)
      evals.append({"seconds": max(r["wall_time"] - spent, 0.0), "updates": r["step"],
                    "accuracy": r[ACC]})
    if "loss" in r:
      train.append({**r, "seconds": r["wall_time"] - spent})
  processes = [json.load(open(os.path.join(workdir, f"{role}.json")))
               for role in {"pinned": ("trainer", "searcher"), "sync": ("sync",)}[arm]]
  clock = evals[-1]["seconds"]  # the final evaluation follows the last update
  steps = len(train)
  produced = (processes[0]["searcher_samples"] if arm == "pinned"  # as of the last sync
              else train[-1]["searcher_samples"] if train else 0)
  reached = next((e for e in evals if e["accuracy"] >= target), None)
  out = {
      "processes": processes, "evals": evals, "target": target,
      "seconds_to_target": reached and reached["seconds"],
      "updates_to_target": reached and reached["updates"],
      "start_accuracy": evals[0]["accuracy"], "final_accuracy": evals[-1]["accuracy"],
      "best_accuracy": max(e["accuracy"] for e in evals), "updates": steps,
      "training_seconds": clock,
      "samples_produced": produced, "samples_trained": steps * trained_per_update,
      "samples_produced_per_second": produced / max(clock, 1e-9),
      "samples_trained_per_second": steps * trained_per_update / max(clock, 1e-9),
      "staleness_mean": (sum(r["staleness_mean"] for r in train) / steps) if steps else None,
      "seconds_per_update": clock / steps if steps else None,
      "update_seconds_median": sorted(r["step_seconds"] for r in train)[steps // 2]
                               if steps else None,
  }
  if arm == "pinned":
    out["sync_seconds_mean"] = processes[0]["sync_seconds_mean"]
    out["searcher_busy_fraction"] = processes[1]["searcher_busy_fraction"]
  return out


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--minutes", type=float, default=25.0, help="training budget per arm")
  parser.add_argument("--target", type=float, default=0.9, help="held-out sampled pass@1")
  parser.add_argument("--eval_seconds", type=float, default=150.0,
                      help="training seconds between evaluations")
  parser.add_argument("--eval_samples", type=int, default=8, help="samples per problem")
  parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                      help="a config override of the pinned arm only (a sweep point: "
                           "sync.every=4, buffer.m=0.5, sampler.num_prompts_per_batch=2)")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--out", default="/tmp/tba_async_pinned")
  parser.add_argument("--tiny", action="store_true", help="the tiny random model (a test)")
  parser.add_argument("--compilation_cache", default="",
                      help="a JAX compilation cache directory for the workers (default none: "
                           "compilation counts in both arms, as a fresh run's)")
  parser.add_argument("--arms", default=",".join(ARMS), help="which arms, comma-separated")
  parser.add_argument("--cores", default="",
                      help="two cores, e.g. 0,1 (default: the first two this process may use)")
  # A worker process of an arm (run_arm starts them).
  parser.add_argument("--worker", default="", help=argparse.SUPPRESS)
  parser.add_argument("--ports", default="", help=argparse.SUPPRESS)
  parser.add_argument("--config", default="", help=argparse.SUPPRESS)
  parser.add_argument("--override", action="append", default=[], help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  cores = ([int(x) for x in args.cores.split(",")] if args.cores
           else sorted(os.sched_getaffinity(0))[:2])
  if args.worker:
    return worker(args.worker, cores, [int(p) for p in args.ports.split(",")], args.config,
                  args.override, args.out, args.compilation_cache)
  if len(cores) < 2:
    raise SystemExit(f"needs two cores; this process may use {sorted(os.sched_getaffinity(0))}")
  spec = "configs/gsm8k.py:" + ("tiny" if args.tiny else "cpu")
  budget = args.minutes * 60
  base = common_overrides(budget, args.eval_seconds, args.eval_samples, args.seed)
  recipe = load(spec, base)
  trained = recipe.buffer.num_prompts * recipe.buffer.samples_per_prompt
  results = {}
  for arm in args.arms.split(","):
    workdir = os.path.join(args.out, arm)
    overrides = base + arm_overrides(arm, recipe) + (args.set if arm == "pinned" else [])
    t0 = time.time()
    # Set-up, compilation, pre-fill and evaluations come on top of the budget.
    run_arm(arm, spec, overrides, cores, workdir, timeout_s=3 * budget + 1800,
            cache=args.compilation_cache)
    print(f"[{arm}] finished in {time.time() - t0:.0f} s", flush=True)
    results[arm] = {"config": spec, "overrides": overrides,
                    **summarize(workdir, arm, args.target, trained)}
  with open(os.path.join(args.out, "summary.json"), "w") as f:
    json.dump(results, f, indent=1)
  _print(results, spec, budget)
  return results


def _print(results: dict, spec: str, budget: float) -> None:
  fmt = lambda v: ("-" if v is None else f"{v:.3f}" if isinstance(v, float) else str(v))
  keys = ("start_accuracy", "best_accuracy", "final_accuracy", "seconds_to_target",
          "updates_to_target", "updates", "training_seconds", "samples_produced_per_second",
          "samples_trained_per_second", "staleness_mean", "seconds_per_update",
          "update_seconds_median", "sync_seconds_mean", "searcher_busy_fraction")
  print(f"\n{spec}, training budget {budget:.0f} s per arm, target "
        f"{next(iter(results.values()))['target']}")
  print(f"{'':>28}" + "".join(f"{arm:>12}" for arm in results))
  for key in keys:
    print(f"{key:>28}" + "".join(f"{fmt(r.get(key)):>12}" for r in results.values()))
  for arm, r in results.items():
    print(f"{arm}: " + "; ".join(f"{p['role']} on cores {p['affinity']}" for p in r["processes"]))
  if all(results.get(a, {}).get("seconds_to_target") for a in ARMS):
    ratio = results["sync"]["seconds_to_target"] / results["pinned"]["seconds_to_target"]
    print(f"time to target, sync / pinned: {ratio:.2f}x")


if __name__ == "__main__":
  main()
