"""Runtime pieces built from config sections: the task, searchers, evaluation, the
replay buffer, the loss and its schedules (and, re-exported from model_builders, the
devices, the model and the tokenizer). tba_jax.loop.run wires them together; tests and
benchmarks build the same pieces from the same config.

The seams a researcher extends are plain dicts, name -> builder. Their names are
declared in tba_jax/choices.py, where a config file reads them without JAX, and each
dict here is that dict with the builders filled in (choices.fill), so no list of names
is written twice and a name without a builder stops the import:
  TASKS      task.name -> fn(task section, tokenizer) -> tasks.Task
             (an experiment adds its own: experiments/launch.main(..., tasks=...))
  LOSSES     loss.name -> fn(loss section) -> train_step.LossFn
  SCHEDULES  optim.schedule -> fn(optim section, num_train_steps) -> lr(u)
  LR_CONTROLS optim.lr_control -> fn(optim section) -> optim.DriftControl or None
"""
from __future__ import annotations

import dataclasses
import functools
import os

import jax
import optax

from tba_jax import (choices, faults, lora, losses, optim, paged_kv, train_state, train_step,
                     verifiers, weight_sync)
from tba_jax.batch import Layout
from tba_jax.errors import ConfigError, DataError
from tba_jax.evaluation import Evaluator
from tba_jax.model import ModelConfig
from tba_jax.model_builders import (  # noqa: F401 (re-exported: a run is built from here)
    check_model_path, evaluation_mesh, load_model, load_policy, load_tokenizer, lora_config,
    meshes, model_path, publisher, use_cpu_devices)
from tba_jax.replay_buffer import ReplayBuffer
from tba_jax.sampler import Buckets, Sampler, SamplingOptions
from tba_jax.schedule import Schedule
from tba_jax.rows import StaticRows
from tba_jax.searcher import Exploration, PromptShard, Scoring, Searcher
from tba_jax.searcher_pool import SearcherPool
from tba_jax.streaming import StreamingRows
from tba_jax.target_distance import TargetDistance
from tba_jax.turns import TurnRows, TurnSampler
from tba_jax.tasks import Task, arithmetic, as_stage, gsm8k, hold_out, redteam, tldr
from tba_jax.tasks import math as math_task  # (not `math`: the stdlib module's name)


def build_task(task_cfg, tokenizer) -> Task:
  """The task that task.name names (TASKS), built from the task section."""
  if task_cfg.name not in TASKS:
    raise ConfigError(f"task.name={task_cfg.name!r}: must be one of "
                      f"{', '.join(map(repr, TASKS))}")
  return TASKS[task_cfg.name](task_cfg, tokenizer)


def _gsm8k_task(task_cfg, tokenizer) -> Task:
  """GSM8K from the hub or task.data_path (tasks/gsm8k.py)."""
  return _math_word_task(task_cfg, tokenizer, gsm8k, gsm8k.extract_answer)


def _math_task(task_cfg, tokenizer) -> Task:
  """MATH 12k / MATH-500, boxed answers (tasks/math.py)."""
  return _math_word_task(task_cfg, tokenizer, math_task, math_task.answer_of)


def _arithmetic_task(task_cfg, tokenizer) -> Task:
  """Offline arithmetic (tasks/arithmetic.py): the CPU default's data and the suite's tasks."""
  a = task_cfg.arithmetic
  try:
    train, validation, test = arithmetic.make_problems(
        a.ops, a.low, a.high, seed=a.seed, test_fraction=a.test_fraction,
        validation_fraction=a.validation_fraction, form=a.form, num_problems=a.num_problems)
  except ValueError as e:
    raise ConfigError(f"task.arithmetic: {e}") from None
  return question_task(task_cfg, tokenizer, train, test, gsm8k.extract_answer,
                       validation=validation)


def _math_word_task(task_cfg, tokenizer, source, answer) -> Task:
  path = task_cfg.data_path or None
  one_file = _check_splits(source.data_file("train", path), source.data_file("test", path),
                           task_cfg.test_on_train)
  train, test = source.load("train", path), source.load("test", path)
  # One file as both splits (task.test_on_train): it is every split, validation too.
  return question_task(task_cfg, tokenizer, train, test, answer,
                       validation=train if one_file else None)


