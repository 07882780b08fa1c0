r"""A simulated pod: the trainer step and the searcher decode step of a recipe compiled
(not run) for N fake CPU devices with the project's meshes; per-device memory and
collectives from the compiled programs, every time figure predicted.

  python -m benchmarks.pod --model qwen2.5-7b --num_devices 64
  python -m benchmarks.pod --model qwen2.5-7b --num_devices 8 --splits 8x1,4x2,2x4,1x8

For each trainer split FSDP x tensor (--splits, default tensor 1, 4 and 8, the rest
FSDP) and micro-batch size (--microbatch_rows) the real TB update
(train_step.make_update, float32 master weights and moments, bfloat16 compute, remat)
over abstract sharded arrays is lowered and compiled; for each searcher tensor degree the
decode step (sampler.model_logits_fn over a KV cache of --decode_rows rows) likewise.
Per device it prints XLA's memory_analysis() (arguments, outputs, temporaries: what the
compiled program allocates, not a shape floor) and the collectives of the compiled HLO
(kind, count, bytes), with a predicted time at the chip-to-chip bandwidth of each chip
(benchmarks/roofline.py's CHIPS; ring all-gather / reduce-scatter moving (n-1)/n of the
bytes per device, all-reduce twice that). Layers are scanned, and XLA lists a loop
body's collectives once: each is counted once per trip of every loop around it (the
while loops' known_trip_count: the layer scan inside the micro-batch loop). The weight publish (trainer -> searcher) moves the
bfloat16 weights once: its time at the link bandwidth is predicted. A layout fits a chip
when arguments + outputs + temporaries (less donated aliases) stay within its HBM.
benchmarks/memory.py's shape floor for the same layout is printed beside it.
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import time

MODELS = {"qwen2.5-7b": "Qwen/Qwen2.5-7B-Instruct", "qwen2.5-1.5b": "Qwen/Qwen2.5-1.5B-Instruct",
          "rho-1b": "realtreetune/rho-1b-sft-GSM8K"}
COLLECTIVES = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute")
FITS = {"v5p-64": ("v5p", 64), "8xH200": ("H200", 8)}
_DTYPE_BYTES = {"f32": 4, "bf16": 2, "f16": 2, "s32": 4, "u32": 4, "s8": 1, "u8": 1, "pred": 1,
                "f64": 8, "s64": 8}


def _shape_bytes(text: str) -> int:
  """Bytes of an HLO result type: `bf16[4,128]{1,0}` or a tuple of them."""
  total = 0
  for dtype, dims in re.findall(r"(\w+)\[([\d,]*)\]", text):
    if dtype in _DTYPE_BYTES:
      n = 1
      for d in filter(None, dims.split(",")):
        n *= int(d)
      total += n * _DTYPE_BYTES[dtype]
  return total


def collectives(hlo: str) -> dict:
  """{kind: (count, bytes per device)} of the compiled HLO's collectives per run: one
  inside a while body counts once per trip of every loop around it (XLA's
  known_trip_count: the layer scan inside the micro-batch loop, for instance)."""
  parent, comp, found = {}, "", []  # body -> (computation holding the while, trips)
  for line in hlo.splitlines():
    head = re.match(r"^(?:ENTRY )?%?([\w.\-]+) .*\{$", line)
    if head:
      comp = head.group(1)
      continue
    loop = re.search(r" while\(.*body=%?([\w.\-]+)", line)
    if loop:
      trips = re.search(r'"known_trip_count":\{"n":"(\d+)"', line)
      parent[loop.group(1)] = (comp, int(trips.group(1)) if trips else 1)
    m = re.search(r"= (\([^=]*\)|\w+\[[\d,]*\][^ ]*) (" + "|".join(COLLECTIVES) +
                  r")(?:-start)?\(", line)
    if m:
      found.append((comp, m.group(2), _shape_bytes(m.group(1))))

  def times(c: str, depth: int = 0) -> int:
    if c not in parent or depth > 16:
      return 1
    up, trips = parent[c]
    return trips * times(up, depth + 1)

  out = {}
  for c, kind, nbytes in found:
    n = times(c)
    count, total = out.get(kind, (0, 0))
    out[kind] = (count + n, total + n * nbytes)
  return out


def link_seconds(coll: dict, group: int, link_gbps: float) -> float:
  """Ring time of the collectives at one link's bandwidth, groups of `group` devices."""
  if group <= 1:
    return 0.0
  frac = (group - 1) / group
  total = 0.0
  for kind, (_, nbytes) in coll.items():
    total += nbytes * (2 * frac if kind == "all-reduce" else frac)
  return total / (link_gbps * 1e9)


def _memory(compiled) -> dict:
  m = compiled.memory_analysis()
  args, outs, temps, alias = (m.argument_size_in_bytes, m.output_size_in_bytes,
                              m.temp_size_in_bytes, m.alias_size_in_bytes)
  return dict(args=args, outputs=outs, temps=temps, alias=alias, peak=args + outs + temps - alias)


