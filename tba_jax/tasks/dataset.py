"""A task from a data set in the field's schemas, with no code of the user's but a reward
function (configs/dataset.py, experiments/dataset.py):

  verl  parquet rows {data_source, prompt: [chat messages], ability,
        reward_model: {ground_truth, style}, extra_info} (DAPO-Math-17k and many hub sets)
  trl   TRL's `prompt` column (chat messages, or text) with `solution` or `answer`
  qa    plain `question` / `answer` (GSM8K's "#### 72" answers too)

The schema is read from the first train row's columns, or named (`Source.format`). A
chat-message prompt is rendered by the tokenizer's chat template (a template-less tokenizer:
"role: text" lines, then "assistant: "); in a data set of messages a text prompt is one user
turn.

Splits: `path` is a .parquet / .jsonl / .json file (the train split), a directory of split
files (train.parquet, test.jsonl, data/test-00000-of-00001.parquet, ...) or a hub data set
id (read by the `datasets` library when it is installed); `validation_path` / `test_path`
name files of their own. A missing test split is `test_fraction` of train and a missing
validation split `validation_fraction` of the rest, each drawn with a fixed seed
(tasks.hold_out); problem ids are row numbers in their file, kept in every split.

The reward: "" = the built-in checker the ground truths call for (all numbers: GSM8K's
last-number rule, verifiers' paper_regex; else math_verify), a checker by name, or a
function by name (tasks/reward_functions.py: TRL's and verl's signatures). Bad input stops
before the run writes anything: a missing column, an empty split, a prompt longer than
`max_prompt_len`, a ground truth the checker cannot parse, each a DataError or ConfigError
naming the file and row.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
from typing import Any, Callable

from tba_jax import choices, verifiers
from tba_jax.errors import ConfigError, DataError
from tba_jax.tasks import (VALIDATION_SEED, Problem, Task, gsm8k, hold_out, read_records,
                           reward_functions)
from tba_jax.tasks import math as math_task

# A missing test split is held out of train with this seed (the validation split's is
# tasks.VALIDATION_SEED): fixed, so every run on a data set tests on the same rows.
TEST_SEED = 1
_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:e[+-]?\d+)?")
_EXTENSIONS = (".parquet", ".jsonl", ".json")
SPLITS = ("train", "validation", "test")


@dataclasses.dataclass(frozen=True)
class Schema:
  """What a format needs of a row: its columns, where the prompt is, the ground truth."""
  columns: tuple[str, ...]  # required in every row
  prompt: str               # the column the prompt is read from
  truth: Callable[[dict], Any]  # the row's ground truth (None: it has none)
  described: str            # for errors


def _verl_truth(row: dict):
  model = row["reward_model"]
  return model.get("ground_truth") if isinstance(model, dict) else None


# format name -> its schema (config task.format's choices, with "auto").
FORMATS = {
    "verl": Schema(("prompt", "reward_model"), "prompt", _verl_truth,
                   "verl's (prompt: chat messages, reward_model: {ground_truth, style})"),
    "trl": Schema(("prompt",), "prompt", lambda r: r.get("solution", r.get("answer")),
                  "TRL's (prompt: chat messages or text, solution or answer)"),
    "qa": Schema(("question", "answer"), "question", lambda r: r["answer"],
                 "question / answer"),
}
assert ("auto", *FORMATS) == choices.DATASET_FORMATS, "tba_jax/choices.py names these schemas"


@dataclasses.dataclass(frozen=True)
class Source:
  """Where a data set's splits are (module docstring)."""
  path: str
  format: str = "auto"  # "auto" or a FORMATS name
  split_names: tuple[str, str, str] = SPLITS  # train, validation, test: directory / hub names
  validation_path: str = ""
  test_path: str = ""
  validation_fraction: float = 0.05
  test_fraction: float = 0.1


@dataclasses.dataclass(frozen=True)
class Prompting:
  """How a prompt's text is made (config task.prompt_style, question_suffix, system_prompt)."""
  style: str = "chat"  # text prompts: "chat", "paper" or a format string of {question}
  suffix: str = ""     # appended to the question (a message prompt: to its last user turn)
  system: str = ""     # the system turn of chat prompts that have none ("" = none added)


