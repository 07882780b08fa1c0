"""Tools a model calls between its turns: a calculator and a sandboxed Python.

  calculator("123 * 456")             -> "56088"
  run_python("print(2 ** 10)", 5.0)   -> "1024\n"

Both return a string whatever the input: a result, or "error: ..." that the model reads
as the environment's reply. Neither can hurt the run that calls it.

The calculator parses arithmetic with `ast` and walks the tree itself (never eval):
numbers, + - * / // % **, unary signs and parentheses; exponents, operand sizes and the
expression's length are bounded, so `9**9**9` is an error, not a hang.

`run_python` (tasks/sandbox.py, whose docstring is the sandbox's spec) runs model-written code
in fresh pid, network and mount namespaces under a uid of its own, with memory, process and
CPU limits per call (a cgroup leaf where the host allows one), a seccomp deny list, and a
deadline; nothing it starts outlives the call or its caller. It raises SandboxUnavailable
only when the host cannot confine code, never because of what the code does:
`check_sandbox()` finds that out once, at start.
"""
from __future__ import annotations

import ast
import math
import operator

from tba_jax.tasks.sandbox import (  # noqa: F401 (re-exported: tools.run_python)
    SandboxUnavailable, check_sandbox, run_python)

# --- Calculator ------------------------------------------------------------------------
MAX_EXPRESSION_CHARS = 200
MAX_EXPONENT = 64
MAX_DIGITS = 100  # operands and results beyond 10^100 are refused

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
           ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
           ast.Pow: operator.pow}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}


class _CalcError(ValueError):
  pass


def _check_size(x):
  if abs(x) >= 10 ** MAX_DIGITS:
    raise _CalcError(f"a number beyond 10^{MAX_DIGITS}")
  return x


def _evaluate(node):
  if isinstance(node, ast.Expression):
    return _evaluate(node.body)
  if isinstance(node, ast.Constant) and type(node.value) in (int, float):
    return _check_size(node.value)
  if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
    return _UNARY[type(node.op)](_evaluate(node.operand))
  if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
    a, b = _evaluate(node.left), _evaluate(node.right)
    if isinstance(node.op, ast.Pow) and abs(b) > MAX_EXPONENT:
      raise _CalcError(f"an exponent beyond {MAX_EXPONENT}")
    try:
      out = _BINARY[type(node.op)](a, b)
    except ZeroDivisionError:
      raise _CalcError("division by zero") from None
    except OverflowError:
      raise _CalcError("overflow") from None
    if isinstance(out, complex):
      raise _CalcError("a complex result")
    return _check_size(out)
  raise _CalcError(f"unsupported syntax ({type(node).__name__}): numbers, + - * / // % ** "
                   "and parentheses only")


def calculator(expression: str) -> str:
  """The value of an arithmetic expression as text ("56088", "0.5"), or "error: ..."."""
  expression = expression.strip()
  if len(expression) > MAX_EXPRESSION_CHARS:
    return f"error: expression longer than {MAX_EXPRESSION_CHARS} characters"
  try:
    value = _evaluate(ast.parse(expression, mode="eval"))
  except SyntaxError:
    return "error: not an arithmetic expression"
  except _CalcError as e:
    return f"error: {e}"
  if isinstance(value, float):
    if not math.isfinite(value):
      return "error: overflow"
    if value.is_integer() and abs(value) < 2 ** 53:
      return str(int(value))
    return repr(round(value, 10))
  return str(value)
