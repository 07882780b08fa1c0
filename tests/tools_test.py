"""The tools a model calls: the ast calculator (tasks/tools.py); the sandboxed Python is
tasks/sandbox.py's, tested in sandbox_test.py."""
import pytest

from tba_jax.tasks import sandbox, tools
from tba_jax.tasks.tools import calculator


@pytest.mark.parametrize("expression, expected", [
    ("123 * 456", "56088"), ("(2 + 3) * -4", "-20"), ("7 / 2", "3.5"), ("2 ** 10", "1024"),
    ("17 // 5", "3"), ("17 % 5", "2"), (" 1.5 * 2 ", "3")])
def test_calculator_evaluates_arithmetic(expression, expected):
  assert calculator(expression) == expected


@pytest.mark.parametrize("expression", [
    "__import__('os').system('true')", "9 ** 9 ** 9", "10 ** 200 * 10 ** 200", "1 / 0", "x + 1",
    "1 +", "[1, 2]", "(-1) ** 0.5", "1" * 300])
def test_calculator_refuses_everything_else_with_an_error_string(expression):
  assert calculator(expression).startswith("error: ")


def test_tools_offers_the_sandbox_under_its_names():
  assert (tools.run_python, tools.SandboxUnavailable, tools.check_sandbox) == (
      sandbox.run_python, sandbox.SandboxUnavailable, sandbox.check_sandbox)
