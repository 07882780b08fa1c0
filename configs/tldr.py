r"""TBA on Reddit TL;DR summarisation: the paper's preference fine-tuning runs (Pythia).

Usage: python -m experiments.tldr --config configs/tldr.py:VARIANT --workdir DIR
       [--config.section.key=value ...]   (or VARIANT,key=value,... in the arg)
       python -m experiments.evaluate_tldr --config configs/tldr.py:VARIANT --workdir DIR \
           [--policy EXPORTED_OR_HUB_MODEL]   (evaluate a policy on its own; docs/experiments/tldr.md)

Variants (tldr_spec.md; where no measured result is given, none has been measured here):

  pythia410m, pythia1b, pythia2p8b  Table 3 of the paper: the SFT policy
          mnoukhov/pythia{size}-sft-tldr trained against the reward model
          mnoukhov/pythia{size}-rm-tldr6.9b, float32, 256 updates of 8 prompts x K=20
          (40,960 episodes), S=20 samples per prompt at T=0.7, 128 new tokens, lr 3e-6
          linearly to 0 (update u uses 3e-6 (1 - u/256)), beta 1.0 -> 0.05 annealed
          over a 128-step target and switched to 0.05 at step 32, m=0.5, k=10, 3
          searchers + 1 trainer, 10,000 completions before the first step (2.8b:
          20,000, see the table), gradient checkpointing for 2.8b. Evaluated before
          training and every 64 steps (the authors' checkpoints at 25% of the run) on
          the validation split at T = 0.010001: win rate against the reference
          summaries under the gold reward model
          cleanrl/EleutherAI_pythia-6.9b-deduped__reward__tldr, Table 1's perplexity
          under the SFT policy, the KL the authors log (tasks/tldr.py).
            python -m experiments.tldr --config configs/tldr.py:pythia410m --workdir DIR
          Hardware: 4 accelerators (4 x A100 80GB in the paper), 1 trainer + 3
          searchers; the gold model is sharded over all of them (docs/experiments/tldr.md: memory per
          device and other layouts). Expected (paper, Pythia-410M, ~15 steps
          off-policy): win rate 0.86 at perplexity 1.13 (Table 1 reports this for the
          Table-1 run below); per-size results appear only in the paper's figures.
          Not measured here (no accelerator, no hub access in this work).

  pythia410m_table1  Table 1's TBA run: pythia410m for 625 updates (100,000 episodes)
          with 2 searchers (1 trainer + 2 searchers on 3 devices), beta's anneal target
          at N/2 = 312 and its switch at N/8 = 78 (the paper's rule for the schedule; the
          exact values of this run are not released, tldr_spec.md says UNSURE),
          evaluated every 157 steps. Expected (Table 1): win rate 0.86, perplexity 1.13,
          where PPO / RLOO at the same ~15 steps off-policy reach 0.76 / 0.77 and online
          DPO 0.82; ablating m: 0.4 -> 0.67, 0.5 -> 0.82, 0.6 -> 0.80 win rate.
            python -m experiments.tldr --config configs/tldr.py:pythia410m_table1 --workdir DIR

  tiny    A random 2-layer GPT-NeoX policy with the byte tokenizer that has Pythia's
          special ids ("pythia_bytes": <|endoftext|> = 0, <|padding|> = 1), random
          GPT-NeoX reward and gold models created from a seed in memory (no download),
          and a dozen short posts in configs/data/tldr_tiny (one is dropped by the
          prompt-length filter), async on 2 CPU devices (1 trainer + 1 searcher), 6
          steps. For tests and as a smoke test; its scores are meaningless (random
          models). Measured on the 2-core CPU: BENCHMARKS.md.
            python -m experiments.tldr --config configs/tldr.py:tiny --workdir /tmp/tldr_tiny

  The pythia* settings against the authors' (bbartoldson/TBA; "trainer" is
  src/tba_trainer_tldr.py, "yml" configs/tba_pythia2.8b_tldr.yml, "launch"
  launch_training_tldr.sh, "buffer" src/buffer_utils.py):

  setting                  ours                           authors                  where
  data                     vwxyzjn/..._1706381144 train   same                     yml L2
  prompt                   the row's query, no specials,  same (pythia adds none)  tba_tldr.py L31-46,
                           > 512 tokens dropped                                    L86-91
  EOS / pad                <|endoftext|> 0 / <|padding|> 1 same                    async_rlhf sft.py L68
  models                   sft / rm-tldr6.9b, float32     same, float32, no dropout trainer L160, yml L13-15
  reward                   RM score at the EOS token, -1  same (TRL get_reward)    trainer L447-486
                           without EOS, raw
  sampling                 T 0.7, top-p 1, 128 tokens     T 0.7 + 1e-7, vLLM fp16  trainer L283-288,
                           (float32)                                               L398-410, yml L5, L7
  S, K                     20, 20                         rloo_k 20, multiplier 1  trainer L63-64
  searcher batch           410m 2 / 1b 1 / 2.8b 1 prompts ceil(40|20|10 / 20), >=1 launch L8-14,
                                                                                   trainer L298-301
  batch B x K              8 x 20, 8 micro-batches        8 micro-batches of 20    yml L11-12
  EOS in log pi            counted                        counted (pad mask > EOS) trainer L489-492
  loss                     VarGrad TB, log Z per prompt   same                     trainer L610-626
  optimizer                AdamW .9/.999/1e-8, wd 0, no   HF Trainer defaults,     trainer L217,
                           clipping                       loop never clips         L624-626
  lr                       3e-6 linear to 0, lr(u)        scheduler steps first    yml L10, trainer L583
  steps                    256                            40960 / 160              yml L6
  beta                     1.0 -> .05, D 128, switch 32   same, (u - 1) / D        trainer L56-60, L576-580
  m, k                     0.5, 10                        on_policy_prob, sync 10  trainer L67-68
  buffer per prompt        newest 100, de-duplicated      same                     buffer L36-54, trainer L146
  m branch entries         K uniform, newest generation   same                     buffer L76-83
  other slots              K by softmax(score), without   same (inv_temp 1)        buffer L56-75
                           replacement
  searchers / trainers     3 / 1                          3 / 1                    launch L3, L17
  prefill                  10,000 (2.8b 20,000)           > 10k by a counter that  trainer L820-854
                                                          adds 10 x 3 per 20 x 3
                                                          made for 2.8b (~20k)
  gradient checkpointing   2.8b (model.remat)             2.8b only                trainer L250-252
  evaluation               validation, T .010001, 128     same, on saved           generate_tldr.yml,
                           tokens, gold 6.9B, every 64    checkpoints (25%)        yml L20, eval_tldr/run.sh

  Deliberate differences that remain (beyond configs/gsm8k.py's: searchers without a
  sync barrier, reshuffled prompt order, the shortfall of fewer than K unique entries
  drawn with replacement): sampling in float32 rather than vLLM's float16; the
  any-prompt slots draw prompts uniformly rather than cycling through all seen prompts
  without replacement; evaluation inside the run (same pipeline) rather than on saved
  checkpoints afterwards; the logged KL leaves out their batches' padding positions
  (tasks/tldr.py). In the evaluation also:
  - the validation split through the training prompts' filter (queries of at most
    512 tokens; how many of the real split's are longer is not counted here), where
    their generate_for_eval.py L48 takes dataset["query"] unfiltered;
  - generation in float32, where theirs runs vLLM with dtype "auto" (L40, L100-104),
    which is float16 for these float32 checkpoints;
  - a text without "TL;DR:" gets KL 0 here; their src/kl.py L89-101 masks all its
    labels, so its kl_mean is 0 / 0 = NaN and the logged mean KL (load_and_eval.py
    L90, L106) is NaN.
"""
import os

