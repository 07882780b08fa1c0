"""Multi-turn tool use from the command line; recipes in configs/tools.py.

  python -m experiments.tools --config configs/tools.py:tiny --workdir /tmp/tools_tiny
"""
import dataclasses

from experiments import launch
from tba_jax import config_builders
from tba_jax.errors import ConfigError
from tba_jax.tasks import gsm8k, tool_use, tools


def _environment(task):
  t = task.tools
  try:
    return tool_use.environment(t.tool, max_turns=t.max_turns, max_turn_tokens=t.max_turn_tokens,
                                max_reply_tokens=t.max_reply_tokens, timeout_s=t.timeout_s,
                                num_workers=t.num_workers, score=t.score,
                                stop=tuple(t.stop.split(",")), bare_calls=t.bare_calls)
  except (ValueError, tools.SandboxUnavailable) as e:  # a machine without the sandbox too
    raise ConfigError(f"task.tools: {e}") from None


def _with_tool(task_cfg, task):
  """The task with its tool's instructions after each question and the environment."""
  instructions = tool_use.INSTRUCTIONS[task_cfg.tools.tool]
  ask = lambda p: dataclasses.replace(p, fields={**p.fields, "question":
                                                 p.fields["question"] + instructions})
  prompt = task.prompt
  return dataclasses.replace(task, prompt=lambda p: prompt(ask(p)),
                             environment=_environment(task_cfg))


def _multiplication(task_cfg, tokenizer):
  try:
    train, test = tool_use.multiplication_problems(task_cfg.digits, task_cfg.num_train,
                                                   task_cfg.num_test, seed=task_cfg.arithmetic.seed)
  except ValueError as e:
    raise ConfigError(f"task: {e}") from None
  task = config_builders.question_task(task_cfg, tokenizer, train, test, gsm8k.extract_answer)
  return _with_tool(task_cfg, task)


# config task.name -> fn(task section, tokenizer) -> Task (config_builders.TASKS).
TASKS = {"tool_multiplication": _multiplication,
         "gsm8k_python": lambda t, tok: _with_tool(t, config_builders.TASKS["gsm8k"](t, tok))}

if __name__ == "__main__":
  launch.main("tools.py:tiny", tasks=TASKS)
