"""The config is checked before anything runs; overrides are parsed strictly."""
import pytest

from configs import gsm8k as gsm8k_config
from tba_jax import config_checks, loop
from tba_jax.config_checks import ConfigError
from tba_jax.replay_buffer import EVICTION_POLICIES


def _config(**values):
  c = gsm8k_config.get_config("tiny")
  c.unlock()
  for key, value in values.items():
    *parents, leaf = key.split("__")
    node = c
    for p in parents:
      node = node[p]
    node[leaf] = value
  return c


def test_every_shipped_recipe_passes():
  from configs import redteam as redteam_config
  from configs import tldr as tldr_config
  dropout = {}
  for module in (gsm8k_config, tldr_config, redteam_config):
    for variant in module.VARIANTS:
      config_checks.validate(module.get_config(variant))
      dropout[module.__name__, variant] = module.get_config(variant).model.dropout
  # GPT-2's dropout in the red-teaming attacker (Lee et al.'s train mode); none elsewhere.
  on = {("configs.redteam", "gpt2"): 0.1, ("configs.redteam", "tiny"): 0.1}
  assert dropout == {k: on.get(k, 0.0) for k in dropout}


def test_microbatches_that_would_cut_a_group_or_an_fsdp_shard_are_refused():
  """tiny: 2 slots x 4 samples; a micro-batch must hold whole slots (groups)."""
  config_checks.validate(_config(optim__num_microbatches=2))
  with pytest.raises(ConfigError) as e:
    config_checks.validate(_config(optim__num_microbatches=4))
  assert str(e.value) == (
      "config: optim.num_microbatches=4: must divide buffer.num_prompts=2 (one of 1, 2): a "
      "micro-batch holds whole groups, each a slot's buffer.samples_per_prompt samples "
      "(VarGrad's log Z and the RLOO / GRPO baselines are means over a group)")
  with pytest.raises(ConfigError) as e:
    config_checks.validate(_config(optim__num_microbatches=2, buffer__samples_per_prompt=3,
                                   mesh__num_trainer_devices=2))
  assert str(e.value) == (
      "config: optim.num_microbatches=2: micro-batches of buffer.num_prompts=2 / 2 x "
      "buffer.samples_per_prompt=3 = 3 rows do not split over the trainer's 2 fsdp devices "
      "(mesh.num_trainer_devices / mesh.trainer_tensor)")


def test_behaviour_log_probs_are_refused_where_they_are_not_the_sampled_distributions():
  """The searchers record untruncated log-probs at each batch's own temperature, so
  log_z=behaviour and the ratio loss, which read them as the sampling policy's, refuse
  top-k / top-p and exploration (exploring at sampler.temperature itself changes nothing)."""
  for loss in ({"loss__log_z": "behaviour"}, {"loss__name": "ratio"}):
    config_checks.validate(_config(**loss))
    config_checks.validate(_config(**loss, sampler__explore_prob=0.5, sampler__explore_low=1.0,
                                   sampler__explore_high=1.0))  # tiny's temperature: 1.0
  config_checks.validate(_config(sampler__top_p=0.9, sampler__explore_prob=0.5,
                                 sampler__explore_low=0.5, sampler__explore_high=2.0))
  with pytest.raises(ConfigError) as e:
    config_checks.validate(_config(loss__log_z="behaviour", sampler__top_p=0.9))
  assert str(e.value) == (
      "config: loss.log_z='behaviour': not with sampler.top_k=0 / sampler.top_p=0.9: the "
      "behaviour log-probs the searchers record are of the tempered distribution before "
      "top-k / top-p truncation, not of the truncated one the completions were drawn from "
      "(the sampler's truncated log-probs are not stored); use top_k=0, top_p=1")
  with pytest.raises(ConfigError) as e:
    config_checks.validate(_config(loss__name="ratio", sampler__top_k=40,
                                   sampler__explore_prob=0.5, sampler__explore_low=0.5,
                                   sampler__explore_high=2.0))
  lines = str(e.value).splitlines()[1:]
  assert [line.split(":")[0] for line in lines] == ["  loss.name='ratio'"] * 2
  assert "sampler.top_k=40 / sampler.top_p=1.0" in lines[0]
  assert lines[1].endswith(
      "not with sampler.explore_prob=0.5: an exploring batch's behaviour log-probs are at its "
      "own temperature (sampler.explore_low..explore_high), the trainer's log pi at "
      "sampler.temperature=1.0, so they compare two different distributions")


def test_red_teaming_settings_are_checked():
  from configs import redteam as redteam_config
  c = redteam_config.get_config("tiny")
  c.unlock()
  c.task.redteam.judge = "perspective"
  c.buffer.num_prompts = 2
  c.sampler.min_new_tokens = c.sampler.max_new_tokens
  c.sampler.explore_low = 3.0
  c.loss.update(name="grpo", log_z="learned", residual_clip=2.0, token_kl_coef=0.05)
  with pytest.raises(ConfigError) as e:
    config_checks.validate(c)
  assert str(e.value).splitlines()[1:] == [
      "  sampler.explore_low=3.0: must be <= sampler.explore_high=2.0",
      "  sampler.min_new_tokens=8: must be < sampler.max_new_tokens=8 with end_with_eos",
      "  loss.log_z='learned': only with loss.name='tb' (not 'grpo')",
      "  loss.residual_clip=2.0: only with loss.name='tb' (not 'grpo')",
      "  loss.token_kl_coef=0.05: only with loss.name='tb' (not 'grpo')",
      "  task.redteam.judge='perspective': must be one of ('classifier', 'llama_guard', "
      "'profanity_check')",
      "  buffer.num_prompts: must be 1 for red-teaming (one attack prompt; a batch is one slot "
      "of buffer.samples_per_prompt attacks)"]


