"""Searcher throughput: completed samples per second on RL workloads, three engines.

  python -m benchmarks.searcher_throughput --out /tmp/searcher_throughput.json
      # the full run: 1-2 hours on 2 cores; GSM8K from --gsm8k_data
      # (default ../shared/data/gsm8k beside the checkout)
  python -m benchmarks.searcher_throughput --workloads cpu --rows 8 --cpu_prompts 2
      # a smoke test (a few minutes)

Engines, each in its own subprocess, with the same number of rows in flight:
  streaming     tba_jax's sampler with num_slots = ROWS (continuous batching);
                --chunk_steps / --window_step take lists to compare settings
  static        tba_jax's sampler on consecutive batches of ROWS rows
  transformers  `generate` (torch) on the same batches, left-padded, with the
                weights tba_jax exports (hf_checkpoints.save_hf)
Workloads, SmolLM2-135M-Instruct float32, T = 0.7, no top-k / top-p, a row
ends at EOS or its length limit:
  cpu    the `cpu` task's prompts (configs/gsm8k.py:cpu: arithmetic questions in
         ChatML + " Answer with just the number."), S = 8, 32 new tokens
  gsm8k  GSM8K test questions in the chat template, S = 4, 256 new tokens
Rows are prompt-major (a prompt's S samples adjacent), as a searcher makes them;
by default each run has 4 samples per row in flight (rows / 2 cpu prompts,
rows GSM8K questions).
The engines sample independently (same distribution, different draws), so
completion lengths differ a little between them; tokens/s is printed beside
samples/s. The tba_jax engines' times exclude compilation (jax.monitoring's
compile events, printed separately): a searcher compiles once per run. Each
row also prints the engine's process CPU seconds and the 1-minute load average
before -> after it (the machine may be shared: compare CPU seconds when it was).
"Useful" is the fraction of decode row-steps (rows x decode steps; the first
token comes from the prefill) spent on rows still generating.
"""
from __future__ import annotations

import argparse
import functools
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKLOADS = {  # samples per prompt, new tokens
    "cpu": (8, 32),
    "gsm8k": (4, 256),
}
TEMPERATURE = 0.7


