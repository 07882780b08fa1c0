"""How close the sampler's decode step is to its matmuls and to the memory roofline.

  python -m benchmarks.decode_floor                     # batch 8 and 64, 128 new tokens
  python -m benchmarks.decode_floor --batches 8 --new_tokens 32 --no_transformers

SmolLM2-135M-Instruct float32, greedy, GSM8K chat prompts (as benchmarks.sampler).
For each batch B, measured in this one process:
- tba_jax: the whole `Sampler` call, and a prefill-only call (max_new_tokens=1);
  decode step = (whole - prefill) / (N - 1).
- The decode step's matmuls alone on B rows (every layer's q, k, v, o, gate, up,
  down, then the LM head): in jax (XLA:CPU) and in torch (F.linear on [out, in]
  weights, what `generate` runs). Neither engine's decode step can be faster.
- Memory read bandwidth (a jitted sum over 1 GiB), and the roofline floor of a
  step: (parameter bytes + the KV-cache bytes the step reads) / bandwidth.
- The ceiling: B * N / (prefill + N * jax matmul time), the tok/s of a sampler
  whose decode step were nothing but its matmuls, beside transformers `generate`
  timed here (benchmarks/sampler.py's measurement; --no_transformers skips it).
"""
import argparse

import numpy as np

from benchmarks import sampler as sampler_bench
from benchmarks.timing import best_of


def _decode_matrices(params):
  """Per-layer matmul weights as [L, in, out] (jax layout), and the LM head [D, V]."""
  a, m = params["layers"]["attn"], params["layers"]["mlp"]
  heads_out = lambda w: w.reshape(w.shape[0], w.shape[1], -1)  # [L,D,N,H] -> [L,D,N*H]
  heads_in = lambda w: w.reshape(w.shape[0], -1, w.shape[-1])  # [L,N,H,D] -> [L,N*H,D]
  mats = [heads_out(a["q"]), heads_out(a["k"]), heads_out(a["v"]), heads_in(a["o"]),
          m["gate"], m["up"], m["down"]]
  head = params["lm_head"] if "lm_head" in params else params["embed"].T
  return [np.asarray(w) for w in mats], np.ascontiguousarray(np.asarray(head))


def _jax_matmul_seconds(mats, head, batch, repeats):
  import jax
  import jax.numpy as jnp
  mats, head = [jnp.asarray(w) for w in mats], jnp.asarray(head)
  xs = [jnp.ones((batch, w.shape[1]), jnp.float32) for w in mats]
  x_head = jnp.ones((batch, head.shape[0]), jnp.float32)

  @jax.jit
  def step(mats, head):
    def layer(i, acc):  # a loop over stacked layers, as the model's scan
      return acc + sum(jnp.dot(x, w[i]).sum() for x, w in zip(xs, mats))
    return jax.lax.fori_loop(0, mats[0].shape[0], layer, 0.0) + jnp.dot(x_head, head).sum()

  step(mats, head).block_until_ready()
  return best_of(lambda: step(mats, head).block_until_ready(), repeats)[0]


def _torch_matmul_seconds(mats, head, batch, repeats):
  import torch
  layers = [[torch.from_numpy(np.ascontiguousarray(w[i].T)) for w in mats]
            for i in range(mats[0].shape[0])]
  head = torch.from_numpy(np.ascontiguousarray(head.T))
  xs = [torch.ones(batch, w.shape[1]) for w in layers[0]]
  x_head = torch.ones(batch, head.shape[1])

  def step():
    with torch.inference_mode():
      for ws in layers:
        for x, w in zip(xs, ws):
          torch.nn.functional.linear(x, w)
      torch.nn.functional.linear(x_head, head)

  step()
  return best_of(step, repeats)[0]


def _read_gbps(repeats):
  import jax
  import jax.numpy as jnp
  x = jnp.ones((256, 1024, 1024), jnp.float32) * 0.5  # 1 GiB
  total = jax.jit(jnp.sum)
  total(x).block_until_ready()
  return x.nbytes / best_of(lambda: total(x).block_until_ready(), repeats)[0] / 1e9


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--batches", default="8,64")
  parser.add_argument("--new_tokens", type=int, default=128)
  parser.add_argument("--repeats", type=int, default=3, help="timed runs; best kept")
  parser.add_argument("--no_transformers", action="store_true")
  args = parser.parse_args()
  import jax

  from tba_jax import batch as batch_lib
  from tba_jax import hf_checkpoints, model as model_lib, sampler, tokenizer as tokenizer_lib
  path = hf_checkpoints.smollm2_gguf_path()
  tok = tokenizer_lib.from_gguf(path)
  cfg, params = hf_checkpoints.load(path)
  mats, head = _decode_matrices(params)
  param_bytes = 4 * model_lib.count_params(cfg)
  gbps = _read_gbps(args.repeats)
  n, batches = args.new_tokens, [int(b) for b in args.batches.split(",")]
  peer = {}
  if not args.no_transformers:
    runs = sampler_bench.run_transformers(path, batches, n, 1)["results"]
    peer = {r["batch"]: b * n / r["seconds"] for b, r in zip(batches, runs)}
  print(f"SmolLM2-135M-Instruct float32, greedy, {n} new tokens; memory read {gbps:.1f} GB/s")
  print("batch | prefill s | decode ms/step | matmuls jax ms | matmuls torch ms | matmul share "
        "| roofline ms | of roofline | ceiling tok/s | transformers tok/s")
  key = jax.random.key(0)
  for b in batches:
    prompts = sampler_bench.gsm8k_prompts(tok, b)
    make = lambda new: sampler.Sampler(cfg, sampler.SamplingOptions(max_new_tokens=new, greedy=True,
                                                                     pad_id=tok.pad_id))
    whole, prefill_only = make(n), make(1)
    whole(params, prompts, key), prefill_only(params, prompts, key)  # compile
    total = best_of(lambda: whole(params, prompts, key), args.repeats)[0]
    prefill = best_of(lambda: prefill_only(params, prompts, key), args.repeats)[0]
    step = (total - prefill) / (n - 1)
    mm_jax = _jax_matmul_seconds(mats, head, b, args.repeats)
    mm_torch = _torch_matmul_seconds(mats, head, b, args.repeats)
    width = batch_lib.bucket(max(map(len, prompts)), whole.prompt_buckets, "prompt length")
    kv_bytes = 2 * 4 * cfg.num_layers * b * cfg.num_kv_heads * (width + n - 1) * cfg.head_dim
    floor = (param_bytes + kv_bytes) / (gbps * 1e9)
    ceiling = b * n / (prefill + n * mm_jax)
    print(f"{b:>5} | {prefill:9.2f} | {step * 1e3:14.1f} | {mm_jax * 1e3:14.1f} | "
          f"{mm_torch * 1e3:16.1f} | {mm_jax / step:12.0%} | {floor * 1e3:11.1f} | "
          f"{floor / step:11.0%} | {ceiling:13.1f} | {peer.get(b, float('nan')):18.1f}")


if __name__ == "__main__":
  main()
