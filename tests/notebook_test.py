"""notebooks/colab.ipynb, executed as CI runs it: TBA_QUICK=1 on a CPU, offline."""
import os
import re
import shlex
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOK = os.path.join(ROOT, "notebooks", "colab.ipynb")


@pytest.mark.slow  # ~35 s: the whole notebook; the checks below of how it starts stay default
def test_the_colab_notebook_runs_in_quick_mode_by_readme_s_command(tmp_path):
  nbformat = pytest.importorskip("nbformat")
  readme = open(os.path.join(ROOT, "README.md")).read()
  command = re.search(r"Its quick mode.*?```bash\n(.*?)\n```", readme, re.S).group(1)
  assert command == ("TBA_QUICK=1 HF_HUB_OFFLINE=1 jupyter execute notebooks/colab.ipynb "
                     "--output=/tmp/colab_quick")
  *assignments, program, subcommand, notebook, _ = shlex.split(command)
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # a fresh runtime: 1 device
  env.update(dict(a.split("=") for a in assignments), JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
  executed = tmp_path / "colab_quick"
  out = subprocess.run([os.path.join(os.path.dirname(sys.executable), program), subcommand,
                        notebook, f"--output={executed}", "--timeout=600"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=1200)
  assert out.returncode == 0, out.stderr[-4000:]  # a failing cell is named there
  nb = nbformat.read(f"{executed}.ipynb", as_version=4)
  text = "\n".join(o.get("text", "") for cell in nb.cells if cell.cell_type == "code"
                   for o in cell.get("outputs", []) if o.get("output_type") == "stream")
  assert "QUICK mode" in text
  assert "TB loss" in text and "reward" in text
  assert "'adapter_config.json', 'adapter_model.safetensors'" in text
  assert "peft (base + adapter) vs the merged export: max |logit difference|" in text
  gap = float(text.split("max |logit difference| ")[1].split()[0])
  assert gap < 1e-4
  # The live plot was drawn (a figure in the training cell's outputs).
  assert any(o.get("data", {}).get("image/png") for cell in nb.cells
             for o in cell.get("outputs", []) if o.get("output_type") in ("display_data",
                                                                            "update_display_data"))


def _setup_cell():
  nbformat = pytest.importorskip("nbformat")
  cell = next(c for c in nbformat.read(NOTEBOOK, as_version=4).cells if c.cell_type == "code")
  assert cell.source.splitlines()[0].startswith("# Setup.")
  return cell.source


def test_opened_outside_a_checkout_without_tba_source_it_stops_with_one_sentence(tmp_path):
  # A fresh runtime: tba_jax not importable (sys.modules[...] = None hides this checkout's),
  # the working directory not a checkout, TBA_SOURCE unset.
  code = "import sys; sys.modules['tba_jax'] = None\n" + _setup_cell()
  env = {k: v for k, v in os.environ.items() if k not in ("TBA_SOURCE", "PYTHONPATH")}
  out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=60)
  assert out.returncode == 1 and out.stdout == ""
  assert out.stderr == ("tba_jax is not installed here and this is not a checkout of it: set "
                        "TBA_SOURCE at the top of this cell to your copy's git URL or a tba_jax "
                        "wheel, then run the cell again.\n")
  assert os.listdir(tmp_path) == []  # nothing cloned or installed


def test_inside_a_checkout_it_needs_no_source(tmp_path):
  # Opened from notebooks/ of a checkout (tba_jax/ beside it), nothing installed: it goes on.
  code = "import sys; sys.modules['tba_jax'] = None\n" + _setup_cell()
  env = {k: v for k, v in os.environ.items() if k not in ("TBA_SOURCE", "PYTHONPATH")}
  out = subprocess.run([sys.executable, "-c", code], cwd=os.path.join(ROOT, "notebooks"),
                       env=env, capture_output=True, text=True, timeout=60)
  assert out.returncode == 0, out.stderr
  assert out.stdout == f"full mode, in {ROOT}\n"