def _num_prompts(workload: str, num_rows: int, args) -> int:
  """--cpu_prompts / --gsm8k_questions, or by default 4 samples per row slot."""
  given = args.cpu_prompts if workload == "cpu" else args.gsm8k_questions
  return given or max(1, 4 * num_rows // WORKLOADS[workload][0])


def _prompts(workload: str, num_rows: int, args, tok) -> list[list[int]]:
  """The distinct prompts of a workload, as token ids."""
  from configs.gsm8k import get_config
  from tba_jax import config_builders
  from tba_jax.tasks import gsm8k
  n = _num_prompts(workload, num_rows, args)
  if workload == "cpu":
    task = config_builders.build_task(get_config("cpu").task, tok)
    if n > len(task.train):
      raise ValueError(f"the cpu task has {len(task.train)} training prompts, not {n}")
    return [tok.encode(task.prompt(p)) for p in task.train[:n]]
  problems = gsm8k.load("test", args.gsm8k_data, limit=n)
  return [tok.encode(gsm8k.make_prompt(p.fields["question"], "chat", tok)) for p in problems]


def _compile_seconds():
  """A running total of jax's tracing, lowering and compiling time."""
  import jax
  total = [0.0]

  def listen(name, seconds, **_):
    if name.startswith("/jax/core/compile/"):
      total[0] += seconds

  jax.monitoring.register_event_duration_secs_listener(listen)
  return lambda: total[0]


def _run_jax(engine: str, rows, num_rows: int, new_tokens: int, cfg, params, tok, compiled,
             chunk_steps: int = 0, window_step: int = 0) -> dict:
  import jax
  from tba_jax import continuous, sampler
  options = sampler.SamplingOptions(max_new_tokens=new_tokens, temperature=TEMPERATURE,
                                    eos_ids=tok.eos_ids, pad_id=tok.pad_id)
  key = jax.random.key(0)
  lengths, row_steps = [], 0
  c0, t0, cpu0, load0 = compiled(), time.perf_counter(), time.process_time(), os.getloadavg()[0]
  if engine == "streaming":
    stream = continuous.Stream(sampler.Sampler(cfg, options), params, key, num_slots=num_rows,
                               max_prompt_len=max(map(len, rows)), chunk_steps=chunk_steps,
                               window_step=window_step)
    stream.add(rows, range(len(rows)))
    while stream.busy():
      lengths.extend(len(c.tokens) for c in stream.step())
    row_steps = stream.stats.decode_steps * num_rows
    extra = dict(chunks=stream.stats.chunks, refills=stream.stats.refills,
                 prefilled_prompts=stream.stats.prefilled_prompts)
  else:
    s = sampler.Sampler(cfg, options)
    for b in range(0, len(rows), num_rows):
      out = s(params, rows[b:b + num_rows], jax.random.fold_in(key, b))
      lengths.extend(out.lengths.tolist())
      bucket = next(x for x in s.batch_buckets if x >= len(out.lengths))
      row_steps += bucket * (out.num_decode_steps - 1)
    extra = {}
  seconds = time.perf_counter() - t0
  return dict(seconds=seconds, compile_seconds=compiled() - c0, lengths=lengths,
              row_steps=row_steps, cpu_seconds=time.process_time() - cpu0,
              load=(load0, os.getloadavg()[0]), **extra)


def _run_transformers(rows, num_rows: int, new_tokens: int, hf_dir: str, tok) -> dict:
  import torch
  import transformers
  model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
  torch.manual_seed(0)
  eos = list(tok.eos_ids)
  lengths, row_steps = [], 0
  t0, cpu0, load0 = time.perf_counter(), time.process_time(), os.getloadavg()[0]
  for b in range(0, len(rows), num_rows):
    batch = rows[b:b + num_rows]
    width = max(map(len, batch))
    ids = torch.full((len(batch), width), tok.pad_id, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    for i, p in enumerate(batch):
      ids[i, width - len(p):] = torch.tensor(p)
      mask[i, width - len(p):] = 1
    with torch.inference_mode():
      out = model.generate(input_ids=ids, attention_mask=mask, do_sample=True,
                           temperature=TEMPERATURE, top_k=0, top_p=1.0,
                           max_new_tokens=new_tokens, eos_token_id=eos, pad_token_id=tok.pad_id)
    gen = out[:, width:].numpy()
    ended = np.isin(gen, eos)
    lengths.extend(np.where(ended.any(1), ended.argmax(1) + 1, gen.shape[1]).tolist())
    row_steps += len(batch) * (gen.shape[1] - 1)
  return dict(seconds=time.perf_counter() - t0, compile_seconds=0.0, lengths=lengths,
              row_steps=row_steps, cpu_seconds=time.process_time() - cpu0,
              load=(load0, os.getloadavg()[0]))


def _child(args) -> None:
  """One engine on one (workload, rows) pair; prints one JSON line per setting."""
  from tba_jax import hf_checkpoints, tokenizer as tokenizer_lib
  path = hf_checkpoints.smollm2_gguf_path()
  tok = tokenizer_lib.from_gguf(path)
  cfg, params = hf_checkpoints.load(path)
  workload, num_rows = args.workloads, int(args.rows)
  samples, new_tokens = WORKLOADS[workload]
  rows = [p for p in _prompts(workload, num_rows, args, tok) for _ in range(samples)]
  if args.engine == "transformers":
    hf_dir = tempfile.mkdtemp(prefix="searcher_throughput_hf_")
    hf_checkpoints.save_hf(cfg, params, hf_dir)
    del params
    runs = [("transformers", lambda: _run_transformers(rows, num_rows, new_tokens, hf_dir, tok))]
  elif args.engine == "static":
    compiled = _compile_seconds()
    runs = [("static", lambda: _run_jax("static", rows, num_rows, new_tokens, cfg, params, tok,
                                        compiled))]
  else:
    compiled = _compile_seconds()
    runs = [(f"streaming c{c} w{w}", functools.partial(
        _run_jax, "streaming", rows, num_rows, new_tokens, cfg, params, tok, compiled, c, w))
            for c, w in itertools.product(_ints(args.chunk_steps), _ints(args.window_step))]
  for engine, run in runs:
    print(json.dumps(dict(run(), workload=workload, rows=num_rows, engine=engine)), flush=True)


def _ints(s: str) -> list[int]:
  return [int(x) for x in str(s).split(",")]


def _report(results: list[dict], args) -> None:
  for workload in args.workloads.split(","):
    samples, new_tokens = WORKLOADS[workload]
    sel = [r for r in results if r["workload"] == workload]
    print(f"\n{workload}: S={samples} samples per prompt, up to {new_tokens} new tokens, "
          f"T={TEMPERATURE}")
    print(f"{'rows':>4} | {'engine':<18} | {'samples/s':>9} | {'tok/s':>6} | {'seconds':>7} | "
          f"{'compile s':>9} | {'cpu s':>6} | {'load':>9} | {'len p10/p50/p90':>15} | "
          f"{'useful':>6} | {'vs transformers':>15} | {'vs static':>9}")
    for num_rows in _ints(args.rows):
      group = [r for r in sel if r["rows"] == num_rows]
      print(f"  {num_rows} rows in flight: {len(group[0]['lengths'])} samples")
      rate = {}
      for r in group:
        seconds = r["seconds"] - r["compile_seconds"]
        lengths = np.asarray(r["lengths"])
        rate[r["engine"]] = len(lengths) / seconds
        r["samples_per_s"], r["tokens_per_s"] = len(lengths) / seconds, lengths.sum() / seconds
        r["useful"] = (lengths - 1).sum() / max(r["row_steps"], 1)
      for r in group:
        p = np.percentile(r["lengths"], [10, 50, 90]).astype(int)
        vs = lambda e: (f"{r['samples_per_s'] / rate[e]:.2f}x" if e in rate and e != r["engine"]
                        else "")
        print(f"{num_rows:>4} | {r['engine']:<18} | {r['samples_per_s']:>9.3f} | "
              f"{r['tokens_per_s']:>6.1f} | {r['seconds']:>7.1f} | {r['compile_seconds']:>9.1f} | "
              f"{r.get('cpu_seconds', 0):>6.0f} | {'%.1f->%.1f' % tuple(r.get('load', (0, 0))):>9} | "
              f"{'/'.join(map(str, p)):>15} | {r['useful']:>6.1%} | {vs('transformers'):>15} | "
              f"{vs('static'):>9}")
      for r in group:
        if "chunks" in r:
          print(f"       {r['engine']}: {r['chunks']} chunks, {r['refills']} refills, "
                f"{r['prefilled_prompts']} prompt prefills")


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--workloads", default="cpu,gsm8k", help="comma list of: cpu, gsm8k")
  parser.add_argument("--rows", default="16,64", help="rows in flight, comma list")
  parser.add_argument("--engines", default="streaming,static,transformers")
  parser.add_argument("--cpu_prompts", type=int, default=0,
                      help="cpu task prompts (x 8 samples); 0: rows / 2, i.e. 4 samples a slot")
  parser.add_argument("--gsm8k_questions", type=int, default=0,
                      help="GSM8K questions (x 4 samples); 0: rows, i.e. 4 samples a slot")
  parser.add_argument("--gsm8k_data", default=os.path.join(REPO, "..", "shared", "data", "gsm8k"),
                      help="directory with test.jsonl (or .parquet)")
  parser.add_argument("--chunk_steps", default="32", help="streaming: decode steps per chunk")
  parser.add_argument("--window_step", default="64", help="streaming: window granularity")
  parser.add_argument("--out", default="", help="also write the results as JSON here")
  parser.add_argument("--engine", help=argparse.SUPPRESS)  # set in the per-engine subprocess
  args = parser.parse_args()
  if args.engine:
    _child(args)
    return
  unknown = set(args.workloads.split(",")) - set(WORKLOADS)
  if unknown:
    parser.error(f"unknown workloads {sorted(unknown)} (choose from {sorted(WORKLOADS)})")
  if "gsm8k" in args.workloads.split(",") and not os.path.exists(args.gsm8k_data):
    parser.error(f"--gsm8k_data {args.gsm8k_data} does not exist (a directory with test.jsonl)")
  # One subprocess per (workload, rows, engine), the engines of a pair back to
  # back (the load of a shared machine drifts); results are saved as they come.
  results = []
  pairs = itertools.product(args.workloads.split(","), _ints(args.rows), args.engines.split(","))
  for workload, num_rows, engine in pairs:
    settings = {k: v for k, v in vars(args).items() if k not in ("engine", "engines", "out")}
    settings.update(workloads=workload, rows=num_rows)
    cmd = [sys.executable, "-m", "benchmarks.searcher_throughput", "--engine", engine] + [
        f"--{k}={v}" for k, v in settings.items()]
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True, cwd=REPO).stdout
    for line in out.strip().splitlines():
      if line.startswith("{"):
        results.append(json.loads(line))
        r = results[-1]
        print(f"# {workload} rows {num_rows} {r['engine']}: {r['seconds']:.1f} s "
              f"({r['compile_seconds']:.1f} s compiling)", flush=True)
    if args.out:
      with open(args.out, "w") as f:
        json.dump(results, f)
  _report(results, args)


if __name__ == "__main__":
  main()
