r"""TBA on MATH (12,000 train / 500 test, MATH-500): TBA-prime's recipe and variants.

Usage: python -m experiments.math --config configs/math.py:VARIANT --workdir DIR
       [--config.section.key=value ...]   (or VARIANT,key=value,... in the arg)

The task (tba_jax/tasks/math.py): MATH problems from the hub (nlile/hendrycks-MATH-benchmark,
or task.data_path), the gold the answer string, checked by task.verifier (math_verify:
LaTeX and symbolic equivalence), evaluated on MATH-500 (greedy pass@1, sampled pass@1 and
pass@k for k = 2, 4, ..., eval.num_samples).

Variants (none has been run here: no accelerator was lent to this work, no hub access):

  tba_prime  TBA-prime's Qwen2.5-7B-Instruct MATH run (bbartoldson/tba-prime at
          115573d, its TBA_qwen2.5_7b_math configs), setting by setting below: TB with
          beta 0.001, log Z from the sampling policy's log-probs, lr 3e-6 constant,
          AdamW (0.9, 0.99, wd 0.01), 256 samples (16 prompts x 16) per update, weights
          published every 3 updates, T = 1.0, prompts in the chat template with
          their boxed-answer instruction, 1,024 tokens of context.
            python -m experiments.math --config configs/math.py:tba_prime --workdir DIR
          Hardware: 8 accelerators, 4 trainer (FSDP) + 4 searchers (theirs: 4 H100
          training + 4 H100 inference, multinode_launch.sh L40, L54). Memory per
          device, computed (python -m benchmarks.memory --math): a trainer device 47.9
          GB (states + logits floor + evaluation copy), a searcher device 60.7 GB
          (weights x 3 + KV cache): under an H200's 141 GB and a TPU v5p chip's 95 GB
          (v5p-16: 8 chips). Not measured.

  tba_prime_qwen3  The same recipe for Qwen/Qwen3-4B (per-head q/k norms; tied
          embeddings), with the chat template's thinking switch off: in 1,024 tokens of
          context a thinking Qwen3 is cut off before its answer on most MATH problems
          (theirs leaves enable_thinking at True, inference/config.py L245-248; set
          --config.task.thinking=on with a longer sampler.max_new_tokens for that).
          Same hardware; computed 27.8 GB per trainer device, 62.8 GB per searcher.
          Not measured.

  tba_prime_ratio  TBA-prime's comparison run (GRPO_qwen2.5_7b_math.toml: the same files
          with grpo.off_policy.type = "ratio", L30-33): its per-token ratio loss
          (loss.name=ratio: -min(pi/pi_b, 8) (r - mean r) per token, losses.ratio),
          no reference model in the loss. Same hardware. Not measured.

  tiny    A random 2-layer model with the byte tokenizer on the 8 + 6 MATH-format
          problems in configs/data/math_tiny (written for the tests, not from MATH),
          math_verify, TB with behaviour log Z; runs end to end in seconds on CPU.

The tba_prime settings against TBA-prime's (paths in bbartoldson/tba-prime at 115573d;
"train" is src/zeroband/train.py, "loss" src/zeroband/training/loss.py, "tcfg"
src/zeroband/training/config.py, "icfg" src/zeroband/inference/config.py, "T" / "I"
configs/{training,inference}/TBA_qwen2.5_7b_math.toml, "utils" src/zeroband/inference/
utils.py, "data" src/zeroband/training/data.py):

  setting                ours (tba_prime)               TBA-prime                   where
  model / reference      Qwen2.5-7B-Instruct; the       same; the reference loaded  T L8, I L15,
                         initial weights                once, never updated         train L135-137
  reference reset        none (ref_reset_every 0)       none in the code (tba_spec  train L169, L219,
                                                        says every 50: set           L288
                                                        loss.ref_reset_every=50)
  data                   MATH 12k train (hub)           math-hendrycks-genesys-     I L19, README L62
                                                        format, a local copy
  prompt                 chat template, user turn =     same, add_generation_prompt utils L180-193
                         problem + " Place your answer
                         at end exactly inside latex
                         box for example \boxed{12} or
                         \boxed{51}."
  thinking switch        template default (Qwen2.5:     enable_thinking=True (no    icfg L245-248
                         none)                          effect on Qwen2.5)
  reward                 math_verify of the final       last \boxed{}, mathd or     genesys/math.py
                         answer after any </think>      sympy equality, after       L11-45
                                                        </think>
  samples per prompt S   16                             n = 16                      icfg L14, tcfg L115
  searcher batch         16 prompts x 16 = 256 rows,    max_batch_size 256 // n =   I L6, infer.py
                         streaming (num_slots 256)      16 prompts, vLLM            L157-158
  sampling               T 1.0, top-p 1, top-k off      same (vLLM defaults)        icfg L32-54
  context                512 prompt + 512 new tokens    max_model_len 1024 (prompt  I L16, T L24,
                                                        + completion), seq 1024     icfg L73-79
  logits for log pi      / T (1.0)                      / temperature               loss L125
  EOS in log pi          counted                        counted (loss_mask = 1 on   data L272
                                                        every output token)
  loss                   TB, (log Z + log pi - log      TB, (log Z + beta (log pi   loss L130-131
                         pi_ref - r / beta)^2, mean     - log pi_ref) - r)^2 summed
                                                        / (2 beta tokens): our
                                                        residual x beta^2 / (2 beta
                                                        tokens), a scale Adam
                                                        ignores
  log Z                  -mean_j (log pi_b - log        the same from the trainer's train L258-281
                         pi_ref - r / beta) per prompt  recomputed log-probs of the
                         (loss.log_z=behaviour), the    sampling weights, once per
                         sampling policy's log-probs    rollout step
                         stored with each sample
  beta                   0.001, constant                0.001 ("0.001 or 0.005")    T L32
  KL anchoring           the reference term of the TB   the same term; no separate  T L30-33, tcfg
                         target only (kl_coef unused)   KL loss (kl_coef None), no   L127-128
                                                        entropy bonus
  importance weights     none (ratio_clip 0)            none in TB                  loss L88-132
  batch B x K            16 prompts x 16 = 256          batch_size 256              T L16
  micro-batches          16 (one prompt each)           micro_bs 2 per GPU          T L11
  updates per sync k     3                              step_per_rollout 3: 3       T L17, train
                                                        updates per rollout step,   L232-283, L520
                                                        weights saved after them
  staleness              unbounded; m = 1 takes the     async_level 2: inference at icfg L327-333,
                         latest sync's prompts          most 2 rollout steps ahead  infer.py L224-229
  prefill                768 (one rollout step)         waits for 3 x 256 rows      data L123, train
                                                                                    L194
  sample reuse           replay buffer, newest 16 per   each sample trained once    data L226-312
                         prompt, m = 1.0
  optimizer              AdamW lr 3e-6 constant,        torch AdamW, no scheduler,  T L20, tcfg
                         (0.9, 0.99), eps 1e-8, wd      (0.9, 0.99), wd 0.01        L15-18, train
                         0.01                                                       L143-148
  gradient clipping      global norm 1.0                1.0                         tcfg L28, train L447
  precision              bf16 compute, fp32 masters     FSDP bf16 params, fp32      train L59-68
                         and moments                    reduce; fp32 masters
  activation ckpt        remat                          ac_ckpt = true              T L13
  seed                   42                             torch.manual_seed(42)       train L107
  steps                  600                            until stopped               tcfg L212
  evaluation             MATH-500 every 100 steps:      none configured (online     icfg L336-376,
                         greedy pass@1, 4 samples at    MATH-500 evals exist, off   eval/utils.py
                         T 1.0 (pass@1/2/4)             in these files)             L18-25

  What it needs that we lack (or do differently):
  - Their log Z is (1/K) x the sum over one run of num_grad_acc_steps // K micro-batches
    (train L248, L279-281). Rows are dealt round-robin over the trainer GPUs (data
    L151-176), so with 4 GPUs a run holds 4 of a prompt's 16 samples: their log Z is a
    quarter of the group mean (exact on one GPU). Ours is the group mean, by prompt id.
  - A bound on staleness (their async_level 2); ours is m and the sync period.
  - Each sample trained exactly once; we sample from a replay buffer.
  - Completion budget per prompt (1,024 - prompt tokens); ours is a fixed 512, and a
    prompt over task.max_prompt_len = 512 tokens stops the run at start (raise it).
  - Their grader (mathd normalisation + sympy); ours is math-verify.
  - Loss normalisation by the micro-batch's token count (a per-micro-batch weight).
"""
import os

