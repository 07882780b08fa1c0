"""notebooks/colab.ipynb, executed as CI runs it: TBA_QUICK=1 on a CPU, offline."""
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOK = os.path.join(ROOT, "notebooks", "colab.ipynb")


def test_the_colab_notebook_runs_in_quick_mode(tmp_path):
  nbformat = pytest.importorskip("nbformat")
  from nbclient import NotebookClient
  nb = nbformat.read(NOTEBOOK, as_version=4)
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # a fresh runtime: 1 device
  env.update(TBA_QUICK="1", HF_HUB_OFFLINE="1", JAX_PLATFORMS="cpu",
             PYTHONPATH=ROOT)
  client = NotebookClient(nb, timeout=600, kernel_name="python3",
                          resources={"metadata": {"path": ROOT}})
  client.execute(env=env)  # raises CellExecutionError naming the cell that failed
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
