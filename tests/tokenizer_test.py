"""Tokenizers: the byte tokenizer, GGUF-metadata BPE, and the real SmolLM2 one."""
import os

import pytest

from tba_jax import hf_checkpoints, tokenizer


def test_byte_tokenizer_round_trips_and_names_its_specials():
  tok = tokenizer.byte_tokenizer()
  text = "Natalia sold 48 clips. 7 * 8 = 56 ✓"
  ids = tok.encode(text)
  assert min(ids) >= len(tokenizer.BYTE_SPECIALS) and len(ids) == len(text.encode())
  assert tok.decode(ids) == text
  assert tok.pad_id == 0 and tok.eos_ids == (1, 4)
  assert tok.chat_prompt("hi") == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
  assert tok.encode("<|im_end|>") == [4]


def _write_tokenizer_gguf(path, pre):
  import gguf
  from tokenizers import pre_tokenizers
  alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
  tokens = ["<|endoftext|>", "<|im_end|>"] + alphabet + ["12", "Ġ1", "ab"]
  merges = ["1 2", "Ġ 1", "a b"]
  w = gguf.GGUFWriter(path, "llama")
  w.add_tokenizer_model("gpt2")
  w.add_tokenizer_pre(pre)
  w.add_token_list(tokens)
  w.add_token_types([3, 3] + [1] * (len(tokens) - 2))
  w.add_token_merges(merges)
  w.add_eos_token_id(1)
  w.add_pad_token_id(0)
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.close()
  return tokens


@pytest.mark.parametrize("pre,merged", [("smollm", False), ("gpt2", True)])
def test_gguf_tokenizer_applies_the_pre_tokenizer_digit_split(tmp_path, pre, merged):
  path = str(tmp_path / "tok.gguf")
  tokens = _write_tokenizer_gguf(path, pre)
  tok = tokenizer.from_gguf(path)
  ids = tok.encode("ab 12<|im_end|>")
  pieces = [tokens[i] for i in ids]
  # SmolLM splits every digit on its own, so the "12" merge can never apply.
  assert ("12" in pieces) == merged
  assert pieces[0] == "ab" and pieces[-1] == "<|im_end|>"
  assert tok.decode(ids, skip_special_tokens=False) == "ab 12<|im_end|>"
  assert tok.eos_ids == (1,) and tok.pad_id == 0


def test_unknown_gguf_pre_tokenizer_is_refused(tmp_path):
  path = str(tmp_path / "tok.gguf")
  _write_tokenizer_gguf(path, "made-up")
  with pytest.raises(ValueError, match="pre-tokenizer 'made-up'"):
    tokenizer.from_gguf(path)


@pytest.mark.slow
def test_real_smollm2_tokenizer_matches_transformers_gguf_conversion():
  import transformers
  path = hf_checkpoints.smollm2_gguf_path()
  ours = tokenizer.from_gguf(path)
  ref = transformers.AutoTokenizer.from_pretrained(os.path.dirname(path),
                                                   gguf_file=os.path.basename(path))
  for text in ["What is 7 * 8?", "Natalia sold 1,234.5 clips  in\n\nMay!", "<|im_start|>user\nx"]:
    assert ours.encode(text) == ref.encode(text, add_special_tokens=False)
  assert ours.eos_ids == (2,)  # <|im_end|> ends SmolLM2's turns
  assert ours.chat_prompt("hi").endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")


@pytest.mark.parametrize("source", ["gguf", "bytes"])
def test_saved_tokenizer_loads_in_transformers_beside_a_model_and_encodes_the_same(tmp_path,
                                                                                    source):
  import json

  import transformers
  from tba_jax.model import ModelConfig
  if source == "gguf":
    _write_tokenizer_gguf(str(tmp_path / "tok.gguf"), "smollm")
    ours = tokenizer.from_gguf(str(tmp_path / "tok.gguf"))
  else:
    ours = tokenizer.byte_tokenizer()
  out = tmp_path / "export"
  # As in an export: a llama config.json beside the tokenizer files.
  hf_checkpoints.config_to_hf(ModelConfig(vocab_size=ours.vocab_size, dim=8, mlp_dim=16,
                                          num_layers=1, num_heads=2, num_kv_heads=1,
                                          head_dim=4)).save_pretrained(str(out))
  ours.save_pretrained(str(out))
  theirs = transformers.AutoTokenizer.from_pretrained(str(out))
  for text in ["ab 12<|im_end|>", "ab  1\n\n12 ab", "Natalia sold 48 clips"]:
    assert theirs(text)["input_ids"] == ours.encode(text), text
  generation = json.loads((out / "generation_config.json").read_text())
  assert generation["eos_token_id"] == list(ours.eos_ids)
  assert generation["pad_token_id"] == ours.pad_id