import ml_collections

from configs import common

VARIANTS = ("tba_prime", "tba_prime_qwen3", "tba_prime_ratio", "tiny")
TINY_DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "math_tiny")
# TBA-prime's instruction after each problem (tba-prime src/zeroband/inference/utils.py L184).
BOXED_SUFFIX = (" Place your answer at end exactly inside latex box for example \\boxed{12} "
                "or \\boxed{51}.")


def _common(c):
  """configs/common.py's base (every key the runtime reads) set to TBA-prime's MATH run."""
  c.seed = 42
  c.num_train_steps = 600
  c.model.update(path="Qwen/Qwen2.5-7B-Instruct", dtype="bfloat16", remat=True)
  c.task.update(name="math", data_path="", prompt_style="chat", question_suffix=BOXED_SUFFIX,
                thinking="auto", verifier="math_verify", max_prompt_len=512)
  c.mesh.update(num_trainer_devices=4, num_searchers=4)
  c.sampler.update(temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=512,
                   num_samples_per_prompt=16, num_prompts_per_batch=16, num_slots=256)
  c.loss.update(name="tb", beta_start=0.001, beta_end=0.001, beta_anneal_steps=1,
                beta_switch_step=1, include_eos=True, ratio_clip=0.0, kl_coef=0.0,
                ref_reset_every=0, log_z="behaviour")
  c.optim.update(learning_rate=3e-6, schedule="constant", warmup_steps=0, weight_decay=0.01,
                 b1=0.9, b2=0.99, grad_clip_norm=1.0, master_weights_fp32=True,
                 moments_dtype="float32", num_microbatches=16)
  c.buffer.update(num_prompts=16, samples_per_prompt=16, m=1.0, reuse_latest=True,
                  max_per_prompt=16, dedup=True, prefill=768)
  c.sync.update(every=3, mode="async")
  c.eval.update(every=100, num_problems=0, greedy=True, num_samples=4, temperature=0.0,
                max_new_tokens=512, batch_size=64, devices="trainer")
  c.checkpoint.update(every=100)


