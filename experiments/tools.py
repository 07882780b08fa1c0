"""Multi-turn tool use from the command line; recipes in configs/tools.py.

  python -m experiments.tools --config configs/tools.py:tiny --workdir /tmp/tools_tiny
"""
import dataclasses

from experiments import launch
from tba_jax import config_builders
from tba_jax.errors import ConfigError
from tba_jax.tasks import gsm8k, tool_calls, tool_use, tools


def _call_format(task_cfg, tokenizer) -> str:
  """task.tools.call_format resolved: "tag" or "hermes". The template's format needs the
  template's prompt (prompt_style "chat"), where its tools are declared."""
  requested, chat = task_cfg.tools.call_format, task_cfg.prompt_style == "chat"
  if requested == "hermes" and not chat:
    raise ConfigError(f"task.tools.call_format='hermes' declares the tools through the chat "
                      f"template: it needs task.prompt_style='chat' (it is "
                      f"{task_cfg.prompt_style!r}), or use call_format='tag'")
  return tool_calls.call_format(requested, tokenizer if chat else None)


def _environment(task, tokenizer=None):
  """The environment of task.tools (`tokenizer`: its template's format; None: the tag's)."""
  t = task.tools
  try:
    return tool_use.environment(tool_use.tool(t.tool, t.timeout_s), max_turns=t.max_turns,
                                max_turn_tokens=t.max_turn_tokens,
                                max_reply_tokens=t.max_reply_tokens,
                                num_workers=t.num_workers, score=t.score,
                                stop=tuple(t.stop.split(",")), bare_calls=t.bare_calls,
                                call_format=_call_format(task, tokenizer), tokenizer=tokenizer)
  except (ValueError, tools.SandboxUnavailable) as e:  # a machine without the sandbox too
    raise ConfigError(f"task.tools: {e}") from None


def _with_tool(task_cfg, task, tokenizer):
  """The task with its tool's instructions after each question and the environment; in the
  template's format, the prompt renders the tool's schema through the template too."""
  fmt = _call_format(task_cfg, tokenizer)
  if fmt == "tag":
    instructions = tool_use.INSTRUCTIONS[task_cfg.tools.tool]
    ask = lambda p: dataclasses.replace(p, fields={**p.fields, "question":
                                                   p.fields["question"] + instructions})
    prompt = task.prompt
    return dataclasses.replace(task, prompt=lambda p: prompt(ask(p)),
                               environment=_environment(task_cfg))
  tool = tool_use.tools(task_cfg.tools.timeout_s)[task_cfg.tools.tool]
  suffix = task_cfg.question_suffix + tool_use.HERMES_INSTRUCTIONS[tool.name]
  system = task_cfg.system_prompt or None
  thinking = {"auto": None, "on": True, "off": False}[task_cfg.thinking]
  prompt = lambda p: tokenizer.chat_prompt(p.fields["question"] + suffix, system=system,
                                           thinking=thinking, tools=[tool.schema])
  return dataclasses.replace(task, prompt=prompt, templated_prompts=True,
                             environment=_environment(task_cfg, tokenizer))


def _multiplication(task_cfg, tokenizer):
  try:
    train, test = tool_use.multiplication_problems(task_cfg.digits, task_cfg.num_train,
                                                   task_cfg.num_test, seed=task_cfg.arithmetic.seed)
  except ValueError as e:
    raise ConfigError(f"task: {e}") from None
  task = config_builders.question_task(task_cfg, tokenizer, train, test, gsm8k.extract_answer)
  return _with_tool(task_cfg, task, tokenizer)


# config task.name -> fn(task section, tokenizer) -> Task (config_builders.TASKS).
TASKS = {"tool_multiplication": _multiplication,
         "gsm8k_python": lambda t, tok: _with_tool(t, config_builders.TASKS["gsm8k"](t, tok), tok)}

if __name__ == "__main__":
  launch.main("tools.py:tiny", tasks=TASKS)
