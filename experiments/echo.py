"""The echo task (tba_jax/tasks/echo.py) from the command line; recipes in configs/echo.py.

  python -m experiments.echo --config configs/echo.py:tiny --workdir /tmp/echo_tiny
"""
from experiments import launch
from tba_jax.tasks import echo

# config task.name -> fn(task section, tokenizer) -> Task: how the config reaches the task.
TASKS = {"echo": lambda task, tokenizer: echo.make_task(task.num_test)}

if __name__ == "__main__":
  launch.main("echo.py:tiny", tasks=TASKS)
