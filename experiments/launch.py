r"""The command line every experiment shares: flags, config errors, start-up, the run.

  python -m experiments.EXPERIMENT --config configs/EXPERIMENT.py:VARIANT --workdir DIR
      [--config.section.key=value ...]
  python -m experiments.EXPERIMENT --config DIR/config.yaml --workdir DIR2   # rerun DIR's
  tba train EXPERIMENT ...      # the same command (experiments/cli.py)
  # several hosts: the same command on every host, plus
      --coordinator_address=HOST0:1234 --num_processes=N --process_id=I

An experiment module is `launch.main("EXPERIMENT.py:DEFAULT_VARIANT")`; the task is
built from the config's `task` section (config_builders.build_task). An experiment of a
task the runtime does not know passes its builder, `launch.main("EXPERIMENT.py:VARIANT",
tasks={name: fn(task section, tokenizer) -> Task})` (README, "Adding a task"). Rerunning with
the same --workdir resumes from the newest checkpoint there. A run writes its resolved config
to WORKDIR/config.yaml (tba_jax/run_config.py); `--config WORKDIR/config.yaml` reads it back
with the experiment's own config file declaring the keys. A job other than
training (experiments/evaluate_tldr.py) passes its own `job(config, workdir)`.

An error the user can fix (tba_jax.errors.UserError: a config value, a data file, a
refused resume, a config of another experiment) prints one `error: ...` paragraph on
stderr and exits 1; TBA_DEBUG=1 shows its traceback too. Other errors are bugs and
keep theirs. Ctrl-C and SIGTERM save a checkpoint and exit 0 (tba_jax/interrupts.py);
a second Ctrl-C exits 130 at once.
"""
import difflib
import importlib.util
import os
import re
import shlex
import sys

from absl import app, flags, logging
from ml_collections import config_flags

from tba_jax.errors import UserError

# The task names (config task.name) each experiment's entry point runs.
EXPERIMENTS = {"gsm8k": ("gsm8k", "arithmetic"), "math": ("math",), "tldr": ("tldr",),
               "redteam": ("redteam",)}
# TBA_DEBUG=1: errors a user can fix show their traceback too.
_DEBUG = os.environ.get("TBA_DEBUG", "") not in ("", "0")

_CONFIGS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")
# `--config W/config.yaml` (a run's resolved config, tba_jax/run_config.py) is read through
# this config file, with the experiment's own config file: `_saved_configs`.
_SAVED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "saved_config.py")
SAVED_SUFFIXES = (".yaml", ".yml")
# No default here: ml_collections would parse it, with the command line's overrides, while
# this module is imported, where an error can only be a traceback. `_parse_flags` adds it.
_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config.", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Checkpoints, metrics and the export go here.",
                               required=True)
_COORDINATOR = flags.DEFINE_string(
    "coordinator_address", "", "host:port of process 0 for multi-host runs ('auto' on TPU pods; "
    "'' = single process).")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", 0, "Number of processes (hosts).")
_PROCESS_ID = flags.DEFINE_integer("process_id", -1, "This process's index.")
_HEARTBEAT = flags.DEFINE_integer(
    "heartbeat_timeout", 100, "Multi-host: seconds without heartbeats after which a process "
    "counts as lost and the others stop (tba_jax/distributed.py).")
_CACHE = flags.DEFINE_string("compilation_cache", "~/.cache/tba_jax/xla",
                             "Persistent XLA compilation cache ('' = off): restarts and "
                             "resumes skip recompiling.")


def _load_config_file(spec: str):
  """The config that `--config=spec` names, without the command line's overrides."""
  path, _, arg = spec.partition(":")
  module_spec = importlib.util.spec_from_file_location("_experiment_config", path)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  return module.get_config(arg) if arg else module.get_config()


