"""The PartitionSpec tables cover every parameter of every architecture and head."""
import jax
import pytest
from jax.sharding import PartitionSpec as P

from tba_jax import model, sharding
from tba_jax.model_config import EncoderConfig, ModelConfig

_DECODER = dict(vocab_size=64, dim=32, mlp_dim=64, num_layers=2, num_heads=4, num_kv_heads=2,
                head_dim=8)
_NEOX = dict(norm="layer", parallel_residual=True, rotary_fraction=0.25, activation="gelu",
             gated_mlp=False, qkv_bias=True, bias=True)
CONFIGS = {
    "llama": ModelConfig(**_DECODER),
    "qwen2_classifier": ModelConfig(**_DECODER, qkv_bias=True, num_labels=2),
    "gpt_neox": ModelConfig(**_DECODER, **_NEOX),
    "gpt2_classifier": ModelConfig(**_DECODER, **dict(_NEOX, parallel_residual=False),
                                   position_embedding="learned", num_labels=1),
    "gated_with_biases": ModelConfig(**_DECODER, bias=True),
    "bert_classifier": EncoderConfig(vocab_size=64, dim=32, mlp_dim=64, num_layers=2, num_heads=4,
                                     num_labels=3),
    "roberta": EncoderConfig(vocab_size=64, dim=32, mlp_dim=64, num_layers=2, num_heads=4,
                             padding_positions=True, model_type="roberta"),
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("role", ["trainer", "searcher"])
def test_every_parameter_has_a_rule(name, role):
  mesh = sharding.make_mesh(role, jax.devices()[:4], tensor=2)
  specs = sharding.param_specs(CONFIGS[name], role, mesh)  # raises naming a leaf without a rule
  shapes = model.param_shapes(CONFIGS[name])
  assert jax.tree.structure(specs, is_leaf=lambda x: isinstance(x, P)) == jax.tree.structure(shapes)


def test_new_leaves_shard_like_their_dimensions():
  mesh = sharding.make_mesh("searcher", jax.devices()[:4], tensor=2)
  gpt2 = sharding.param_specs(CONFIGS["gpt2_classifier"], "searcher", mesh)
  assert gpt2["pos_embed"] == P(None, None)  # positions and the model dim stay whole
  assert gpt2["score"] == P(None, None)  # labels are never split
  assert gpt2["layers"]["mlp"]["up_bias"] == P(None, "tensor")
  mesh = sharding.make_mesh("trainer", jax.devices()[:4], tensor=1)
  bert = sharding.param_specs(CONFIGS["bert_classifier"], "trainer", mesh)
  assert bert["pooler"] == P("fsdp", None) and bert["type_embed"] == P(None, "fsdp")


def test_a_leaf_without_a_rule_is_named():
  mesh = sharding.make_mesh("searcher", jax.devices()[:1])
  with pytest.raises(KeyError, match="no sharding rule for parameter 'layers/attn/extra'"):
    sharding.param_spec("searcher", "layers/attn/extra", (2, 4), mesh)
