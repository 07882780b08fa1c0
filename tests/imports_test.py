"""The layering the design states, checked on the source (nothing is imported): no import
circle among tba_jax's modules (tasks/ one room), and each rule of RULES: a module of one
layer never imports one of another (imports inside functions count). Config files are also
imported for real, in a fresh interpreter: they load no JAX."""
import ast
import functools
import glob
import json
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("tba_jax", "configs", "experiments", "benchmarks")

# What a config file may import of tba_jax: the declarations (allowed names, key checks,
# error types), none of which imports JAX or numpy.
DECLARATIONS = ("tba_jax", "tba_jax.choices", "tba_jax.config_checks", "tba_jax.errors")
_JAX = r"(jax|jaxlib|flax|optax|orbax|chex)(\..*)?"
_MODEL = r"tba_jax\.(model|model_config|layers|blocks|attention|kv_cache|encoder|lora|paged_kv)"
_FORMATS = r"tba_jax\.(hf_checkpoints|hf_configs|hf_layouts|gguf_weights|tokenizer)"
_UPDATE = r"tba_jax\.(losses|optim|train_step)"
_SAMPLING = (r"tba_jax\.(sampler|rows|continuous|slot_programs|replies|turns|streaming|searcher|"
             r"searcher_pool|evaluation)")
_BUILDERS = r"tba_jax\.(loop|run_evaluation|config_builders|model_builders)"

# (importer, forbidden, why): no module whose name matches `importer` imports one whose name
# matches `forbidden` (regular expressions over dotted names, matched whole).
RULES = [
    (r"configs\.\w+", r"tba_jax\.(?!(choices|config_checks|errors)$).*",
     "configs never the runtime: a config file is data, read and validated without it"),
    (r"configs\.\w+", _JAX + r"|numpy(\..*)?",
     "configs never JAX: importing one costs what importing ml_collections costs"),
    (r"tba_jax\.(choices|config_checks|errors)", r"tba_jax\.(?!(choices|errors)$).*|" + _JAX +
     r"|numpy(\..*)?", "the declarations a config imports import no runtime and no JAX"),
    (_MODEL, _FORMATS,
     "the model never imports formats: checkpoints and tokenizers are read above it"),
    (_MODEL, _UPDATE,
     "the model never imports losses or the update: they are written on its outputs"),
    (_MODEL, _SAMPLING + "|" + _BUILDERS + r"|tba_jax\.(tasks(\..*)?|replay_buffer|weight_sync)",
     "the model knows nothing of the sampling, the tasks or the runtime that call it"),
    (r"tba_jax\.sampler",
     r"tba_jax\.(continuous|slot_programs|replies|turns|streaming|searcher|searcher_pool)",
     "the static sampler knows nothing of streaming: it is the reference the pool is tested "
     "against, and the caller picks the implementation"),
    (r"tba_jax\.(rows|continuous|slot_programs|replies|turns)",
     r"tba_jax\.(searcher|searcher_pool|streaming)",
     "the pool never the searcher: rows reach a searcher through its rows protocol"),
    (_SAMPLING, r"tba_jax\.train_step|" + _BUILDERS,
     "the searchers never the update or the builders: sequence log-probs live in the model"),
    (r"tba_jax\.(losses|logprobs)", r"tba_jax\.(?!logprobs$).*",
     "the losses and the log-probs are functions of arrays (logits, log-probs, rewards, "
     "masks), tested without a model"),
    (r"tba_jax\.(replay_buffer|buffer_state|near_duplicates|entries|batch)",
     r"tba_jax\.(model|sampler|searcher|searcher_pool|loop)|" + _UPDATE,
     "the buffer never the model or the update: it does not import the update to know what "
     "a batch is"),
    (r"tba_jax\.tasks(\..*)?", r"tba_jax\.(continuous|slot_programs|replies|turns|streaming|"
     r"searcher|searcher_pool|"
     r"evaluation|train_step|replay_buffer|weight_sync)|" + _BUILDERS,
     "a task is data, prompts and a reward stage: it knows nothing of the runtime"),
    (r"tba_jax(\..*)?", r"(configs|experiments|benchmarks|tests)(\..*)?|ml_collections(\..*)?",
     "the library never its callers or a config file: config is read at the edges"),
    (r"tba_jax\.(?!(loop|run_evaluation|config_builders|model_builders)$).*", _BUILDERS,
     "only the loop builds a run from the config: a library module never reaches up to it"),
]

# (importer, imported) -> why it is allowed for now. Each entry names a violation that exists:
# when the code is mended the entry fails its own test and is removed, the rule unchanged.
KNOWN_VIOLATIONS: dict = {}


@functools.cache
def _paths() -> dict:
  """Module name -> file, for every .py file of the project's packages."""
  out = {}
  for package in PACKAGES:
    for path in glob.glob(os.path.join(ROOT, package, "**", "*.py"), recursive=True):
      name = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
      out[name.removesuffix(".__init__")] = path
  return out


