r"""TBA red-teaming: an attacker learns diverse prompts that make a victim reply toxically.

  python -m experiments.redteam --config configs/redteam.py:cpu --workdir /tmp/rt_cpu
  python -m experiments.redteam --config configs/redteam.py:tiny --workdir /tmp/rt_tiny
  python -m experiments.redteam --config configs/redteam.py:gpt2 --workdir DIR \
      --config.model.path=sft/gpt2      # the attacker after `python -m experiments.sft`

The recipes are in configs/redteam.py; the flags and outputs are the GSM8K job's
(experiments/launch.py), and at the end WORKDIR/successful_attacks.txt lists the
successful attacks of the last evaluation with the victim's replies
(tasks/redteam_report.py). Rerunning with the same --workdir resumes.

task.redteam.attacker_sft (the `cpu` recipes): before training, the attacker's SFT
warm-up, a configs/sft.py recipe run from model.path into WORKDIR/attacker_sft
(experiments/sft.py); its export is then the attacker and its reference (lm), as
Lee et al.'s SFT attacker is. A rerun reuses an export already there.
"""
import os

from experiments import launch

WARMUP_DIR = "attacker_sft"


def warm_up(recipe: str, base_path: str, workdir: str) -> str:
  """The export of configs/sft.py:`recipe` fine-tuned from `base_path` into
  WORKDIR/WARMUP_DIR (made once: a rerun reuses it); returns its path."""
  from configs import sft as sft_config
  from experiments import sft
  out = os.path.join(workdir, WARMUP_DIR)
  if os.path.isfile(os.path.join(out, "config.json")):
    print(f"The attacker's SFT warm-up: reusing {out}.", flush=True)
    return out
  c = sft_config.get_config(recipe)
  c.model.path = base_path  # the warm-up starts from the attacker the config names
  sft.check(c)
  print(f"The attacker's SFT warm-up (configs/sft.py:{recipe}, {c.num_train_steps} steps of "
        f"{c.batch_size} from {c.data.path or 'its built-in rows'}):", flush=True)
  # Written aside, then renamed: an interrupted warm-up leaves no half export to reuse.
  partial = out + ".partial"
  sft.run(c, partial)
  os.replace(partial, out)
  return out


def check(config) -> None:
  """The training config's checks, and task.redteam.attacker_sft's (a configs/sft.py recipe)."""
  from configs import sft as sft_config
  from experiments import sft
  from tba_jax import config_checks
  from tba_jax.errors import ConfigError
  config_checks.validate(config)
  recipe = config.task.redteam.attacker_sft
  if recipe:
    try:
      c = sft_config.get_config(recipe)
    except Exception as e:  # an unknown variant or key: ml_collections' message
      raise ConfigError(f"config: task.redteam.attacker_sft={recipe!r}: {e}") from None
    sft.check(c)
    if c.data.path and not os.path.isfile(c.data.path):
      raise ConfigError(f"config: task.redteam.attacker_sft={recipe!r}: its data.path "
                        f"{c.data.path!r} does not exist")


def train_and_report(config, workdir: str) -> None:
  import jax  # here, not at the top: launch sets up the devices before JAX starts
  from tba_jax import loop, run_evaluation
  from tba_jax.tasks import redteam_report
  if config.task.redteam.attacker_sft:
    config.model.path = warm_up(config.task.redteam.attacker_sft, config.model.path, workdir)
  loop.run(config, workdir)
  if jax.process_index() == 0:
    path = redteam_report.write_report(workdir, run_evaluation.SAMPLES_DIR)
    if path:
      print(f"The successful attacks, with the victim's replies: {path}")


if __name__ == "__main__":
  launch.main("redteam.py:gpt2", train_and_report, check=check)
