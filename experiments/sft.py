r"""Supervised fine-tuning: next-token loss on the completion of (prompt, completion) pairs.

  python -m experiments.sft --model gpt2 --data sft.jsonl --out sft/gpt2
  # red-teaming's attacker, from GFNOrg/red-teaming's SFT data (written to --data first):
  git clone https://github.com/GFNOrg/red-teaming /tmp/red-teaming
  python -m experiments.sft --model gpt2 --redteam_repo /tmp/red-teaming --data sft.jsonl \
      --out sft/gpt2

--data is a jsonl file of {"prompt": ..., "completion": ...}; the loss is the mean
negative log-likelihood of the completion's tokens and an EOS after them (the
marked span), the prompt tokens being context only (with the BOS the tokenizer
adds to a prompt by default). Training is the TB trainer's jitted update
(train_step.make_update) with this loss: AdamW, the same shardings over every
local device, micro-batches. The defaults are Lee et al.'s attacker SFT (README of
GFNOrg/red-teaming: lr 3e-5, 100 steps of 1024 examples in 32 micro-batches,
clip 1.0, weight decay 0.1, 100 warmup steps: the lr rises through the whole run;
the stock gpt2 config's dropout 0.1 on in training, --dropout, as model.dropout),
except that weight decay applies to every weight (theirs spares biases and
LayerNorms) and every example is trained on (they hold out 10% for a validation
loss). The result is written in Hugging Face format to --out: the `model.path`
of configs/redteam.py.
"""
from __future__ import annotations

import argparse
import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np


def sft_loss(token_logprobs, batch, beta):
  """train_step.LossFn: the mean negative log-likelihood of the counted completion tokens."""
  del beta
  mask = batch.completion_mask
  nll = -jnp.sum(jnp.where(mask > 0, token_logprobs, 0.0)) / jnp.maximum(jnp.sum(mask), 1.0)
  return nll, {}


def read_rows(path: str) -> list[dict]:
  rows = []
  with open(path) as f:
    for number, line in enumerate(f, 1):
      if not line.strip():
        continue
      row = json.loads(line)
      if not isinstance(row, dict) or not {"prompt", "completion"} <= set(row):
        raise ValueError(f"{path}, line {number}: expected an object with 'prompt' and "
                         "'completion'")
      rows.append(row)
  if not rows:
    raise ValueError(f"{path}: no examples")
  return rows


def encode(rows, tokenizer) -> tuple[list[list[int]], list[list[int]]]:
  """(prompt ids, completion ids + EOS) per row."""
  prompts = [tokenizer.encode_prompt(r["prompt"]) for r in rows]
  completions = [tokenizer.encode(r["completion"]) + [tokenizer.eos_ids[0]] for r in rows]
  return prompts, completions


def batch_of(prompts, completions, layout):
  """A TrainBatch (in batch.Layout `layout`) whose completion_mask marks each completion
  (+ EOS)."""
  from tba_jax import batch as batch_lib
  n, tc = len(prompts), layout.completion_len
  tokens, attention = batch_lib.token_rows(prompts, completions, layout)
  counted = (np.arange(tc)[None] < np.array([len(c) for c in completions])[:, None])
  zeros = np.zeros((n, tc), np.float32)
  return batch_lib.TrainBatch(
      tokens=tokens, attention_mask=attention, completion_mask=counted.astype(np.float32),
      ref_logprobs=zeros, behaviour_logprobs=zeros, rewards=np.zeros(n, np.float32),
      group_ids=np.arange(n, dtype=np.int32), prompt_ids=np.zeros(n, np.int32),
      versions=np.zeros(n, np.int32))


