"""The experiment config checked up front, and `key=value` overrides parsed strictly.

`validate(config)` runs before anything is loaded or written (loop.run calls it
first), so a misspelt mode or an out-of-range value stops the run with one line
per problem naming the key, the value and what is allowed, instead of running
with a silently different behaviour. `apply_overrides` is the parser behind
`configs/gsm8k.py:VARIANT,key=value,...`; the command line's
`--config.key=value` errors are explained with the same words
(experiments/gsm8k.py).
"""
from __future__ import annotations

import difflib
import importlib.util
from typing import Any, Callable, Iterable

from tba_jax import config_builders, faults, replay_buffer, verifiers
from tba_jax.errors import ConfigError  # noqa: F401 (public here too: config_checks.ConfigError)
from tba_jax.model_config import ATTENTION_IMPLS, LORA_TARGETS

# Keys whose value must be one of a fixed set. The seams' names come from their tables
# (a task, loss or schedule added there is allowed here with no second list).
CHOICES = {
    "sync.mode": ("async", "alternate"),
    "loss.name": tuple(config_builders.LOSSES),
    "optim.schedule": tuple(config_builders.SCHEDULES),
    "buffer.eviction": replay_buffer.EVICTION_POLICIES,
    "task.name": tuple(config_builders.TASKS),
    "task.verifier": verifiers.VERIFIERS,
    "task.thinking": ("auto", "on", "off"),
    "buffer.priority": replay_buffer.PRIORITIES,
    "loss.log_z": ("vargrad", "learned", "behaviour"),
    "model.dtype": ("float32", "bfloat16"),
    "sync.weights_dtype": ("", "float32", "bfloat16"),
    "model.add_bos": ("auto", "on", "off"),
    "model.attention_impl": ATTENTION_IMPLS,
    "eval.devices": ("trainer", "searcher"),
    "optim.moments_dtype": ("float32", "bfloat16"),
    "fault.stop_signal": faults.SIGNALS,
}
# Keys only one task has, checked when the config's task.name is that task.
TASK_CHOICES = {"tldr": {"task.reward_dtype": ("float32", "bfloat16")}}
# Counts and periods that must be >= 1.
AT_LEAST_ONE = (
    "num_train_steps", "task.max_prompt_len", "mesh.num_trainer_devices", "mesh.num_searchers",
    "mesh.trainer_tensor", "mesh.searcher_tensor", "sampler.max_new_tokens",
    "sampler.kv_page_size",
    "sampler.num_samples_per_prompt", "sampler.num_prompts_per_batch", "loss.beta_anneal_steps",
    "optim.num_microbatches", "buffer.num_prompts", "buffer.samples_per_prompt",
    "buffer.max_per_prompt", "buffer.prefill", "sync.every", "eval.max_new_tokens",
    "loss.ref_temp_steps", "loss.target_temp_steps",
    "eval.batch_size", "checkpoint.every", "checkpoint.max_to_keep", "log.every")
# Sizes, periods and coefficients where 0 means "off" / "all" / "none".
AT_LEAST_ZERO = (
    "max_train_seconds", "task.num_train_problems", "mesh.num_cpu_devices", "mesh.num_devices",
    "sampler.top_k", "loss.beta_start", "loss.beta_end", "loss.beta_switch_step",
    "loss.ratio_clip", "loss.kl_coef", "loss.ref_reset_every", "optim.learning_rate",
    "optim.warmup_steps", "optim.stable_steps", "optim.decay_steps", "optim.weight_decay",
    "optim.grad_clip_norm", "buffer.max_entries", "eval.every", "eval.every_seconds",
    "eval.num_problems", "eval.num_samples", "eval.temperature", "searcher.max_restarts",
    "fault.searcher_fail_at", "fault.searcher", "fault.stop_at_step", "fault.stop_process",
    "model.lora.rank", "sampler.min_new_tokens", "eval.min_new_tokens", "buffer.near_duplicate",
    "buffer.freeze_step", "optim.linear_decay_steps", "sampler.num_slots",
    "searcher.mismatch_every")
# Closed intervals [low, high].
INTERVALS = {
    "buffer.m": (0.0, 1.0), "buffer.reward_weight": (0.0, 1.0), "optim.b1": (0.0, 1.0),
    "optim.b2": (0.0, 1.0), "sampler.explore_prob": (0.0, 1.0),
}
# Open below: must be > 0.
POSITIVE = ("sampler.temperature", "sampler.top_p", "buffer.reward_tau", "model.lora.alpha",
            "sampler.explore_low", "sampler.explore_high", "loss.ref_temp_start",
            "loss.ref_temp_end", "loss.target_temp_start", "loss.target_temp_end",
            "loss.log_z_learning_rate")