def question_task(task_cfg, tokenizer, train, test, answer, validation=None) -> Task:
  """A task of questions with a checkable final answer (GSM8K, MATH, arithmetic): the
  prompt style, the verifier and the headline metrics are the config's. `validation`:
  None = task.validation_fraction of `train`, held out (tasks.hold_out)."""
  if validation is None:
    train, validation = _hold_out(train, task_cfg.validation_fraction)
  if task_cfg.num_train_problems:
    train = train[:task_cfg.num_train_problems]
  style, suffix = task_cfg.prompt_style, task_cfg.question_suffix
  thinking = {"auto": None, "on": True, "off": False}[task_cfg.thinking]
  if task_cfg.system_prompt and style != "chat":
    raise ConfigError(f"task.system_prompt is set, but task.prompt_style={style!r}: only the "
                      "chat template has a system turn (prompt_style='chat')")
  if style in ("paper", "chat"):
    system = task_cfg.system_prompt or None
    prompt = lambda p: gsm8k.make_prompt(p.fields["question"] + suffix, style, tokenizer,
                                         thinking, system=system)
  else:
    prompt = lambda p: style.format(question=p.fields["question"] + suffix)
  return Task(train=train, validation=validation, test=test, prompt=prompt,
              reward=verifiers.VerifierReward(task_cfg.verifier),
              templated_prompts=style == "chat", answer=answer,
              name=task_cfg.name, reward_metric=gsm8k.REWARD_METRIC, headline=gsm8k.HEADLINE)


def _hold_out(train, fraction: float):
  """(train, validation) of task.validation_fraction (tasks.hold_out), as a config error."""
  try:
    return hold_out(train, fraction)
  except ValueError as e:
    raise ConfigError(f"task.validation_fraction: {e}") from None


def _check_splits(train_file: str, test_file: str, test_on_train: bool) -> bool:
  """Whether one file is both splits; refused (evaluation would score the training problems)
  unless task.test_on_train asks for it."""
  one_file = os.path.realpath(train_file) == os.path.realpath(test_file)
  if one_file and not test_on_train:
    raise ConfigError(
        f"task.data_path: {train_file} would be both the train and the test split, so the "
        "evaluation would score the training problems. Give a directory holding train.jsonl "
        "and test.jsonl, or set task.test_on_train=true to evaluate on the training problems.")
  return one_file


def _tldr_task(t, tokenizer) -> Task:
  """TL;DR (tasks/tldr.py) with the authors' prompt-length filter: the data set's train file
  (less task.validation_fraction of it, the validation split) and its validation file, the
  test split (what the paper reports)."""
  tldr.check_tokenizer(tokenizer, tokenizer.hf.name_or_path)
  path = t.data_path or None
  train, dropped = tldr.to_problems(tldr.load_rows("train", path), tokenizer, t.max_prompt_len)
  test, dropped_test = tldr.to_problems(tldr.load_rows("validation", path), tokenizer,
                                        t.max_prompt_len)
  for split, kept, gone in (("train", train, dropped), ("validation", test, dropped_test)):
    if not kept:
      raise DataError(f"TL;DR {split} ({t.data_path or tldr.HUB_ID}): all {gone} prompts are "
                      f"longer than task.max_prompt_len={t.max_prompt_len} tokens")
  if (dropped or dropped_test) and jax.process_index() == 0:
    print(f"TL;DR: dropped {dropped} train and {dropped_test} validation-file (test split) "
          f"prompts longer than task.max_prompt_len={t.max_prompt_len} tokens")
  # The data set's validation file is the test split (what the paper reports); settings are
  # chosen on task.validation_fraction of the train posts.
  train, validation = _hold_out(train, t.validation_fraction)
  if t.num_train_problems:
    train = train[:t.num_train_problems]
  return dataclasses.replace(
      tldr.make_task(train, test, tokenizer, reward_model=t.reward_model,
                     gold_reward_model=t.gold_reward_model, dtype=t.reward_dtype),
      validation=validation)


