"""Tokenizers: the byte tokenizer, GGUF-metadata BPE, prompts' BOS, the real SmolLM2 one."""
import os
import subprocess
import sys

import pytest

from tba_jax import config_builders, hf_checkpoints, tokenizer


def test_byte_tokenizer_round_trips_and_names_its_specials():
  tok = tokenizer.byte_tokenizer()
  text = "Natalia sold 48 clips. 7 * 8 = 56 ✓"
  ids = tok.encode(text)
  assert min(ids) >= len(tokenizer.BYTE_SPECIALS) and len(ids) == len(text.encode())
  assert tok.decode(ids) == text
  assert tok.pad_id == 0 and tok.eos_ids == (1, 4)
  assert tok.chat_prompt("hi") == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
  assert tok.encode("<|im_end|>") == [4]


# The part of Qwen3's chat template that the thinking switch changes (its generation prompt).
_THINKING_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n"
    "{% endif %}{% endif %}")


def test_chat_prompt_thinking_switch_reaches_the_template_and_the_task():
  from configs import math as math_config
  from tba_jax.tasks import math as math_task
  tok = tokenizer.byte_tokenizer()
  plain = tok.chat_prompt("hi")
  with pytest.raises(ValueError, match="no thinking switch"):
    tok.chat_prompt("hi", thinking=False)
  tok.hf.chat_template = _THINKING_TEMPLATE
  assert tok.chat_prompt("hi") == tok.chat_prompt("hi", thinking=True) == plain
  assert tok.chat_prompt("hi", thinking=False) == plain + "<think>\n\n</think>\n\n"
  for thinking, opens_closed in (("auto", False), ("on", False), ("off", True)):
    c = math_config.get_config(f"tiny,task.prompt_style=chat,task.thinking={thinking}")
    prompt = config_builders.build_task(c.task, tok).prompt
    problem = math_task.load("test", math_config.TINY_DATA)[0]
    assert prompt(problem).endswith("<think>\n\n</think>\n\n") == opens_closed


def test_gemmas_end_of_turn_is_an_eos_id():
  import transformers
  from tokenizers import Tokenizer as RawTokenizer, models
  vocab = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<end_of_turn>": 3, "a": 4}
  hf = transformers.PreTrainedTokenizerFast(
      tokenizer_object=RawTokenizer(models.WordLevel(vocab, unk_token="<pad>")),
      pad_token="<pad>", eos_token="<eos>", bos_token="<bos>",
      additional_special_tokens=["<end_of_turn>"])
  assert tokenizer._wrap(hf, tokenizer._chat_end_ids(hf)).eos_ids == (1, 3)


def _write_tokenizer_gguf(path, pre, add_bos_token=None):
  import gguf
  from tokenizers import pre_tokenizers
  alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
  tokens = ["<|endoftext|>", "<|im_end|>", "<s>"] + alphabet + ["12", "Ġ1", "ab"]
  merges = ["1 2", "Ġ 1", "a b"]
  w = gguf.GGUFWriter(path, "llama")
  w.add_tokenizer_model("gpt2")
  w.add_tokenizer_pre(pre)
  w.add_token_list(tokens)
  w.add_token_types([3, 3, 3] + [1] * (len(tokens) - 3))
  w.add_token_merges(merges)
  w.add_eos_token_id(1)
  w.add_bos_token_id(2)
  w.add_pad_token_id(0)
  if add_bos_token is not None:
    w.add_add_bos_token(add_bos_token)
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


@pytest.mark.parametrize("add_bos_token", [True, False, None])
def test_gguf_prompts_get_the_bos_the_file_asks_for_as_transformers_gives(tmp_path,
                                                                         add_bos_token):
  import transformers
  path = str(tmp_path / "tok.gguf")
  _write_tokenizer_gguf(path, "gpt2", add_bos_token)
  ref = transformers.AutoTokenizer.from_pretrained(str(tmp_path), gguf_file="tok.gguf")
  text = "ab 12<|im_end|>\nab"
  ids = tokenizer.from_gguf(path).encode_prompt(text)
  assert ids == ref(text)["input_ids"]
  assert (ids[0] == 2) == bool(add_bos_token)  # absent = False for a BPE ("gpt2") vocabulary


LLAMA_TEMPLATE = ("{{ bos_token }}{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}"
                  "{% endfor %}{% if add_generation_prompt %}[assistant] {% endif %}")


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
  """A Llama-style tokenizer (like RhoMath-1B's: BOS put first by its post-processor, no pad
  token, a chat template that writes {{ bos_token }} itself) saved as a HF directory."""
  import transformers
  vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
  for ch in "▁abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789[]:?.+*\n":
    vocab.setdefault(ch, len(vocab))
  tok = transformers.LlamaTokenizer(vocab=vocab, merges=[], add_bos_token=True)
  tok.chat_template = LLAMA_TEMPLATE
  path = str(tmp_path_factory.mktemp("llama_tokenizer"))
  tok.save_pretrained(path)
  return path


