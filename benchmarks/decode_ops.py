"""Op counts of the compiled one-token decode step: what a decode step runs, per layer.

  python -m benchmarks.decode_ops --shape rho-1b          # RhoMath-1B's shape, batch 8
  python -m benchmarks.decode_ops --shape tiny --batch 4  # the test's shape

On an H200 a decode step of RhoMath-1B's shape ran 680 kernels, 243 of them copies of
weight slices out of the stacked layer arrays (LAB_LOG.md, "One H200 again"). This
compiles the same decode loops on the CPU from abstract shapes (jax.ShapeDtypeStruct:
the 1B shape needs no memory) and counts the optimized HLO that one decode step runs (the
decode while loop's body, a layer scan's body counted once a layer) and one layer's share
of it (the step's counts less those of the same model with 2 layers, over the layers
between: the same measure whether the layers are scanned or unrolled): instructions,
fusions, copies, dots, dynamic slices, and the weight-slice copies: an instruction with
the size of one layer's weight that slices (or copies) it. XLA:CPU fuses differently from
XLA:GPU, but a copy of a weight slice in the CPU's program is one in the GPU's, and fewer
instructions per layer are fewer kernels on either.

Two decode loops: the static sampler's (sampler.decode_program: one index for all rows)
and the slot pool's (slot_programs.decode_program: one cache slot per row).
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import functools
import json
import math
import re

TINY = dict(vocab_size=256, dim=64, mlp_dim=176, num_layers=3, num_heads=4, num_kv_heads=2,
            head_dim=16, max_position_embeddings=512, dtype="float32")

_HEADER = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
_INSTR = re.compile(r"^\s*(ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")


def _shape_and_op(rhs: str) -> tuple[str, str]:
  """(result type, opcode) of an instruction's right-hand side `TYPE op(...)...`."""
  if rhs.startswith("("):  # a tuple type: skip to its closing parenthesis
    depth = 0
    for i, c in enumerate(rhs):
      depth += c == "("
      depth -= c == ")"
      if depth == 0:
        break
    typ, rest = rhs[:i + 1], rhs[i + 1:].lstrip()
  else:
    typ, _, rest = rhs.partition(" ")
  return typ, rest.split("(", 1)[0].strip()


def parse_hlo(text: str) -> tuple[dict, str]:
  """({computation name: [instruction dict]}, entry name) of an HLO module's text.
  An instruction: name, type (dims only, layout dropped), op, and the computations it calls."""
  comps, entry, current = {}, None, None
  for line in text.splitlines():
    if current is None:
      m = _HEADER.match(line)
      if m and not line.startswith("HloModule"):
        current = m.group(2)
        comps[current] = []
        if m.group(1):
          entry = current
      continue
    if line.strip() == "}":
      current = None
      continue
    m = _INSTR.match(line)
    if not m:
      continue
    typ, op = _shape_and_op(m.group(3))
    calls = re.findall(r"(?:calls|body|condition|to_apply)=%?([\w.\-]+)", m.group(3))
    comps[current].append(dict(name=m.group(2), type=re.sub(r"\{[^}]*\}", "", typ), op=op,
                               calls=calls, root=bool(m.group(1)),
                               body=(re.findall(r"body=%?([\w.\-]+)", m.group(3)) or [None])[0]))
  return comps, entry


_FREE = {"parameter", "constant", "get-tuple-element", "tuple", "bitcast"}


def _root(comps, comp):
  return next(i for i in comps[comp] if i["root"])


def count(comps: dict, comp: str, weight_sizes: set[int]) -> dict:
  """Counts over computation `comp`'s own instructions (a fusion or a while: one each;
  free ones — parameters, constants, tuples, bitcasts — left out)."""
  c = collections.Counter()
  for i in comps[comp]:
    if i["op"] in _FREE:
      continue
    c["instructions"] += 1
    op = i["op"]
    inner = [x["op"] for f in i["calls"] if op == "fusion" for x in comps.get(f, [])]
    root_op = _root(comps, i["calls"][0])["op"] if op == "fusion" else op
    c["fusions"] += op == "fusion"
    c["copies"] += root_op == "copy" or op == "copy"
    c["dots"] += (op in ("dot", "convolution") or "dot" in inner or
                  (op == "custom-call"))  # CPU's oneDNN matmuls are custom calls
    c["dynamic_slices"] += op == "dynamic-slice" or "dynamic-slice" in inner
    weight_sized = _elements(i["type"]) in weight_sizes
    # A weight slice read out of the stacked layer arrays into a buffer of its own.
    c["weight_slice_copies"] += weight_sized and (
        root_op in ("dynamic-slice", "slice", "copy") or "dynamic-slice" in inner or
        "slice" in inner)
    # Any pass over a weight besides its matmul (a slice, a layout copy, a cast).
    c["weight_sized_outputs"] += weight_sized
  return dict(c)


def _whiles(comps, comp):
  return [i["body"] for i in comps[comp] if i["op"] == "while"]


def step_counts(compiled_text: str, weight_sizes: set[int], num_layers: int) -> dict:
  """Counts of the instructions one decode step runs: the decode loop's body (the entry's
  largest while body), with the layer scan's while (when the layers are scanned) replaced
  by num_layers times its body's counts."""
  comps, entry = parse_hlo(compiled_text)
  step = max(_whiles(comps, entry), key=lambda b: len(comps[b]))
  out = collections.Counter(count(comps, step, weight_sizes))
  nested = _whiles(comps, step)
  if len(nested) > 1:
    raise ValueError(f"expected at most one loop (the layer scan) in the decode step: {nested}")
  for body in nested:
    out["instructions"] -= 1  # the while itself
    for k, v in count(comps, body, weight_sizes).items():
      out[k] += num_layers * v
  return dict(out)


