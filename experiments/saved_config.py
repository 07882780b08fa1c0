"""A run's config.yaml as an ml_collections config file (tba_jax/run_config.py).

  python -m experiments.gsm8k --config W/config.yaml --workdir W2   # launch points it here:
  --config=experiments/saved_config.py:configs/gsm8k.py:W/config.yaml

The argument is the experiment's config file, then the YAML file. The recipe the YAML names
(its `variant`; the file's default recipe when the variant is another file's, e.g. a
configs/suite.py task run by experiments.gsm8k) is built from the config file first, so every
key keeps its declared check and type, then takes the YAML's value.
"""
import importlib.util

from tba_jax import run_config


def _recipe(config_file: str, variant: str):
  spec = importlib.util.spec_from_file_location("_saved_config_recipe", config_file)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  try:
    return module.get_config(variant)
  except ValueError:  # not a variant of this file (common.from_recipes): its keys are the same
    return module.get_config()


def get_config(arg: str):
  config_file, sep, path = arg.partition(".py:")
  if not sep:
    raise ValueError(f"saved_config: {arg!r} is not CONFIG_FILE.py:CONFIG.yaml")
  saved = run_config.read(path)
  return run_config.restore(_recipe(config_file + ".py", saved["variant"]), saved, path)
