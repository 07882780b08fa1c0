"""HF tensor names per architecture: one tensor per parameter leaf, the names a checkpoint
may hold a tensor under."""
import jax

from hf_configs_test import GPT2, HATE, MINILM, PYTHIA_160M
from tba_jax import hf_layouts, model
from tba_jax.hf_configs import config_from_hf


def test_aliases_cover_bare_backbones_legacy_norms_and_pythia_heads():
  neox = config_from_hf(PYTHIA_160M)
  assert hf_layouts.aliases(neox, "embed_out.weight") == ["embed_out.weight", "lm_head.weight"]
  bert = config_from_hf(MINILM)
  assert hf_layouts.aliases(bert, "bert.embeddings.LayerNorm.bias") == [
      "bert.embeddings.LayerNorm.bias", "embeddings.LayerNorm.bias",
      "bert.embeddings.LayerNorm.beta", "embeddings.LayerNorm.beta"]


def test_every_parameter_has_one_hf_tensor():
  for c in (PYTHIA_160M, GPT2, MINILM, HATE, dict(GPT2, architectures=["GPT2ForSequenceClassification"])):
    cfg = config_from_hf(c)
    leaves = [leaf for spec in hf_layouts.leaf_specs(cfg) for leaf in spec.leaves]
    assert len(leaves) == len(set(leaves))
    shapes = model.param_shapes(cfg)
    flat = {"/".join(k.key for k in path)
            for path, _ in jax.tree_util.tree_leaves_with_path(shapes)}
    assert set(leaves) == flat
