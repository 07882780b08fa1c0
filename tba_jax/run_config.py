"""A run's resolved config, saved as WORKDIR/config.yaml, and read back to rerun it.

  write(workdir, config.to_dict())      # loop.run, once the workdir's checkpoints accept it
  config = restore(recipe_config, read("W/config.yaml"))   # experiments/saved_config.py

The file holds every key of the config as the run applied it (recipe, variant and command
line overrides resolved). `--config W/config.yaml` on any experiment's command line
(experiments/launch.py) reruns it: the experiment's config file builds the recipe the file
names (its `variant` key), which declares each key's check and type, and every value is then
the file's, so the rerun resolves the same config; `--config.key=value` still overrides.
A key the recipe has and the file lacks, or the reverse, is refused by name (a file of
another experiment or version). Resuming in the same workdir is checked against the
checkpoint as any resume is (checkpoint.Checkpointer.check_config); the file is rewritten
only once that check passed, so it always holds the config the workdir's run computes with.
"""
from __future__ import annotations

import os

import yaml

from tba_jax.errors import ConfigError

FILE = "config.yaml"
_HEADER = ("# The resolved config of the run in this directory (tba_jax/run_config.py). Rerun "
           "it:\n#   tba train EXPERIMENT --config {path} --workdir DIR\n")


def _plain(value):
  """Tuples as lists, recursively: what YAML's safe dumper writes."""
  if isinstance(value, dict):
    return {k: _plain(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [_plain(v) for v in value]
  return value


def write(workdir: str, config_dict: dict) -> str:
  """WORKDIR/config.yaml, written whole or not at all; returns its path."""
  path = os.path.join(workdir, FILE)
  os.makedirs(workdir, exist_ok=True)
  text = _HEADER.format(path=path) + yaml.safe_dump(_plain(config_dict), sort_keys=False,
                                                     allow_unicode=True)
  with open(path + ".tmp", "w") as f:
    f.write(text)
  os.replace(path + ".tmp", path)
  return path


def read(path: str) -> dict:
  """The config a config.yaml holds, as nested dicts."""
  try:
    with open(path) as f:
      saved = yaml.safe_load(f)
  except OSError as e:
    raise ConfigError(f"--config {path}: {e.strerror}") from None
  except yaml.YAMLError as e:
    raise ConfigError(f"--config {path}: not YAML ({e})") from None
  if not isinstance(saved, dict) or not isinstance(saved.get("variant"), str):
    raise ConfigError(f"--config {path}: not a run's config.yaml (a mapping of the config's "
                      "keys, with its recipe's `variant`)")
  return saved


def flatten(d: dict, prefix: str = "") -> dict:
  """{"section.key": value} of a nested dict (an empty dict is a value)."""
  out = {}
  for k, v in d.items():
    if isinstance(v, dict) and v:
      out.update(flatten(v, f"{prefix}{k}."))
    else:
      out[f"{prefix}{k}"] = v
  return out


def restore(config, saved: dict, path: str = FILE):
  """`config` (the recipe's ConfigDict; only its existing keys are set) with every value of
  `saved`; a key one of them lacks is refused by name (module doc)."""
  want, have = flatten(config.to_dict()), flatten(saved)
  missing, extra = sorted(set(want) - set(have)), sorted(set(have) - set(want))
  if missing or extra:
    said = "; ".join(s for s in (f"missing {missing[:8]}" if missing else "",
                                 f"unknown {extra[:8]}" if extra else "") if s)
    raise ConfigError(f"--config {path}: its keys are not those of the recipe it names (variant "
                      f"{saved['variant']!r} of the experiment's config file): {said}. Was it "
                      "written by another experiment, or by another version of tba_jax?")
  for key, value in have.items():
    if isinstance(value, dict):
      continue  # an empty section, as the recipe's
    *parents, name = key.split(".")
    section = config
    for p in parents:
      section = section[p]
    if isinstance(section[name], tuple) and isinstance(value, list):
      value = tuple(value)  # the recipe's type (YAML has lists only)
    try:
      section[name] = value
    except TypeError as e:  # ml_collections refuses a value of another type
      raise ConfigError(f"--config {path}: {key}={value!r}: {e}") from None
  return config
