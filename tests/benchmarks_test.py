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


def test_trl_grpo_fingerprints_name_the_recipe_not_the_seed_split_or_evaluation_grid():
  """The protocol counts configurations by these (benchmarks/protocol.py): a run's seed, its
  split and its evaluation grid leave them alone; an lr, a beta or the budget do not."""
  from benchmarks import trl_grpo
  from benchmarks.trl_grpo import Schedule, TrlSettings
  spec = trl_grpo.CPU_RECIPE
  base = Schedule(600.0, 60.0, 8, "validation")
  tba = trl_grpo.tba_fingerprint(spec, [], base)
  assert trl_grpo.tba_fingerprint(spec, [], Schedule(600.0, 30.0, 2, "test")) == tba
  assert trl_grpo.tba_fingerprint(spec, ["optim.learning_rate=1e-5"], base) != tba
  assert trl_grpo.tba_fingerprint(spec, [], Schedule(900.0, 60.0, 8, "validation")) != tba
  trl = trl_grpo.trl_fingerprint(spec, TrlSettings(), base)
  assert trl_grpo.trl_fingerprint(spec, TrlSettings(), Schedule(600.0, 5.0, 1, "test")) == trl
  assert trl_grpo.trl_fingerprint(spec, TrlSettings(lr=2e-5), base) != trl
  assert trl_grpo.trl_fingerprint(spec, TrlSettings(beta=0.0), base) != trl
  assert TrlSettings.parse(TrlSettings(lr=2e-5, k=4).spec()[len("trl:"):]) == TrlSettings(
      lr=2e-5, k=4)
  # A seed-7 run of the recipe, as tba_arm resolves it, is the same recipe.
  from benchmarks import protocol
  seeded = trl_grpo.load_config(spec, trl_grpo.tba_overrides(base, 7))
  assert seeded.seed == 7 and protocol.fingerprint(seeded.to_dict()) == tba


@pytest.mark.parametrize("extra", [[], ["--trl_only"]])
def test_trl_grpo_reads_the_test_split_only_as_the_suites_recorded_read(tmp_path, extra):
  from benchmarks import trl_grpo
  with pytest.raises(SystemExit) as e:
    trl_grpo.main(["--split", "test", "--task", "add_mul_1d", "--results_dir", str(tmp_path),
                   "--out", str(tmp_path / "out"), *extra])
  assert "python -m benchmarks.suite --split test" in str(e.value.code)
  assert not os.listdir(tmp_path)  # refused before anything ran or was written