def trainer_program(cfg, devices, fsdp: int, tensor: int, rows: int, prompt_len: int,
                    new_tokens: int, microbatches: int):
  import jax
  import jax.numpy as jnp
  from tba_jax import config_builders, model, sharding, train_step
  from tba_jax.batch import TrainBatch
  from tba_jax.model_config import ModelConfig  # noqa: F401
  mesh = sharding.make_mesh("trainer", devices[:fsdp * tensor], tensor)
  optimizer = train_step.make_optimizer(1e-5, 0.0, 1.0)
  loss = config_builders.LOSSES["tb"](_loss_cfg())
  update = train_step.make_update(cfg, optimizer, loss, lambda s: jnp.float32(0.01), mesh,
                                  temperature=1.0, compute_dtype="bfloat16",
                                  num_microbatches=microbatches, remat=True)
  state_sh = train_step.state_shardings(cfg, optimizer, mesh)
  shapes = jax.eval_shape(lambda p: train_step.TrainState(
      params=p, opt_state=optimizer.init(p), step=jnp.zeros((), jnp.int32)),
      model.param_shapes(cfg))
  state = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                       shapes, state_sh)
  t = prompt_len + new_tokens
  b = train_step.batch_shardings(mesh)
  sds = lambda shape, dtype, s: jax.ShapeDtypeStruct(shape, dtype, sharding=s)
  batch = TrainBatch(
      tokens=sds((rows, t), jnp.int32, b.tokens), attention_mask=sds((rows, t), jnp.int32, b.tokens),
      completion_mask=sds((rows, new_tokens), jnp.float32, b.tokens),
      ref_logprobs=sds((rows, new_tokens), jnp.float32, b.tokens),
      behaviour_logprobs=sds((rows, new_tokens), jnp.float32, b.tokens),
      rewards=sds((rows,), jnp.float32, b.rewards), group_ids=sds((rows,), jnp.int32, b.rewards),
      prompt_ids=sds((rows,), jnp.int32, b.rewards), versions=sds((rows,), jnp.int32, b.rewards))
  return update.lower(state, batch).compile()


def _loss_cfg():
  import ml_collections
  return ml_collections.ConfigDict(dict(ratio_clip=0.0, log_z="vargrad"))


