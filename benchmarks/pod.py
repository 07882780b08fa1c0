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
(kind, count, bytes), with a predicted time on each chip (benchmarks/roofline.py's
CHIPS; collective_seconds): every collective a ring over its replica groups (all-gather
and reduce-scatter moving (n-1)/n of the data per device, all-reduce twice that; an
all-to-all 1/n to each member; a collective-permute its whole buffer). A group inside
one node (GPUs: 8 on NVLink; TPUs: a whole ICI slice) moves at link_gbps; a group that
spans nodes moves at the network's pace, net_gbps per GPU (one 400 Gb/s NIC each, 1/9 of
NVLink), times the group's GPUs in each node (NCCL's rings, one per NIC rail, share the
cross-node bytes among them), at most link_gbps. The program's devices are taken as
numbered node by node (jax.devices() on GPU hosts: process by process). Layers are
scanned, and XLA lists a loop body's collectives once: each is counted once per trip of
every loop around it (the while loops' known_trip_count: the layer scan inside the
micro-batch loop). The weight publish (trainer -> searcher) moves the bfloat16 weights
once: its time is predicted with the searcher in the trainer's node (link_gbps) and in
another node (net_gbps: all of it through the searcher GPU's one NIC); the trainer-side
float32 -> bfloat16 cast (HBM, 6 bytes a parameter over the trainer's shards) is not
counted. A layout fits a chip when arguments + outputs + temporaries (less donated
aliases) stay within its HBM.
benchmarks/memory.py's shape floor for the same layout is printed beside it.
"""
from __future__ import annotations

import argparse
import math
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


def replica_groups(line: str) -> list[list[int]] | None:
  """The device groups of one collective in compiled HLO text: its replica_groups
  (explicit `{{0,1},{2,3}}`, iota `[2,2]<=[4]` / `[2,2]<=[2,2]T(1,0)`, or Shardy's
  `mesh['axis_0'=2,'axis_1'=2] {'axis_1'}`), or a collective-permute's source -> target
  pairs. None: every device of the program (`{}`) or a form not parsed here."""
  import numpy as np
  m = re.search(r"source_target_pairs=\{((?:\{\d+,\d+\},?)*)\}", line)
  if m:
    return [list(map(int, p)) for p in re.findall(r"\{(\d+),(\d+)\}", m.group(1))]
  m = re.search(r"replica_groups=\{((?:\{[\d,]*\},?)+)\}", line)
  if m:
    return [[int(d) for d in g.split(",") if d] for g in re.findall(r"\{([\d,]*)\}", m.group(1))]
  m = re.search(r"replica_groups=\[(\d+),(\d+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?", line)
  if m:
    ids = np.arange(math.prod(int(d) for d in m.group(3).split(","))).reshape(
        [int(d) for d in m.group(3).split(",")])
    if m.group(4):
      ids = ids.transpose([int(p) for p in m.group(4).split(",")])
    return ids.reshape(int(m.group(1)), int(m.group(2))).tolist()
  m = re.search(r"replica_groups=mesh\[([^\]]*)\](?:, device_ids=\(\[([\d,]+)\]"
                r"(?:T\(([\d,]+)\))?\))? \{([^}]*)\}", line)
  if m and ":" not in m.group(4):  # (a sub-axis, 'axis_0':(1)2, is not parsed)
    axes = re.findall(r"'([^']+)'=(\d+)", m.group(1))
    names, sizes = [a for a, _ in axes], [int(n) for _, n in axes]
    over = re.findall(r"'([^']+)'", m.group(4))
    if not set(over) <= set(names):
      return None
    ids = np.arange(math.prod(sizes))
    if m.group(2):  # device_ids=([16,4]T(1,0)): the mesh's devices, an iota transposed
      ids = ids.reshape([int(d) for d in m.group(2).split(",")])
      if m.group(3):
        ids = ids.transpose([int(p) for p in m.group(3).split(",")])
    moved = [names.index(a) for a in over]
    keep = [i for i in range(len(names)) if i not in moved]
    ids = ids.reshape(sizes).transpose(keep + moved)
    return ids.reshape(-1, math.prod(sizes[i] for i in moved)).tolist()
  return None


def collective_ops(hlo: str) -> list[dict]:
  """The compiled HLO's collectives, one dict per instruction: kind, count (one inside a
  while body counts once per trip of every loop around it, XLA's known_trip_count: the
  layer scan inside the micro-batch loop, for instance), bytes (per device, count x the
  bytes of its result) and groups (replica_groups(); None: all the program's devices)."""
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
      found.append((comp, m.group(2), _shape_bytes(m.group(1)), replica_groups(line)))

  def times(c: str, depth: int = 0) -> int:
    if c not in parent or depth > 16:
      return 1
    up, trips = parent[c]
    return trips * times(up, depth + 1)

  return [dict(kind=kind, count=times(c), bytes=times(c) * nbytes, groups=groups)
          for c, kind, nbytes, groups in found]


def collectives(hlo: str) -> dict:
  """{kind: (count, bytes per device)} of the compiled HLO's collectives per run
  (collective_ops summed by kind)."""
  out = {}
  for op in collective_ops(hlo):
    count, total = out.get(op["kind"], (0, 0))
    out[op["kind"]] = (count + op["count"], total + op["bytes"])
  return out


def _seconds_per_byte(kind: str, group: list[int], chip: dict) -> float:
  """Seconds per byte of a collective's result, for one group of devices (module doc)."""
  node, link = chip["node_chips"], chip["link_gbps"] * 1e9
  net = chip["net_gbps"] * 1e9 if chip.get("net_gbps") else None
  if kind == "collective-permute":  # group: (source, target); the source sends it all
    src, dst = group
    if src == dst:
      return 0.0
    if src // node == dst // node:
      return 1 / link
    return 1 / net if net else math.nan
  n = len(group)
  if n <= 1:
    return 0.0
  per_node = {}
  for d in group:
    per_node[d // node] = per_node.get(d // node, 0) + 1
  local = min(per_node.values())  # the group's devices in each node (the fewest)
  if len(per_node) > 1 and not net:
    return math.nan
  if kind == "all-to-all":  # 1/n of the buffer to each member: those in other nodes by NIC
    if len(per_node) == 1:
      return (n - 1) / n / link
    return max((local - 1) / n / link, (n - local) / n / net)
  # Rings: all-gather (result: the gathered array) sends (n-1)/n of it, reduce-scatter
  # (result: one shard) (n-1) shards, all-reduce 2 (n-1)/n. Across nodes a ring's
  # bottleneck is the network: NCCL runs one ring per NIC rail, so a group with `local`
  # devices in each node carries its cross-node bytes over `local` NICs at once.
  frac = {"all-reduce": 2 * (n - 1) / n, "reduce-scatter": n - 1}.get(kind, (n - 1) / n)
  return frac / (link if len(per_node) == 1 else min(link, local * net))


def collective_seconds(ops: list[dict], chip: dict, num_devices: int) -> float:
  """Predicted seconds of collective_ops() on `chip` (a roofline.CHIPS entry), the
  program's devices numbered node by node (chip["node_chips"] to a node): each
  instruction at the pace of its slowest group (the groups run at once), one after
  another. nan where a group leaves a TPU slice (chip["net_gbps"] None)."""
  total = 0.0
  for op in ops:
    groups = op["groups"] if op["groups"] is not None else [list(range(num_devices))]
    per_byte = [_seconds_per_byte(op["kind"], g, chip) for g in groups]
    if any(math.isnan(x) for x in per_byte):
      return math.nan
    total += op["bytes"] * max(per_byte, default=0.0)
  return total


def _memory(compiled) -> dict:
  m = compiled.memory_analysis()
  args, outs, temps, alias = (m.argument_size_in_bytes, m.output_size_in_bytes,
                              m.temp_size_in_bytes, m.alias_size_in_bytes)
  return dict(args=args, outputs=outs, temps=temps, alias=alias, peak=args + outs + temps - alias)


def trainer_program(cfg, devices, fsdp: int, tensor: int, rows: int, prompt_len: int,
                    new_tokens: int, microbatches: int):
  import jax
  import jax.numpy as jnp
  from tba_jax import config_builders, model, optim, sharding, train_state, train_step
  from tba_jax.batch import TrainBatch
  from tba_jax.model_config import ModelConfig  # noqa: F401
  mesh = sharding.make_mesh("trainer", devices[:fsdp * tensor], tensor)
  optimizer = optim.make_optimizer(1e-5, 0.0, 1.0)
  loss = config_builders.LOSSES["tb"](_loss_cfg())
  objective = train_step.Objective(loss, lambda s: jnp.float32(0.01), 1.0)
  forward = train_step.Forward(dtype="bfloat16", num_microbatches=microbatches, remat=True)
  update = train_step.make_update(cfg, optimizer, objective, mesh, forward=forward)
  state_sh = train_state.state_shardings(cfg, optimizer, mesh)
  shapes = jax.eval_shape(lambda p: train_state.TrainState(
      params=p, opt_state=optimizer.init(p), step=jnp.zeros((), jnp.int32)),
      model.param_shapes(cfg))
  state = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                       shapes, state_sh)
  t = prompt_len + new_tokens
  b = train_state.batch_shardings(mesh)
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
  return ml_collections.ConfigDict(dict(ratio_clip=0.0, log_z="vargrad", residual_clip=0.0,
                                         token_kl_coef=0.0))


def searcher_program(cfg, devices, tensor: int, rows: int, cache_len: int):
  import dataclasses
  import jax
  import jax.numpy as jnp
  from tba_jax import model, sampler, sharding
  from tba_jax.kv_cache import KVCache
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
        " | ".join(f"{k} s predicted" for k in CHIPS) + " | fits |")
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
      ops = collective_ops(compiled.as_text())
      coll = collectives(compiled.as_text())
      floor = _floor(cfg, fsdp * tensor, micro, args)
      times = [collective_seconds(ops, chip, fsdp * tensor) for chip in CHIPS.values()]
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
    ops = collective_ops(compiled.as_text())
    coll = collectives(compiled.as_text())
    cells = ", ".join(f"{k} {c} x, {b / 1e9:.3f}" for k, (c, b) in coll.items()) or "none"
    times = [collective_seconds(ops, chip, tensor) for chip in CHIPS.values()]
    print(f"| {tensor} | {mem['args'] / 1e9:.2f} | {mem['outputs'] / 1e9:.2f} | "
          f"{mem['temps'] / 1e9:.2f} | {mem['peak'] / 1e9:.2f} | {cells} | "
          + " | ".join(f"{s:.4f}" for s in times) + " |")
  print(f"\n## weight publish (trainer -> searcher): {weights / 1e9:.2f} GB of bfloat16 weights")
  print("| chip | link GB/s | predicted s, searcher in the trainer's node / slice | "
        "network GB/s | predicted s, searcher in another node |")
  print("|---|---|---|---|---|")
  for name, chip in CHIPS.items():
    net = chip.get("net_gbps")
    print(f"| {name} | {chip['link_gbps']:.0f} | {weights / (chip['link_gbps'] * 1e9):.2f} | "
          + (f"{net:.0f} | {weights / (net * 1e9):.2f} |" if net else "-- | -- (one ICI slice) |"))
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
