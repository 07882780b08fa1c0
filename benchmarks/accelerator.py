r"""Sampler, trainer and weight-sync speed of a 1B-class model on one accelerator.

  python -m benchmarks.accelerator --hbm_gbps 4800 --peak_tflops 989   # H200 datasheet
  (benchmarks/gpu.sh runs this under two gemm settings, beside a learning run and TRL's)

A random-init model of RhoMath-1B's shape (Llama, 22 layers, dim 2048,
32 heads / 4 kv heads, vocab 32000) in bfloat16.
- Sampler: generated tokens/s at --sampler_batches, greedy, --new_tokens, no
  EOS; the memory-bandwidth roofline fraction = (weight bytes + mean KV-cache
  bytes read per decode step) / decode-step time / HBM bandwidth. The same for
  the streaming sampler (continuous batching) at --stream_slots slots, 2 x
  slots rows each.
- Trainer: one TB update (float32 master weights, bfloat16 compute) on
  --train_batch sequences of --train_len tokens; model FLOPs utilisation =
  6 x params x tokens / step time / peak bf16 FLOP/s.
- Weight sync: publishing the trainer's params to a searcher copy (bfloat16).
Medians over --repeats; one line per figure, and a JSON line at the end. --parts picks
the figures; --profile DIR also traces one sampler call per batch size and prints its
device kernels per decode step (how many, their summed time beside the step's, the
largest), which is how the weight-slice copies were found (LAB_LOG.md, "One H200 again").
--json PATH rewrites the results there after every figure, so a part cut off by its time
limit (benchmarks/gpu.sh) still leaves the figures it had measured.
"""
import argparse
import functools
import json
import os

import numpy as np

from benchmarks.timing import median_seconds


