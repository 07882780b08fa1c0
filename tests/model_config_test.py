"""Architecture configs refuse what no model can be built from, naming the field."""
import pytest

from tba_jax.model_config import EncoderConfig, ModelConfig

SMALL = dict(vocab_size=8, dim=8, mlp_dim=8, num_layers=1, num_heads=2, num_kv_heads=2, head_dim=4)


@pytest.mark.parametrize("change,message", [
    (dict(norm="batch"), r"norm must be one of \('rms', 'rms_plus_one', 'layer'\)"),
    (dict(sliding_window=4), "give both"),
    (dict(sliding_layers=(0,)), "give both"),
    (dict(sliding_window=4, sliding_layers=(1,)), r"indices must lie in \[0, 1\)"),
    (dict(local_rope_theta=1e4), "local_rope_theta needs sliding_layers"),
    (dict(position_embedding="alibi"), "position_embedding must be"),
    (dict(activation="relu"), "activation must be one of"),
    (dict(num_labels=-1), "num_labels=-1"),
    (dict(head_dim=6, rotary_fraction=0.5), "3 rotary dims"),
    (dict(head_dim=3), "3 rotary dims"),
])
def test_bad_decoder_configs_are_refused(change, message):
  with pytest.raises(ValueError, match=message):
    ModelConfig(**{**SMALL, **change})


def test_learned_positions_need_no_rotary_dims():
  cfg = ModelConfig(**{**SMALL, "head_dim": 3}, position_embedding="learned")
  assert cfg.rotary_dim == 3  # unused without rope


def test_rotary_dim_truncates_like_transformers():
  assert ModelConfig(**{**SMALL, "head_dim": 80}, rotary_fraction=0.25).rotary_dim == 20


def test_bad_encoder_configs_are_refused():
  with pytest.raises(ValueError, match="dim=10 is not a multiple of num_heads=4"):
    EncoderConfig(vocab_size=8, dim=10, mlp_dim=8, num_layers=1, num_heads=4)
  with pytest.raises(ValueError, match="dtype"):
    EncoderConfig(vocab_size=8, dim=8, mlp_dim=8, num_layers=1, num_heads=2, dtype="float16")