def _file_imports(name: str, path: str) -> dict:
  """{imported module: "file:line" of its first import} of module `name` at `path`; a project
  name resolved to the project module it is (`from tba_jax import model`: tba_jax.model),
  others as written (`from jax import numpy`: jax, jax.numpy)."""
  package = name if path.endswith("__init__.py") else name.rsplit(".", 1)[0]
  found = {}
  for node in ast.walk(ast.parse(open(path).read())):
    if isinstance(node, ast.Import):
      names = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        parts = package.split(".")[:len(package.split(".")) - node.level + 1]
        base = ".".join(parts + ([base] if base else []))
      names = [base] + [f"{base}.{a.name}" for a in node.names]
    else:
      continue
    for imported in names:
      if imported.split(".")[0] in PACKAGES and imported not in _paths():
        continue  # a name from a project module (`from tba_jax.model import Params`)
      found.setdefault(imported, f"{os.path.relpath(path, ROOT)}:{node.lineno}")
  found.pop(name, None)
  return found


@functools.cache
def _imports() -> dict:
  """Module name -> its imports (_file_imports), for every module of the project."""
  return {name: _file_imports(name, path) for name, path in _paths().items()}


def _violations(importer: str, forbidden: str, imports=None) -> dict:
  """(module, imported) -> "file:line" of each import that breaks the rule."""
  return {(name, imported): where
          for name, found in (imports or _imports()).items() if re.fullmatch(importer, name)
          for imported, where in found.items() if re.fullmatch(forbidden, imported)}


def test_the_design_states_at_least_eight_rules_each_about_modules_that_exist():
  assert len(RULES) >= 8
  for importer, forbidden, why in RULES:
    assert any(re.fullmatch(importer, m) for m in _paths()), (importer, why)
    assert why


@pytest.mark.parametrize("importer, forbidden, why", RULES, ids=[r[2][:40] for r in RULES])
def test_no_module_imports_across_a_rule(importer, forbidden, why):
  broken = {k: v for k, v in _violations(importer, forbidden).items()
            if k not in KNOWN_VIOLATIONS}
  assert not broken, "\n".join(f"{where} imports {imported}: {why}"
                               for (_, imported), where in sorted(broken.items()))


@pytest.mark.parametrize("violation", sorted(KNOWN_VIOLATIONS))
def test_each_known_violation_still_breaks_a_rule(violation):
  # Mended: remove it from KNOWN_VIOLATIONS, so that the rule holds it from now on.
  assert any(violation in _violations(importer, forbidden) for importer, forbidden, _ in RULES), (
      f"{violation} no longer happens: remove it from KNOWN_VIOLATIONS")


def test_an_import_inside_a_function_breaks_a_rule_and_is_named_by_file_and_line(tmp_path):
  path = tmp_path / "sampler.py"
  path.write_text("import numpy as np\n\n\ndef pick():\n  from . import continuous\n"
                  "  from tba_jax.model import Params\n")
  found = _file_imports("tba_jax.sampler", str(path))
  at = lambda line: f"{os.path.relpath(path, ROOT)}:{line}"
  assert found == {"numpy": at(1), "tba_jax": at(5), "tba_jax.continuous": at(5),
                   "tba_jax.model": at(6)}
  rule = next(r for r in RULES if r[0] == r"tba_jax\.sampler")
  assert _violations(*rule[:2], imports={"tba_jax.sampler": found}) == {
      ("tba_jax.sampler", "tba_jax.continuous"): at(5)}


def _room(name: str) -> str:
  return "tba_jax.tasks" if name.startswith("tba_jax.tasks") else name


def test_no_import_circle_with_tasks_as_one_room():
  graph = {}
  for name, found in _imports().items():
    if name.split(".")[0] == "tba_jax":
      deps = {_room(d) for d in found if d in _paths() and d.startswith("tba_jax")}
      graph.setdefault(_room(name), set()).update(deps - {_room(name)})
  state, circles = {}, []

  def visit(node, path):
    state[node] = "open"
    for dep in sorted(graph.get(node, ())):
      if state.get(dep) == "open":
        circles.append(path[path.index(dep):] + [node, dep])
      elif dep not in state:
        visit(dep, path + [node])
    state[node] = "done"

  for node in sorted(graph):
    if node not in state:
      visit(node, [])
  assert not circles, circles


@pytest.mark.parametrize("config", ["tldr", "redteam", "math"])
def test_other_experiments_configs_do_not_import_the_gsm8k_recipes(config):
  assert "configs.gsm8k" not in _imports()[f"configs.{config}"]


# Imports every config file in turn (and builds and validates the GSM8K one), printing the
# modules each one loaded.
_PROBE = """
import importlib, json, sys
loaded = {}
for name in sys.argv[1:]:
  before = set(sys.modules)
  importlib.import_module(name)
  loaded[name] = sorted(set(sys.modules) - before)
before = set(sys.modules)
from tba_jax import config_checks
config_checks.validate(importlib.import_module("configs.gsm8k").get_config("tiny"))
loaded["validating configs/gsm8k.py:tiny"] = sorted(set(sys.modules) - before)
print(json.dumps(loaded))
"""


def test_importing_and_validating_a_config_loads_no_jax_and_only_the_declarations():
  configs = sorted(n for n in _paths() if re.fullmatch(r"configs\.\w+", n))  # configs/*.py
  assert "configs.gsm8k" in configs and "configs.common" in configs
  out = subprocess.run([sys.executable, "-c", _PROBE, *configs], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
  assert out.returncode == 0, out.stderr[-3000:]
  loaded = json.loads(out.stdout.splitlines()[-1])
  assert set(configs) < set(loaded)
  for config, modules in loaded.items():
    heavy = [m for m in modules if re.fullmatch(_JAX + r"|numpy(\..*)?", m) or
             (m.startswith("tba_jax") and m not in DECLARATIONS)]
    assert not heavy, f"{config} loads {heavy}"