def train(model_path: str, rows: list[dict], *, out: str | None, steps: int, batch_size: int,
          num_microbatches: int, learning_rate: float, warmup_steps: int, weight_decay: float,
          grad_clip: float, dropout: float, seed: int = 0, dtype: str = "float32",
          tokenizer: str = "", log_every: int = 10) -> list[float]:
  """Fine-tunes `model_path` on `rows`; returns the loss of every step (writes `out`)."""
  from tba_jax import hf_checkpoints, sharding, train_step
  from tba_jax.batch import Layout
  from tba_jax import tokenizer as tokenizer_lib
  tok = tokenizer_lib.load(tokenizer or model_path)
  mesh = sharding.make_mesh("trainer", jax.local_devices())
  cfg, params = hf_checkpoints.load(model_path, dtype, mesh=mesh, role="trainer")
  prompts, completions = encode(rows, tok)
  # Fixed shapes, one compile: every row padded to the longest prompt / completion.
  layout = Layout(max(map(len, prompts)), max(map(len, completions)), tok.pad_id)
  lr = train_step.warmup_linear(learning_rate, warmup_steps, max(steps, warmup_steps))
  optimizer = train_step.make_optimizer(lr, weight_decay, grad_clip or None)
  state = train_step.init_state(params, optimizer,
                                train_step.state_shardings(cfg, optimizer, mesh))
  del params
  update = train_step.make_update(cfg, optimizer, sft_loss,
                                  lambda u: jnp.ones((), jnp.float32), mesh, temperature=1.0,
                                  num_microbatches=num_microbatches, lr_schedule=lr,
                                  dropout=dropout, dropout_seed=seed)
  shardings = train_step.batch_shardings(mesh)
  rng = np.random.default_rng(seed)
  order, position, losses = rng.permutation(len(rows)), 0, []
  start = time.perf_counter()
  for step in range(1, steps + 1):
    # Epochs of a shuffled order, as a shuffling data loader; batches may span two epochs.
    idx = []
    while len(idx) < batch_size:
      take = order[position:position + batch_size - len(idx)]
      idx.extend(take.tolist())
      position += len(take)
      if position == len(order):
        order, position = rng.permutation(len(rows)), 0
    batch = batch_of([prompts[i] for i in idx], [completions[i] for i in idx], layout)
    state, metrics = update(state, jax.device_put(batch, shardings))
    losses.append(float(metrics["loss"]))
    if step % log_every == 0 or step == steps:
      print(f"step {step}/{steps}: loss {losses[-1]:.4f}, lr {float(metrics['lr']):.3g} "
            f"({time.perf_counter() - start:.0f} s)", flush=True)
  if out:
    hf_checkpoints.save_hf(cfg, jax.tree.map(lambda x: np.asarray(x).astype(cfg.jnp_dtype),
                                             state.params), out)
    tok.save_pretrained(out)
    print(f"Wrote the fine-tuned model to {out} (Hugging Face format).")
  return losses


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--model", required=True, help="HF directory or hub id of a causal LM")
  p.add_argument("--tokenizer", default="", help="default: the model's")
  p.add_argument("--data", required=True, help="jsonl of {'prompt', 'completion'}")
  p.add_argument("--redteam_repo", default="",
                 help="a GFNOrg/red-teaming checkout: write its SFT examples to --data first")
  p.add_argument("--redteam_copies", type=int, default=38, help="examples per instruction")
  p.add_argument("--out", required=True, help="directory for the fine-tuned model")
  p.add_argument("--steps", type=int, default=100)
  p.add_argument("--batch_size", type=int, default=1024)
  p.add_argument("--num_microbatches", type=int, default=32)
  p.add_argument("--learning_rate", type=float, default=3e-5)
  p.add_argument("--warmup_steps", type=int, default=100)
  p.add_argument("--weight_decay", type=float, default=0.1)
  p.add_argument("--grad_clip", type=float, default=1.0)
  p.add_argument("--dropout", type=float, default=0.1,
                 help="attention, residual and embedding dropout in training (GPT-2's 0.1)")
  p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
  p.add_argument("--seed", type=int, default=0)
  args = p.parse_args(argv)
  if args.batch_size % args.num_microbatches:
    p.error(f"--batch_size={args.batch_size} does not split into "
            f"--num_microbatches={args.num_microbatches}")
  if args.redteam_repo:
    from tba_jax.tasks import redteam
    rows = redteam.sft_rows(os.path.join(args.redteam_repo, "prompts", "alpaca.jsonl"),
                            os.path.join(args.redteam_repo, "prompts", "sft_dataset.json"),
                            args.redteam_copies, args.seed)
    with open(args.data, "w") as f:
      f.writelines(json.dumps(r) + "\n" for r in rows)
    print(f"Wrote {len(rows)} examples to {args.data}.")
  train(args.model, read_rows(args.data), out=args.out, steps=args.steps,
        batch_size=args.batch_size, num_microbatches=args.num_microbatches,
        learning_rate=args.learning_rate, warmup_steps=args.warmup_steps,
        weight_decay=args.weight_decay, grad_clip=args.grad_clip, dropout=args.dropout,
        seed=args.seed,
        dtype=args.dtype, tokenizer=args.tokenizer)


if __name__ == "__main__":
  main()