def _redteam_task(task_cfg, tokenizer) -> Task:
  del tokenizer  # the attacker's prompt is fixed; the victim and judges bring their own
  return redteam_task(task_cfg.redteam)


def redteam_task(r) -> Task:
  """The red-teaming task from config.task.redteam (tasks/redteam.py)."""
  # "smollm2": the embedded SmolLM2 (its GGUF file), as model.path.
  path = lambda p: model_path(p) if p == "smollm2" else p
  victim = redteam.Victim(path(r.victim), r.victim_dtype, r.victim_prompt, r.victim_temperature,
                          r.victim_top_p, r.victim_max_new_tokens, r.num_replies, r.seed)
  judge = redteam.Judge(r.judge, r.judge_path, r.toxic_label, r.judge_dtype, r.seed)
  task = redteam.make_task(victim, judge, path(r.embedder))
  return dataclasses.replace(task, validation=task.test)  # one attack prompt: every split


# task.name -> fn(task section, tokenizer) -> Task. An experiment of a new task registers
# its builder here through experiments/launch.main(..., tasks={name: builder}).
TASKS = choices.fill(choices.TASKS, {
    "gsm8k": _gsm8k_task, "math": _math_task, "arithmetic": _arithmetic_task, "tldr": _tldr_task,
    "redteam": _redteam_task})


def searcher_pool(config, task: Task, tokenizer, model_config: ModelConfig, meshes, *,
                  publish, params, reference=None, schedule: Schedule = Schedule(),
                  fault_plan: faults.Plan | None = None,
                  hosts: tuple[int, int] | None = None) -> SearcherPool:
  """This process's searchers, one per mesh, with the task's reward stage built on each.

  `publish(params, i)` places params on searcher i's devices; `params` are the trainer's
  first weights (version 0), `reference` the reference policy's (trainer-side) params,
  or None: the first weights (with LoRA: the base, adapters off). Each searcher
  samples its own shard of the training prompts (a global stride over every
  process's searchers); `schedule`: how they run beside the trainer (the mode, fixed
  here). `fault_plan`: failures on purpose (tba_jax/faults.py, a testing aid).
  `hosts`: (this process's index, count) among the processes that search; None: every
  process searches (jax.process_index(), jax.process_count()). A layout where some processes
  only train (benchmarks/async_pinned.py) passes its own, so its searchers cover every prompt.
  Read from `config`: the sampler section, the searcher section (restarts, mismatch
  checks), task.max_prompt_len (the prompts' budget), the seed, and
  sync.in_flight_updates: the rows come from static batches, or with sampler.num_slots > 0
  from a continuous-batching pool (streaming.StreamingRows), which then takes new weights
  between decode chunks.
  """
  s, max_prompt_len = config.sampler, config.task.max_prompt_len
  # Ids are per split (the replay buffer's prompt ids are train ids).
  prompt_tokens = encode_prompts(task.train, task, tokenizer, max_prompt_len)
  train_ids = [p.id for p in task.train]
  problems = {p.id: p for p in task.train}
  stage = as_stage(task.reward)
  host, num_hosts = hosts or (jax.process_index(), jax.process_count())
  num_shards = len(meshes) * num_hosts
  options = SamplingOptions(
      max_new_tokens=s.max_new_tokens, temperature=s.temperature, top_k=s.top_k, top_p=s.top_p,
      eos_ids=tokenizer.eos_ids, pad_id=tokenizer.pad_id, min_new_tokens=s.min_new_tokens,
      end_with_eos=s.end_with_eos)
  searchers = []
  for i, mesh in enumerate(meshes):
    shard = i + len(meshes) * host  # this searcher's global index
    sampler = Sampler(model_config, options, mesh=mesh, buckets=Buckets(length=s.length_buckets))
    turns = (None if task.environment is None else  # replies read as plain text
             (task.environment, tokenizer.encode_text, tokenizer.decode))
    try:
      # sampler.kv_pages: 0 = auto (from the devices' free memory), -1 = full rows. On
      # devices the trainer's params live on (one device: alternate mode) the update's
      # gradients and activations come after the pool is sized: it takes a smaller share.
      shared = set(mesh.devices.flat) & jax.tree.leaves(params)[0].sharding.device_set
      auto = paged_kv.AutoPages(paged_kv.SHARED_MEMORY_FRACTION if shared
                                else paged_kv.AUTO_MEMORY_FRACTION)
      pages = dict(kv_pages=auto if s.kv_pages == 0 else max(s.kv_pages, 0),
                   page_size=s.kv_page_size)
      rows = (StreamingRows(sampler, num_slots=s.num_slots,
                            in_flight_updates=config.sync.in_flight_updates, turns=turns, **pages)
              if s.num_slots else
              TurnRows(TurnSampler(sampler, *turns))
              if task.environment is not None else StaticRows(sampler))
    except ValueError as e:  # num_slots that the searcher's devices cannot split
      raise ConfigError(f"sampler.num_slots={s.num_slots}: {e}") from None
    first = publish(params, i)
    reward = stage.build(mesh)
    if fault_plan:
      reward = fault_plan.reward(reward, shard)
    if reference is not None:
      ref, ref_config = publish(reference, i), None
    elif model_config.lora is not None:
      # The reference is the base model: the adapters off (not zero: no work spent on them).
      ref, ref_config = lora.split(first)[0], lora.base_config(model_config)
    else:
      ref, ref_config = first, None
    searchers.append(Searcher(
        shard, rows=rows, mailbox=weight_sync.Mailbox(0, first),
        prompts=PromptShard(train_ids[shard::num_shards], prompt_tokens, problems, max_prompt_len),
        scoring=Scoring(reward, tokenizer.decode, ref, ref_config,
                        mismatch_every=config.searcher.mismatch_every),
        num_prompts=s.num_prompts_per_batch, num_samples=s.num_samples_per_prompt,
        seed=config.seed, explore=Exploration(s.explore_prob, s.explore_low, s.explore_high)))
  return SearcherPool(searchers, publish=publish,
                      layout=Layout(max_prompt_len, s.max_new_tokens, tokenizer.pad_id),
                      max_restarts=config.searcher.max_restarts, schedule=schedule)