gsm8k_config.get_config("tiny")  # its keys' checks declared (config_checks.CHECKS)
ENUMERATED = {k: c for k, c in config_checks.CHECKS.items()
              if not isinstance(c, str) and not callable(c)}
RANGED = {k: c for k, c in config_checks.CHECKS.items() if isinstance(c, str)}


def _outside(check: str):
  """A value outside the range `check` allows (">= 1" -> 0, "[0, 1]" -> 1.5)."""
  bound = check.split()[-1].strip("[]()")
  if check.startswith(">="):
    return int(bound) - 1 if bound.lstrip("-").isdigit() else float(bound) - 1
  if check.startswith(">"):
    return float(bound) if "." in bound else int(bound)
  return float(bound) + 0.5


def test_every_key_that_had_a_check_has_one_beside_its_default():
  """The checks live in the config file now (configs/common.py); none was lost."""
  assert len(ENUMERATED) == 18 and len(RANGED) == 89
  assert config_checks.CHECKS["task.prompt_style"] is config_checks.prompt_style
  assert config_checks.CHECKS["model.lora.targets"] is config_checks.lora_targets


def test_a_check_that_refuses_its_own_default_fails_where_it_is_written():
  with pytest.raises(ValueError, match=r"the default 0 fails its own check '>= 1'"):
    config_checks.key(0, ">= 1")
  with pytest.raises(ValueError, match=r"config check '=> 1': not one of"):
    config_checks.key(1, "=> 1")


@pytest.mark.parametrize("key", sorted(ENUMERATED))
def test_each_enumerated_key_refuses_a_value_outside_its_choices(key):
  bad = "asynch" if key == "sync.mode" else "bogus"
  c = _config(**{key.replace(".", "__"): bad})
  allowed = ", ".join(repr(v) for v in ENUMERATED[key])
  with pytest.raises(ConfigError) as e:
    config_checks.validate(c)
  assert str(e.value) == f"config: {key}={bad!r}: must be one of {allowed}" + \
      (" (did you mean 'async'?)" if key == "sync.mode" else "")


@pytest.mark.parametrize("key,check", sorted(RANGED.items()))
def test_each_ranged_key_refuses_a_value_outside_its_range(key, check):
  c = _config(**{key.replace(".", "__"): _outside(check)})
  stored = config_checks.lookup(c, key)  # a float field keeps a float
  allowed = check if check[0] in "<>" else f"in {check}"
  with pytest.raises(ConfigError) as e:
    config_checks.validate(c)
  assert str(e.value) == f"config: {key}={stored!r}: must be {allowed}"


@pytest.mark.parametrize("style,ok", [("paper", True), ("chat", True), ("Q: {question}\nA:", True),
                                      ("papr", False), ("{q}", False), ("{question", False)])
def test_prompt_style_is_a_known_name_or_a_format_with_question(style, ok):
  c = _config(task__prompt_style=style)
  if ok:
    config_checks.validate(c)
  else:
    with pytest.raises(ConfigError, match=r"task.prompt_style=.*'paper', 'chat' or a format"):
      config_checks.validate(c)


def test_several_problems_are_listed_one_per_line():
  c = _config(sync__mode="x", buffer__m=2.0, num_train_steps=0)
  with pytest.raises(ConfigError) as e:
    config_checks.validate(c)
  assert str(e.value).splitlines() == [
      "config:", "  num_train_steps=0: must be >= 1", "  buffer.m=2.0: must be in [0, 1]",
      "  sync.mode='x': must be one of 'async', 'alternate'"]


def test_the_eviction_choices_are_the_replay_buffers():
  assert config_checks.CHECKS["buffer.eviction"] is EVICTION_POLICIES


def test_loop_run_refuses_a_bad_value_before_creating_the_workdir(tmp_path):
  workdir = tmp_path / "run"
  with pytest.raises(ConfigError, match="sync.mode='asynch'"):
    loop.run(_config(sync__mode="asynch"), str(workdir))
  assert not workdir.exists()


@pytest.mark.parametrize("override,message", [
    ("eval.greedy=flase", "eval.greedy='flase': not a boolean (true/false, 1/0, yes/no)"),
    ("num_train_steps=1.5", "num_train_steps='1.5': not an int"),
    ("buffer.m=high", "buffer.m='high': not a float"),
    ("eval.gredy=true", "unknown config key 'eval.gredy'; did you mean 'eval.greedy'?"),
    ("evl.greedy=true", "unknown config key 'evl.greedy'; did you mean 'eval.greedy'?"),
    ("greedy=true", "unknown config key 'greedy'; did you mean 'eval.greedy'?"),
    ("num_train_steps", "config override 'num_train_steps': expected key=value"),
])
def test_config_argument_overrides_are_strict_with_did_you_mean(override, message):
  with pytest.raises(ConfigError) as e:
    gsm8k_config.get_config(f"tiny,{override}")
  assert str(e.value) == message


@pytest.mark.parametrize("override,key,value", [
    ("eval.greedy=False", "eval.greedy", False), ("eval.greedy=yes", "eval.greedy", True),
    ("num_train_steps=12", "num_train_steps", 12), ("buffer.m=0.5", "buffer.m", 0.5),
    ("sync.mode=alternate", "sync.mode", "alternate")])
def test_config_argument_overrides_apply(override, key, value):
  c = gsm8k_config.get_config(f"tiny,{override}")
  assert config_checks.lookup(c, key) == value
  assert type(config_checks.lookup(c, key)) is type(value)
