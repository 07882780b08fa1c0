"""benchmarks/: every module imports (as `python -m benchmarks.X` would, without running its
main), every project name it imports or reads off a project module exists (also those
imported inside functions, which an import alone does not reach), and the TL;DR searcher
benchmark runs end to end at tiny shapes."""
import ast
import dataclasses
import importlib
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODULES = sorted(f[:-3] for f in os.listdir(os.path.join(ROOT, "benchmarks")) if f.endswith(".py"))
PROJECT = ("tba_jax", "benchmarks", "experiments", "configs")


def _project_names(module: str) -> list[tuple[object, str]]:
  """(project module, name) for every `from X import name` of a project module X anywhere in
  benchmarks/<module>.py, and every `alias.name` read off such a module bound to `alias`."""
  with open(os.path.join(ROOT, "benchmarks", module + ".py")) as f:
    tree = ast.parse(f.read())
  aliases, out = {}, []
  for node in ast.walk(tree):
    if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in PROJECT:
      source = importlib.import_module(node.module)
      for name in node.names:
        out.append((source, name.name))
        value = getattr(source, name.name, None)
        if value is None:  # a submodule not imported by its package
          value = importlib.import_module(f"{node.module}.{name.name}")
        if type(value) is type(source):
          aliases[name.asname or name.name] = value
    elif isinstance(node, ast.Import):
      for name in node.names:
        if name.name.split(".")[0] in PROJECT and name.asname:
          aliases[name.asname] = importlib.import_module(name.name)
  for node in ast.walk(tree):
    if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and
        node.value.id in aliases):
      out.append((aliases[node.value.id], node.attr))
  return out


@pytest.mark.parametrize("module", MODULES)
def test_every_benchmark_imports_and_the_project_names_it_uses_exist(module):
  importlib.import_module(f"benchmarks.{module}")
  missing = []
  for source, name in _project_names(module):
    if not hasattr(source, name):
      try:
        importlib.import_module(f"{source.__name__}.{name}")
      except ImportError:
        missing.append(f"{source.__name__}.{name}")
  assert not missing, f"benchmarks/{module}.py uses names that do not exist: {missing}"


def test_the_tldr_searcher_benchmark_times_each_part_at_tiny_shapes(tiny_cfg):
  """Its whole path (a searcher step, sampling, the reference's log-probs as Searcher.score
  computes them, the reward model) on a tiny model: a method the searcher lost fails here."""
  from benchmarks import tldr_searcher
  seconds = tldr_searcher.measure(tiny_cfg, dataclasses.replace(tiny_cfg, num_labels=1),
                                  prompts=1, samples=2, prompt_len=4, new_tokens=3, repeats=1,
                                  max_prompt_len=8)
  assert set(seconds) == {"step", "sampling", "reference", "reward"}
  assert all(s > 0 for s in seconds.values())