def replay_buffer(buffer_cfg, *, priority_beta: float, seed: int) -> ReplayBuffer:
  """The global replay buffer of the config's `buffer` section."""
  b = buffer_cfg
  return ReplayBuffer(b.max_per_prompt, b.max_entries or None, b.eviction, seed=seed,
                      dedup=b.dedup, priority=b.priority, priority_beta=priority_beta,
                      near_duplicate=b.near_duplicate)


def evaluator(eval_cfg, sampler_cfg, task: Task, tokenizer, model_config: ModelConfig, mesh,
              max_prompt_len: int, progress: bool, include_eos: bool = True) -> Evaluator:
  """Greedy and/or sampled evaluation on `mesh`, scored by the task's reward stage;
  `include_eos` (loss.include_eos) for the distance to TB's target."""
  e, s = eval_cfg, sampler_cfg
  split = getattr(task, e.split)  # eval.split: "validation" or "test"
  problems = split[:e.num_problems] if e.num_problems else split
  prompt_tokens = list(encode_prompts(problems, task, tokenizer, max_prompt_len).values())

  def make_sampler(cfg=model_config, **kw):
    sampler = Sampler(cfg, SamplingOptions(
        max_new_tokens=e.max_new_tokens, eos_ids=tokenizer.eos_ids, pad_id=tokenizer.pad_id,
        min_new_tokens=e.min_new_tokens, **kw), mesh=mesh)
    if task.environment is None:
      return sampler
    # With turns: each row's problem found by its prompt's tokens (the env's reply sees it).
    by_prompt = {tuple(t): p for t, p in zip(prompt_tokens, problems)}
    return TurnSampler(sampler, task.environment, tokenizer.encode_text, tokenizer.decode,
                       problems=by_prompt)

  sampling = dict(temperature=e.temperature or s.temperature, top_k=s.top_k, top_p=s.top_p)
  target = None
  # The distance to TB's target reads the sampled pass as samples of the trained (tempered,
  # untruncated) policy: only where they are.
  if (e.target_distance and e.num_samples and sampling["temperature"] == s.temperature
      and not s.top_k and s.top_p == 1.0):
    target = TargetDistance(
        Layout(max_prompt_len, e.max_new_tokens, tokenizer.pad_id), s.temperature, include_eos,
        mesh,
        # LoRA: the reference is the base model, sampled with its own config.
        reference_sampled=(make_sampler(lora.base_config(model_config), **sampling)
                           if model_config.lora is not None else None))
  return Evaluator(
      problems=problems,
      prompt_tokens=prompt_tokens,
      decode=tokenizer.decode, reward=as_stage(task.reward).build(mesh),
      eos_ids=tokenizer.eos_ids, batch_size=e.batch_size,
      greedy=make_sampler(greedy=True) if e.greedy else None,
      sampled=make_sampler(**sampling) if e.num_samples else None,
      num_samples=e.num_samples, answer=task.answer,
      metrics=task.evaluation.build(mesh) if task.evaluation is not None else None,
      model_config=model_config, progress=progress, target=target)