import ml_collections

from configs import common
from tba_jax import config_checks
from tba_jax.config_checks import key

VARIANTS = ("pythia410m", "pythia1b", "pythia2p8b", "pythia410m_table1", "tiny")
TINY_DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "tldr_tiny")


def _common(c):
  """configs/common.py's base (every key the runtime reads) set to the authors' TL;DR run."""
  c.num_train_steps = 256  # 40,960 episodes / (8 prompts x 20)
  c.model.update(
      path="mnoukhov/pythia410m-sft-tldr",  # the SFT policy (and the reference)
      tokenizer="",       # "" = from model.path (the SFT tokenizer sets <|padding|> as pad)
      add_bos="off",      # the query is tokenized with no special tokens
      dtype="float32",    # policy, reference and searcher copies (paper B.2)
      # The architecture when path == "random" (GPT-NeoX, random init).
      random=dict(vocab_size=258, dim=64, mlp_dim=256, num_layers=2, num_heads=4,
                  num_kv_heads=4, head_dim=16, norm="layer", parallel_residual=True,
                  rotary_fraction=0.25, activation="gelu", gated_mlp=False, qkv_bias=True,
                  bias=True, model_type="gpt_neox"))
  c.task.update(
      name="tldr",
      data_path="",       # "" = the hub dataset; or a directory with train/validation .jsonl
      max_prompt_len=512,  # longer queries are dropped (the authors' filter)
      num_train_problems=0)  # 0 = all
  c.task.reward_model = "mnoukhov/pythia410m-rm-tldr6.9b"  # the training reward (or "random")
  c.task.gold_reward_model = "cleanrl/EleutherAI_pythia-6.9b-deduped__reward__tldr"  # win rate
  c.task.update(config_checks.declare(dict(
      reward_dtype=key("float32", ("float32", "bfloat16")),  # of both reward models
  ), "task."))
  c.mesh.update(num_trainer_devices=1, num_searchers=3)
  c.sampler.update(
      temperature=0.7,          # sampling and training temperature (the tempered policy)
      top_p=1.0, top_k=0, max_new_tokens=128,
      num_samples_per_prompt=20,  # S completions per prompt
      num_prompts_per_batch=2)    # prompts per searcher batch (rows = this x S)
  c.loss.update(
      name="tb",
      beta_start=1.0,        # beta anneals linearly from beta_start to beta_end ...
      beta_end=0.05,
      beta_anneal_steps=128,  # ... as if over this many steps ((u-1)/D) ...
      beta_switch_step=32,   # ... and from this step on beta = beta_end (an abrupt switch)
      include_eos=True,      # the EOS token's log-prob counts in log pi
      ratio_clip=0.0, kl_coef=0.04, ref_reset_every=0)
  c.optim.update(
      learning_rate=3e-6, schedule="linear", warmup_steps=0, stable_steps=0, decay_steps=0,
      weight_decay=0.0, b1=0.9, b2=0.999, grad_clip_norm=0.0, master_weights_fp32=True,
      moments_dtype="float32",
      num_microbatches=8)    # gradient accumulation; each micro-batch holds one prompt's K
  c.buffer.update(
      num_prompts=8,             # B prompts per training batch
      samples_per_prompt=20,     # K completions per prompt in a batch
      m=0.5, reuse_latest=True,
      max_per_prompt=100,        # newest entries kept per prompt
      dedup=True, max_entries=0, eviction="oldest",
      reward_weight=1.0,         # off-latest slots: K entries by softmax(reward / tau)
      reward_tau=1.0,
      prefill=10000)             # completions in the buffer before the first step
  c.sync.update(every=10, mode="async", weights_dtype="")
  c.eval.update(
      every=64,              # steps between evaluations (0 = only before and after)
      every_seconds=0.0,
      num_problems=0,        # 0 = the whole validation split
      greedy=False,          # no argmax pass: the paper samples near-greedily instead
      num_samples=1,         # one generation per prompt ...
      temperature=0.010001,  # ... at the authors' evaluation temperature
      max_new_tokens=128, batch_size=64,
      # Searcher 0's devices: the gold model and the reference live there (memory table).
      devices="searcher")
  c.checkpoint.update(every=64, max_to_keep=3)
  c.export = True  # write the final policy to WORKDIR/export (Hugging Face format)


