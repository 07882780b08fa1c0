"""BERT / RoBERTa encoders: classifier scores and sentence embeddings against
transformers, padding, sharding, refused uses."""
import jax
import numpy as np
import pytest

from hf_models import PAD, hf_embeddings, hf_scores, make_model, padded_batch
from tba_jax import hf_checkpoints, model, sharding
from tba_jax.model import EncoderConfig


@pytest.fixture(scope="module")
def load(tmp_path_factory):
  """load(name, head) -> (hf model, path, cfg, params), each checkpoint built once."""
  cache = {}

  def get(name, head):
    if (name, head) not in cache:
      hf = make_model(name, head)
      path = str(tmp_path_factory.mktemp(f"{name}_{head}"))
      hf.save_pretrained(path)
      cache[name, head] = (hf, path, *hf_checkpoints.load(path))
    return cache[name, head]

  return get


def _batch(name, side, seed=0):
  return padded_batch(np.random.default_rng(seed), [10, 4, 1], side, pad=PAD.get(name, 0))


ALL = [("bert", "classifier"), ("roberta", "classifier"), ("bert", "bare"), ("roberta", "bare")]


@pytest.mark.parametrize("name,head", ALL)
def test_config_describes_the_checkpoint(name, head, load):
  _, _, cfg, _ = load(name, head)
  assert isinstance(cfg, EncoderConfig)
  assert cfg.padding_positions == (name == "roberta") and cfg.pad_token_id == PAD.get(name, 0)
  assert cfg.num_labels == (3 if head == "classifier" else 0)


@pytest.mark.parametrize("name", ["bert", "roberta"])
def test_scores_match_transformers_left_and_right_padded(name, load):
  hf, _, cfg, params = load(name, "classifier")
  for side in ("left", "right"):
    tokens, mask = _batch(name, side)
    ours = np.asarray(model.scores(cfg, params, tokens, mask))
    assert ours.shape == (3, 3) and ours.dtype == np.float32
    np.testing.assert_allclose(ours, hf_scores(hf, tokens, mask), atol=1e-4, rtol=0)


@pytest.mark.parametrize("name", ["bert", "roberta"])
def test_embeddings_match_sentence_transformers_mean_pooling(name, load):
  hf, _, cfg, params = load(name, "bare")
  for side in ("left", "right"):
    tokens, mask = _batch(name, side, seed=1)
    ours = np.asarray(model.embed(cfg, params, tokens, mask))
    assert ours.shape == (3, cfg.dim) and ours.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(ours, axis=-1), 1.0, atol=1e-6)
    cosine = np.sum(ours * hf_embeddings(hf, tokens, mask), axis=-1)
    assert cosine.min() >= 0.99999, cosine


def test_roberta_embedding_does_not_depend_on_the_padding_side(load):
  # RoBERTa numbers real tokens from pad_token_id + 1 wherever the padding sits;
  # BERT numbers by index, so left padding shifts its positions (as in transformers).
  _, _, cfg, params = load("roberta", "bare")
  left, right = (np.asarray(model.embed(cfg, params, *_batch("roberta", side, seed=2)))
                 for side in ("left", "right"))
  np.testing.assert_allclose(left, right, atol=1e-5)


def test_scores_without_a_head_and_logits_of_an_encoder_are_refused(load):
  _, _, cfg, params = load("bert", "bare")
  with pytest.raises(ValueError, match="no sequence-classification head"):
    model.scores(cfg, params, *_batch("bert", "right"))
  with pytest.raises(ValueError, match="encoder has no LM head"):
    model.logits(cfg, params, *_batch("bert", "right"))


@pytest.mark.parametrize("name,head", [("bert", "classifier"), ("roberta", "bare")])
def test_encoder_shards_on_a_searcher_mesh_with_equal_outputs(name, head, load):
  _, path, cfg, ref_params = load(name, head)
  mesh = sharding.make_mesh("searcher", jax.devices()[4:], tensor=2)
  _, params = hf_checkpoints.load(path, mesh=mesh, role="searcher")
  want = sharding.param_shardings(cfg, "searcher", mesh)
  assert jax.tree.map(lambda x: x.sharding, params) == want
  assert want["layers"]["attn"]["q"].spec == jax.sharding.PartitionSpec(None, None, "tensor", None)
  tokens, mask = padded_batch(np.random.default_rng(3), [7, 2, 5, 3], "right",
                              pad=PAD.get(name, 0))
  rows = sharding.batch_sharding("searcher", mesh)
  fn = model.scores if head == "classifier" else model.embed
  got = fn(cfg, params, jax.device_put(tokens, rows), jax.device_put(mask, rows))
  np.testing.assert_allclose(np.asarray(got), np.asarray(fn(cfg, ref_params, tokens, mask)),
                             atol=1e-5, rtol=0)