def encode_prompts(problems, task: Task, tokenizer, max_len: int) -> dict[int, list[int]]:
  """Prompt ids per problem id, BOS as `tokenizer.add_bos` says (Tokenizer.encode_prompt)."""
  out = {p.id: tokenizer.encode_prompt(task.prompt(p), templated=task.templated_prompts)
         for p in problems}
  too_long = [i for i, ids in out.items() if len(ids) > max_len]
  if too_long:
    longest = max(too_long, key=lambda i: len(out[i]))
    raise ConfigError(f"task.max_prompt_len={max_len}: {len(too_long)} of {len(out)} prompts "
                      f"are longer (the longest, problem {longest}'s, has {len(out[longest])} "
                      "tokens); raise task.max_prompt_len to at least that")
  for i, ids in out.items():
    if ids and ids[-1] in tokenizer.eos_ids:  # the authors assert the same (tba_gsm8k.py L85)
      raise ConfigError(f"problem {i}: the prompt ends with an EOS token (the tokenizer "
                        "appends EOS by default?); generation would start after the end")
  return out


# loss.name -> fn(loss section) -> train_step.LossFn.
LOSSES = choices.fill(choices.LOSSES, {
    "tb": lambda lo: functools.partial(train_step.tb_loss, ratio_clip=lo.ratio_clip or None,
                                       log_z_from_behaviour=lo.log_z == "behaviour",
                                       residual_clip=lo.residual_clip or None,
                                       token_kl_coef=lo.token_kl_coef or None),
    # the paper's Proximal RLOO baseline (PPO eps)
    "rloo": lambda lo: functools.partial(train_step.rloo_loss, ratio_clip=lo.ratio_clip or 0.2),
    "grpo": lambda lo: functools.partial(train_step.grpo_loss, clip_eps=lo.ratio_clip or 0.2),
    # TBA-prime's per-token ratio loss (its cap c: 8 by default)
    "ratio": lambda lo: functools.partial(train_step.ratio_loss, ratio_clip=lo.ratio_clip or 8.0),
})


def loss_fn(loss_cfg):
  """The LossFn that loss.name names (LOSSES)."""
  if loss_cfg.name not in LOSSES:
    raise ConfigError(f"loss.name={loss_cfg.name!r}: must be one of {', '.join(map(repr, LOSSES))}")
  return LOSSES[loss_cfg.name](loss_cfg)


