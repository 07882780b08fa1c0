r"""TBA post-training on GSM8K-format math. The recipes are in configs/gsm8k.py.

  python -m experiments.gsm8k --config configs/gsm8k.py:cpu --workdir /tmp/tba_cpu
  python -m experiments.gsm8k --config configs/gsm8k.py:rho1b --workdir DIR \
      --config.model.path=/path/to/rho-1b-sft-GSM8K
  # several hosts: the same command on every host, plus
      --coordinator_address=HOST0:1234 --num_processes=N --process_id=I

Rerunning with the same --workdir resumes from the newest checkpoint there.
"""
from absl import app, flags, logging
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", "configs/gsm8k.py:cpu", "Experiment config.",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Checkpoints, metrics and the export go here.",
                               required=True)
_COORDINATOR = flags.DEFINE_string(
    "coordinator_address", "", "host:port of process 0 for multi-host runs ('auto' on TPU pods; "
    "'' = single process).")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", 0, "Number of processes (hosts).")
_PROCESS_ID = flags.DEFINE_integer("process_id", -1, "This process's index.")
_CACHE = flags.DEFINE_string("compilation_cache", "~/.cache/tba_jax/xla",
                             "Persistent XLA compilation cache ('' = off): restarts and "
                             "resumes skip recompiling.")


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)  # orbax logs every file it writes at INFO
  if _CACHE.value:
    import os
    import jax
    jax.config.update("jax_compilation_cache_dir", os.path.expanduser(_CACHE.value))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
  if _CONFIG.value.mesh.num_cpu_devices:
    # Must happen before JAX creates its backends; ignored when an accelerator is present.
    import jax
    jax.config.update("jax_num_cpu_devices", _CONFIG.value.mesh.num_cpu_devices)
  # Multi-host start-up must come before anything touches the devices.
  from tba_jax import distributed
  distributed.initialize(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value)
  from tba_jax import loop
  loop.run(_CONFIG.value, _WORKDIR.value)


if __name__ == "__main__":
  app.run(main)
