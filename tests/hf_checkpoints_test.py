"""Checkpoint I/O: safetensors round trip, GGUF, pytorch_model.bin, sharded placement,
name variants, bad inputs."""
import json
import os

import jax
import numpy as np
import pytest

from hf_models import (edit_config, hf_logits, hf_scores, left_padded_batch, make_hf_model,
                       make_model, padded_batch)
from tba_jax import hf_checkpoints, model, sharding


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
  """llama.cpp's convert script permutation of q/k rows (what GGUF files hold)."""
  return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _write_gguf(hf, path):
  import gguf
  c = hf.config
  w = gguf.GGUFWriter(path, "llama")
  w.add_block_count(c.num_hidden_layers)
  w.add_context_length(c.max_position_embeddings)
  w.add_embedding_length(c.hidden_size)
  w.add_feed_forward_length(c.intermediate_size)
  w.add_head_count(c.num_attention_heads)
  w.add_head_count_kv(c.num_key_value_heads)
  w.add_rope_freq_base(c.rope_parameters["rope_theta"])
  w.add_layer_norm_rms_eps(c.rms_norm_eps)
  w.add_rope_dimension_count(c.hidden_size // c.num_attention_heads)
  w.add_vocab_size(c.vocab_size)
  sd = {k: v.numpy() for k, v in hf.state_dict().items()}
  names = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
           "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
           "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
           "mlp.down_proj": "ffn_down"}
  w.add_tensor("token_embd.weight", sd["model.embed_tokens.weight"])
  w.add_tensor("output_norm.weight", sd["model.norm.weight"])
  for i in range(c.num_hidden_layers):
    for hf_name, g in names.items():
      t = sd[f"model.layers.{i}.{hf_name}.weight"]
      if g == "attn_q":
        t = _permute(t, c.num_attention_heads)
      elif g == "attn_k":
        t = _permute(t, c.num_key_value_heads)
      w.add_tensor(f"blk.{i}.{g}.weight", t)
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
  hf = make_hf_model("llama_tied", seed=3)
  path = str(tmp_path_factory.mktemp("llama"))
  hf.save_pretrained(path)
  return hf, path


def test_gguf_with_llamacpp_permutation_loads_to_same_logits(llama_dir, tmp_path):
  hf, path = llama_dir
  gguf_path = str(tmp_path / "tiny.gguf")
  _write_gguf(hf, gguf_path)
  cfg_hf, params_hf = hf_checkpoints.load(path)
  cfg, params = hf_checkpoints.load(gguf_path)
  assert cfg.tie_embeddings  # no output.weight in the file
  tokens, mask = left_padded_batch(np.random.default_rng(4), [7, 4])
  a = np.asarray(model.logits(cfg, params, tokens, mask))
  b = np.asarray(model.logits(cfg_hf, params_hf, tokens, mask))
  np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)


@pytest.mark.parametrize("variant", ["qwen2", "llama3_scaling"])
def test_save_hf_round_trip_through_transformers(variant, tmp_path):
  import transformers
  hf = make_hf_model(variant, seed=5)
  src = str(tmp_path / "src")
  hf.save_pretrained(src)
  cfg, params = hf_checkpoints.load(src)
  out = str(tmp_path / "export")
  hf_checkpoints.save_hf(cfg, params, out)
  reloaded = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
  tokens, mask = left_padded_batch(np.random.default_rng(5), [6, 3])
  ref = hf_logits(hf, tokens, mask)
  got = hf_logits(reloaded, tokens, mask)
  real = mask.astype(bool)
  np.testing.assert_allclose(got[real], ref[real], atol=1e-5, rtol=0)
  assert hf_checkpoints.read_config(out) == cfg
  with open(os.path.join(out, "config.json")) as f:  # serving stacks pick the class from it
    assert json.load(f)["architectures"] == [type(hf).__name__]


