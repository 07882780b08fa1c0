r"""TBA preference fine-tuning on Reddit TL;DR (Pythia). The recipes are in configs/tldr.py.

  python -m experiments.tldr --config configs/tldr.py:pythia410m --workdir DIR
  python -m experiments.tldr --config configs/tldr.py:tiny --workdir /tmp/tldr_tiny
  # several hosts: the same command on every host, plus
      --coordinator_address=HOST0:1234 --num_processes=N --process_id=I

Rerunning with the same --workdir resumes from the newest checkpoint there. The
flags are experiments/launch.py's, shared by every experiment; an exported policy
is evaluated on its own with experiments/evaluate_tldr.py.
"""
from experiments import launch

if __name__ == "__main__":
  launch.main("tldr.py:pythia410m")
