"""One process of the two-process LoRA run in tests/lora_test.py.

  python lora_multihost_worker.py PORT PROCESS_ID WORKDIR
"""
import json
import os
import sys

# This checkout's tba_jax, not an installed one (sys.path[0] is tests/).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402

from absl import logging  # noqa: E402

logging.set_verbosity(logging.WARNING)


def main(port: str, process_id: int, workdir: str):
  from tba_jax import distributed
  distributed.initialize(f"127.0.0.1:{port}", 2, process_id)
  assert jax.process_count() == 2 and len(jax.devices()) == 4
  from lora_test import _tiny_config
  from loop_test import toy_task
  from tba_jax import loop
  # Async, the trainer mesh spanning both hosts (FSDP), one searcher per host; the export
  # gathers the merged weights and the adapters from both.
  c = _tiny_config(num_train_steps=4, mesh=dict(num_devices=2, num_trainer_devices=1),
                   sync=dict(mode="async", every=2), buffer=dict(prefill=16), export=True,
                   eval=dict(every=0, num_problems=4, num_samples=0, greedy=True))
  print("RESULT " + json.dumps(loop.run(c, workdir, task=toy_task(c)), default=str), flush=True)


if __name__ == "__main__":
  main(sys.argv[1], int(sys.argv[2]), sys.argv[3])
