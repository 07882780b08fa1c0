"""Tool-use tasks: problems whose prompt says how to call a tool, and their environments.

  train, test = multiplication_problems(digits=3, num_train=2000, num_test=64, seed=0)
  env = environment(tool("calculator", timeout_s=5.0), max_turns=2, ...)  # environment.py
  task = dataclasses.replace(question_task, environment=env)

The embedded CPU default cannot multiply two 3-digit numbers in its head (configs/tools.py);
with the calculator it only has to write the call `<tool>123 * 456</tool>` and copy the
result. GSM8K with the Python tool (`<tool>python: print(...)</tool>`) is the accelerator
recipe's task. Models whose chat template declares tools call them in its own format
instead (`call_format="hermes"`: tasks/tool_calls.py), with `tools()`' schemas in the prompt
and HERMES_INSTRUCTIONS after each question.
"""
from __future__ import annotations

import numpy as np

from tba_jax.tasks import Problem, tool_calls
from tba_jax.tasks.environment import Environment, tool_reply
from tba_jax.tasks.tool_calls import Tool
from tba_jax.tasks.tools import calculator, check_sandbox, run_python

# What each tool's prompt suffix tells the model, and the tool a bare call goes to.
INSTRUCTIONS = {
    "calculator": (" You can use a calculator: write <tool>EXPRESSION</tool>, e.g. "
                   "<tool>12 * 34</tool>, and its result comes back as <result>...</result>. "
                   "Then give the final answer as a number."),
    "python": (" You can run Python: write <tool>python: CODE</tool>; what the code prints "
               "comes back as <result>...</result>. Then give the final answer as a number on "
               "the last line."),
}
# The same for a model that calls tools in its chat template's format (the tool's schema in
# the prompt says how).
HERMES_INSTRUCTIONS = {
    "calculator": " Use the calculator tool for the arithmetic, then give the final answer as "
                  "a number.",
    "python": " You can run Python with the python tool; then give the final answer as a "
              "number on the last line.",
}


def tools(timeout_s: float) -> dict[str, Tool]:
  """The tools by name, with their schemas (`timeout_s`: the Python tool's limit per call)."""
  return {
      "calculator": Tool("calculator", "Evaluates an arithmetic expression: numbers, + - * / "
                         "// % ** and parentheses.", {"expression": "e.g. 12 * 34"}, calculator),
      "python": Tool("python", "Runs Python code in a sandbox and returns what it prints.",
                     {"code": "a Python program that prints its result"},
                     lambda code: run_python(code, timeout_s=timeout_s)),
  }


def tool(name: str, timeout_s: float) -> Tool:
  """The tool `name` of `tools(timeout_s)`; ValueError for a name it does not hold."""
  available = tools(timeout_s)
  if name not in available:
    raise ValueError(f"unknown tool {name!r}; choose from {sorted(available)}")
  return available[name]


def multiplication_problems(digits: int, num_train: int, num_test: int, *, seed: int
                            ) -> tuple[list[Problem], list[Problem]]:
  """(train, test) products of two `digits`-digit numbers, distinct pairs drawn with `seed`
  (GSM8K's format: fields question / answer, target the product)."""
  low, high = 10 ** (digits - 1), 10 ** digits
  if digits < 1 or num_train < 1 or num_test < 1:
    raise ValueError(f"multiplication needs digits, num_train, num_test >= 1; got {digits}, "
                     f"{num_train}, {num_test}")
  if num_train + num_test > (high - low) ** 2:
    raise ValueError(f"{num_train + num_test} problems asked of {(high - low) ** 2} pairs")
  rng, pairs = np.random.default_rng(seed), {}
  while len(pairs) < num_train + num_test:
    a, b = (int(x) for x in rng.integers(low, high, 2))
    pairs.setdefault((a, b), None)

  def problem(i, a, b):
    return Problem(i, {"question": f"What is {a} * {b}?",
                       "answer": f"{a} * {b} = {a * b}\n#### {a * b}"}, float(a * b))

  pairs = list(pairs)
  return ([problem(i, *p) for i, p in enumerate(pairs[num_test:])],
          [problem(i, *p) for i, p in enumerate(pairs[:num_test])])


def environment(tool: Tool, *, max_turns: int, max_turn_tokens: int, max_reply_tokens: int,
                num_workers: int, score: str, stop: tuple[str, ...] = ("</tool>",),
                bare_calls: bool = False, call_format: str = "tag",
                tokenizer=None) -> Environment:
  """The environment of one tool (`tool(name, timeout_s)`, which sets its limit per
  call). `call_format` "tag": `<tool>...</tool>` calls answered `<result>...</result>`
  (`stop`, `bare_calls`: environment.tool_reply's; the tiny recipe's random model);
  "hermes": the chat template's calls and tool turn (tasks/tool_calls.py, `tokenizer`'s
  template; its stop is the call's closing tag). `score`: what the reward reads,
  environment.SCORES. The Python tool's sandbox is probed here, so a machine that cannot
  confine code fails the run at its start (SandboxUnavailable), not at its first call."""
  if call_format not in ("tag", "hermes"):
    raise ValueError(f"call_format={call_format!r}: 'tag' or 'hermes' (tool_calls.call_format "
                     "resolves 'auto')")
  if tool.name == "python":
    check_sandbox()  # SandboxUnavailable (with the reason) on a host that cannot confine code
  if call_format == "hermes":
    if bare_calls:
      raise ValueError("bare_calls=True is the tag format's (a turn without tags is a call); "
                       "a hermes call is JSON inside <tool_call>...</tool_call>")
    if tokenizer is None:
      raise ValueError("call_format='hermes' needs the tokenizer whose template declares it")
    reply = tool_calls.hermes_reply([tool], tool_calls.tool_turn(tokenizer, tool.name),
                                    tokenizer.encode_text, max_reply_tokens)
    stop = tool_calls.HERMES_STOP
  else:
    reply = tool_reply({tool.name: tool.fn}, default=tool.name, bare_calls=bare_calls)
  return Environment(reply=reply, stop=stop, max_turns=max_turns,
                     max_turn_tokens=max_turn_tokens, max_reply_tokens=max_reply_tokens,
                     num_workers=num_workers, score=score)