def test_save_hf_sharded_index_and_bfloat16(llama_dir, tmp_path):
  _, path = llama_dir
  cfg, params = hf_checkpoints.load(path, dtype="bfloat16")
  assert params["embed"].dtype == np.dtype("bfloat16")
  hf_checkpoints.save_hf(cfg, params, str(tmp_path), max_shard_bytes=20_000)
  assert os.path.exists(tmp_path / "model.safetensors.index.json")
  cfg2, params2 = hf_checkpoints.load(str(tmp_path), dtype="bfloat16")
  assert cfg2 == cfg
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(params2)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_load_places_each_leaf_on_its_mesh_sharding(llama_dir):
  _, path = llama_dir
  mesh = sharding.make_mesh("trainer", jax.devices()[:4])
  cfg, params = hf_checkpoints.load(path, mesh=mesh, role="trainer")
  want = sharding.param_shardings(cfg, "trainer", mesh)
  for leaf, s in zip(jax.tree.leaves(params), jax.tree.leaves(want)):
    assert leaf.sharding == s
  _, ref = hf_checkpoints.load(path)
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(ref)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_unsupported_architecture_is_named(llama_dir, tmp_path):
  path = edit_config(llama_dir[1], tmp_path, model_type="falcon", architectures=["FalconForCausalLM"])
  with pytest.raises(ValueError, match="unsupported architecture model_type='falcon'"):
    hf_checkpoints.load(path)


def test_wrong_tensor_shape_is_named(llama_dir, tmp_path):
  path = edit_config(llama_dir[1], tmp_path, intermediate_size=96)
  with pytest.raises(ValueError, match=r"model.layers.0.mlp.gate_proj.weight.*\(128, 64\)"):
    hf_checkpoints.load(path)


def test_missing_tensor_is_named(llama_dir, tmp_path):
  path = edit_config(llama_dir[1], tmp_path, tie_word_embeddings=False)
  with pytest.raises(KeyError, match="lm_head.weight"):
    hf_checkpoints.load(path)


def test_checkpoint_that_does_not_fit_the_model_is_refused(llama_dir):
  cfg, _ = hf_checkpoints.load(llama_dir[1])
  with pytest.raises(ValueError, match="does not fit the model"):
    hf_checkpoints.load(llama_dir[1], model_config=cfg.replace(num_layers=3))


def test_missing_path_and_offline_hub_give_clear_errors(tmp_path):
  with pytest.raises(FileNotFoundError, match="no such file"):
    hf_checkpoints.load(str(tmp_path / "nope"))
  with pytest.raises(FileNotFoundError, match="no config.json"):
    hf_checkpoints.load(str(tmp_path))
  with pytest.raises(OSError, match="could not fetch 'someone/some-model'"):
    hf_checkpoints.load("someone/some-model")


@pytest.mark.slow
def test_real_smollm2_gguf_matches_transformers_gguf_loading():
  import torch
  import transformers
  from tba_jax import tokenizer
  path = hf_checkpoints.smollm2_gguf_path()
  cfg, params = hf_checkpoints.load(path)
  tok = tokenizer.from_gguf(path)
  data = os.path.join(os.path.dirname(__file__), "data", "gsm8k_test.jsonl")
  question = json.loads(open(data).readline())["question"]
  ids = tok.encode("[MATH TASK] Problem:\n" + question + "\n\nSolution:\n")
  ours = np.asarray(model.logits(cfg, params, np.array([ids])))
  ref = transformers.AutoModelForCausalLM.from_pretrained(
      os.path.dirname(path), gguf_file=os.path.basename(path), dtype=torch.float32)
  hf_tok = transformers.AutoTokenizer.from_pretrained(os.path.dirname(path),
                                                      gguf_file=os.path.basename(path))
  assert hf_tok.encode(question, add_special_tokens=False) == tok.encode(question)
  with torch.no_grad():
    want = ref(torch.tensor([ids])).logits.numpy()
  np.testing.assert_allclose(ours, want, atol=1e-3, rtol=0)


