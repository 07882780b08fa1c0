"""The experiment config checked up front, and `key=value` overrides parsed strictly.

`validate(config)` runs before anything is loaded or written (loop.run calls it
first), so a misspelt mode or an out-of-range value stops the run with one line
per problem naming the key, the value and what is allowed, instead of running
with a silently different behaviour. Each key's own check is declared beside its
default in the config file (`name=key(default, check)`, configs/common.py; `declare`
collects them); the checks that relate several keys are here. `apply_overrides` is
the parser behind `configs/gsm8k.py:VARIANT,key=value,...`; the command line's
`--config.key=value` errors are explained with the same words (experiments/launch.py).

A config file imports this module and tba_jax/choices.py (the allowed names) and
nothing of the runtime: neither imports JAX, so a config is loaded and validated
anywhere (tests/imports_test.py holds them to it). What needs the runtime to check (a
model path, a task's data) is checked by the builders, at launch.
"""
from __future__ import annotations

import dataclasses
import difflib
import importlib.util
import re
from typing import Any, Callable, Collection, Iterable

from tba_jax.choices import LORA_TARGETS, REDTEAM_JUDGES, REDTEAM_PROMPT_STYLES
from tba_jax.errors import ConfigError  # noqa: F401 (public here too: config_checks.ConfigError)

# A check: ">= N", "> N", "<= N", "< N"; an interval "[lo, hi]" (or with "(" / ")": open);
# a collection of the allowed values (a dict: its keys, read when validating, so a task
# registered since is allowed); or a function of the value giving what is wrong, or None.
Check = str | Collection | Callable[[Any], "str | None"]
_COMPARE = re.compile(r"^(>=|>|<=|<) (-?[\d.e-]+)$")
_INTERVAL = re.compile(r"^([\[(])(-?[\d.e-]+), (-?[\d.e-]+)([\])])$")


@dataclasses.dataclass(frozen=True)
class Key:
  """A config key's default with its check, as a config file declares it."""
  default: Any
  check: Check


def key(default, check: Check) -> Key:
  """`name=key(default, check)` in a config file's section (see `declare`)."""
  if _failure(check, default):  # a malformed check, or a default it refuses, fails here
    raise ValueError(f"the default {default!r} fails its own check {check!r}")
  return Key(default, check)


# Dotted key -> its check, from every section `declare` has seen.
CHECKS: dict[str, Check] = {}


def declare(tree: dict, prefix: str = "") -> dict:
  """`tree` (nested dicts) with each Key replaced by its default; the checks recorded
  in CHECKS under their dotted names ("sampler.top_p")."""
  out = {}
  for name, value in tree.items():
    if isinstance(value, Key):
      CHECKS[prefix + name] = value.check
      value = value.default
    elif isinstance(value, dict):
      value = declare(value, f"{prefix}{name}.")
    out[name] = value
  return out


def _number(text: str) -> float:
  return float(text) if any(c in text for c in ".e") else int(text)


def _failure(check: Check, value) -> str | None:
  """What `value` must be when it fails `check`; None when it passes."""
  if callable(check):
    return check(value)
  if not isinstance(check, str):
    return None if value in check else "one of " + ", ".join(map(repr, check))
  compare, interval = _COMPARE.match(check), _INTERVAL.match(check)
  if not (compare or interval):
    raise ValueError(f"config check {check!r}: not one of '>= N', '> N', '[lo, hi]', '(lo, hi]'")
  must = check if compare else f"in {check}"
  if isinstance(value, bool) or not isinstance(value, (int, float)):
    return must
  if compare:
    op, bound = compare.group(1), _number(compare.group(2))
    ok = {">=": value >= bound, ">": value > bound, "<=": value <= bound, "<": value < bound}[op]
  else:
    lo, hi = _number(interval.group(2)), _number(interval.group(3))
    ok = ((lo <= value if interval.group(1) == "[" else lo < value) and
          (value <= hi if interval.group(4) == "]" else value < hi))
  return None if ok else must


def prompt_style(style) -> str | None:
  """task.prompt_style's check: a known style, or a format string of {question}."""
  if style in ("paper", "chat"):
    return None
  try:
    style.format(question="")
    if "{question}" in style:
      return None
  except (KeyError, IndexError, ValueError, AttributeError):
    pass
  return "'paper', 'chat' or a format string whose only field is {question}"