def _explain(error: Exception, argv: list[str]) -> str:
  """One line for a flag-parsing error: the override at fault, else the error's last line."""
  from tba_jax import config_checks
  specs = [a.split("=", 1)[1] for a in argv if a.startswith("--config=")]
  specs += [b for a, b in zip(argv, argv[1:]) if a == "--config"]  # the "--config X" form
  overrides = [m.groups() for m in (re.match(r"--config\.([\w.]+)=(.*)", a) for a in argv) if m]
  try:
    config = _load_config_file(specs[-1]) if specs else None
  except Exception:  # an error in the config argument itself: reported below
    config = None
  for key, text in overrides if config is not None else ():
    try:
      config_checks.parse_value(key, text, config_checks.lookup(config, key))
    except (KeyError, AttributeError, TypeError):
      return config_checks.unknown_key_message(key, config)
    except config_checks.ConfigError as e:
      return f"--config.{e}"
  lines = [line for line in str(error).splitlines() if line.strip()]
  last = lines[-1].strip() if lines else repr(error)
  # "pkg.module.SomeError: message" (a config file's traceback) -> "message"
  return re.sub(r"^[\w.]*(Error|Exception): ", "", last)


def _parse_flags(argv: list[str], default_config: str) -> list[str]:
  if not any(a == "--config" or a.startswith("--config=") for a in argv[1:]):
    argv = argv[:1] + [f"--config={os.path.join(_CONFIGS, default_config)}"] + argv[1:]
  try:
    missing = _missing_config_file(argv)
    if missing:
      raise UserError(missing)
    argv = _saved_configs(argv, default_config)
    return flags.FLAGS(argv)
  except Exception as e:  # flag and config errors: one line, not a traceback
    if _DEBUG:
      raise
    sys.exit(f"error: {e if isinstance(e, UserError) else _explain(e, argv)}")


def _saved_configs(argv: list[str], default_config: str) -> list[str]:
  """argv with each `--config W/config.yaml` read through experiments/saved_config.py: the
  experiment's config file declares the keys, the YAML gives every value."""
  own = os.path.join(_CONFIGS, default_config.partition(":")[0])
  spec = lambda path: (f"{_SAVED}:{own}:{os.path.abspath(path)}"
                       if path.endswith(SAVED_SUFFIXES) else path)
  out = list(argv[:1])
  for i, a in enumerate(argv[1:], 1):
    if a.startswith("--config="):
      a = "--config=" + spec(a.split("=", 1)[1])
    elif argv[i - 1] == "--config":
      a = spec(a)
    out.append(a)
  return out


def _missing_config_file(argv: list[str]) -> str | None:
  """What is wrong when --config names no file; None when it names one."""
  specs = [a.split("=", 1)[1] for a in argv if a.startswith("--config=")]
  specs += [b for a, b in zip(argv, argv[1:]) if a == "--config"]
  path, _, arg = specs[-1].partition(":") if specs else ("", "", "")
  if not path or os.path.isfile(path):
    return None
  if path.endswith(SAVED_SUFFIXES):
    return (f"config file {path!r} does not exist (a run writes its resolved config to "
            "WORKDIR/config.yaml once its workdir's checkpoints accept it)")
  # (common.py is the base the config files share, not a config)
  ours = sorted(f for f in os.listdir(_CONFIGS)
                if f.endswith(".py") and f not in ("__init__.py", "common.py"))
  name = os.path.basename(path)
  if name in ours and not os.path.isabs(path):
    return (f"config file {path!r} not found from {os.getcwd()}: a config path is relative to "
            f"the current directory. Run from the repository root ({os.path.dirname(_CONFIGS)}) "
            f"or give the full path: --config={os.path.join(_CONFIGS, name)}"
            f"{':' + arg if arg else ''}")
  close = difflib.get_close_matches(name, ours, n=1)
  hint = f"; did you mean configs/{close[0]}?" if close else ""
  return (f"config file {path!r} does not exist (the configs are {', '.join(ours)} in "
          f"{_CONFIGS}){hint}")


