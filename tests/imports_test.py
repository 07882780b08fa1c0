"""The layering: no import circle among tba_jax's modules (tasks/ one room, imports inside
functions counted), and the lower layers do not reach up."""
import ast
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _modules() -> dict:
  """Module name -> the set of tba_jax modules it imports, anywhere in its file."""
  paths = {}
  for folder, _, files in os.walk(os.path.join(ROOT, "tba_jax")):
    for f in files:
      if f.endswith(".py"):
        path = os.path.join(folder, f)
        name = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
        paths[name.removesuffix(".__init__")] = path
  graph = {}
  for name, path in paths.items():
    package = name if path.endswith("__init__.py") else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(open(path).read())):
      if isinstance(node, ast.Import):
        found.update(a.name for a in node.names)
      elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
          parts = package.split(".")[:len(package.split(".")) - node.level + 1]
          base = ".".join(parts + ([base] if base else []))
        found.add(base)
        found.update(f"{base}.{a.name}" for a in node.names)
    graph[name] = {m for m in found if m in paths and m != name}
  return graph


def _room(name: str) -> str:
  return "tba_jax.tasks" if name.startswith("tba_jax.tasks") else name


def test_no_import_circle_with_tasks_as_one_room():
  graph = {}
  for name, deps in _modules().items():
    graph.setdefault(_room(name), set()).update(_room(d) for d in deps if _room(d) != _room(name))
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


@pytest.mark.parametrize("module, forbidden", [
    ("tba_jax.sampler", "tba_jax.continuous"),    # the sampler knows nothing of streaming
    ("tba_jax.searcher", "tba_jax.train_step"),   # sequence log-probs live in the model layer
    ("tba_jax.lora", "tba_jax.hf_layouts"),       # the model never depends on formats
])
def test_lower_layers_do_not_import_upper_ones(module, forbidden):
  assert forbidden not in _modules()[module]


@pytest.mark.parametrize("config", ["tldr", "redteam", "math"])
def test_other_experiments_configs_do_not_import_the_gsm8k_recipes(config):
  tree = ast.parse(open(os.path.join(ROOT, "configs", f"{config}.py")).read())
  names = {a.name for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
           for a in n.names} | {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
  assert "gsm8k" not in names and "configs.gsm8k" not in names
