"""One searcher batch of the `cpu` recipe, by part: sampling and the reference scoring.

  python -m benchmarks.searcher_batch              # median of 5 calls each, after a warm-up
  python -m benchmarks.searcher_batch --repeats 3

SmolLM2-135M-Instruct float32 (the embedded GGUF), one CPU device, the recipe's searcher
batch: 4 arithmetic prompts of configs/gsm8k.py:cpu x 8 samples, 32 new tokens at T = 0.7,
EOS on (every variant draws the same tokens from the same key, so each does the same work).
Each part runs as a searcher runs it and as it ran before:
  sample     the Sampler's call: rows that share a prompt prefilling it once
             (share_prompts, the default) against every row prefilling its own
  reference  the reference log-probs of the batch's completions as a searcher scores them
             (model.completion_token_logprobs, the trainer's function): each prompt once for
             its 8 rows against every row whole
"""
from __future__ import annotations

import argparse
import os


def reference_logprobs(cfg, params, prompts, completions, layout, temperature: float,
                       prompt_group: int):
  """A callable: the reference log-probs of `completions` as a searcher scores them (the
  trainer's `model.completion_token_logprobs` over `layout`'s columns, each run of
  `prompt_group` rows sharing one prompt pass). Compiles on its first call."""
  import jax
  import numpy as np

  from tba_jax import batch as batch_lib
  from tba_jax import model

  tokens, mask = batch_lib.token_rows(prompts, completions, layout)
  fn = jax.jit(model.completion_token_logprobs,
               static_argnames=("model_config", "completion_len", "temperature", "prompt_group"))
  return lambda: np.asarray(fn(cfg, params, tokens, mask, completion_len=layout.completion_len,
                               temperature=temperature, prompt_group=prompt_group))


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--repeats", type=int, default=5)
  args = parser.parse_args()
  os.environ.setdefault("JAX_PLATFORMS", "cpu")  # before jax is imported

  import jax

  from benchmarks.timing import median_seconds
  from configs import gsm8k
  from tba_jax import batch as batch_lib
  from tba_jax import config_builders, hf_checkpoints, sharding
  from tba_jax.sampler import Buckets, Sampler, SamplingOptions

  c = gsm8k.get_config("cpu")
  s = c.sampler
  mesh = sharding.make_mesh("searcher", jax.devices()[:1])
  cfg, params = hf_checkpoints.load(hf_checkpoints.smollm2_gguf_path(), mesh=mesh,
                                    role="searcher")
  tok = config_builders.load_tokenizer(c.model)
  task = config_builders.build_task(c.task, tok)
  prompts = [tok.encode_prompt(task.prompt(p)) for p in task.train[:s.num_prompts_per_batch]
             for _ in range(s.num_samples_per_prompt)]
  key = jax.random.key(0)
  options = SamplingOptions(max_new_tokens=s.max_new_tokens, temperature=s.temperature,
                            eos_ids=tok.eos_ids, pad_id=tok.pad_id)
  buckets = Buckets(length=s.length_buckets)
  shared = Sampler(cfg, options, mesh=mesh, buckets=buckets)
  whole = Sampler(cfg, options, mesh=mesh, buckets=buckets, share_prompts=False)
  out = shared(params, prompts, key)
  completions = [t[:n] for t, n in zip(out.tokens, out.lengths)]
  width = batch_lib.completion_width(int(out.lengths.max()), s.max_new_tokens, s.length_buckets)
  layout = batch_lib.Layout(c.task.max_prompt_len, width, tok.pad_id)
  reference = lambda group: reference_logprobs(cfg, params, prompts, completions, layout,
                                               s.temperature, group)

  parts = [("sample, each prompt prefilled once", lambda: shared(params, prompts, key)),
           ("sample, every row prefilled", lambda: whole(params, prompts, key)),
           (f"reference, each prompt once ({width} completion columns)",
            reference(s.num_samples_per_prompt)),
           (f"reference, every row whole ({width} completion columns)", reference(1))]
  print(f"cpu searcher batch: {len(prompts)} rows ({s.num_prompts_per_batch} prompts x "
        f"{s.num_samples_per_prompt}), prompt {max(map(len, prompts))} tokens, completions "
        f"{int(out.lengths.min())}-{int(out.lengths.max())} tokens, "
        f"{jax.devices()[0].platform}, load average {os.getloadavg()[0]:.1f}")
  for name, fn in parts:
    fn()  # compile
    print(f"{name:>52}: {median_seconds(fn, args.repeats):6.2f} s (median of {args.repeats})")


if __name__ == "__main__":
  main()
