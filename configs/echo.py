"""Echo (tba_jax/tasks/echo.py): the README's example of adding a task.

  python -m experiments.echo --config configs/echo.py:tiny --workdir /tmp/echo_tiny

tiny: the GSM8K smoke test's random 2-layer model, byte tokenizer, devices and
schedule (6 steps, offline) on the echo task; its scores mean nothing (random model).
"""
from configs import common, gsm8k


def _tiny(c):
  gsm8k.RECIPES["tiny"](c)
  c.task.update(name="echo", num_test=4)  # num_test: words held out for evaluation


def get_config(arg: str = "tiny"):
  return common.from_recipes(arg, "configs/echo.py", {"tiny": _tiny})