def kernel_summary(folder: str, steps: int, step_seconds: float) -> dict:
  """Device kernels of a traced sampler call (the perfetto trace under `folder`): how many
  run per decode step, their summed time per step beside the step's wall time, and the
  kernels that take most of it. Prints the figures and returns them."""
  import collections
  import glob
  import gzip
  [path] = glob.glob(os.path.join(folder, "**", "*perfetto_trace.json.gz"), recursive=True)
  events = json.load(gzip.open(path))["traceEvents"]
  names = {e["pid"]: e["args"]["name"] for e in events
           if e.get("ph") == "M" and e.get("name") == "process_name"}
  device = {pid for pid, name in names.items() if "/device:" in name and "CPU" not in name}
  kernels = [e for e in events if e.get("ph") == "X" and e.get("pid") in device]
  if not kernels:
    print(f"  profile: no device kernels in {path} (processes: {sorted(names.values())})")
    return {}
  busy = collections.Counter()
  count = collections.Counter()
  for e in kernels:
    busy[e["name"]] += e["dur"] * 1e-6
    count[e["name"]] += 1
  total = sum(busy.values())
  out = {"kernels_per_step": len(kernels) / steps, "kernel_ms_per_step": total / steps * 1e3,
         "step_ms": step_seconds * 1e3,
         "top": [(n[:80], busy[n] / steps * 1e3, count[n] / steps) for n, _ in busy.most_common(8)]}
  print(f"  profile: {out['kernels_per_step']:.0f} kernels a step, {out['kernel_ms_per_step']:.2f}"
        f" ms of kernel time a step of {out['step_ms']:.2f} ms wall")
  for name, ms, per_step in out["top"]:
    print(f"    {ms:7.3f} ms/step  {per_step:6.1f}/step  {name}")
  return out


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--hbm_gbps", type=float, default=4800.0)
  parser.add_argument("--peak_tflops", type=float, default=989.0)
  parser.add_argument("--sampler_batches", default="8,64,256")
  parser.add_argument("--stream_slots", default="64,256",
                      help="continuous batching: slot counts (2 x slots rows each)")
  parser.add_argument("--prompt_len", type=int, default=128)
  parser.add_argument("--new_tokens", type=int, default=256)
  parser.add_argument("--train_batch", type=int, default=16)
  parser.add_argument("--train_len", type=int, default=640)
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--small", action="store_true", help="a 2-layer model (smoke test on CPU)")
  parser.add_argument("--tiny", action="store_true",
                      help="a 2-layer, 64-wide model (gpu.sh's dry run on CPU: seconds)")
  parser.add_argument("--json", default="", help="write the results here after every figure")
  parser.add_argument("--attention_impl", default="auto",
                      help="model.attention_impl: auto, xla, cudnn, pallas (tba_jax/attention.py)")
  parser.add_argument("--parts", default="sampler,streaming,trainer",
                      help="which figures to measure (the trainer's include the weight sync)")
  parser.add_argument("--profile", default="",
                      help="a folder: trace one sampler call per batch size there and print "
                           "the device kernels per decode step and where their time goes")
  parser.add_argument("--unroll_layers", action="store_true",
                      help="unroll the model's layer scan (one straight-line program per step)")
  args = parser.parse_args(argv)
  parts = set(args.parts.split(","))
  if args.unroll_layers:
    from benchmarks.roofline import unrolled_layers
    unrolled_layers().__enter__()  # for the whole process

  import jax
  import jax.numpy as jnp

  from tba_jax import (continuous, losses, model, optim, sharding, train_state, train_step,
                       weight_sync)
  from tba_jax.model import ModelConfig
  from tba_jax.sampler import Buckets, Sampler, SamplingOptions

  cfg = ModelConfig(vocab_size=32000, dim=2048, mlp_dim=5632, num_layers=2 if args.small else 22,
                    num_heads=32, num_kv_heads=4, head_dim=64, dtype="bfloat16",
                    attention_impl=args.attention_impl)
  if args.tiny:
    cfg = cfg.replace(vocab_size=256, dim=64, mlp_dim=128, num_layers=2, num_heads=4,
                      num_kv_heads=2, head_dim=16)
  n_params = model.count_params(cfg)
  device = jax.devices()[0]
  results = {"device": str(device.device_kind), "params": n_params,
             "hbm_gbps": args.hbm_gbps, "peak_tflops": args.peak_tflops}

  def save():
    if args.json:
      with open(args.json, "w") as f:
        json.dump(results, f, indent=1)

  save()
  print(f"{device.device_kind}: RhoMath-1B-shaped model, {n_params / 1e9:.2f}B params, bfloat16")
  rng = np.random.default_rng(0)
  mesh = sharding.make_mesh("searcher", [device])
  params = model.init_params(cfg, 0, sharding.param_shardings(cfg, "searcher", mesh))
  weight_bytes = n_params * 2

  # ----- Sampler ----------------------------------------------------------------
  for b in (int(x) for x in args.sampler_batches.split(",") if "sampler" in parts):
    exact = Buckets(prompt=(args.prompt_len,), batch=(b,))
    sampler = Sampler(cfg, SamplingOptions(max_new_tokens=args.new_tokens, greedy=True), mesh=mesh,
                      buckets=exact)
    prompts = [list(rng.integers(3, cfg.vocab_size, args.prompt_len)) for _ in range(b)]
    sampler(params, prompts, jax.random.key(0))  # compile
    seconds = median_seconds(lambda: sampler(params, prompts, jax.random.key(1)), args.repeats)
    # Decode-step time from a prefill-only run (max_new_tokens=1) subtracted out.
    prefill_only = Sampler(cfg, SamplingOptions(max_new_tokens=1, greedy=True), mesh=mesh,
                           buckets=exact)
    prefill_only(params, prompts, jax.random.key(0))
    prefill = median_seconds(lambda: prefill_only(params, prompts, jax.random.key(1)),
                              args.repeats)
    step = (seconds - prefill) / (args.new_tokens - 1)
    mean_slots = args.prompt_len + args.new_tokens // 2
    kv_bytes = 2 * cfg.num_layers * b * mean_slots * cfg.num_kv_heads * cfg.head_dim * 2
    roofline = (weight_bytes + kv_bytes) / step / (args.hbm_gbps * 1e9)
    tps = b * args.new_tokens / seconds
    results[f"sampler_b{b}"] = {"tokens_per_s": tps, "step_ms": step * 1e3,
                                "hbm_roofline_fraction": roofline}
    print(f"sampler batch {b:>4}: {tps:>9.0f} tok/s, decode step {step * 1e3:6.2f} ms, "
          f"{roofline:5.1%} of the HBM roofline")
    save()
    if args.profile:
      folder = os.path.join(args.profile, f"sampler_b{b}")
      try:  # a trace that fails costs its figure, not the measurements after it
        with jax.profiler.trace(folder, create_perfetto_trace=True):
          sampler(params, prompts, jax.random.key(2))
        results[f"sampler_b{b}"]["profile"] = kernel_summary(folder, args.new_tokens, step)
      except Exception as e:  # noqa: BLE001
        print(f"  profile of batch {b} failed: {type(e).__name__}: {e}")
      save()

  # ----- Streaming sampler (continuous batching) -----------------------------------------
  # 2 x N rows through N slots (every slot refilled once), no EOS: the pool's own cost.
  # The step time includes the prefills (an upper bound), so the roofline is a lower bound.
  for n in (int(x) for x in args.stream_slots.split(",") if x and "streaming" in parts):
    pool = Sampler(cfg, SamplingOptions(max_new_tokens=args.new_tokens, greedy=True), mesh=mesh,
                   buckets=Buckets(prompt=(args.prompt_len,)))
    prompts = [list(rng.integers(3, cfg.vocab_size, args.prompt_len)) for _ in range(2 * n)]
    run = lambda key: continuous.generate(pool, params, prompts, key, num_slots=n)
    run(jax.random.key(0))  # compile
    seconds = median_seconds(lambda: run(jax.random.key(1)), args.repeats)
    step = seconds / (2 * args.new_tokens)
    mean_slots = args.prompt_len + args.new_tokens // 2
    kv_bytes = 2 * cfg.num_layers * n * mean_slots * cfg.num_kv_heads * cfg.head_dim * 2
    roofline = (weight_bytes + kv_bytes) / step / (args.hbm_gbps * 1e9)
    tps = 2 * n * args.new_tokens / seconds
    results[f"streaming_{n}_slots"] = {"tokens_per_s": tps, "step_ms": step * 1e3,
                                       "hbm_roofline_fraction": roofline}
    print(f"streaming {n:>4} slots: {tps:>9.0f} tok/s, step {step * 1e3:6.2f} ms (prefill "
          f"included), {roofline:5.1%} of the HBM roofline")
    save()

  if "trainer" not in parts:
    print("RESULTS " + json.dumps(results))
    return
  # ----- Trainer ------------------------------------------------------------------
  trainer_mesh = sharding.make_mesh("trainer", [device])
  optimizer = optim.make_optimizer(1e-5, 0.0, 1.0)
  state = train_state.init_state(jax.tree.map(lambda x: x.astype(jnp.float32), params), optimizer,
                                train_state.state_shardings(cfg.replace(dtype="float32"),
                                                           optimizer, trainer_mesh))
  objective = train_step.Objective(train_step.tb_loss,
                                   functools.partial(losses.constant_beta, beta=0.01), 0.7)
  update = train_step.make_update(cfg.replace(dtype="float32"), optimizer, objective,
                                  trainer_mesh, forward=train_step.Forward(dtype="bfloat16"))
  n, t, tc = args.train_batch, args.train_len, args.train_len // 2
  batch = train_step.TrainBatch(
      tokens=rng.integers(3, cfg.vocab_size, (n, t)).astype(np.int32),
      attention_mask=np.ones((n, t), np.int32), completion_mask=np.ones((n, tc), np.float32),
      ref_logprobs=np.full((n, tc), -2.0, np.float32),
      behaviour_logprobs=np.full((n, tc), -2.0, np.float32),
      rewards=rng.integers(0, 2, n).astype(np.float32),
      group_ids=np.arange(n, dtype=np.int32) // 4, prompt_ids=np.arange(n, dtype=np.int32) // 4,
      versions=np.zeros(n, np.int32))
  state, m = update(state, batch)
  jax.block_until_ready(m)

  def one_step():
    nonlocal state
    state, out = update(state, batch)
    jax.block_until_ready(out)

  seconds = median_seconds(one_step, args.repeats)
  mfu = 6 * n_params * n * t / seconds / (args.peak_tflops * 1e12)
  results["trainer"] = {"tokens_per_s": n * t / seconds, "step_s": seconds, "mfu": mfu}
  print(f"trainer {n} x {t} tokens: {n * t / seconds:,.0f} tok/s, {seconds:.3f} s/step, "
        f"MFU {mfu:.1%}")
  save()

  # ----- Weight sync -----------------------------------------------------------------
  dst = sharding.param_shardings(cfg, "searcher", mesh)
  jax.block_until_ready(weight_sync.publish(state.params, dst, dtype="bfloat16"))
  seconds = median_seconds(
      lambda: jax.block_until_ready(weight_sync.publish(state.params, dst, dtype="bfloat16")),
      args.repeats)
  results["sync"] = {"seconds": seconds, "gb_per_s": weight_bytes / seconds / 1e9}
  print(f"weight sync (bfloat16, {weight_bytes / 1e9:.1f} GB): {seconds * 1e3:.1f} ms, "
        f"{weight_bytes / seconds / 1e9:.0f} GB/s")
  save()
  print("RESULTS " + json.dumps(results))


if __name__ == "__main__":
  main()