# ----- Reading ---------------------------------------------------------------------------
def read_rows(path: str) -> list[dict]:
  """A .parquet, .jsonl or .json file's rows (.json: a list of objects, or JSON lines)."""
  if not path.endswith(_EXTENSIONS):
    raise DataError(f"{path}: not a .parquet, .jsonl or .json file")
  if not path.endswith(".json"):
    return read_records(path)
  with open(path) as f:
    text = f.read()
  try:
    data = json.loads(text)
  except json.JSONDecodeError:
    return read_records(path)  # one object a line
  data = [data] if isinstance(data, dict) else data
  if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
    raise DataError(f"{path}: expected a JSON list of objects, or one object a line")
  if not data:
    raise DataError(f"{path}: the file holds no rows (it is empty)")
  return data


def _split_file(directory: str, name: str) -> str | None:
  """`name`'s file in a directory: NAME.parquet / .jsonl / .json, else the one data file
  below it whose name starts with NAME (a hub snapshot's data/NAME-00000-of-00001.parquet)."""
  for ext in _EXTENSIONS:
    if os.path.isfile(os.path.join(directory, name + ext)):
      return os.path.join(directory, name + ext)
  found = sorted(os.path.join(d, f) for d, _, files in os.walk(directory) for f in files
                 if f.startswith(name) and f.endswith(_EXTENSIONS))
  if len(found) > 1:
    raise DataError(f"{directory}: several files could be the {name} split: {found}")
  return found[0] if found else None


def _hub_splits(dataset_id: str) -> dict[str, list[dict]]:
  try:
    import datasets
  except ImportError:
    raise DataError(f"task.path={dataset_id!r} is no local file or directory; as a hub data "
                    "set id it needs the `datasets` library: pip install datasets") from None
  try:
    loaded = datasets.load_dataset(dataset_id)
  except Exception as e:  # the hub's errors are many (network, a wrong id, a gated set)
    raise DataError(f"could not load the hub data set {dataset_id!r} ({type(e).__name__}: "
                    f"{e}); or give a local .parquet / .jsonl / .json file or directory"
                    ) from None
  return {name: split.to_list() for name, split in loaded.items()}


def load_splits(source: Source) -> dict[str, tuple[str, list[dict]] | None]:
  """{"train" / "validation" / "test": (where, rows), or None where the data has no such
  split}; `where` names the file (or hub split) in errors."""
  path, names = source.path, dict(zip(SPLITS, source.split_names))
  if not path:
    raise ConfigError("task.path is empty: give a .parquet, .jsonl or .json file, a "
                      "directory of split files, or a hub data set id")
  out = dict.fromkeys(SPLITS)
  if os.path.isfile(path):
    out["train"] = path, read_rows(path)
  elif os.path.isdir(path):
    for split, name in names.items():
      file = _split_file(path, name)
      out[split] = None if file is None else (file, read_rows(file))
    if out["train"] is None:
      raise DataError(f"task.path={path!r}: no {names['train']}.parquet, .jsonl or .json "
                      "(nor a data file whose name starts with it) in the directory")
  elif re.fullmatch(r"[\w.-]+/[\w.-]+", path) and not path.endswith(_EXTENSIONS):
    hub = _hub_splits(path)
    for split, name in names.items():
      out[split] = (f"{path} ({name} split)", hub[name]) if name in hub else None
    if out["train"] is None:
      raise DataError(f"the hub data set {path!r} has no split {names['train']!r} (it has "
                      f"{', '.join(hub)}); name its train split with task.train_split")
  else:
    raise DataError(f"task.path={path!r} does not exist (from {os.getcwd()}): give a file, a "
                    "directory or a hub data set id (owner/name)")
  for split, file in (("validation", source.validation_path), ("test", source.test_path)):
    if file:
      if not os.path.isfile(file):
        raise DataError(f"task.{split}_path={file!r} does not exist (from {os.getcwd()})")
      out[split] = file, read_rows(file)
  for split, found in out.items():
    if found is not None and not found[1]:
      raise DataError(f"{found[0]}: the {split} split is empty")
  return out


# ----- Rows to problems ------------------------------------------------------------------
def detect_format(columns, named: str = "auto") -> str:
  """The format `named`, or the one the columns show (reward_model: verl, prompt: trl,
  question: qa)."""
  if named != "auto":
    if named not in FORMATS:
      raise ConfigError(f"task.format={named!r}: must be 'auto' or one of "
                        f"{', '.join(map(repr, FORMATS))}")
    return named
  columns = set(columns)
  for name, column in (("verl", "reward_model"), ("trl", "prompt"), ("qa", "question")):
    if column in columns:
      return name
  raise DataError(
      f"cannot tell the data set's schema from its columns ({', '.join(sorted(columns))}): "
      "expected " + "; ".join(f"{n}: {s.described}" for n, s in FORMATS.items()))


