r"""TBA post-training on MATH (12k / 500, MATH-500). The recipes are in configs/math.py.

  python -m experiments.math --config configs/math.py:tba_prime --workdir DIR
  python -m experiments.math --config configs/math.py:tiny --workdir /tmp/tba_math_tiny
  # several hosts: the same command on every host, plus
      --coordinator_address=HOST0:1234 --num_processes=N --process_id=I

Rerunning with the same --workdir resumes from the newest checkpoint there. The flags
are experiments/launch.py's, shared by every experiment.
"""
from experiments import launch

if __name__ == "__main__":
  launch.main("math.py:tba_prime")
