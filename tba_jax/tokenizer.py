"""Tokenizers: transformers' AutoTokenizer, one rebuilt from GGUF metadata, or a byte one.

All three are wrapped in one `Tokenizer` (a transformers fast tokenizer inside)
exposing what the rest of the code needs: encode / decode, EOS and pad ids,
and the chat template.

Prompts and BOS (`encode_prompt`). A model is trained with whatever its
tokenizer adds by default, so a prompt gets exactly that: transformers'
`tokenizer(text)`, which for a Llama tokenizer (RhoMath-1B, the paper's model)
puts `<s>` first and for SmolLM2 or Qwen2.5 adds nothing (the authors tokenize
their GSM8K prompts this way: bbartoldson/TBA src/gsm8k_utils.py L30). Text
rendered by a chat template already holds the template's own special tokens
(`{{ bos_token }}` included), so it is tokenized as `apply_chat_template`
does, with nothing added: never a second BOS. `add_bos="on"` / `"off"` force a
single leading BOS / none whatever the tokenizer's default.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Sequence

# GGUF pre-tokenizer names -> the regex splits llama.cpp applies, in order.
_GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_PRE_SPLITS = {
    "default": [_GPT2_SPLIT], "gpt2": [_GPT2_SPLIT],
    # SmolLM / StarCoder: every digit on its own, then GPT-2's split.
    "smollm": [r"\p{N}", _GPT2_SPLIT], "starcoder": [r"\p{N}", _GPT2_SPLIT],
    "refact": [r"\p{N}", _GPT2_SPLIT],
    "llama-bpe": [_LLAMA3_SPLIT], "llama3": [_LLAMA3_SPLIT], "qwen2": [_QWEN2_SPLIT],
}


ADD_BOS = ("auto", "on", "off")


@dataclasses.dataclass
class Tokenizer:
  """A transformers fast tokenizer plus the ids generation needs."""
  hf: object  # transformers.PreTrainedTokenizerFast
  eos_ids: tuple[int, ...]
  pad_id: int
  add_bos: str = "auto"  # prompts: "auto" (the tokenizer's default), "on" or "off"

  def __post_init__(self):
    if self.add_bos not in ADD_BOS:
      raise ValueError(f"add_bos={self.add_bos!r}; expected one of {ADD_BOS}")
    if self.add_bos == "on" and self.hf.bos_token_id is None:
      raise ValueError("add_bos='on' but the tokenizer defines no BOS token")

  @property
  def vocab_size(self) -> int:
    return len(self.hf)

  def encode(self, text: str) -> list[int]:
    """The text's own tokens, no special tokens added (prompts: `encode_prompt`)."""
    return self.hf.encode(text, add_special_tokens=False)

  def encode_text(self, text: str) -> list[int]:
    """`encode` with special-token strings spelled as ordinary text, never parsed into their
    ids: what the model reads of an environment's reply (a tool that prints "<|im_end|>"
    must not end the model's turn in its context; tba_jax/turns.py)."""
    return self.hf.encode(text, add_special_tokens=False, split_special_tokens=True)

  def encode_prompt(self, text: str, templated: bool = False) -> list[int]:
    """A prompt's ids, BOS per `add_bos` (module docstring).

    `templated`: the text came from the chat template (`chat_prompt`).
    """
    ids = self.hf.encode(text, add_special_tokens=not templated)
    bos = self.hf.bos_token_id
    starts_with_bos = bool(ids) and bos is not None and ids[0] == bos
    if self.add_bos == "on" and not starts_with_bos:
      ids = [bos] + ids
    elif self.add_bos == "off" and starts_with_bos:
      ids = ids[1:]
    return ids

  def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
    return self.hf.decode(list(ids), skip_special_tokens=skip_special_tokens)

  def chat_prompt(self, user_text: str, system: str | None = None,
                  thinking: bool | None = None, tools: Sequence[dict] | None = None) -> str:
    """The chat template applied to one user turn, ending where the reply starts.

    With `system=None` the template may insert its own default system prompt.
    `thinking`: the template's reasoning switch (Qwen3's `enable_thinking`: False
    opens the reply with an empty <think></think> block); None leaves the template's
    default. A template without the switch refuses True / False. `tools`: JSON schemas of
    the tools the model may call, rendered where the template declares tools (its `tools=`;
    tasks/tool_calls.py); a template that reads no tools refuses them.
    """
    messages = [{"role": "user", "content": user_text}]
    if system is not None:
      messages.insert(0, {"role": "system", "content": system})
    switch = {}
    if thinking is not None:
      if "enable_thinking" not in (self.hf.chat_template or ""):
        raise ValueError(f"thinking={thinking}: this tokenizer's chat template has no thinking "
                         "switch (enable_thinking); leave it at the template's default")
      switch = {"enable_thinking": thinking}
    if tools:
      if "tools" not in (self.hf.chat_template or ""):
        raise ValueError("tools were given, but this tokenizer's chat template declares none "
                         "(it never reads `tools`): use the tag call format")
      switch["tools"] = list(tools)
    return self.hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                       **switch)

  def save_pretrained(self, out_dir: str) -> None:
    """The tokenizer files and a generation_config.json with every EOS id, beside a model.

    transformers' `generate` and vLLM stop at the generation config's EOS ids, so
    a chat model's end-of-turn marker (not always the tokenizer's EOS) is listed.
    """
    import transformers
    self.hf.save_pretrained(out_dir)
    transformers.GenerationConfig(
        eos_token_id=list(self.eos_ids), pad_token_id=self.pad_id,
        bos_token_id=self.hf.bos_token_id).save_pretrained(out_dir)