def _check_experiment(experiment: str, config, argv: list[str]) -> None:
  """Refuses a config of another experiment's task, naming the command that runs it."""
  if experiment not in EXPERIMENTS:  # a job without a task (experiments/sft.py)
    return
  name = config.task.name
  right = next((e for e, names in EXPERIMENTS.items() if name in names), None)
  if name in EXPERIMENTS[experiment] or right is None:  # an unknown name: config_checks says
    return
  module = os.path.splitext(os.path.basename(argv[0]))[0]
  raise UserError(
      f"experiments.{module} runs {' / '.join(EXPERIMENTS[experiment])} configs; this one has "
      f"task.name={name!r}. Run it with: python -m experiments.{right} {shlex.join(argv[1:])}")


def _main(argv, experiment: str, job=None, tasks=None, check=None):
  logging.set_verbosity(logging.WARNING)  # orbax logs every file it writes at INFO
  try:
    _start(argv, experiment, job, tasks or {}, check)
  except Exception as e:
    if _DEBUG:
      raise
    # Errors the message explains: one paragraph. Anything else is a bug: its traceback.
    from tba_jax import loop
    if isinstance(e, (UserError, loop.SearcherError)):
      sys.exit(f"error: {e}")
    from tba_jax import distributed
    if isinstance(e, distributed.ProcessLostError):
      # Exit now: JAX's shutdown at exit would wait for the lost process until its timeout.
      print(f"error: {e}", file=sys.stderr, flush=True)
      sys.stdout.flush()
      os._exit(1)
    raise
  except KeyboardInterrupt as e:  # a second Ctrl-C, or one outside the training steps
    print(str(e) or f"Ctrl-C: stopped at once; what {_WORKDIR.value} holds is kept (rerun the "
          "same command to resume from its newest checkpoint).", file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(130)  # at once: no waiting for the searcher threads or JAX's shutdown


def _start(argv, experiment: str, job, tasks: dict, check) -> None:
  try:
    config = _CONFIG.value
    config.seed  # ml_collections loads the file on first use
  except Exception as e:  # an error in the config file or its argument
    raise UserError(_explain(e, argv)) from e
  _check_experiment(experiment, config, argv)
  from tba_jax import config_builders, config_checks
  config_builders.TASKS.update(tasks)  # the experiment's own tasks, by config task.name
  # Before anything touches the devices or the workdir.
  (check or config_checks.validate)(config)
  config_builders.use_cpu_devices(config.mesh.num_cpu_devices)
  if _CACHE.value:
    import jax
    jax.config.update("jax_compilation_cache_dir", os.path.expanduser(_CACHE.value))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
  # Multi-host start-up must come before anything touches the devices.
  from tba_jax import distributed
  distributed.initialize(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value,
                         heartbeat_timeout_s=_HEARTBEAT.value)
  from tba_jax import evaluation, loop
  (job or loop.run)(config, _WORKDIR.value)
  if evaluation.batch_left_running():
    # A stop abandoned an evaluation batch (its checkpoint is saved): Python's shutdown
    # would abort inside that batch's XLA call, so leave now, output flushed.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def main(default_config: str, job=None, tasks: dict | None = None, check=None) -> None:
  """Runs the experiment (or `job(config, workdir)`); `default_config` ("gsm8k.py:cpu")
  when --config is not given. Its file names the experiment (EXPERIMENTS): a config of
  another experiment's task is refused. `tasks`: {task.name: fn(task section, tokenizer)
  -> tasks.Task} of the tasks this experiment adds (config_builders.TASKS). `check`: a
  job whose config is not the training one validates it itself (experiments/sft.py)."""
  experiment = default_config.partition(".py")[0]
  if tasks:
    EXPERIMENTS[experiment] = (*EXPERIMENTS.get(experiment, ()), *tasks)
  app.run(lambda argv: _main(sys.argv, experiment, job, tasks, check),
          flags_parser=lambda argv: _parse_flags(argv, default_config))
