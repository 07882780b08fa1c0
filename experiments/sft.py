r"""Supervised fine-tuning: next-token loss on the completion of (prompt, completion) pairs.

  python -m experiments.sft --config configs/sft.py:gpt2 --workdir sft/gpt2 \
      --config.data.path=sft.jsonl
  # red-teaming's attacker, from GFNOrg/red-teaming's SFT data (written to data.path first):
  git clone https://github.com/GFNOrg/red-teaming /tmp/red-teaming
  python -m experiments.sft --config configs/sft.py:gpt2 --workdir sft/gpt2 \
      --config.data.redteam_repo=/tmp/red-teaming --config.data.path=/tmp/rt_sft.jsonl

data.path is a jsonl file of {"prompt": ..., "completion": ...}; the loss is the mean
negative log-likelihood of the completion's tokens and an EOS after them (the
marked span), the prompt tokens being context only (with the BOS the tokenizer
adds to a prompt by default). Training is the TB trainer's jitted update
(train_step.make_update) with this loss: AdamW, the same shardings over every
local device, micro-batches. The recipes (configs/sft.py) hold the settings; the flags,
errors and start-up are every experiment's (experiments/launch.py). The result is
written in Hugging Face format to the workdir: the `model.path` of configs/redteam.py.
"""
from __future__ import annotations

import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from tba_jax.errors import ConfigError, DataError


def sft_loss(token_logprobs, batch, beta):
  """train_step.LossFn: the mean negative log-likelihood of the counted completion tokens."""
  del beta
  mask = batch.completion_mask
  nll = -jnp.sum(jnp.where(mask > 0, token_logprobs, 0.0)) / jnp.maximum(jnp.sum(mask), 1.0)
  return nll, {}


def read_rows(path: str) -> list[dict]:
  if not os.path.isfile(path):
    raise DataError(f"data.path={path!r}: no such file (a jsonl of prompt/completion rows)")
  rows = []
  with open(path) as f:
    for number, line in enumerate(f, 1):
      if not line.strip():
        continue
      row = json.loads(line)
      if not isinstance(row, dict) or not {"prompt", "completion"} <= set(row):
        raise DataError(f"{path}, line {number}: expected an object with 'prompt' and "
                         "'completion'")
      rows.append(row)
  if not rows:
    raise DataError(f"{path}: no examples")
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


# data.path "": a few rows to smoke-test the job with (configs/sft.py:tiny).
BUILT_IN_ROWS = [{"prompt": "List:\n1.", "completion": " Say hi"},
                 {"prompt": "List:\n1.", "completion": " Go home now"},
                 {"prompt": "Q", "completion": " abc"},
                 {"prompt": "Longer prompt here:\n1.", "completion": " x"}] * 2


def train(c, rows: list[dict], out: str | None) -> list[float]:
  """Fine-tunes the model of config `c` (configs/sft.py) on `rows`; returns the loss of
  every step (writes the model to `out`)."""
  from tba_jax import (config_builders, hf_checkpoints, optim, run_config, sharding,
                       train_state, train_step)
  from tba_jax.batch import Layout
  tok = config_builders.load_tokenizer(c.model)
  mesh = sharding.make_mesh("trainer", jax.local_devices())
  cfg, params = config_builders.load_model(c.model, tok, c.model.dtype, mesh, c.seed)
  prompts, completions = encode(rows, tok)
  # Fixed shapes, one compile: every row padded to the longest prompt / completion.
  layout = Layout(max(map(len, prompts)), max(map(len, completions)), tok.pad_id)
  o, steps = c.optim, c.num_train_steps
  lr = optim.warmup_linear(o.learning_rate, o.warmup_steps, max(steps, o.warmup_steps))
  optimizer = optim.make_optimizer(lr, o.weight_decay, o.grad_clip_norm or None)
  state = train_state.init_state(params, optimizer,
                                train_state.state_shardings(cfg, optimizer, mesh))
  del params
  # beta is unread by sft_loss; the log-probs untempered.
  objective = train_step.Objective(sft_loss, lambda u: jnp.ones((), jnp.float32), 1.0)
  forward = train_step.Forward(num_microbatches=o.num_microbatches, dropout=c.model.dropout,
                               dropout_seed=c.seed)
  update = train_step.make_update(cfg, optimizer, objective, mesh, forward=forward, lr_schedule=lr)
  shardings = train_state.batch_shardings(mesh)
  rng = np.random.default_rng(c.seed)
  order, position, losses = rng.permutation(len(rows)), 0, []
  start = time.perf_counter()
  for step in range(1, steps + 1):
    # Epochs of a shuffled order, as a shuffling data loader; batches may span two epochs.
    idx = []
    while len(idx) < c.batch_size:
      take = order[position:position + c.batch_size - len(idx)]
      idx.extend(take.tolist())
      position += len(take)
      if position == len(order):
        order, position = rng.permutation(len(rows)), 0
    batch = batch_of([prompts[i] for i in idx], [completions[i] for i in idx], layout)
    state, metrics = update(state, jax.device_put(batch, shardings))
    losses.append(float(metrics["loss"]))
    if step % c.log.every == 0 or step == steps:
      print(f"step {step}/{steps}: loss {losses[-1]:.4f}, lr {float(metrics['lr']):.3g} "
            f"({time.perf_counter() - start:.0f} s)", flush=True)
  if out:
    hf_checkpoints.save_hf(cfg, jax.tree.map(lambda x: np.asarray(x).astype(cfg.jnp_dtype),
                                             state.params), out)
    tok.save_pretrained(out)
    run_config.write(out, c.to_dict())  # `--config OUT/config.yaml` reruns it
    print(f"Wrote the fine-tuned model to {out} (Hugging Face format).")
  return losses


def check(c) -> None:
  """The SFT config's values that cannot run, as one ConfigError."""
  problems = [f"{k}={v!r}: must be >= 1" for k, v in (
      ("num_train_steps", c.num_train_steps), ("batch_size", c.batch_size),
      ("optim.num_microbatches", c.optim.num_microbatches), ("log.every", c.log.every))
      if not v >= 1]
  if not problems and c.batch_size % c.optim.num_microbatches:
    problems.append(f"batch_size={c.batch_size}: does not split into "
                    f"optim.num_microbatches={c.optim.num_microbatches}")
  if c.model.dtype not in ("float32", "bfloat16"):
    problems.append(f"model.dtype={c.model.dtype!r}: must be one of 'float32', 'bfloat16'")
  if c.data.redteam_repo and not c.data.path:
    problems.append("data.path='': data.redteam_repo writes its examples there; name a file")
  if problems:
    raise ConfigError("config: " + "; ".join(problems))


def run(c, workdir: str) -> list[float]:
  """The job: data.path's rows (written from data.redteam_repo first, when set), trained
  into `workdir`."""
  if c.data.redteam_repo:
    from tba_jax.tasks import redteam
    rows = redteam.sft_rows(os.path.join(c.data.redteam_repo, "prompts", "alpaca.jsonl"),
                            os.path.join(c.data.redteam_repo, "prompts", "sft_dataset.json"),
                            c.data.redteam_copies, c.seed)
    with open(c.data.path, "w") as f:
      f.writelines(json.dumps(r) + "\n" for r in rows)
    print(f"Wrote {len(rows)} examples to {c.data.path}.")
  return train(c, read_rows(c.data.path) if c.data.path else BUILT_IN_ROWS, out=workdir)


if __name__ == "__main__":
  from experiments import launch
  launch.main("sft.py:gpt2", run, check=check)
