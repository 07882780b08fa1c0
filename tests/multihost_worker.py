"""One process of the two-process loopback test (tests/distributed_test.py)."""
import json
import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402

from absl import logging  # noqa: E402

logging.set_verbosity(logging.WARNING)


def main(port: str, process_id: int, workdir: str):
  from tba_jax import distributed
  distributed.initialize(f"127.0.0.1:{port}", 2, process_id)
  assert jax.process_count() == 2 and len(jax.devices()) == 4
  sys.path.insert(0, os.path.dirname(__file__))
  from loop_test import tiny_config, toy_task
  from tba_jax import loop
  c = tiny_config(num_train_steps=6, mesh=dict(num_devices=2, num_trainer_devices=1),
                  sync=dict(mode="async", every=2), buffer=dict(prefill=16),
                  eval=dict(every=0, num_problems=4, num_samples=0, greedy=True))
  result = loop.run(c, workdir, task=toy_task(c))
  print("RESULT " + json.dumps(result, default=str), flush=True)


if __name__ == "__main__":
  main(sys.argv[1], int(sys.argv[2]), sys.argv[3])
