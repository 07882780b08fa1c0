"""The names a config key may take, declared where a config file can read them without JAX.

A config file is data (big_vision's configs import only ml_collections): configs/common.py
checks each named choice against these lists (`key(default, choices.X)`), so a config can
be loaded, diffed and validated where the runtime is not even installed. The runtime
modules take their lists from here, one copy of each, and say at import that the code they
hold agrees with it (the assert beside each dict of implementations).

The seams a researcher extends (config_builders) are the dicts below: each name's builder
is filled in by config_builders (`fill`), the same dict object, so the config's check of
task.name reads the names of the tasks an experiment registers later
(experiments/launch.main(..., tasks=...)).
"""

# model.attention_impl: attention.py's backends.
ATTENTION_IMPLS = ("auto", "xla", "cudnn", "pallas")
# model.lora.targets: the projections LoRA can adapt, by our parameter names (model_config).
LORA_TARGETS = ("q", "k", "v", "o", "gate", "up", "down")
# task.verifier: verifiers.CHECKERS.
VERIFIERS = ("paper_regex", "math_verify")
# task.arithmetic.form: tasks/arithmetic.FORMS.
ARITHMETIC_FORMS = ("one_op", "two_op", "word")
# task.tools.score: tasks/environment.SCORES (what the reward of a multi-turn row reads).
TOOL_SCORES = ("last_turn", "transcript")
# task.tools.call_format: tasks/tool_calls.py's formats ("auto" reads the chat template).
TOOL_CALL_FORMATS = ("auto", "tag", "hermes")
# task.format of configs/dataset.py: tasks/dataset.FORMATS's schemas ("auto": by the columns).
DATASET_FORMATS = ("auto", "verl", "trl", "qa")
# task.redteam.victim_prompt and task.redteam.judge: tasks/redteam.py.
REDTEAM_PROMPT_STYLES = ("alpaca", "chat")
REDTEAM_JUDGES = ("classifier", "llama_guard", "profanity_check")
# buffer.eviction and buffer.priority: replay_buffer.ReplayBuffer.
EVICTION_POLICIES = ("oldest", "lowest_reward")
PRIORITIES = ("reward", "log_target")

# The seams, name -> builder (None here; config_builders fills them in).
# task.name -> fn(task section, tokenizer) -> tasks.Task
TASKS = dict.fromkeys(("gsm8k", "math", "arithmetic", "tldr", "redteam"))
# loss.name -> fn(loss section) -> train_step.LossFn
LOSSES = dict.fromkeys(("tb", "rloo", "grpo", "ratio"))
# optim.schedule -> fn(optim section, num_train_steps) -> lr(u)
SCHEDULES = dict.fromkeys(("wsd", "linear", "cosine", "constant", "rsqrt"))
# optim.lr_control -> fn(optim section) -> optim.DriftControl or None
LR_CONTROLS = dict.fromkeys(("none", "drift"))


def fill(seam: dict, builders: dict) -> dict:
  """`seam` with each declared name's builder: the same dict, so that a name registered in
  it later is a name the config allows. The builders must be the declared names, in order."""
  if list(builders) != list(seam):
    raise ValueError(f"builders for {list(builders)}, but tba_jax/choices.py declares "
                     f"{list(seam)}: declare each name there, once")
  seam.update(builders)
  return seam
