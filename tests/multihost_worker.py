"""One process of the two-process loopback tests (tests/distributed_test.py).

  python multihost_worker.py PORT PROCESS_ID WORKDIR NUM_TRAIN_STEPS HEARTBEAT_TIMEOUT_S

A run of NUM_TRAIN_STEPS, or until signalled (the tests send SIGTERM or SIGKILL to one
process). A lost peer ends it as experiments/gsm8k.py does:
the error on stderr, exit status 1.
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


def main(port: str, process_id: int, workdir: str, num_train_steps: int, heartbeat_s: int):
  # A cache of its own beside the tests' (conftest.py), so a relaunch does not compile again:
  # a 2-process program over 4 devices must never be read back by the single-process tests'
  # 4-device programs of the same HLO (reading one crashed the test process).
  jax.config.update("jax_compilation_cache_dir", os.path.join(os.path.expanduser(
      os.environ.get("TBA_JAX_TEST_CACHE", "~/.cache/tba_jax_test_xla")), "two_processes"))
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
  from tba_jax import distributed
  distributed.initialize(f"127.0.0.1:{port}", 2, process_id, heartbeat_timeout_s=heartbeat_s)
  assert jax.process_count() == 2 and len(jax.devices()) == 4
  sys.path.insert(0, os.path.dirname(__file__))
  from loop_test import tiny_config, toy_task
  from tba_jax import loop
  c = tiny_config(num_train_steps=num_train_steps, max_train_seconds=300.0,
                  mesh=dict(num_devices=2, num_trainer_devices=1),
                  sync=dict(mode="async", every=2), buffer=dict(prefill=16),
                  checkpoint=dict(every=1000),
                  eval=dict(every=0, num_problems=4, num_samples=0, greedy=True))
  try:
    result = loop.run(c, workdir, task=toy_task(c))
  except distributed.ProcessLostError as e:
    print(f"error: {e}", file=sys.stderr, flush=True)
    os._exit(1)
  print("RESULT " + json.dumps(result, default=str), flush=True)


if __name__ == "__main__":
  main(sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
