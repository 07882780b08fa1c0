r"""A run's newest checkpoint exported as the run's end exports its policy: Hugging Face format
(what transformers and vLLM load), with LoRA merged into the base and the adapter beside it in
PEFT's format (tba_jax/loop.py export_checkpoint).

  tba export EXPERIMENT --workdir DIR [--out PATH]

For a run stopped before its end (a finished run has exported already, to DIR/export). The
config is DIR/config.yaml unless --config names another; the checkpoint is restored as a
resume restores it, so a config that computes something else is refused by name. --out:
where to write (default DIR/export, which the run's own end would write again).
"""
import os

from absl import flags

_OUT = flags.DEFINE_string("out", "", "Directory to export to ('' = WORKDIR/export).")


def export(config, workdir: str) -> None:
  """launch.main's job (module doc)."""
  from tba_jax import loop
  out = _OUT.value or os.path.join(workdir, "export")
  step = loop.export_checkpoint(config, workdir, out)
  print(f"Exported the checkpoint of step {step} from {workdir}.")
