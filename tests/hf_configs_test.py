"""config.json parsing per architecture (published configs' fields) and its refusals."""
import pytest

from tba_jax import hf_configs, model
from tba_jax.model_config import EncoderConfig, ModelConfig

# The fields of the published config.json files the experiments use.
PYTHIA_160M = {  # EleutherAI/pythia-160m (transformers 4.24 era: rotary_pct, rotary_emb_base)
    "architectures": ["GPTNeoXForCausalLM"], "bos_token_id": 0, "eos_token_id": 0,
    "hidden_act": "gelu", "hidden_size": 768, "intermediate_size": 3072, "layer_norm_eps": 1e-05,
    "max_position_embeddings": 2048, "model_type": "gpt_neox", "num_attention_heads": 12,
    "num_hidden_layers": 12, "rotary_emb_base": 10000, "rotary_pct": 0.25,
    "tie_word_embeddings": False, "use_parallel_residual": True, "vocab_size": 50304}
GPT2 = {  # gpt2
    "activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"],
    "bos_token_id": 50256, "eos_token_id": 50256, "layer_norm_epsilon": 1e-05,
    "model_type": "gpt2", "n_ctx": 1024, "n_embd": 768, "n_head": 12, "n_layer": 12,
    "n_positions": 1024, "vocab_size": 50257}
MINILM = {  # sentence-transformers/all-MiniLM-L6-v2
    "architectures": ["BertModel"], "hidden_act": "gelu", "hidden_size": 384,
    "intermediate_size": 1536, "layer_norm_eps": 1e-12, "max_position_embeddings": 512,
    "model_type": "bert", "num_attention_heads": 12, "num_hidden_layers": 6, "pad_token_id": 0,
    "position_embedding_type": "absolute", "type_vocab_size": 2, "vocab_size": 30522}
HATE = {  # facebook/roberta-hate-speech-dynabench-r4-target
    "architectures": ["RobertaForSequenceClassification"], "bos_token_id": 0, "eos_token_id": 2,
    "hidden_act": "gelu", "hidden_size": 768, "id2label": {"0": "nothate", "1": "hate"},
    "intermediate_size": 3072, "layer_norm_eps": 1e-05, "max_position_embeddings": 514,
    "model_type": "roberta", "num_attention_heads": 12, "num_hidden_layers": 12,
    "pad_token_id": 1, "position_embedding_type": "absolute", "type_vocab_size": 1,
    "vocab_size": 50265}


def test_pythia_legacy_rotary_fields():
  cfg = hf_configs.config_from_hf(PYTHIA_160M)
  assert isinstance(cfg, ModelConfig)
  assert (cfg.rotary_dim, cfg.rope_theta, cfg.parallel_residual, cfg.norm) == (16, 10000.0, True,
                                                                              "layer")
  assert (cfg.activation, cfg.gated_mlp, cfg.qkv_bias, cfg.bias) == ("gelu", False, True, True)
  assert model.count_params(cfg) == 162_322_944


def test_gpt2_fields():
  cfg = hf_configs.config_from_hf(GPT2)
  assert (cfg.position_embedding, cfg.max_position_embeddings, cfg.mlp_dim) == ("learned", 1024, 3072)
  assert (cfg.activation, cfg.tie_embeddings, cfg.num_labels) == ("gelu_tanh", True, 0)
  assert model.count_params(cfg) == 124_439_808


def test_minilm_is_a_bare_bert_and_the_toxicity_model_a_two_label_roberta():
  minilm = hf_configs.config_from_hf(MINILM)
  assert isinstance(minilm, EncoderConfig)
  assert (minilm.num_labels, minilm.padding_positions, minilm.head_dim) == (0, False, 32)
  hate = hf_configs.config_from_hf(HATE)
  assert (hate.num_labels, hate.padding_positions, hate.pad_token_id, hate.type_vocab_size) == \
      (2, True, 1, 1)


def test_sequence_classification_label_count():
  c = dict(PYTHIA_160M, architectures=["GPTNeoXForSequenceClassification"])
  assert hf_configs.config_from_hf(c).num_labels == 2  # transformers' default
  assert hf_configs.config_from_hf(dict(c, num_labels=1)).num_labels == 1
  assert hf_configs.config_from_hf(dict(c, id2label={"0": "reward"})).num_labels == 1


@pytest.mark.parametrize("config,message", [
    (dict(MINILM, position_embedding_type="relative_key"), "position_embedding_type"),
    (dict(MINILM, is_decoder=True), "decoder"),
    (dict(GPT2, add_cross_attention=True), "cross-attention"),
    (dict(PYTHIA_160M, attention_bias=False), "attention_bias=false"),
    (dict(PYTHIA_160M, hidden_act="relu"), "hidden_act='relu'"),
    (dict(PYTHIA_160M, architectures=["GPTNeoXModel"]), "unsupported head"),
    (dict(MINILM, architectures=["BertForMaskedLM"]), "BertForMaskedLM"),
])
def test_unsupported_variants_are_named(config, message):
  with pytest.raises(ValueError, match=message):
    hf_configs.config_from_hf(config)


def test_export_refuses_encoders():
  with pytest.raises(ValueError, match="decoders only"):
    hf_configs.config_to_hf(hf_configs.config_from_hf(MINILM))