def to_problems(where: str, rows: list[dict], kind: str, need_truth: bool) -> list[Problem]:
  """One Problem per row (id: the row number; fields: the row; target: its ground truth as
  written). A missing column, or a missing ground truth where `need_truth`, is a DataError."""
  schema = FORMATS[kind]
  problems = []
  for i, row in enumerate(rows):
    missing = [c for c in schema.columns if c not in row]
    if missing:
      raise DataError(f"{where}: row {i} has no {missing[0]!r} column, which format {kind!r} "
                      f"needs ({schema.described}); the row's columns: {', '.join(sorted(row))}")
    truth = schema.truth(row)
    if truth is None and need_truth:
      raise DataError(f"{where}: row {i} has no ground truth ({schema.described}), and the "
                      "built-in checkers compare with it: add it, or name a reward function "
                      "(task.reward=PATH.py:FUNCTION)")
    messages_of(row[schema.prompt], where, i)  # a malformed prompt stops here
    problems.append(Problem(i, row, truth))
  return problems


def messages_of(prompt, where: str = "", row: int = 0) -> list[dict] | None:
  """A prompt's chat messages ({role, content} each, a new list), or None when it is text."""
  if isinstance(prompt, str):
    return None
  if (isinstance(prompt, (list, tuple)) and prompt and
      all(isinstance(m, dict) and isinstance(m.get("role"), str) and
          isinstance(m.get("content"), str) for m in prompt)):
    return [{"role": m["role"], "content": m["content"]} for m in prompt]
  raise DataError(f"{where}: row {row}: the prompt is neither text nor a list of chat messages "
                  f"({{'role': ..., 'content': ...}} each): {str(prompt)[:80]!r}")


# ----- Prompts -----------------------------------------------------------------------------
def plain_chat(messages: list[dict]) -> str:
  """Chat messages as text for a tokenizer without a chat template."""
  return "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant: "


def renderer(tokenizer, prompting: Prompting, chat: bool) -> tuple[Callable[[Any], str], bool]:
  """(fn(prompt value) -> the text the model continues, whether that text is the chat
  template's). `chat`: the data set's prompts are messages, so a text prompt is a user turn."""
  template = bool(getattr(tokenizer.hf, "chat_template", None))
  as_chat = chat or prompting.style == "chat"

  def render(prompt) -> str:
    messages = messages_of(prompt)
    if messages is None and not as_chat:
      question = prompt + prompting.suffix
      if prompting.style == "paper":
        return gsm8k.PAPER_PROMPT.format(question=question)
      return prompting.style.format(question=question)
    messages = [{"role": "user", "content": prompt}] if messages is None else messages
    users = [i for i, m in enumerate(messages) if m["role"] == "user"]
    if prompting.suffix and users:
      last = messages[users[-1]]
      messages[users[-1]] = {**last, "content": last["content"] + prompting.suffix}
    if prompting.system and not any(m["role"] == "system" for m in messages):
      messages = [{"role": "system", "content": prompting.system}] + messages
    if not template:
      return plain_chat(messages)
    return tokenizer.hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

  return render, as_chat and template


def check_lengths(splits: dict[str, list[Problem]], prompt, tokenizer, templated: bool,
                  max_len: int, where: dict[str, str]) -> None:
  """Refuses prompts longer than `max_len` tokens, naming how many and the longest."""
  lengths = [(len(tokenizer.encode_prompt(prompt(p), templated=templated)), split, p.id)
             for split, problems in splits.items() for p in problems]
  too_long = [x for x in lengths if x[0] > max_len]
  if too_long:
    n, split, row = max(too_long)
    raise ConfigError(f"task.max_prompt_len={max_len}: {len(too_long)} of {len(lengths)} prompts "
                      f"are longer (the longest, row {row} of {where[split]}, has {n} tokens); "
                      f"raise task.max_prompt_len to at least {n}, or shorten them")


# ----- Built-in rewards: the ground truths parsed -------------------------------------------
def gold_of(truth) -> float | str:
  """A ground truth as the checkers compare it: a number (GSM8K's "... #### 72" too), else
  the text (a LaTeX answer). ValueError when it is neither."""
  if isinstance(truth, (int, float)) and not isinstance(truth, bool):
    return float(truth)
  if not isinstance(truth, str):
    raise ValueError(f"the ground truth {truth!r} is a {type(truth).__name__}, not text or a "
                     "number")
  text = truth.strip()
  if "####" in text:
    return gsm8k.gold_answer(text)
  if _NUMBER.fullmatch(text.replace(",", "")):
    return float(text.replace(",", ""))
  if not text:
    raise ValueError("the ground truth is empty")
  return text