def searcher_program(cfg, devices, tensor: int, rows: int, cache_len: int):
  import dataclasses
  import jax
  import jax.numpy as jnp
  from tba_jax import model, sampler, sharding
  from tba_jax.model import KVCache
  mesh = sharding.make_mesh("searcher", devices[:tensor], tensor)
  psh = sharding.param_shardings(cfg, "searcher", mesh)
  params = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, jnp.bfloat16, sharding=s),
                        model.param_shapes(cfg), psh)
  cache = jax.eval_shape(lambda: KVCache.init(cfg, rows, cache_len, jnp.bfloat16))
  kv = sharding.cache_sharding(cfg, mesh)
  rows_sh = sharding.batch_sharding("searcher", mesh, 2)
  one = sharding.batch_sharding("searcher", mesh, 1)
  cache = dataclasses.replace(
      cache, k=jax.ShapeDtypeStruct(cache.k.shape, cache.k.dtype, sharding=kv),
      v=jax.ShapeDtypeStruct(cache.v.shape, cache.v.dtype, sharding=kv),
      mask=jax.ShapeDtypeStruct(cache.mask.shape, bool, sharding=rows_sh),
      index=jax.ShapeDtypeStruct((rows,), jnp.int32, sharding=one))
  tok = jax.ShapeDtypeStruct((rows, 1), jnp.int32, sharding=rows_sh)
  fn = jax.jit(sampler.model_logits_fn(cfg.replace(dtype="bfloat16")), donate_argnums=(4,))
  return fn.lower(params, tok, tok, tok, cache).compile()


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--model", default="qwen2.5-7b", choices=sorted(MODELS))
  parser.add_argument("--num_devices", type=int, default=64)
  parser.add_argument("--splits", default="", help="FSDPxTENSOR,...; default: tensor 1, 4, 8")
  parser.add_argument("--microbatch_rows", default="64",
                      help="rows per micro-batch (the batch: 4 micro-batches of it)")
  parser.add_argument("--prompt_len", type=int, default=384)
  parser.add_argument("--new_tokens", type=int, default=512)
  parser.add_argument("--decode_rows", type=int, default=256)
  parser.add_argument("--searcher_tensor", default="1,2,4,8")
  args = parser.parse_args(argv)
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                             + f" --xla_force_host_platform_device_count={args.num_devices}")
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  import jax

  from benchmarks import memory
  from benchmarks.roofline import CHIPS
  from tba_jax import model
  from tba_jax.model_config import ModelConfig
  start = time.perf_counter()
  devices = jax.devices()
  if len(devices) != args.num_devices:
    sys.exit(f"{len(devices)} devices, not {args.num_devices}: run in a fresh process")
  cfg = ModelConfig(**memory.ARCHITECTURES[MODELS[args.model]], dtype="float32")
  n = args.num_devices
  splits = ([tuple(map(int, s.split("x"))) for s in args.splits.split(",")] if args.splits else
            [(n // t, t) for t in (1, 4, 8) if n % t == 0])
  weights = model.count_params(cfg) * 2
  print(f"# {args.model}: {model.count_params(cfg) / 1e9:.2f}B params, {n} fake CPU devices; "
        f"compiled, not run; load {os.getloadavg()[0]:.1f}; every time is predicted")
  print("\n## trainer step (TB, float32 master + AdamW, bfloat16 compute, remat, 4 micro-batches)")
  print("| fsdp x tensor | micro-batch rows | args GB | outputs GB | temps GB | peak GB/device | "
        "memory.py floor GB | collectives (count, GB/device) | " +
        " | ".join(f"{k} ICI/NVLink s predicted" for k in CHIPS) + " | fits |")
  print("|---|---|---|---|---|---|---|---|" + "---|" * len(CHIPS) + "---|")
  results = []
  for fsdp, tensor in splits:
    for micro in map(int, args.microbatch_rows.split(",")):
      rows = 4 * micro
      if micro % fsdp:
        continue  # a micro-batch splits over the fsdp axis
      t0 = time.perf_counter()
      compiled = trainer_program(cfg, devices, fsdp, tensor, rows, args.prompt_len,
                                 args.new_tokens, 4)
      mem = _memory(compiled)
      coll = collectives(compiled.as_text())
      floor = _floor(cfg, fsdp * tensor, micro, args)
      times = [link_seconds(coll, fsdp * tensor, chip["link_gbps"]) for chip in CHIPS.values()]
      fits = [name for name, (chip, count) in FITS.items()
              if count == n and mem["peak"] <= CHIPS[chip]["hbm_gb"] * 1e9]
      results.append((fsdp, tensor, micro, mem, coll, fits))
      cells = ", ".join(f"{k} {c} x, {b / 1e9:.2f}" for k, (c, b) in coll.items())
      print(f"| {fsdp} x {tensor} | {micro} | {mem['args'] / 1e9:.2f} | {mem['outputs'] / 1e9:.2f} |"
            f" {mem['temps'] / 1e9:.2f} | {mem['peak'] / 1e9:.2f} | {floor / 1e9:.2f} | {cells} | "
            + " | ".join(f"{s:.2f}" for s in times) + f" | {', '.join(fits) or '-'} |"
            f" <!-- compile {time.perf_counter() - t0:.0f} s -->")
  print(f"\n## searcher decode step ({args.decode_rows} rows, cache {args.prompt_len} + "
        f"{args.new_tokens} slots, bfloat16)")
  print("| tensor | args GB | outputs GB | temps GB | peak GB/device | collectives per step "
        "(count, GB/device) | " + " | ".join(f"{k} s/step predicted" for k in CHIPS) + " |")
  print("|---|---|---|---|---|---|" + "---|" * len(CHIPS))
  for tensor in map(int, args.searcher_tensor.split(",")):
    compiled = searcher_program(cfg, devices, tensor, args.decode_rows,
                                args.prompt_len + args.new_tokens)
    mem = _memory(compiled)
    coll = collectives(compiled.as_text())
    cells = ", ".join(f"{k} {c} x, {b / 1e9:.3f}" for k, (c, b) in coll.items()) or "none"
    times = [link_seconds(coll, tensor, chip["link_gbps"]) for chip in CHIPS.values()]
    print(f"| {tensor} | {mem['args'] / 1e9:.2f} | {mem['outputs'] / 1e9:.2f} | "
          f"{mem['temps'] / 1e9:.2f} | {mem['peak'] / 1e9:.2f} | {cells} | "
          + " | ".join(f"{s:.4f}" for s in times) + " |")
  print(f"\n## weight publish (trainer -> searcher): {weights / 1e9:.2f} GB of bfloat16 weights")
  print("| chip | link GB/s | predicted s |")
  print("|---|---|---|")
  for name, chip in CHIPS.items():
    print(f"| {name} | {chip['link_gbps']:.0f} | {weights / (chip['link_gbps'] * 1e9):.2f} |")
  print(f"\n# {time.perf_counter() - start:.0f} s on this machine "
        f"({os.cpu_count()} cores, load {os.getloadavg()[0]:.1f})")
  return results


def _floor(cfg, trainers: int, micro: int, args) -> float:
  """benchmarks/memory.py's trainer floor for this layout: master params, moments and
  gradients (float32) sharded over every trainer device, plus one micro-batch's float32
  completion logits [rows, new, V] split over the devices."""
  from tba_jax import model
  n = model.count_params(cfg)
  return (4 + 8 + 4) * n / trainers + micro * args.new_tokens * cfg.vocab_size * 4 / trainers


if __name__ == "__main__":
  main()