def _wrap(hf, extra_eos: Sequence[int] = (), add_bos: str = "auto") -> Tokenizer:
  eos = [hf.eos_token_id] if hf.eos_token_id is not None else []
  eos += [i for i in extra_eos if i not in eos]
  if not eos:
    raise ValueError("tokenizer defines no EOS token")
  # No pad token: pad = EOS, as the authors do (bbartoldson/TBA tba_gsm8k.py L58-59).
  pad = hf.pad_token_id if hf.pad_token_id is not None else eos[0]
  return Tokenizer(hf=hf, eos_ids=tuple(eos), pad_id=pad, add_bos=add_bos)


def _chat_end_ids(hf) -> list[int]:
  # Chat models end a turn with a marker that is not always the EOS token.
  vocab = hf.get_vocab()
  ends = ("<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "<end_of_turn>")  # ... Gemma's
  return [vocab[t] for t in ends if t in vocab]


def from_pretrained(path_or_repo_id: str, add_bos: str = "auto") -> Tokenizer:
  """transformers.AutoTokenizer from a local directory or a hub id."""
  import transformers
  try:
    hf = transformers.AutoTokenizer.from_pretrained(path_or_repo_id)
  except OSError as e:
    raise OSError(f"could not load a tokenizer from {path_or_repo_id!r}: {e}") from None
  return _wrap(hf, _chat_end_ids(hf), add_bos)


def from_gguf(path: str, add_bos: str = "auto") -> Tokenizer:
  """The byte-level BPE tokenizer (e.g. SmolLM2's) described by a GGUF file's metadata.

  Its default special tokens follow the file's `tokenizer.ggml.add_bos_token` /
  `add_eos_token` flags (absent = False for this tokenizer model), as
  transformers' own GGUF loading does; SmolLM2's file says False.
  """
  import transformers
  from tokenizers import Regex, Tokenizer as RawTokenizer, decoders, models, pre_tokenizers

  from tba_jax.gguf_weights import gguf_reader
  reader = gguf_reader(path)
  field = lambda k, d=None: reader.fields[k].contents() if k in reader.fields else d
  kind = field("tokenizer.ggml.model")
  if kind != "gpt2":
    raise ValueError(f"{path}: GGUF tokenizer model {kind!r} is not supported (only byte-level "
                     "BPE, 'gpt2')")
  pre = field("tokenizer.ggml.pre", "default")
  if pre not in _PRE_SPLITS:
    raise ValueError(f"{path}: GGUF pre-tokenizer {pre!r} is not supported "
                     f"(supported: {sorted(_PRE_SPLITS)})")
  tokens = field("tokenizer.ggml.tokens")
  merges = [tuple(m.split(" ", 1)) for m in field("tokenizer.ggml.merges")]
  raw = RawTokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, merges,
                                fuse_unk=False, byte_fallback=False))
  raw.pre_tokenizer = pre_tokenizers.Sequence(
      [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in _PRE_SPLITS[pre]] +
      [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
  raw.decoder = decoders.ByteLevel()
  # Control tokens (type 3) are matched whole, never split.
  types = field("tokenizer.ggml.token_type", [])
  specials = [t for t, ty in zip(tokens, types) if ty == 3]
  name = lambda key: tokens[field(key)] if field(key) is not None else None
  hf = transformers.PreTrainedTokenizerFast(
      tokenizer_object=raw, bos_token=name("tokenizer.ggml.bos_token_id"),
      eos_token=name("tokenizer.ggml.eos_token_id"), unk_token=name("tokenizer.ggml.unknown_token_id"),
      pad_token=name("tokenizer.ggml.padding_token_id"), additional_special_tokens=specials,
      chat_template=field("tokenizer.chat_template"),
      add_bos_token=bool(field("tokenizer.ggml.add_bos_token", False)),
      add_eos_token=bool(field("tokenizer.ggml.add_eos_token", False)))
  return _wrap(hf, _chat_end_ids(hf), add_bos)


BYTE_SPECIALS = ("<pad>", "<eos>", "<bos>", "<|im_start|>", "<|im_end|>")
# Pythia's (GPT-NeoX-20B tokenizer's) first two ids, as the TL;DR SFT tokenizers set them:
# <|endoftext|> = 0 is EOS (and BOS), <|padding|> = 1 the pad token (async_rlhf sft.py L68).
PYTHIA_BYTE_SPECIALS = ("<|endoftext|>", "<|padding|>")


def byte_tokenizer(add_bos: str = "auto", pythia: bool = False) -> Tokenizer:
  """A tiny real tokenizer for tests and the `tiny` configs: special tokens, then 256 bytes.

  Default ("bytes"): ids 0-4 are the specials (pad, eos, bos, im_start, im_end), with a
  chat template. `pythia=True` ("pythia_bytes"): Pythia's special ids instead
  (PYTHIA_BYTE_SPECIALS), so a tiny TL;DR run sees the real EOS and pad ids and strings.
  """
  import transformers
  from tokenizers import Tokenizer as RawTokenizer, decoders, models, pre_tokenizers
  specials = PYTHIA_BYTE_SPECIALS if pythia else BYTE_SPECIALS
  byte_chars = list(pre_tokenizers.ByteLevel.alphabet())
  vocab = {t: i for i, t in enumerate(specials)}
  vocab.update({c: len(specials) + i for i, c in enumerate(sorted(byte_chars))})
  raw = RawTokenizer(models.BPE(vocab, [], fuse_unk=False))
  raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
  raw.decoder = decoders.ByteLevel()
  if pythia:
    eos = specials[0]
    hf = transformers.PreTrainedTokenizerFast(tokenizer_object=raw, eos_token=eos, bos_token=eos,
                                              unk_token=eos, pad_token=specials[1])
    return _wrap(hf, (), add_bos)
  template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
              "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
  hf = transformers.PreTrainedTokenizerFast(
      tokenizer_object=raw, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>",
      additional_special_tokens=["<|im_start|>", "<|im_end|>"], chat_template=template)
  return _wrap(hf, _chat_end_ids(hf), add_bos)


def load(path: str, add_bos: str = "auto") -> Tokenizer:
  """A tokenizer for a model path: GGUF metadata, a HF directory / hub id, "bytes" or
  "pythia_bytes" (byte_tokenizer)."""
  if path in ("bytes", "pythia_bytes"):
    return byte_tokenizer(add_bos, pythia=path == "pythia_bytes")
  if path.endswith(".gguf") and os.path.exists(path):
    return from_gguf(path, add_bos)
  return from_pretrained(path, add_bos)
