r"""Greedy pass@1 of SmolLM2-135M-Instruct on real GSM8K through tba_jax's evaluation.

  python -m benchmarks.gsm8k_baseline --data ../shared/data/gsm8k --num_problems 200

The first --num_problems test problems, the --prompt_style prompt ("chat": the
tokenizer's chat template; "paper": the TBA paper's "[MATH TASK] ..." prompt),
greedy decoding up to --max_new_tokens, the paper's answer extraction.
"""
import argparse
import time


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--data", default="../shared/data/gsm8k",
                      help="directory with test.jsonl ('' = the Hugging Face hub)")
  parser.add_argument("--num_problems", type=int, default=200)
  parser.add_argument("--prompt_style", default="chat")
  parser.add_argument("--max_new_tokens", type=int, default=512)
  parser.add_argument("--batch_size", type=int, default=32)
  args = parser.parse_args()

  import jax

  from tba_jax import hf_checkpoints, tasks, tokenizer
  from tba_jax.evaluation import Evaluator
  from tba_jax.sampler import Sampler, SamplingOptions
  from tba_jax.tasks import gsm8k

  path = hf_checkpoints.smollm2_gguf_path()
  cfg, params = hf_checkpoints.load(path)
  tok = tokenizer.from_gguf(path)
  problems = gsm8k.load("test", args.data or None, limit=args.num_problems)
  prompts = [tok.encode_prompt(gsm8k.make_prompt(p.fields["question"], args.prompt_style, tok),
                               templated=args.prompt_style == "chat") for p in problems]
  greedy = Sampler(cfg, SamplingOptions(max_new_tokens=args.max_new_tokens, greedy=True,
                                         eos_ids=tok.eos_ids, pad_id=tok.pad_id))
  evaluator = Evaluator(problems=problems, prompt_tokens=prompts, decode=tok.decode,
                        reward=tasks.TextReward(gsm8k.reward).build(None),
                        eos_ids=tok.eos_ids, batch_size=args.batch_size, greedy=greedy)
  t0 = time.perf_counter()
  result = evaluator(params, jax.random.key(0))
  print(f"SmolLM2-135M-Instruct (Q4_1 GGUF, float32), GSM8K test first {len(problems)}, "
        f"prompt {args.prompt_style!r}, greedy, <= {args.max_new_tokens} new tokens: "
        f"pass@1 = {result['eval/greedy_pass@1']:.3f} "
        f"({round(result['eval/greedy_pass@1'] * len(problems))}/{len(problems)}), "
        f"{time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
  main()
