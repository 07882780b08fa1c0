"""`tba`: every experiment's command line as one command (setup.py's console script).

  tba train EXPERIMENT --config configs/EXPERIMENT.py:VARIANT --workdir DIR [--config.K=V ...]
  tba train EXPERIMENT --config DIR/config.yaml --workdir DIR2   # rerun DIR's resolved config
  tba eval EXPERIMENT --workdir DIR [--policy PATH] [--step N]  # DIR/config.yaml's evaluation
  tba export EXPERIMENT --workdir DIR [--out PATH]   # the newest checkpoint's policy, HF format
  tba plot WORKDIR [WORKDIR ...] --out fig.png                   # experiments/plot.py
  tba --help                                                     # the experiments, their variants

`tba train X ARGS` is `python -m experiments.X ARGS`: the module runs as the main program
with the same flags (experiments/launch.py), so the two spellings are one command. The
experiments are the modules of this package whose main program is
`launch.main("X.py:VARIANT")` for their own configs/X.py (a job on another experiment's
config, experiments/evaluate_tldr.py, is not one); the variants are configs/X.py's VARIANTS
(or its RECIPES' names), read from the file's syntax tree, so `--help` imports no JAX.
"""
from __future__ import annotations

import ast
import dataclasses
import difflib
import glob
import importlib
import os
import runpy
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
_CONFIGS = os.path.join(os.path.dirname(_HERE), "configs")
COMMANDS = ("train", "eval", "export", "plot")


@dataclasses.dataclass(frozen=True)
class Experiment:
  name: str
  summary: str                # the module docstring's first line
  default: str                # the variant run without --config
  variants: tuple[str, ...]   # configs/NAME.py's recipes


def _main_call(tree: ast.Module) -> ast.Call | None:
  """The `launch.main(...)` call under the module's `if __name__ == "__main__":`."""
  for node in tree.body:
    if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test):
      for sub in ast.walk(node):
        if isinstance(sub, ast.Call) and ast.unparse(sub.func) == "launch.main":
          return sub
  return None


def variants(config_file: str) -> tuple[str, ...]:
  """A config file's variants without running it: its VARIANTS tuple, its RECIPES dict's
  keys, or the dict given to common.from_recipes; () when written otherwise."""
  tree = ast.parse(open(config_file).read())
  assigned = {t.id: node.value for node in tree.body if isinstance(node, ast.Assign)
              for t in node.targets if isinstance(t, ast.Name)}
  try:
    return tuple(ast.literal_eval(assigned["VARIANTS"]))
  except (KeyError, ValueError):
    pass
  calls = [n.args[2] for n in ast.walk(tree) if isinstance(n, ast.Call) and len(n.args) > 2
           and ast.unparse(n.func).endswith("from_recipes")]
  for recipes in [assigned.get("RECIPES"), *calls]:
    if isinstance(recipes, ast.Dict):
      return tuple(k.value for k in recipes.keys if isinstance(k, ast.Constant))
  return ()


def experiments() -> dict[str, Experiment]:
  """The experiments of this package (module doc), by name."""
  found = {}
  for path in sorted(glob.glob(os.path.join(_HERE, "*.py"))):
    name = os.path.basename(path)[:-3]
    tree = ast.parse(open(path).read())
    call = _main_call(tree)
    if call is None or not call.args or not isinstance(call.args[0], ast.Constant):
      continue
    config, _, default = str(call.args[0].value).partition(":")
    config_file = os.path.join(_CONFIGS, config)
    if config != f"{name}.py" or not os.path.isfile(config_file):
      continue  # a job on another experiment's configs
    summary = (ast.get_docstring(tree) or name).strip().splitlines()[0]
    found[name] = Experiment(name, summary, default, variants(config_file))
  return found


def usage() -> str:
  lines = ["\n\n".join(__doc__.split("\n\n")[:2]).strip(), "",
           "Experiments (configs/EXPERIMENT.py:VARIANT):"]
  for e in experiments().values():
    listed = ", ".join(f"{v} (default)" if v == e.default else v for v in e.variants)
    lines += [f"  {e.name:10s} {e.summary}", f"  {'':10s} variants: {listed or e.default}"]
  lines += ["", "tba train EXPERIMENT --help lists the flags every experiment takes."]
  return "\n".join(lines)


def _fail(message: str) -> None:
  sys.exit(f"error: {message}\n(tba --help lists the commands and experiments)")


def _named(kind: str, name: str | None, choices) -> str:
  """`name` when it is one of `choices`; else a clear error with the closest one."""
  if name is None or (kind != "tba" and name.startswith("-")):
    _fail(f"tba {kind}: name the experiment first (one of {', '.join(choices)})")
  if name not in choices:
    close = difflib.get_close_matches(name, list(choices), n=1)
    _fail(f"unknown {'command' if kind == 'tba' else 'experiment'} {name!r}"
          f"{f'; did you mean {close[0]!r}?' if close else ''} (choose from "
          f"{', '.join(choices)})")
  return name


def _flag(args: list[str], name: str) -> str | None:
  """The value of --name in `args` ("--name=V" or "--name V"), or None."""
  for i, a in enumerate(args):
    if a.startswith(f"--{name}="):
      return a.split("=", 1)[1]
    if a == f"--{name}" and i + 1 < len(args):
      return args[i + 1]
  return None


def _train(name: str, args: list[str]) -> None:
  sys.argv = [name, *args]
  runpy.run_module(f"experiments.{name}", run_name="__main__", alter_sys=True)


def _job(name: str, args: list[str], job_module: str, job_name: str) -> None:
  """Runs experiments.`job_module`.`job_name` under the experiment's launch (its tasks),
  with WORKDIR/config.yaml as the config unless --config names one."""
  from experiments import launch
  from tba_jax import run_config
  workdir = _flag(args, "workdir")
  if workdir is None:
    _fail(f"tba {job_module}: --workdir DIR is required (the run's workdir)")
  if _flag(args, "config") is None:
    saved = os.path.join(workdir, run_config.FILE)
    if not os.path.isfile(saved):
      _fail(f"{saved} does not exist: give the run's config with --config (a run writes "
            "its config.yaml when it starts)")
    args = ["--config", saved, *args]
  experiment = importlib.import_module(f"experiments.{name}")
  tasks = getattr(experiment, "TASKS", None)
  if name not in launch.EXPERIMENTS and not tasks:
    _fail(f"experiment {name!r} trains no task (nothing to {job_module})")
  job = getattr(importlib.import_module(f"experiments.{job_module}"), job_name)
  sys.argv = [experiment.__file__, *args]
  launch.main(f"{name}.py:{experiments()[name].default}", job=job, tasks=tasks)


def main(argv: list[str] | None = None) -> None:
  argv = sys.argv[1:] if argv is None else argv
  if not argv or argv[0] in ("-h", "--help", "help"):
    print(usage())
    return
  command = _named("tba", argv[0], COMMANDS)
  if command == "plot":
    from experiments import plot
    sys.argv = ["tba plot", *argv[1:]]
    plot.main()
    return
  name = _named(command, argv[1] if len(argv) > 1 else None, list(experiments()))
  if command == "train":
    _train(name, argv[2:])
  elif command == "eval":
    _job(name, argv[2:], "evaluate", "evaluate")
  else:
    _job(name, argv[2:], "export", "export")


if __name__ == "__main__":
  main()
