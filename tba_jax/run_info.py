"""What a run is, printed when it starts and recorded in metrics.jsonl.

The device layout and the mode decide what a run computes as much as the
config does (one device turns `sync.mode=async` into alternation), so every run
states them, with the model, the task sizes and the beta and lr schedules as
the run will apply them, before its first step. loop.run prints `banner(...)`
and writes the same dict as the "run" field of the segment's first
metrics.jsonl row (metrics.MetricsWriter.start_segment).
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import jax

from tba_jax import lora, model


def _points(fn: Callable[[int], float], steps, last: int) -> str:
  """`fn` at the given steps (within 1..last), e.g. "0.014 @1 -> 0.004 @500 -> 0.004 @700"."""
  pts = sorted({s for s in steps if 1 <= s <= last} | {1, last})
  values = [(s, float(fn(s))) for s in pts]
  if len({v for _, v in values}) == 1:
    return f"{values[0][1]:.4g} at every step"
  return " -> ".join(f"{v:.4g} @{s}" for s, v in values)


def schedules(c, beta_at: Callable[[int], float], lr_at: Callable[[int], float]) -> dict:
  """The beta and lr of the update that produces step s, at the steps where they change."""
  n, lo, o = c.num_train_steps, c.loss, c.optim
  beta_steps = (lo.beta_anneal_steps // 2, lo.beta_anneal_steps, lo.beta_switch_step - 1,
                lo.beta_switch_step)
  w = o.warmup_steps
  # where the schedule's phases end (config_builders.SCHEDULES)
  stable_end = w + o.stable_steps if o.schedule in ("wsd", "rsqrt") else w
  if o.schedule == "rsqrt":  # no end: the lr is half the peak at 4x the knee, a quarter at 16x
    middle, end = 4 * stable_end, 16 * stable_end
  else:
    end = {"wsd": w + o.stable_steps + o.decay_steps, "cosine": o.decay_steps or n,
           "linear": o.linear_decay_steps or n}.get(o.schedule, n)
    middle = (stable_end + end) // 2
  lr_steps = (w, w + 1, stable_end, middle, end, n // 2)
  return {"beta": _points(beta_at, beta_steps, n) + f" ({lo.name})",
          "lr": _points(lr_at, lr_steps, n) + f" ({o.schedule})"}


def describe(c, *, trainer_mesh, searcher_meshes, mode: str, model_config, task,
             num_eval_problems: int, start_step: int, beta_at, lr_at) -> dict:
  """The setup of this run as a JSON-able dict (the model's parameters counted without
  any LoRA adapters; those as lora.trained_parameters)."""
  device = jax.devices()[0]
  note = ""
  if mode != c.sync.mode:
    note = (f"sync.mode={c.sync.mode!r} asked, but this host has one device: the roles share "
            "it and take turns")
  b, s = c.buffer, c.sampler
  adapters = model_config.lora
  lora_info = {} if adapters is None else {"lora": {
      "rank": adapters.rank, "alpha": adapters.alpha, "targets": ",".join(adapters.targets),
      "trained_parameters": lora.count(model_config),
      # Adapters are trained parameters: float32 masters like any (loop.run); the base is frozen.
      "dtype": "float32" if c.optim.master_weights_fp32 else c.model.dtype}}
  return {
      "devices": {"count": jax.device_count(), "platform": device.platform,
                  "kind": device.device_kind, "processes": jax.process_count()},
      "trainer": {"devices": int(trainer_mesh.devices.size), "mesh": dict(trainer_mesh.shape)},
      "searchers": {"per_process": len(searcher_meshes),
                    "devices_each": int(searcher_meshes[0].devices.size),
                    "shared_with_trainer": bool(set(searcher_meshes[0].devices.flat) &
                                                set(trainer_mesh.devices.flat))},
      "mode": mode, "mode_note": note,
      "model": {"path": c.model.path, "type": model_config.model_type,
                "parameters": model.count_params(lora.base_config(model_config)),
                "layers": model_config.num_layers, "dim": model_config.dim,
                "vocab": model_config.vocab_size,
                "dtype": c.model.dtype, "master_dtype": str(model_config.dtype),
                "searcher_dtype": c.sync.weights_dtype or c.model.dtype, **lora_info},
      # The task's own name (a Task passed to loop.run has one), and what shows whether
      # the run learned, for the plot tool (experiments/plot.py).
      "task": {"name": task.name, "train_problems": len(task.train),
               "validation_problems": len(task.validation), "test_problems": len(task.test),
               "eval_split": c.eval.split, "eval_problems": num_eval_problems,
               "eval_devices": c.eval.devices,
               "metrics": [dataclasses.asdict(m) for m in (task.reward_metric, *task.headline)]},
      "batch": {"prompts": b.num_prompts, "samples_per_prompt": b.samples_per_prompt,
                "m": b.m, "sync_every": c.sync.every, "searcher_prompts": s.num_prompts_per_batch,
                "searcher_samples_per_prompt": s.num_samples_per_prompt,
                "searcher_slots": s.num_slots, "in_flight_updates": c.sync.in_flight_updates},
      "steps": {"from": start_step, "to": c.num_train_steps},
      **schedules(c, beta_at, lr_at),
  }


def count(n: int) -> str:
  """A parameter count to 3 significant digits: 41.2K, 135M, 1.24B."""
  rounded = float(f"{n:.3g}")  # first, so that 999,999 reads 1M, not 1e+03K
  for scale, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
    if rounded >= scale:
      return f"{rounded / scale:g}{suffix}"
  return str(n)


def banner(setup: dict, workdir: str) -> str:
  """A few lines for the console."""
  d, t, sr, m = setup["devices"], setup["trainer"], setup["searchers"], setup["model"]
  ta, ba = setup["task"], setup["batch"]
  mode = {"async": "async (searchers sample in threads while the trainer trains)",
          "alternate": "alternate (a search round, then sync_every training steps)"}[setup["mode"]]
  shared = " (the same device)" if sr["shared_with_trainer"] else ""
  if ba["searcher_slots"]:
    weights = ("new weights taken between decode chunks" if ba["in_flight_updates"] else
               "new weights taken when the slots are empty")
    searching = (f"searchers keep {ba['searcher_slots']} rows in flight (continuous batching, "
                 f"{ba['searcher_samples_per_prompt']} samples per prompt), {weights}")
  else:
    searching = (f"searcher batch {ba['searcher_prompts']} prompts x "
                 f"{ba['searcher_samples_per_prompt']} samples")
  lines = [
      f"tba_jax run in {workdir}: steps {setup['steps']['from']} -> {setup['steps']['to']}",
      f"  devices   {d['count']} x {d['platform']} ({d['kind']}), {d['processes']} process(es)",
      f"  layout    trainer {t['devices']} device(s) {t['mesh']}; searchers {sr['per_process']} "
      f"per process x {sr['devices_each']} device(s){shared}",
      f"  mode      {mode}" + (f"\n            NOTE: {setup['mode_note']}" if setup["mode_note"]
                               else ""),
      f"  model     {m['path']} ({m['type']}, {count(m['parameters'])} parameters, "
      f"{m['layers']} layers); trainer {m['master_dtype']}, searchers {m['searcher_dtype']}",
      *([f"  lora      rank {m['lora']['rank']}, alpha {m['lora']['alpha']:g} on "
         f"{m['lora']['targets']}: {count(m['lora']['trained_parameters'])} parameters "
         f"trained ({m['lora']['dtype']}), the base frozen"] if "lora" in m else []),
      f"  task      {ta['name']}: {ta['train_problems']} train / {ta['validation_problems']} "
      f"validation / {ta['test_problems']} test problems, {ta['eval_problems']} "
      f"{ta['eval_split']} problems evaluated on the {ta['eval_devices']}'s devices",
      f"  batch     {ba['prompts']} prompts x {ba['samples_per_prompt']} samples, m={ba['m']}, "
      f"sync every {ba['sync_every']} steps; {searching}",
      f"  beta      {setup['beta']}",
      f"  lr        {setup['lr']}",
  ]
  return "\n".join(lines)
