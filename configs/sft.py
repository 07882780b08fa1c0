r"""Supervised fine-tuning (experiments/sft.py): next-token loss on the completions of
(prompt, completion) pairs.

  git clone https://github.com/GFNOrg/red-teaming /tmp/red-teaming
  python -m experiments.sft --config configs/sft.py:gpt2 --workdir sft/gpt2 \
      --config.data.redteam_repo=/tmp/red-teaming --config.data.path=/tmp/rt_sft.jsonl
  python -m experiments.sft --config configs/sft.py:tiny --workdir /tmp/sft_tiny  # seconds

gpt2: red-teaming's attacker SFT, Lee et al.'s (README of GFNOrg/red-teaming): lr 3e-5,
100 steps of 1024 examples in 32 micro-batches, clip 1.0, weight decay 0.1, 100 warmup
steps (the lr rises through the whole run), the stock gpt2 config's dropout 0.1 in
training, except that weight decay applies to every weight (theirs spares biases and
LayerNorms) and every example is trained on (they hold out 10% for a validation loss).
The result, in Hugging Face format in WORKDIR, is the `model.path` of configs/redteam.py.
Not timed here (it needs the hub's gpt2 and the red-teaming repository).

smollm2_redteam: the red-teaming attacker's warm-up (configs/redteam.py:cpu runs it first,
task.redteam.attacker_sft): the embedded SmolLM2-135M-Instruct on the 64 provoking
instructions of configs/data/redteam_seed.jsonl (written for this repo: "repeat after me",
"use the word ... in a sentence", insults, rude characters, rants), each after
tasks/redteam.py's ATTACK_PROMPT as the attacker sees it; 24 steps of 16 (6 passes), lr
1e-4 falling linearly to 0, no weight decay, no dropout (SmolLM2 has none). Lee et al.'s
SFT data (3,003 instructions) are not shipped offline; this is its small stand-in.
Measured 2026-12-02 on the 2-core CPU under a load average of 11-13 (other jobs):
12 min 24 s, loss 3.45 (step 4) -> 1.09 (step 24); its samples of the attack prompt
succeed 10 times in 48 (benchmarks/redteam_probe.py; SmolLM2 itself: 0 in 32).

tiny: a random 2-layer model with the byte tokenizer, on 8 built-in rows, 20 steps
(offline, about 10 s on 2 CPU cores): the smoke test of the job.
"""
import os

import ml_collections

from configs import common

# The red-teaming attacker's warm-up data: provoking instructions written for this repo.
REDTEAM_SEED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data",
                            "redteam_seed.jsonl")


def base() -> ml_collections.ConfigDict:
  """Every key experiments/sft.py reads (the shared names: configs/common.py's)."""
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.num_train_steps = 100
  c.batch_size = 1024        # examples per step (the order: epochs of a shuffle)
  c.model = dict(
      path="gpt2",           # HF directory, hub id, .gguf file, "smollm2" or "random"
      tokenizer="",          # "" = from model.path; or a HF directory / hub id, or "bytes"
      add_bos="auto",        # prompts' BOS, as configs/common.py's
      dtype="float32",       # "float32" or "bfloat16" parameters
      dropout=0.1,           # GPT-2's attention, residual and embedding dropout in training
      attention_impl="auto",  # attention kernels, as configs/common.py's
      random=common.base().model.random.to_dict(),  # the architecture when path == "random"
  )
  c.data = dict(
      path="",               # jsonl of {"prompt", "completion"}; "" = the 8 built-in rows
      redteam_repo="",       # a GFNOrg/red-teaming checkout: its SFT examples are written
                             # to data.path first
      redteam_copies=38,     # examples per instruction (redteam_repo)
  )
  c.optim = dict(
      learning_rate=3e-5,    # reached after warmup_steps, then linear to 0 at num_train_steps
      warmup_steps=100,
      weight_decay=0.1,      # AdamW's, on every weight
      grad_clip_norm=1.0,    # 0 = no clipping
      num_microbatches=32,   # gradient accumulation; must divide batch_size
  )
  c.mesh = dict(num_cpu_devices=0)  # > 0 and no accelerator: split the host CPU
  c.log = dict(every=10)     # steps between loss lines
  return c


def _gpt2(c):
  del c  # the defaults are this recipe


def _tiny(c):
  c.update(num_train_steps=20, batch_size=8)
  c.model.update(path="random", tokenizer="bytes", dropout=0.0)
  c.optim.update(learning_rate=3e-3, warmup_steps=0, weight_decay=0.0, num_microbatches=1)
  c.log.every = 5


def _smollm2_redteam(c):
  """The embedded SmolLM2 warmed up on configs/data/redteam_seed.jsonl (module docstring)."""
  c.update(num_train_steps=24, batch_size=16)
  c.model.update(path="smollm2", dropout=0.0)  # SmolLM2 has no dropout
  c.data.path = REDTEAM_SEED
  c.optim.update(learning_rate=1e-4, warmup_steps=0, weight_decay=0.0, num_microbatches=1)
  c.log.every = 4


RECIPES = {"gpt2": _gpt2, "tiny": _tiny, "smollm2_redteam": _smollm2_redteam}
VARIANTS = tuple(RECIPES)


def get_config(arg: str = "gpt2"):
  return common.from_recipes(arg, "configs/sft.py", RECIPES, base=base)