def test_llama_tokenizer_prompts_start_with_exactly_one_bos_as_transformers_gives(llama_dir):
  import transformers
  ref = transformers.AutoTokenizer.from_pretrained(llama_dir)
  tok = tokenizer.load(llama_dir)
  assert tok.pad_id == 2 and tok.eos_ids == (2,)  # no pad token: pad = EOS, as the authors
  paper = "[MATH TASK] Problem:\nWhat is 7 * 8?\n\nSolution:\n"
  assert tok.encode_prompt(paper) == ref(paper)["input_ids"]
  assert tok.encode_prompt(paper)[:2] == [1, tok.encode(paper)[0]]
  # Chat: the template writes BOS; tokenizing its text again would add a second one.
  messages = [{"role": "user", "content": "What is 7 * 8?"}]
  chat = tok.chat_prompt("What is 7 * 8?")
  want = ref.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
  assert tok.encode_prompt(chat, templated=True) == list(want["input_ids"])
  assert ref(chat)["input_ids"][:2] == [1, 1]  # the pitfall encode_prompt avoids
  assert tok.encode_prompt(chat, templated=True).count(1) == 1
  # Forced on / off.
  on, off = tokenizer.load(llama_dir, add_bos="on"), tokenizer.load(llama_dir, add_bos="off")
  for text, templated in ((paper, False), (chat, True)):
    assert on.encode_prompt(text, templated)[:2] == [1, tok.encode(text)[1 if templated else 0]]
    assert 1 not in off.encode_prompt(text, templated)
  with pytest.raises(ValueError, match="add_bos='sometimes'"):
    tokenizer.load(llama_dir, add_bos="sometimes")


def test_task_prompts_get_their_bos_through_the_config_builders(llama_dir):
  from ml_collections import ConfigDict
  tok = tokenizer.load(llama_dir)
  for style, templated in (("paper", False), ("chat", True)):
    c = ConfigDict(dict(name="arithmetic", prompt_style=style, question_suffix="",
                        system_prompt="", num_train_problems=0, thinking="auto",
                        verifier="paper_regex", arithmetic=dict(
                            form="one_op", ops="*", low=7, high=8, test_fraction=0.25,
                            validation_fraction=0.25, num_problems=0, seed=0)))
    task = config_builders.build_task(c, tok)
    assert task.templated_prompts == templated
    ids = config_builders.encode_prompts(task.train, task, tok, max_len=256)
    for p in task.train:
      assert ids[p.id][0] == 1 and ids[p.id].count(1) == 1
  byte = tokenizer.byte_tokenizer()  # adds nothing by default; "on" puts its <bos> (id 2) first
  assert byte.encode_prompt("1+2=") == byte.encode("1+2=")
  assert tokenizer.byte_tokenizer("on").encode_prompt("1+2=") == [2] + byte.encode("1+2=")


@pytest.mark.slow
def test_real_smollm2_tokenizer_matches_transformers_gguf_conversion():
  import transformers

  from configs import gsm8k as gsm8k_config
  path = hf_checkpoints.smollm2_gguf_path()
  ours = tokenizer.from_gguf(path)
  ref = transformers.AutoTokenizer.from_pretrained(os.path.dirname(path),
                                                   gguf_file=os.path.basename(path))
  for text in ["What is 7 * 8?", "Natalia sold 1,234.5 clips  in\n\nMay!", "<|im_start|>user\nx"]:
    assert ours.encode(text) == ref.encode(text, add_special_tokens=False)
  # The `cpu` default's prompts: exactly transformers' tokenizer(text) (the file's
  # tokenizer.ggml.add_bos_token is False, so nothing is added).
  style = gsm8k_config.get_config("cpu").task.prompt_style
  text = style.format(question="What is 7 * 8? Answer with just the number.")
  assert ours.encode_prompt(text) == ref(text)["input_ids"] == ref.encode(text,
                                                                          add_special_tokens=False)
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


def test_no_pytorch_was_not_found_warning_where_tba_jax_does_not_use_torch():
  # sys.modules["torch"] = None: transformers finds no torch, as before the test extras.
  run = lambda code: subprocess.run(
      [sys.executable, "-c", "import sys; sys.modules['torch'] = None\n" + code],
      cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))), capture_output=True,
      text=True, timeout=120)
  plain = run("import transformers")
  assert "PyTorch was not found" in plain.stderr  # what a user without torch saw
  ours = run("from tba_jax import tokenizer\ntokenizer.byte_tokenizer()\nimport transformers\n"
             "transformers.logging.get_logger('transformers').warning('other warnings stay')")
  assert ours.returncode == 0, ours.stderr
  assert "PyTorch was not found" not in ours.stderr and "other warnings stay" in ours.stderr
