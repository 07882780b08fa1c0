"""Sampler throughput: tba_jax vs transformers `generate`, same SmolLM2-135M weights.

  python -m benchmarks.sampler                          # batch 1, 8, 32, 64; 128 new tokens
  python -m benchmarks.sampler --batches 1,8 --new_tokens 32   # a quick look

Greedy, float32, every row generates exactly `--new_tokens` tokens (EOS is
ignored by both engines so they do the same work). Prompts are GSM8K test
questions in the chat template, cycled to the batch size, left-padded.
Each engine runs in its own subprocess so its peak memory is its own: peak RSS
(weights + runtime, from /proc VmHWM reset before each batch) and, on an
accelerator, jax's peak device bytes. tba_jax is timed after a first call that
compiles (reported as "first call", compilation included); transformers after
a 2-token warm-up. Each timing is the best of --repeats runs.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from benchmarks.timing import best_of

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GSM8K = os.path.join(REPO, "tests", "data", "gsm8k_test.jsonl")


def gsm8k_prompts(tokenizer, batch: int) -> list[list[int]]:
  with open(GSM8K) as f:
    questions = [json.loads(line)["question"] for line in f if line.strip()]
  return [tokenizer.encode(tokenizer.chat_prompt(questions[i % len(questions)]))
          for i in range(batch)]


def _reset_peak_rss() -> None:
  try:  # Linux: writing 5 resets VmHWM to the current RSS
    with open("/proc/self/clear_refs", "w") as f:
      f.write("5")
  except OSError:
    pass


def _peak_rss_mb() -> float:
  with open("/proc/self/status") as f:
    for line in f:
      if line.startswith("VmHWM:"):
        return int(line.split()[1]) / 1024
  return float("nan")

def _run_jax(path, batches, new_tokens, repeats):
  import jax
  from tba_jax import hf_checkpoints, sampler, tokenizer as tokenizer_lib
  tok = tokenizer_lib.from_gguf(path)
  cfg, params = hf_checkpoints.load(path)
  device = jax.devices()[0]
  results = []
  for b in batches:
    prompts = gsm8k_prompts(tok, b)
    s = sampler.Sampler(cfg, sampler.SamplingOptions(max_new_tokens=new_tokens, greedy=True,
                                                     pad_id=tok.pad_id))
    _reset_peak_rss()
    t0 = time.perf_counter()
    out = s(params, prompts, jax.random.key(0))  # compiles
    first = time.perf_counter() - t0
    dt, out = best_of(lambda: s(params, prompts, jax.random.key(0)), repeats)
    assert out.tokens.shape == (b, new_tokens) and (out.lengths == new_tokens).all()
    stats = device.memory_stats() or {}
    results.append(dict(batch=b, seconds=dt, first_call_seconds=first,
                        peak_rss_mb=_peak_rss_mb(),
                        peak_device_mb=stats.get("peak_bytes_in_use", float("nan")) / 2**20))
  return dict(device=str(device), results=results)


def run_transformers(path, batches, new_tokens, repeats):
  import torch
  import transformers
  from tba_jax import tokenizer as tokenizer_lib
  tok = tokenizer_lib.from_gguf(path)
  model = transformers.AutoModelForCausalLM.from_pretrained(
      os.path.dirname(path), gguf_file=os.path.basename(path), dtype=torch.float32).eval()
  results = []
  for b in batches:
    prompts = gsm8k_prompts(tok, b)
    width = max(map(len, prompts))
    ids = torch.full((b, width), tok.pad_id, dtype=torch.long)
    mask = torch.zeros((b, width), dtype=torch.long)
    for i, p in enumerate(prompts):
      ids[i, width - len(p):] = torch.tensor(p)
      mask[i, width - len(p):] = 1
    kw = dict(input_ids=ids, attention_mask=mask, do_sample=False, pad_token_id=tok.pad_id,
              max_new_tokens=new_tokens, min_new_tokens=new_tokens)
    _reset_peak_rss()
    with torch.inference_mode():
      model.generate(**{**kw, "max_new_tokens": 2, "min_new_tokens": 2})  # warm up
      dt, out = best_of(lambda: model.generate(**kw), repeats)
    assert out.shape == (b, width + new_tokens)
    results.append(dict(batch=b, seconds=dt, peak_rss_mb=_peak_rss_mb()))
  return dict(device=f"torch {torch.__version__} CPU, {torch.get_num_threads()} threads",
              results=results)


def _child(engine: str, args) -> dict:
  cmd = [sys.executable, "-m", "benchmarks.sampler", "--engine", engine, "--batches",
         args.batches, "--new_tokens", str(args.new_tokens), "--repeats", str(args.repeats)]
  out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True, cwd=REPO).stdout
  return json.loads(out.strip().splitlines()[-1])


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--batches", default="1,8,32,64")
  parser.add_argument("--new_tokens", type=int, default=128)
  parser.add_argument("--repeats", type=int, default=1, help="timed runs per batch; best kept")
  parser.add_argument("--engines", default="tba_jax,transformers")
  parser.add_argument("--engine", help=argparse.SUPPRESS)  # set in the per-engine subprocess
  args = parser.parse_args()
  batches = [int(b) for b in args.batches.split(",")]
  from tba_jax import hf_checkpoints
  path = hf_checkpoints.smollm2_gguf_path()

  if args.engine:  # subprocess: measure one engine, print one JSON line
    run = {"tba_jax": _run_jax, "transformers": run_transformers}[args.engine]
    print(json.dumps(run(path, batches, args.new_tokens, args.repeats)))
    return

  engines = args.engines.split(",")
  runs = {e: _child(e, args) for e in engines}
  n = args.new_tokens
  print(f"\nSmolLM2-135M-Instruct float32, greedy, {n} new tokens per row")
  for e in engines:
    print(f"  {e}: {runs[e]['device']}")
  head = f"{'batch':>5} " + "".join(f"| {e + ' tok/s':>18} {'peak RSS MB':>11} " for e in engines)
  if len(engines) == 2:
    head += f"| {engines[0]}/{engines[1]}"
  print(head)
  for i, b in enumerate(batches):
    row = f"{b:>5} "
    rates = []
    for e in engines:
      r = runs[e]["results"][i]
      rates.append(b * n / r["seconds"])
      row += f"| {rates[-1]:>18.1f} {r['peak_rss_mb']:>11.0f} "
    if len(engines) == 2:
      row += f"| {rates[0] / rates[1]:.2f}x"
    print(row)
  if "tba_jax" in runs:
    extra = ", ".join(f"b{r['batch']}: first call {r['first_call_seconds']:.1f}s"
                      + (f", peak device {r['peak_device_mb']:.0f} MB"
                         if r["peak_device_mb"] == r["peak_device_mb"] else "")
                      for r in runs["tba_jax"]["results"])
    print(f"tba_jax {extra}")


if __name__ == "__main__":
  main()
