"""An experiment's command line with a fault plan (tba_jax/faults.py), a testing aid.

  python tests/fault_worker.py FAULTS EXPERIMENT [experiment flags ...]
  python tests/fault_worker.py stop_at_step=5 gsm8k --config=configs/gsm8k.py:tiny --workdir=DIR

FAULTS is faults.Plan.parse's "key=value,..." ("" = none); the experiment runs as
`python -m experiments.EXPERIMENT` would, with every loop.run call given the plan.
"""
import functools
import os
import runpy
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(faults: str, experiment: str, flags: list[str]) -> None:
  sys.path.insert(0, ROOT)
  from tba_jax import faults as faults_lib
  from tba_jax import loop
  plan = faults_lib.Plan.parse(faults)
  loop.run = functools.partial(loop.run, fault_plan=plan)
  sys.argv = [f"experiments.{experiment}", *flags]
  runpy.run_module(f"experiments.{experiment}", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
  run(sys.argv[1], sys.argv[2], sys.argv[3:])
