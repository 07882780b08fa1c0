r"""One TL;DR searcher step at Pythia-410M shapes: sampling, reference log-probs, reward model.

  python -m benchmarks.tldr_searcher [--prompts 2] [--samples 20] [--prompt_len 448]
                                     [--new_tokens 128] [--repeats 1]

A searcher as the TL;DR run builds it (searcher.Searcher, one device): the policy, the frozen
reference and the training reward model, all with Pythia-410M's shapes (GPT-NeoX, d 1024, 24
layers, 16 heads, vocab 50304; the reward model with a one-label head), random weights,
float32. One step (`search_once`) samples `prompts` x `samples` completions of random
`prompt_len`-token prompts (the defaults are pythia410m's searcher batch, 2 x 20, 128 new
tokens), scores them with the reward model (tasks/tldr.Reward, -1 without EOS) and computes
the reference's log-probs over the task's 512 + 128 columns. No EOS is ever sampled (no EOS
id given), so every row runs all new tokens: the step's upper bound. Prints the time of the
step and of its three parts, each the best of `repeats` timed runs after a compiling one.
"""
import argparse
import os

import numpy as np

from benchmarks.searcher_batch import reference_logprobs
from benchmarks.timing import best_of


def pythia410m(num_labels: int = 0):
  from tba_jax.model_config import ModelConfig
  # EleutherAI/pythia-410m's config.json (the SFT and reward models share it).
  return ModelConfig(vocab_size=50304, dim=1024, mlp_dim=4096, num_layers=24, num_heads=16,
                     num_kv_heads=16, head_dim=64, norm="layer", parallel_residual=True,
                     rotary_fraction=0.25, activation="gelu", gated_mlp=False, qkv_bias=True,
                     bias=True, model_type="gpt_neox", num_labels=num_labels)


def measure(cfg, rm_cfg, *, prompts: int, samples: int, prompt_len: int, new_tokens: int,
            repeats: int, max_prompt_len: int = 512) -> dict[str, float]:
  """Seconds of one searcher step and of its three parts (module doc) for a policy and
  reference of `cfg` and a reward model of `rm_cfg`, random weights on one device."""
  import jax

  from tba_jax import batch as batch_lib
  from tba_jax import model, sharding, weight_sync
  from tba_jax.sampler import Sampler, SamplingOptions
  from tba_jax.rows import StaticRows
  from tba_jax.searcher import PromptShard, Scoring, Searcher
  from tba_jax.tasks import Problem, RewardBatch, tldr

  mesh = sharding.make_mesh("searcher", jax.devices()[:1])
  place = lambda c, seed: model.init_params(c, seed, sharding.param_shardings(c, "searcher", mesh))
  policy, ref_params, reward_params = place(cfg, 0), place(cfg, 1), place(rm_cfg, 2)

  class RandomReward(tldr.Reward):  # the task's reward stage, over these random weights
    def load(self, mesh):
      return rm_cfg, reward_params

  rng = np.random.default_rng(0)
  ids = list(range(prompts))
  prompt_tokens = {i: [int(t) for t in rng.integers(2, cfg.vocab_size, prompt_len)] for i in ids}
  sampler = Sampler(cfg, SamplingOptions(max_new_tokens=new_tokens, temperature=0.7, pad_id=1),
                    mesh=mesh)
  problems = {i: Problem(i, {"query": ""}) for i in ids}
  reward = RandomReward("random", no_eos_reward=-1.0, pad_id=1).build(mesh)
  searcher = Searcher(
      0, rows=StaticRows(sampler), mailbox=weight_sync.Mailbox(0, policy),
      prompts=PromptShard(ids, prompt_tokens, problems, max_prompt_len),
      scoring=Scoring(reward, lambda c: "", ref_params),
      num_prompts=prompts, num_samples=samples, seed=0)
  rows = [prompt_tokens[i] for i in ids for _ in range(samples)]
  out = sampler(policy, rows, jax.random.key(0))
  completions = [out.tokens[r, :out.lengths[r]] for r in range(len(rows))]
  batch = RewardBatch(problems=[Problem(0, {"query": ""})] * len(rows), prompts=rows,
                      completions=completions, ended_with_eos=np.zeros(len(rows), bool),
                      texts=[""] * len(rows))
  # The reference's log-probs as Searcher.score computes them: the completions all run
  # `new_tokens` (no EOS), each prompt once for its `samples` rows.
  reference = reference_logprobs(cfg, ref_params, rows, completions,
                                 batch_lib.Layout(max_prompt_len, new_tokens, 1), 0.7, samples)
  best = lambda fn: best_of(fn, repeats, warmup=1)[0]
  return {"step": best(searcher.search_once),
          "sampling": best(lambda: sampler(policy, rows, jax.random.key(1))),
          "reference": best(reference), "reward": best(lambda: searcher.reward(batch))}


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--prompts", type=int, default=2)
  parser.add_argument("--samples", type=int, default=20)
  parser.add_argument("--prompt_len", type=int, default=448)
  parser.add_argument("--new_tokens", type=int, default=128)
  parser.add_argument("--repeats", type=int, default=1)
  args = parser.parse_args()

  import jax

  seconds = measure(pythia410m(), pythia410m(num_labels=1), prompts=args.prompts,
                    samples=args.samples, prompt_len=args.prompt_len,
                    new_tokens=args.new_tokens, repeats=args.repeats)
  step_s, sample_s = seconds["step"], seconds["sampling"]
  n = args.prompts * args.samples
  print(f"Pythia-410M shapes (policy, reference, reward model), float32, random weights, "
        f"{os.cpu_count()} CPU threads, jax {jax.__version__}; one searcher step: "
        f"{args.prompts} prompts x {args.samples} samples = {n} rows, prompt {args.prompt_len} "
        f"+ {args.new_tokens} new tokens (best of {args.repeats})")
  print(f"  search_once (all of it)      {step_s:8.2f} s  ({n / step_s:.2f} completions/s)")
  print(f"  sampling                     {sample_s:8.2f} s  "
        f"({n * args.new_tokens / sample_s:.1f} new tokens/s)")
  print(f"  reference log-probs (512+{args.new_tokens}) {seconds['reference']:6.2f} s")
  print(f"  reward model                 {seconds['reward']:8.2f} s")


if __name__ == "__main__":
  main()
