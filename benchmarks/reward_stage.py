r"""A searcher batch's cost: sampling vs the reward stage (reward model or Python rule).

  python -m benchmarks.reward_stage [--rows 32] [--prompt_len 128] [--new_tokens 64]

A policy and a reward model with Pythia-160M's shapes (GPT-NeoX, random weights
written by transformers and read back, as TL;DR's policy and reward model share
the architecture), float32. One searcher batch of `rows` completions: the
sampler's generate (T = 0.7, no EOS: every row runs all new tokens), then the
reward stage on the same batch: `tasks.model_rewards.ModelReward` (the reward model's score
of prompt + completion, jitted on the same device) and, for scale,
`tasks.TextReward` with GSM8K's answer check (Python, per completion).
Prints the best of `repeats` timed runs after a compiling one.
"""
import argparse
import os
import tempfile

import numpy as np

from benchmarks.timing import best_of


def _pythia160m(directory: str, classifier: bool):
  import torch
  import transformers
  config = transformers.GPTNeoXConfig(  # EleutherAI/pythia-160m's config.json
      vocab_size=50304, hidden_size=768, intermediate_size=3072, num_hidden_layers=12,
      num_attention_heads=12, max_position_embeddings=2048, rotary_pct=0.25,
      use_parallel_residual=True, bos_token_id=0, eos_token_id=0, num_labels=1)
  torch.manual_seed(int(classifier))
  auto = (transformers.AutoModelForSequenceClassification if classifier
          else transformers.AutoModelForCausalLM)
  auto.from_config(config, dtype=torch.float32).save_pretrained(directory)
  return directory

def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rows", type=int, default=32)
  parser.add_argument("--prompt_len", type=int, default=128)
  parser.add_argument("--new_tokens", type=int, default=64)
  parser.add_argument("--repeats", type=int, default=3)
  args = parser.parse_args()

  import jax

  from tba_jax import hf_checkpoints, sharding, tasks
  from tba_jax.tasks import model_rewards
  from tba_jax.sampler import Sampler, SamplingOptions
  from tba_jax.tasks import Problem, gsm8k

  mesh = sharding.make_mesh("searcher", jax.devices()[:1])
  with tempfile.TemporaryDirectory() as d:
    cfg, params = hf_checkpoints.load(_pythia160m(os.path.join(d, "policy"), False), mesh=mesh,
                                      role="searcher")
    model_reward = model_rewards.ModelReward(_pythia160m(os.path.join(d, "rm"), True)).build(mesh)
  rule = tasks.TextReward(gsm8k.reward).build(mesh)
  rng = np.random.default_rng(0)
  prompts = [list(rng.integers(1, cfg.vocab_size, args.prompt_len)) for _ in range(args.rows)]
  options = SamplingOptions(max_new_tokens=args.new_tokens, temperature=0.7)
  sampler = Sampler(cfg, options, mesh=mesh)
  out = sampler(params, prompts, jax.random.key(0))
  completions = [out.tokens[r, :out.lengths[r]] for r in range(args.rows)]
  batch = tasks.RewardBatch(
      problems=[Problem(r, {"question": "", "answer": "#### 42"}, 42.0) for r in range(args.rows)], prompts=prompts,
      completions=completions, ended_with_eos=np.zeros(args.rows, bool),
      texts=[" ".join(map(str, c[:20])) + " so the answer is 42" for c in completions])

  sample_s = best_of(lambda: sampler(params, prompts, jax.random.key(1)), args.repeats, warmup=1)[0]
  model_s = best_of(lambda: model_reward(batch), args.repeats, warmup=1)[0]
  rule_s = best_of(lambda: rule(batch), args.repeats, warmup=1)[0]
  print(f"Pythia-160M shapes, float32, {os.cpu_count()} CPU threads, jax {jax.__version__}; "
        f"one searcher batch of {args.rows} rows, prompt {args.prompt_len} + "
        f"{args.new_tokens} new tokens (best of {args.repeats})")
  print(f"  sampler generate           {sample_s:8.3f} s")
  print(f"  ModelReward (reward model) {model_s:8.3f} s  ({model_s / sample_s:.1%} of sampling)")
  print(f"  TextReward (GSM8K rule)    {rule_s:8.4f} s  ({rule_s / sample_s:.2%} of sampling)")


if __name__ == "__main__":
  main()