def beta_schedule(loss_cfg):
  """beta(u); with a tempered target (loss.target_temp_*) beta(u) tau(u) (losses.py)."""
  if loss_cfg.name != "tb":  # the baselines' KL coefficient
    return functools.partial(losses.constant_beta, beta=loss_cfg.kl_coef)
  beta = functools.partial(losses.linear_beta, beta_init=loss_cfg.beta_start,
                           beta_final=loss_cfg.beta_end, anneal_steps=loss_cfg.beta_anneal_steps,
                           stop_step=loss_cfg.beta_switch_step)
  if not _tempered(loss_cfg):
    return beta
  tau = _target_temperature(loss_cfg)
  return lambda u: beta(u) * tau(u)


def learned_log_z(loss_cfg, task: Task) -> train_state.LearnedLogZ | None:
  """loss.log_z="learned": a log Z per training prompt id, trained by Adam; None: VarGrad's
  estimate (of the policy's or, "behaviour", of the sampling policy's log-probs)."""
  if loss_cfg.log_z != "learned":
    return None
  return train_state.LearnedLogZ(optax.adam(loss_cfg.log_z_learning_rate),
                                num_prompts=max(p.id for p in task.train) + 1)


def ref_weight_schedule(loss_cfg):
  """1 / (gamma(u) tau(u)), the weight of log pi_ref in a tempered target; None: 1."""
  if not _tempered(loss_cfg):
    return None
  gamma = functools.partial(losses.linear_ramp, start=loss_cfg.ref_temp_start,
                            end=loss_cfg.ref_temp_end, steps=loss_cfg.ref_temp_steps)
  tau = _target_temperature(loss_cfg)
  return lambda u: 1.0 / (gamma(u) * tau(u))


def _target_temperature(loss_cfg):
  return functools.partial(losses.linear_ramp, start=loss_cfg.target_temp_start,
                           end=loss_cfg.target_temp_end, steps=loss_cfg.target_temp_steps)


def _tempered(loss_cfg) -> bool:
  lo = loss_cfg
  return lo.name == "tb" and any(
      v != 1.0 for v in (lo.ref_temp_start, lo.ref_temp_end, lo.target_temp_start,
                         lo.target_temp_end))


# optim.schedule -> fn(optim section, num_train_steps) -> lr(u).
SCHEDULES = choices.fill(choices.SCHEDULES, {
    "wsd": lambda o, n: optim.warmup_stable_decay(o.learning_rate, o.warmup_steps,
                                                  o.stable_steps, o.decay_steps, o.final_lr),
    "linear": lambda o, n: optim.warmup_linear(o.learning_rate, o.warmup_steps,
                                               o.linear_decay_steps or n, o.final_lr),
    "cosine": lambda o, n: optim.warmup_cosine(o.learning_rate, o.warmup_steps,
                                               o.decay_steps or n, o.final_lr),
    "constant": lambda o, n: lambda step: o.learning_rate,
    "rsqrt": lambda o, n: optim.warmup_rsqrt(o.learning_rate, o.warmup_steps, o.stable_steps,
                                             o.final_lr),
})


def lr_schedule(o, num_steps: int):
  """The learning rate of update u (1-based) that optim.schedule names (SCHEDULES)."""
  if o.schedule not in SCHEDULES:
    raise ConfigError(f"optim.schedule={o.schedule!r}: must be one of "
                      f"{', '.join(map(repr, SCHEDULES))}")
  return SCHEDULES[o.schedule](o, num_steps)


# optim.lr_control -> fn(optim section) -> optim.DriftControl, or None: the schedule's lr
# alone. "drift": lr(u) x a scale in [lr_min / learning_rate, 1] kept where each update's mean
# |change of log pi(y)| per sequence is near drift_target (optim.DriftControl).
LR_CONTROLS = choices.fill(choices.LR_CONTROLS, {
    "none": lambda o: None,
    "drift": lambda o: optim.DriftControl(o.drift_target, o.lr_min / o.learning_rate,
                                          o.drift_gain),
})


def saturation_decay(o) -> optim.SaturationDecay | None:
  """optim.saturation_patience > 0: the lr cut when the reward stops rising; else None."""
  if not o.saturation_patience:
    return None
  return optim.SaturationDecay(o.saturation_patience, o.saturation_factor,
                               o.saturation_smoothing, o.saturation_min_gain,
                               o.lr_min / o.learning_rate)
