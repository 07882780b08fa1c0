r"""TBA post-training on GSM8K-format math. The recipes are in configs/gsm8k.py.

  python -m experiments.gsm8k --config configs/gsm8k.py:cpu --workdir /tmp/tba_cpu
  python -m experiments.gsm8k --config configs/gsm8k.py:rho1b --workdir DIR \
      --config.model.path=/path/to/rho-1b-sft-GSM8K
  # several hosts: the same command on every host, plus
      --coordinator_address=HOST0:1234 --num_processes=N --process_id=I

Rerunning with the same --workdir resumes from the newest checkpoint there. Ctrl-C or
SIGTERM (on any host) saves a checkpoint and exits 0; a host lost without notice makes
the others exit non-zero within --heartbeat_timeout seconds, naming it (docs/resume.md).
The flags are experiments/launch.py's, shared by every experiment.
"""
from experiments import launch

if __name__ == "__main__":
  launch.main("gsm8k.py:cpu")