PROMPT_STYLES = ("paper", "chat")


def flat_keys(config, prefix: str = "") -> list[str]:
  """Every leaf key of a (nested) ConfigDict or dict, dotted."""
  out = []
  for k in config.keys():
    v = config[k]
    if hasattr(v, "keys"):
      out.extend(flat_keys(v, f"{prefix}{k}."))
    else:
      out.append(f"{prefix}{k}")
  return out


def lookup(config, key: str):
  node = config
  for part in key.split("."):
    node = node[part]
  return node


def unknown_key_message(key: str, config) -> str:
  keys = flat_keys(config)
  close = difflib.get_close_matches(key, keys, n=1, cutoff=0.6)
  leaf = key.rsplit(".", 1)[-1]
  close = close or [k for k in keys if k.rsplit(".", 1)[-1] == leaf][:1]
  hint = f"; did you mean {close[0]!r}?" if close else ""
  return f"unknown config key {key!r}{hint}"


def _problems(config) -> Iterable[str]:
  get = lambda key: lookup(config, key)
  checks: list[tuple[str, Callable[[Any], bool], str]] = []
  task_choices = TASK_CHOICES.get(get("task.name"), {})
  # task.name read now: an experiment may have registered its task since import (TASKS).
  choices = {**CHOICES, "task.name": tuple(config_builders.TASKS), **task_choices}
  checks += [(k, lambda v, c=c: v in c, "one of " + ", ".join(map(repr, c)))
             for k, c in choices.items()]
  checks += [(k, lambda v: v >= 1, ">= 1") for k in AT_LEAST_ONE]
  checks += [(k, lambda v: v >= 0, ">= 0") for k in AT_LEAST_ZERO]
  checks += [(k, lambda v, lo=lo, hi=hi: lo <= v <= hi, f"in [{lo}, {hi}]")
             for k, (lo, hi) in INTERVALS.items()]
  checks += [(k, lambda v: v > 0, "> 0") for k in POSITIVE]
  checks += [("sampler.top_p", lambda v: v <= 1, "<= 1"),
             ("model.dropout", lambda v: 0 <= v < 1, "in [0, 1)"),
             ("sampler.kv_pages", lambda v: v >= -1, ">= -1 (-1: off, 0: auto)")]
  for key, ok, allowed in checks:
    try:
      value = get(key)
    except (KeyError, AttributeError, TypeError):
      yield f"{key}: missing"
      continue
    try:
      good = ok(value)
    except TypeError:  # e.g. a string where a number belongs
      good = False
    if not good:
      close = difflib.get_close_matches(str(value), choices.get(key, ()), n=1)
      hint = f" (did you mean {close[0]!r}?)" if close else ""
      yield f"{key}={value!r}: must be {allowed}{hint}"
  # Tasks with a fixed prompt (TL;DR's is the dataset's query) have no prompt_style.
  style = get("task.prompt_style") if "prompt_style" in get("task") else "paper"
  if style not in PROMPT_STYLES:
    try:
      style.format(question="")
      has_question = "{question}" in style
    except (KeyError, IndexError, ValueError):
      has_question = False
    if not has_question:
      yield (f"task.prompt_style={style!r}: must be 'paper', 'chat' or a format string whose "
             "only field is {question}")
  targets = [t.strip() for t in str(get("model.lora.targets")).split(",")]
  if targets != ["all"] and (not all(t in LORA_TARGETS for t in targets) or
                             len(set(targets)) != len(targets)):
    yield (f"model.lora.targets={get('model.lora.targets')!r}: must be 'all' or distinct names "
           f"from {','.join(LORA_TARGETS)}")
  if 0 < get("sampler.explore_high") < get("sampler.explore_low"):
    yield (f"sampler.explore_low={get('sampler.explore_low')!r}: must be <= "
           f"sampler.explore_high={get('sampler.explore_high')!r}")
  if get("sampler.end_with_eos") and get("sampler.min_new_tokens") >= get("sampler.max_new_tokens"):
    yield (f"sampler.min_new_tokens={get('sampler.min_new_tokens')!r}: must be < "
           f"sampler.max_new_tokens={get('sampler.max_new_tokens')!r} with end_with_eos")
  yield from _microbatch_problems(get)
  if get("loss.log_z") != "vargrad" and get("loss.name") != "tb":
    yield (f"loss.log_z={get('loss.log_z')!r}: only with loss.name='tb' (not "
           f"{get('loss.name')!r})")
  if get("task.name") == "redteam":
    yield from _redteam_problems(config)
  if get("model.path") == "random" and not get("model.tokenizer"):
    yield "model.tokenizer='': a random model needs a tokenizer (e.g. 'bytes')"
  if not get("model.path"):
    yield ("model.path='': must be a HF directory, a hub id, a .gguf file, 'smollm2' or "
           "'random'")