def _tba_prime(c):
  del c  # _common is the recipe


def _qwen3(c):
  c.model.update(path="Qwen/Qwen3-4B")
  c.task.update(thinking="off")


def _ratio(c):
  c.loss.update(name="ratio", ratio_clip=8.0, kl_coef=0.0, log_z="vargrad")


def _tiny(c):
  c.num_train_steps = 4
  c.model.update(path="random", tokenizer="bytes", dtype="float32", remat=False)
  c.task.update(data_path=TINY_DATA, prompt_style="{question}\n", question_suffix="",
                max_prompt_len=200)
  c.mesh.update(num_trainer_devices=1, num_searchers=1)
  c.sampler.update(max_new_tokens=8, num_samples_per_prompt=4, num_prompts_per_batch=2,
                   num_slots=0)
  c.loss.update(beta_start=0.1, beta_end=0.1)
  c.optim.update(learning_rate=1e-3, num_microbatches=1)
  c.buffer.update(num_prompts=2, samples_per_prompt=4, max_per_prompt=100, prefill=8)
  c.sync.update(every=2)
  c.eval.update(every=2, num_problems=4, num_samples=2, max_new_tokens=8, batch_size=8)
  c.checkpoint.update(every=2)


RECIPES = {"tba_prime": _tba_prime, "tba_prime_qwen3": _qwen3, "tba_prime_ratio": _ratio,
           "tiny": _tiny}
assert tuple(RECIPES) == VARIANTS


def get_config(arg: str = "tba_prime") -> ml_collections.ConfigDict:
  """`arg`: "VARIANT" or "VARIANT,key=value,..." (e.g. "tiny,num_train_steps=2")."""
  return common.from_recipes(arg, "configs/math.py", RECIPES, common=_common)