def builtin_reward(splits: dict[str, list[Problem]], where: dict[str, str], name: str):
  """(the splits with parsed golds as targets, the checker's name): `name` "" picks
  paper_regex when every gold is a number, else math_verify. A gold the checker cannot
  parse is a DataError naming its row."""
  parsed = {}
  for split, problems in splits.items():
    parsed[split] = []
    for p in problems:
      try:
        parsed[split].append(dataclasses.replace(p, target=gold_of(p.target)))
      except ValueError as e:
        raise DataError(f"{where[split]}: row {p.id}: {e}") from None
  golds = [(s, p) for s, problems in parsed.items() for p in problems]
  name = name or ("paper_regex" if all(isinstance(p.target, float) for _, p in golds)
                  else "math_verify")
  try:
    verifiers.check_installed(name)
  except ImportError as e:
    raise ConfigError(f"task.reward={name!r}: {e}") from None
  checker = verifiers.CHECKERS[name]()
  try:
    ok = checker.parses([p.target for _, p in golds])
  finally:
    checker.close()
  bad = [(s, p) for (s, p), good in zip(golds, ok) if not good]
  if bad:
    s, p = bad[0]
    raise DataError(f"{where[s]}: row {p.id}: the checker {name} cannot parse the ground truth "
                    f"{verifiers.gold_text(p.target)!r} ({len(bad)} of {len(golds)} rows), so "
                    "every completion of it would score 0: fix those rows, or name a reward "
                    "function (task.reward=PATH.py:FUNCTION)")
  return parsed, name


# ----- The task ---------------------------------------------------------------------------
def _carve(problems, fraction: float, seed: int, split: str):
  """(rest, held out): `fraction` of `problems` drawn with `seed` (tasks.hold_out)."""
  try:
    return hold_out(problems, fraction, seed=seed)
  except ValueError:
    raise ConfigError(f"task.{split}_fraction={fraction}: it leaves none of the "
                      f"{len(problems)} rows to train on") from None


def make_task(source: Source, tokenizer, *, reward: str, prompting: Prompting,
              max_prompt_len: int, num_train_problems: int = 0, name: str = "dataset") -> Task:
  """The task of `source`'s data (module docstring). `reward`: "", a checker of
  verifiers.VERIFIERS, or PATH.py:FUNCTION / module.path:FUNCTION."""
  found = load_splits(source)
  where = {s: f[0] for s, f in found.items() if f is not None}
  kind = detect_format(found["train"][1][0], source.format)
  function = reward not in ("", *verifiers.VERIFIERS)
  splits = {s: to_problems(f[0], f[1], kind, need_truth=not function)
            for s, f in found.items() if f is not None}
  train = splits["train"]
  if "test" not in splits:
    train, splits["test"] = _carve(train, source.test_fraction, TEST_SEED, "test")
    where["test"] = where["train"]
  if "validation" not in splits:
    train, splits["validation"] = _carve(train, source.validation_fraction, VALIDATION_SEED,
                                         "validation")
    where["validation"] = where["train"]
  splits["train"] = train[:num_train_problems] if num_train_problems else train
  schema = FORMATS[kind]
  chat = any(messages_of(p.fields[schema.prompt]) is not None for p in train)
  render, templated = renderer(tokenizer, prompting, chat)
  prompt = lambda p: render(p.fields[schema.prompt])
  check_lengths(splits, prompt, tokenizer, templated, max_prompt_len, where)
  if function:
    stage = reward_functions.load(reward, prompt_column=schema.prompt, chat=chat,
                                  columns=set(train[0].fields))
    return Task(train=splits["train"], validation=splits["validation"], test=splits["test"],
                prompt=prompt, reward=stage, templated_prompts=templated, name=name,
                evaluation=reward_functions.ScoreDetails(stage) if stage.kind == "verl" else None)
  splits, checker = builtin_reward(splits, where, reward)
  answer = gsm8k.extract_answer if checker == "paper_regex" else math_task.answer_of
  return Task(train=splits["train"], validation=splits["validation"], test=splits["test"],
              prompt=prompt, reward=verifiers.VerifierReward(checker),
              templated_prompts=templated, answer=answer, name=name,
              reward_metric=gsm8k.REWARD_METRIC, headline=gsm8k.HEADLINE)