def _microbatch_problems(get) -> Iterable[str]:
  """Micro-batches of whole groups (a group: one slot's K samples; tba_jax/batch.py) that
  split over the trainer's fsdp devices, so the update does not depend on their number."""
  b, k = get("buffer.num_prompts"), get("buffer.samples_per_prompt")
  m = get("optim.num_microbatches")
  if not all(isinstance(v, int) and v >= 1 for v in (b, k, m)):
    return  # reported above
  if b % m:
    fits = ", ".join(str(d) for d in range(1, b + 1) if b % d == 0)
    yield (f"optim.num_microbatches={m}: must divide buffer.num_prompts={b} (one of {fits}): "
           "a micro-batch holds whole groups, each a slot's buffer.samples_per_prompt samples "
           "(VarGrad's log Z and the RLOO / GRPO baselines are means over a group)")
    return
  devices, tensor = get("mesh.num_trainer_devices"), get("mesh.trainer_tensor")
  fsdp = devices // tensor if devices >= tensor >= 1 and devices % tensor == 0 else 1
  if (b // m * k) % fsdp:
    yield (f"optim.num_microbatches={m}: micro-batches of buffer.num_prompts={b} / {m} x "
           f"buffer.samples_per_prompt={k} = {b // m * k} rows do not split over the "
           f"trainer's {fsdp} fsdp devices (mesh.num_trainer_devices / mesh.trainer_tensor)")


def _redteam_problems(config) -> Iterable[str]:
  from tba_jax.tasks import redteam
  try:
    r = lookup(config, "task.redteam")
  except (KeyError, AttributeError):
    yield "task.redteam: missing (the red-teaming task's section; configs/redteam.py)"
    return
  if r.victim_prompt not in redteam.PROMPT_STYLES:
    yield f"task.redteam.victim_prompt={r.victim_prompt!r}: must be one of {redteam.PROMPT_STYLES}"
  if r.judge not in redteam.JUDGES:
    yield f"task.redteam.judge={r.judge!r}: must be one of {redteam.JUDGES}"
  if r.num_replies < 1:
    yield f"task.redteam.num_replies={r.num_replies!r}: must be >= 1"
  if r.judge == "profanity_check" and importlib.util.find_spec("profanity_check") is None:
    yield ("task.redteam.judge='profanity_check' needs the alt-profanity-check package: "
           "pip install alt-profanity-check")
  if lookup(config, "buffer.num_prompts") != 1:
    yield ("buffer.num_prompts: must be 1 for red-teaming (one attack prompt; a batch is "
           "one slot of buffer.samples_per_prompt attacks)")


def validate(config) -> None:
  """Raises ConfigError listing every value that cannot run (one line each)."""
  problems = list(_problems(config))
  if len(problems) == 1:
    raise ConfigError(f"config: {problems[0]}")
  if problems:
    raise ConfigError("config:\n  " + "\n  ".join(problems))


# ---------------------------------------------------------------------------
# key=value overrides.
# ---------------------------------------------------------------------------
_TRUE, _FALSE = ("true", "1", "yes"), ("false", "0", "no")


def parse_value(key: str, text: str, current):
  """`text` as the type of the key's current value; ConfigError when it is not one."""
  if isinstance(current, bool):
    if text.strip().lower() in _TRUE + _FALSE:
      return text.strip().lower() in _TRUE
    raise ConfigError(f"{key}={text!r}: not a boolean (true/false, 1/0, yes/no)")
  if isinstance(current, (int, float)):
    kind = type(current)
    try:
      return kind(text)
    except ValueError:
      raise ConfigError(f"{key}={text!r}: not {'an int' if kind is int else 'a float'}") from None
  return text


def apply_overrides(config, overrides: Iterable[str]) -> None:
  """Applies "section.key=value" strings to an unlocked config, strictly typed."""
  for item in overrides:
    key, sep, text = item.partition("=")
    key = key.strip()
    if not sep:
      raise ConfigError(f"config override {item!r}: expected key=value")
    try:
      current = lookup(config, key)
    except (KeyError, AttributeError, TypeError):
      raise ConfigError(unknown_key_message(key, config)) from None
    *parents, leaf = key.split(".")
    node = lookup(config, ".".join(parents)) if parents else config
    node[leaf] = parse_value(key, text, current)