def lora_targets(value) -> str | None:
  """model.lora.targets' check: "all", or distinct projection names."""
  targets = [t.strip() for t in str(value).split(",")]
  if targets == ["all"] or (all(t in LORA_TARGETS for t in targets) and
                            len(set(targets)) == len(targets)):
    return None
  return f"'all' or distinct names from {','.join(LORA_TARGETS)}"


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
  if not CHECKS:
    raise ConfigError("config: no key has a check: build the config with configs/common.py's "
                      "base() (its keys declare their checks)")
  for name, check in CHECKS.items():
    try:
      value = get(name)
    except (KeyError, AttributeError, TypeError):
      continue  # a key this config has not (another task's, or one its recipe removed)
    allowed = _failure(check, value)
    if allowed:
      choices = check if isinstance(check, Collection) and not isinstance(check, str) else ()
      close = difflib.get_close_matches(str(value), list(choices), n=1)
      hint = f" (did you mean {close[0]!r}?)" if close else ""
      yield f"{name}={value!r}: must be {allowed}{hint}"
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
  for tb_only in ("loss.residual_clip", "loss.token_kl_coef"):
    if get(tb_only) and get("loss.name") != "tb":
      yield f"{tb_only}={get(tb_only)!r}: only with loss.name='tb' (not {get('loss.name')!r})"
  yield from _behaviour_logprob_problems(get)
  lr_min, lr = get("optim.lr_min"), get("optim.learning_rate")
  controls = []
  if get("optim.lr_control") != "none":
    controls.append(f"optim.lr_control={get('optim.lr_control')!r}")
  if get("optim.saturation_patience"):
    controls.append(f"optim.saturation_patience={get('optim.saturation_patience')!r}")
  if controls and not 0 < lr_min <= lr:
    yield (f"optim.lr_min={lr_min!r}: must be in (0, optim.learning_rate={lr!r}] with "
           f"{' and '.join(controls)} (the controlled lr moves between them)")
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


def _behaviour_logprob_problems(get) -> Iterable[str]:
  """loss.log_z='behaviour' and loss.name='ratio' read the searchers' behaviour log-probs as
  those of the policy that drew each completion. What the searchers store is the sampler's
  `tempered_logprobs` (rows.Sample): log softmax(logits / T) at the batch's own T, never
  truncated; the sampler's truncated `logprobs` are not kept. So they are refused with
  top-k / top-p (the distribution sampled is the truncated one) and with exploration (the
  trainer's log pi is at sampler.temperature, an exploring batch's at its own)."""
  readers = [f"{k}={get(k)!r}" for k, v in (("loss.log_z", "behaviour"), ("loss.name", "ratio"))
             if get(k) == v]
  top_k, top_p, temperature = get("sampler.top_k"), get("sampler.top_p"), get("sampler.temperature")
  explore = (get("sampler.explore_prob") > 0 and
             (get("sampler.explore_low"), get("sampler.explore_high")) != (temperature,) * 2)
  for reader in readers:
    if top_k > 0 or top_p < 1:
      yield (f"{reader}: not with sampler.top_k={top_k!r} / sampler.top_p={top_p!r}: the "
             "behaviour log-probs the searchers record are of the tempered distribution before "
             "top-k / top-p truncation, not of the truncated one the completions were drawn "
             "from (the sampler's truncated log-probs are not stored); use top_k=0, top_p=1")
    if explore:
      yield (f"{reader}: not with sampler.explore_prob={get('sampler.explore_prob')!r}: an "
             "exploring batch's behaviour log-probs are at its own temperature (sampler."
             "explore_low..explore_high), the trainer's log pi at sampler.temperature="
             f"{temperature!r}, so they compare two different distributions")


def _redteam_problems(config) -> Iterable[str]:
  try:
    r = lookup(config, "task.redteam")
  except (KeyError, AttributeError):
    yield "task.redteam: missing (the red-teaming task's section; configs/redteam.py)"
    return
  if r.victim_prompt not in REDTEAM_PROMPT_STYLES:
    yield f"task.redteam.victim_prompt={r.victim_prompt!r}: must be one of {REDTEAM_PROMPT_STYLES}"
  if r.judge not in REDTEAM_JUDGES:
    yield f"task.redteam.judge={r.judge!r}: must be one of {REDTEAM_JUDGES}"
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