# ---------------------------------------------------------------------------
# GPT-NeoX / GPT-2 / encoders: export, pytorch_model.bin, name variants, heads.
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("name,head", [("gpt_neox", "lm"), ("gpt2", "lm"),
                                       ("gpt_neox", "classifier")])
def test_save_hf_round_trip_gpt_neox_and_gpt2(name, head, tmp_path):
  import transformers
  hf = make_model(name, head, seed=6)
  hf.save_pretrained(str(tmp_path / "src"))
  cfg, params = hf_checkpoints.load(str(tmp_path / "src"))
  out = str(tmp_path / "export")
  hf_checkpoints.save_hf(cfg, params, out)
  assert hf_checkpoints.read_config(out) == cfg
  auto = (transformers.AutoModelForCausalLM if head == "lm"
          else transformers.AutoModelForSequenceClassification)
  reloaded = auto.from_pretrained(out).eval()
  assert type(reloaded) is type(hf)
  tokens, mask = padded_batch(np.random.default_rng(6), [6, 3], "right")
  ref, got = (hf_logits(m, tokens, mask) if head == "lm" else hf_scores(m, tokens, mask)
              for m in (hf, reloaded))
  np.testing.assert_allclose(got, ref, atol=1e-5, rtol=0)


def _bin_dir(hf, path, shards=1, dtype=None):
  """A checkpoint directory holding only config.json + pytorch_model.bin (torch.save)."""
  import torch
  os.makedirs(path, exist_ok=True)
  hf.config.save_pretrained(path)
  state = {k: (v if dtype is None else v.to(dtype)).contiguous() for k, v in hf.state_dict().items()}
  if shards == 1:
    torch.save(state, os.path.join(path, "pytorch_model.bin"))
    return str(path)
  names, weight_map = sorted(state), {}
  for i in range(shards):
    fname = f"pytorch_model-{i + 1:05d}-of-{shards:05d}.bin"
    part = {k: state[k] for k in names[i::shards]}
    torch.save(part, os.path.join(path, fname))
    weight_map.update({k: fname for k in part})
  with open(os.path.join(path, "pytorch_model.bin.index.json"), "w") as f:
    json.dump({"metadata": {}, "weight_map": weight_map}, f)
  return str(path)


@pytest.fixture(scope="module")
def roberta_classifier(tmp_path_factory):
  hf = make_model("roberta", "classifier", seed=7)
  path = str(tmp_path_factory.mktemp("roberta_safetensors"))
  hf.save_pretrained(path)
  return hf, path


def test_pytorch_model_bin_loads_without_plain_pickle(roberta_classifier, tmp_path, monkeypatch):
  import pickle
  hf, safetensors_dir = roberta_classifier
  path = _bin_dir(hf, tmp_path / "bin")

  def refuse(*args, **kwargs):
    raise AssertionError("plain pickle was used")

  for name in ("load", "loads", "Unpickler", "_Unpickler"):
    monkeypatch.setattr(pickle, name, refuse)
  cfg, params = hf_checkpoints.load(path)
  monkeypatch.undo()
  ref_cfg, ref = hf_checkpoints.load(safetensors_dir)
  assert cfg == ref_cfg
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(ref)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_sharded_bfloat16_pytorch_model_bin_loads_exactly(roberta_classifier, tmp_path):
  import torch
  hf, safetensors_dir = roberta_classifier
  path = _bin_dir(hf, tmp_path / "bin", shards=2, dtype=torch.bfloat16)
  _, params = hf_checkpoints.load(path, dtype="bfloat16")
  _, ref = hf_checkpoints.load(safetensors_dir, dtype="bfloat16")  # float32 rounded once
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(ref)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def _mark(path):
  open(path, "w").close()


class _Exploit:
  """Unpickled by plain pickle, this calls _mark(path): code run by loading a file."""

  def __init__(self, path):
    self.path = path

  def __reduce__(self):
    return _mark, (self.path,)


