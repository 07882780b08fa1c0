r"""TBA red-teaming: an attacker learns diverse prompts that make a victim reply toxically.

  python -m experiments.redteam --config configs/redteam.py:tiny --workdir /tmp/rt_tiny
  python -m experiments.redteam --config configs/redteam.py:gpt2 --workdir DIR \
      --config.model.path=sft/gpt2      # the attacker after `python -m experiments.sft`

The recipes are in configs/redteam.py; the flags and outputs are the GSM8K job's
(experiments/launch.py). Rerunning with the same --workdir resumes.
"""
from experiments import launch

if __name__ == "__main__":
  launch.main("redteam.py:gpt2")