def _elements(hlo_type: str) -> int | None:
  """The element count of an array type `f32[64,4,16]` (None: a tuple or a scalar)."""
  m = re.fullmatch(r"\w+\[([\d,]+)\]", hlo_type)
  return m and math.prod(int(d) for d in m.group(1).split(","))


def layer_weight_sizes(cfg) -> set[int]:
  """Element counts of one layer's weight matrices: XLA bitcasts their shapes (a slice of
  the stacked q [L,D,N,H] comes out as [D,N*H]) and XLA:CPU casts bfloat16 ones to float32
  before its matmuls, so a weight is recognised by its size alone."""
  import jax
  from tba_jax import model
  return {math.prod(x.shape[1:]) for x in jax.tree.leaves(model.param_shapes(cfg)["layers"])
          if x.ndim > 2}


def compiled_decode_programs(cfg, batch: int, prompt_len: int, new_tokens: int) -> dict:
  """{"static": text, "pool": text}: the optimized HLO of both decode loops, compiled from
  abstract shapes."""
  import jax
  import jax.numpy as jnp

  from tba_jax import model, sampler, sharding, slot_programs

  mesh = sharding.make_mesh("searcher", jax.devices()[:1])
  params = model.param_shapes(cfg)
  options = sampler.SamplingOptions(max_new_tokens=new_tokens, greedy=True)
  sds = jax.ShapeDtypeStruct
  prefill_batch = sampler.PrefillBatch(sds((batch, prompt_len), jnp.int32),
                                       sds((batch, prompt_len), jnp.int32),
                                       sds((batch,), jnp.int32), sds((batch,), bool))
  state = jax.eval_shape(functools.partial(sampler.prefill_program, model_config=cfg,
                                           options=options, mesh=mesh),
                         params, prefill_batch, jax.eval_shape(lambda: jax.random.key(0)),
                         sds((), jnp.float32))
  static = sampler.decode_program.lower(params, state, model_config=cfg, options=options)
  pool_state = jax.eval_shape(functools.partial(
      slot_programs.empty_pool, model_config=cfg, options=options, mesh=mesh, num_slots=batch,
      cache_size=prompt_len + new_tokens), jax.eval_shape(lambda: jax.random.key(0)))
  rules = slot_programs.TurnRules(max_turn_tokens=new_tokens)
  pool = slot_programs.decode_program.lower(
      params, pool_state, sds((), jnp.int32), sds((), jnp.int32), model_config=cfg,
      options=options, rules=rules, window=prompt_len + new_tokens)
  return {"static": static.compile().as_text(), "pool": pool.compile().as_text()}


def measure(cfg, batch: int = 8, prompt_len: int = 128, new_tokens: int = 256) -> dict:
  """{"static": {"step": counts, "layer": counts}, "pool": ...}: the counts of one decode
  step of model config `cfg` (all its layers), and those of one layer: the step's less
  those of the same model with 2 layers, over the layers between (the same whether the
  layers are scanned or unrolled; XLA drops a scan of 1 layer, so not 1). cfg needs 3
  layers or more."""
  if cfg.num_layers < 3:
    raise ValueError(f"{cfg.num_layers} layers: the per-layer counts need 3 or more")
  weights = layer_weight_sizes(cfg)
  steps = {}
  for layers in (2, cfg.num_layers):
    texts = compiled_decode_programs(dataclasses.replace(cfg, num_layers=layers), batch,
                                     prompt_len, new_tokens)
    steps[layers] = {name: step_counts(text, weights, layers) for name, text in texts.items()}
  per_layer = lambda name, k: round((steps[cfg.num_layers][name].get(k, 0) - steps[2][name].get(
      k, 0)) / (cfg.num_layers - 2), 2)
  return {name: {"step": steps[cfg.num_layers][name],
                 "layer": {k: per_layer(name, k) for k in steps[cfg.num_layers][name]}}
          for name in steps[2]}


def model_config(shape: str):
  from tba_jax.model import ModelConfig
  if shape == "tiny":
    return ModelConfig(**TINY)
  from benchmarks.roofline import architecture
  return architecture(shape)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--shape", default="rho-1b", help="tiny, or a benchmarks/roofline.py shape")
  parser.add_argument("--batch", type=int, default=8)
  parser.add_argument("--prompt_len", type=int, default=128)
  parser.add_argument("--new_tokens", type=int, default=256)
  parser.add_argument("--dump", default="", help="also write the optimized HLO to DUMP.{static,pool}.txt")
  args = parser.parse_args()
  cfg = model_config(args.shape)
  if args.dump:
    texts = compiled_decode_programs(cfg, args.batch, args.prompt_len, args.new_tokens)
    for name, text in texts.items():
      with open(f"{args.dump}.{name}.txt", "w") as f:
        f.write(text)
  out = measure(cfg, args.batch, args.prompt_len, args.new_tokens)
  keys = ("instructions", "fusions", "copies", "dots", "dynamic_slices", "weight_slice_copies",
          "weight_sized_outputs")
  print(f"{args.shape}: {cfg.num_layers} layers, {cfg.dtype}, batch {args.batch}")
  print(f"{'':16}" + "".join(f"{k:>14}" for k in keys))
  for program, parts in out.items():
    for part in ("layer", "step"):
      print(f"{program + ' ' + part:16}" + "".join(f"{parts[part].get(k, 0):>14}" for k in keys))
  print(json.dumps(dict(shape=args.shape, batch=args.batch, **out)))


if __name__ == "__main__":
  main()