def _pythia(c, size: str, prompts_per_batch: int):
  c.model.update(path=f"mnoukhov/pythia{size}-sft-tldr")
  c.task.update(reward_model=f"mnoukhov/pythia{size}-rm-tldr6.9b")
  # The authors' searcher batch: ceil(local_rollout_forward_batch_size / S) prompts.
  c.sampler.update(num_prompts_per_batch=prompts_per_batch)


def _pythia2p8b(c):
  _pythia(c, "2.8b", 1)
  c.model.update(remat=True)  # the authors enable gradient checkpointing for 2.8b only
  # Their pre-fill counter adds local_rollout_forward_batch_size (10) x 3 per batch of 20 x 3
  # completions, so the 2.8b run starts from about twice its nominal 10,000.
  c.buffer.update(prefill=20000)
  # The evaluation's KV cache at 64 rows x 640 tokens would be 27 GB on a searcher's device
  # (python -m benchmarks.memory --tldr); 16 rows keep the searcher under 60 GB.
  c.eval.update(batch_size=16)


def _table1(c):
  _pythia(c, "410m", 2)
  c.num_train_steps = 625
  c.mesh.update(num_devices=3, num_searchers=2)
  # The paper's rule: anneal target at N/2, switch at N/8 (tldr_spec.md: UNSURE for this run).
  c.loss.update(beta_anneal_steps=312, beta_switch_step=78)
  c.eval.update(every=157)  # ceil(25% of 625), as the authors' save_steps
  c.checkpoint.update(every=157)


def _tiny(c):
  c.num_train_steps = 6
  c.model.update(path="random", tokenizer="pythia_bytes")
  c.task.update(data_path=TINY_DATA, max_prompt_len=256, reward_model="random",
                gold_reward_model="random")
  c.mesh.update(num_cpu_devices=2, num_searchers=1)
  c.sampler.update(max_new_tokens=12, num_samples_per_prompt=4, num_prompts_per_batch=2)
  c.loss.update(beta_anneal_steps=8, beta_switch_step=4)
  c.optim.update(learning_rate=1e-3, num_microbatches=2)
  c.buffer.update(num_prompts=2, samples_per_prompt=4, prefill=8)
  c.sync.update(every=2)
  c.eval.update(every=3, max_new_tokens=12, batch_size=8)
  c.checkpoint.update(every=3)


RECIPES = {"pythia410m": lambda c: _pythia(c, "410m", 2), "pythia1b": lambda c: _pythia(c, "1b", 1),
           "pythia2p8b": _pythia2p8b, "pythia410m_table1": _table1, "tiny": _tiny}
assert tuple(RECIPES) == VARIANTS


def get_config(arg: str = "pythia410m") -> ml_collections.ConfigDict:
  """`arg`: "VARIANT" or "VARIANT,key=value,..." (e.g. "tiny,num_train_steps=3")."""
  return common.from_recipes(arg, "configs/tldr.py", RECIPES, common=_common)