def test_pytorch_model_bin_that_runs_code_is_refused(roberta_classifier, tmp_path):
  import torch
  hf, _ = roberta_classifier
  path = _bin_dir(hf, tmp_path / "evil")
  marker = str(tmp_path / "code_ran")
  state = torch.load(os.path.join(path, "pytorch_model.bin"), weights_only=True)
  torch.save({**state, "extra": _Exploit(marker)}, os.path.join(path, "pytorch_model.bin"))
  with pytest.raises(ValueError, match="pytorch_model.bin: not a plain tensor checkpoint"):
    hf_checkpoints.load(path)
  assert not os.path.exists(marker)
  torch.load(os.path.join(path, "pytorch_model.bin"), weights_only=False)  # what plain pickle does
  assert os.path.exists(marker)


def test_pytorch_model_bin_without_torch_names_the_conversion(roberta_classifier, tmp_path,
                                                              monkeypatch):
  import sys
  path = _bin_dir(roberta_classifier[0], tmp_path / "bin")
  monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` now fails
  with pytest.raises(ImportError, match=r"pytorch_model.bin.*python -m tba_jax.hf_checkpoints "
                                        r"convert .*bin"):
    hf_checkpoints.load(path)


def test_convert_command_writes_safetensors_that_load(roberta_classifier, tmp_path):
  import subprocess
  import sys
  hf, safetensors_dir = roberta_classifier
  path = _bin_dir(hf, tmp_path / "bin")
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="")
  subprocess.run([sys.executable, "-m", "tba_jax.hf_checkpoints", "convert", path], cwd=repo,
                 env=env, check=True, capture_output=True, timeout=120)
  os.remove(os.path.join(path, "pytorch_model.bin"))  # so the load reads the safetensors
  _, params = hf_checkpoints.load(path)
  _, ref = hf_checkpoints.load(safetensors_dir)
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(ref)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  with pytest.raises(FileExistsError, match="already has model.safetensors"):
    hf_checkpoints.convert(path)


def test_bare_backbone_and_legacy_layernorm_names_load(tmp_path):
  from safetensors.torch import save_file
  # The original `gpt2` files have no "transformer." prefix; old BERT files say gamma / beta.
  for name, head, rename in [
      ("gpt2", "lm", lambda k: k.removeprefix("transformer.")),
      ("bert", "bare", lambda k: k.replace("LayerNorm.weight", "LayerNorm.gamma")
                                  .replace("LayerNorm.bias", "LayerNorm.beta"))]:
    hf = make_model(name, head, seed=8)
    src, renamed = str(tmp_path / name), str(tmp_path / f"{name}_renamed")
    hf.save_pretrained(src)
    os.makedirs(renamed)
    hf.config.save_pretrained(renamed)
    state = {rename(k): v.contiguous() for k, v in hf.state_dict().items() if k != "lm_head.weight"}
    assert set(state) != set(hf.state_dict())
    save_file(state, os.path.join(renamed, "model.safetensors"))
    for a, b in zip(jax.tree.leaves(hf_checkpoints.load(renamed)[1]),
                    jax.tree.leaves(hf_checkpoints.load(src)[1])):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_head_mismatch_and_unsupported_heads_are_named(tmp_path):
  hf = make_model("gpt_neox", "classifier", seed=9)  # 3 labels
  path = str(tmp_path / "rm")
  hf.save_pretrained(path)
  two = edit_config(path, tmp_path, id2label={"0": "bad", "1": "good"}, label2id=None)
  with pytest.raises(ValueError, match=r"score.weight.*\(3, 64\).*\(64, 2\)"):
    hf_checkpoints.load(two)
  import shutil
  shutil.rmtree(two)
  token = edit_config(path, tmp_path, architectures=["GPTNeoXForTokenClassification"])
  with pytest.raises(ValueError, match="unsupported head .*GPTNeoXForTokenClassification"):
    hf_checkpoints.load(token)
