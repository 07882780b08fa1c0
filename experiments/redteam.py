r"""TBA red-teaming: an attacker learns diverse prompts that make a victim reply toxically.

  python -m experiments.redteam --config configs/redteam.py:cpu --workdir /tmp/rt_cpu
  python -m experiments.redteam --config configs/redteam.py:tiny --workdir /tmp/rt_tiny
  python -m experiments.redteam --config configs/redteam.py:gpt2 --workdir DIR \
      --config.model.path=sft/gpt2      # the attacker after `python -m experiments.sft`

The recipes are in configs/redteam.py; the flags and outputs are the GSM8K job's
(experiments/launch.py), and at the end WORKDIR/successful_attacks.txt lists the
successful attacks of the last evaluation with the victim's replies
(tasks/redteam.py attack_report). Rerunning with the same --workdir resumes.
"""
from experiments import launch


def train_and_report(config, workdir: str) -> None:
  import jax  # here, not at the top: launch sets up the devices before JAX starts
  from tba_jax import loop
  from tba_jax.tasks import redteam
  loop.run(config, workdir)
  if jax.process_index() == 0:
    path = redteam.write_report(workdir, loop.SAMPLES_DIR)
    if path:
      print(f"The successful attacks, with the victim's replies: {path}")


if __name__ == "__main__":
  launch.main("redteam.py:gpt2", train_and_report)
