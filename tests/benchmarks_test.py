"""benchmarks/: a package whose every module imports (as `python -m benchmarks.X` would,
without running its main), every project name it imports or reads off a project module
exists (also those imported inside functions, which an import alone does not reach) and is
public, no module edits sys.path or documents itself as `python benchmarks/X.py`, and the
TL;DR searcher benchmark runs end to end at tiny shapes; BENCHMARKS.md stays a short reference
whose figures come from the lab log, and every section quoted from either exists."""
import ast
import dataclasses
import importlib
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODULES = sorted(f[:-3] for f in os.listdir(os.path.join(ROOT, "benchmarks"))
                 if f.endswith(".py") and f != "__init__.py")
PROJECT = ("tba_jax", "benchmarks", "experiments", "configs")
LIBRARY = ("tba_jax", "experiments", "configs")  # benchmarks/ may share its own helpers


def _source(module: str) -> str:
  with open(os.path.join(ROOT, "benchmarks", module + ".py")) as f:
    return f.read()


def _project_names(module: str) -> list[tuple[object, str]]:
  """(project module, name) for every `from X import name` of a project module X anywhere in
  benchmarks/<module>.py, and every `alias.name` read off such a module bound to `alias`."""
  tree = ast.parse(_source(module))
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


def _top_level_work(tree: ast.Module) -> list[str]:
  """Top-level statements that do something when the module is imported: anything but the
  docstring, imports, definitions, assignments, a call filling in a table the module
  assigned, and the `__main__` guard."""
  tables = {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets
            if isinstance(t, ast.Name)}
  work = []
  for i, node in enumerate(tree.body):
    call = node.value if isinstance(node, ast.Expr) else None
    if (isinstance(node, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.ClassDef,
                          ast.Assign, ast.AnnAssign)) or
        (i == 0 and isinstance(call, ast.Constant)) or
        (isinstance(node, ast.If) and ast.unparse(node.test) == "__name__ == '__main__'") or
        (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and
         isinstance(call.func.value, ast.Name) and call.func.value.id in tables)):
      continue
    work.append(f"line {node.lineno}: {ast.unparse(node).splitlines()[0][:70]}")
  return work


@pytest.mark.parametrize("module", MODULES)
def test_every_benchmark_runs_as_a_module_on_public_names_and_imports_without_work(module):
  text, tree = _source(module), ast.parse(_source(module))
  private = sorted({f"{source.__name__}.{name}" for source, name in _project_names(module)
                    if source.__name__.split(".")[0] in LIBRARY and name.startswith("_")
                    and not name.startswith("__")})
  assert not private, f"benchmarks/{module}.py reaches private names of the library: {private}"
  assert "sys.path" not in text, f"benchmarks/{module}.py edits sys.path"
  assert not re.search(r"python3? benchmarks/", text), \
      f"benchmarks/{module}.py documents `python benchmarks/{module}.py`, not `python -m`"
  assert not _top_level_work(tree), f"benchmarks/{module}.py works on import: " \
      f"{_top_level_work(tree)}"
  if any(isinstance(n, ast.FunctionDef) and n.name == "main" for n in tree.body):
    assert ast.unparse(tree.body[-1]) == "if __name__ == '__main__':\n    main()", module


def test_the_device_scripts_run_the_benchmarks_as_modules():
  for script in ("gpu.sh", "tpu.sh"):
    with open(os.path.join(ROOT, "benchmarks", script)) as f:
      text = f.read()
    assert not re.search(r"python3? benchmarks/", text), script
    for name in re.findall(r"python3? -m benchmarks\.(\w+)", text):
      assert name in MODULES, f"{script} runs benchmarks.{name}, which does not exist"


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
  assert seeded.seed == 7
  assert protocol.fingerprint(seeded.to_dict(), trl_grpo.config_defaults()) == tba


@pytest.mark.parametrize("extra", [[], ["--trl_only"]])
def test_trl_grpo_reads_the_test_split_only_as_the_suites_recorded_read(tmp_path, extra):
  from benchmarks import trl_grpo
  with pytest.raises(SystemExit) as e:
    trl_grpo.main(["--split", "test", "--task", "add_mul_1d", "--results_dir", str(tmp_path),
                   "--out", str(tmp_path / "out"), *extra])
  assert "python -m benchmarks.suite --split test" in str(e.value.code)
  assert not os.listdir(tmp_path)  # refused before anything ran or was written


# ----- BENCHMARKS.md (the reference) and benchmarks/results/LAB_LOG.md (the lab log) -----
REFERENCE, LAB_LOG = "BENCHMARKS.md", os.path.join("benchmarks", "results", "LAB_LOG.md")


def _read(path: str) -> str:
  with open(os.path.join(ROOT, path)) as f:
    return f.read()


def _headings(path: str) -> list[str]:
  return [h.strip() for h in re.findall(r"^#+ (.*)$", _read(path), re.M)]


def test_the_reference_is_short_and_every_figure_in_it_is_in_the_lab_log_or_the_results():
  """A figure enters the reference from a lab-log entry (or a results file), verbatim: the
  reference never computes, rounds or invents one."""
  reference = _read(REFERENCE)
  assert len(reference.splitlines()) <= 400
  results = os.path.join(ROOT, "benchmarks", "results")
  sources = _read(LAB_LOG) + "".join(
      _read(os.path.join(results, f)) for f in sorted(os.listdir(results))
      if f.endswith((".json", ".jsonl")))
  figures = set(re.findall(r"\d+(?:[.,]\d+)+", reference))
  missing = sorted(f for f in figures if f not in sources)
  assert figures and not missing, f"figures in {REFERENCE} found in no lab-log entry: {missing}"


def test_every_quoted_section_of_the_reference_or_the_lab_log_exists():
  """`BENCHMARKS.md, "Section"` and `LAB_LOG.md, "Section"` in code and docs: the quoted text
  begins a heading of that file (a section that moved to the lab log is named there)."""
  files = {"BENCHMARKS": _headings(REFERENCE), "LAB_LOG": _headings(LAB_LOG)}
  pattern = re.compile(r"\b(BENCHMARKS|LAB_LOG)(?:\.md)?,? \"([^\"]{1,160})\"", re.S)
  stale = []
  for folder, dirs, names in os.walk(ROOT):
    dirs[:] = [d for d in dirs if not d.startswith((".", "__"))]
    for name in names:
      path = os.path.relpath(os.path.join(folder, name), ROOT)
      if not name.endswith((".py", ".md", ".sh")) or path in (LAB_LOG, "tests/benchmarks_test.py"):
        continue
      for file, quoted in pattern.findall(_read(path)):
        section = " ".join(quoted.replace("#", " ").split())
        if not any(h.startswith(section) for h in files[file]):
          stale.append(f"{path}: {file}, \"{section}\"")
  assert not stale, stale
