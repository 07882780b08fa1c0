"""GSM8K: loading, the paper's prompt, answer extraction and the 0/1 reward.

Answer extraction is the authors' (bbartoldson/TBA src/gsm8k_utils.py L10-22):
commas removed, every match of their number pattern found, the LAST one parsed
as a float and compared to the gold answer (the number after "####") as floats.
The pattern tries, in order, "digits.digits?", ".digits", "digits e digits" and
"digits", each with an optional sign, so "1e3" is 1000, "-.5" is -0.5, "3." is 3
and "+7" is 7; a decimal with an exponent splits ("1.5e3" reads 1.5, then 3), and
"1E3" (capital E) reads 1, then 3, exactly as in their code.

Splits: the data set's train (7,473) and test (1,319); the validation split is
task.validation_fraction of train (5%: 374 problems, drawn with a fixed seed by
tasks.hold_out in config_builders.question_task), the other 7,099 are trained on.
"""
from __future__ import annotations

from tba_jax.errors import DataError
from tba_jax.tasks import Metric, Problem, read_records, split_file
# GSM8K's answer check (the paper's regex) lives with the other verifiers.
from tba_jax.verifiers import extract_answer, reward  # noqa: F401 (public here too)

PAPER_PROMPT = "[MATH TASK] Problem:\n{question}\n\nSolution:\n"
HUB_ID = "openai/gsm8k"
# What the run prints as `start -> end` and the plot tool draws (tasks.Task.headline); the
# offline arithmetic task is scored the same way.
REWARD_METRIC = Metric("reward_mean", "train reward: share of correct answers in the batch",
                       "fraction")
HEADLINE = (Metric("eval/sampled_pass@1", "held-out accuracy, sampled (pass@1)", "fraction"),
            Metric("eval/greedy_pass@1", "held-out accuracy, greedy", "fraction"))


def gold_answer(answer: str) -> float:
  """The gold number of a GSM8K reference answer (after "####")."""
  if "####" not in answer:
    raise ValueError(f"GSM8K answer has no '####' line: {answer[-80:]!r}")
  value = extract_answer(answer.split("####")[-1])
  if value is None:
    raise ValueError(f"GSM8K answer has no number after '####': {answer[-80:]!r}")
  return value


def make_prompt(question: str, style: str, tokenizer=None, thinking: bool | None = None,
                system: str | None = None) -> str:
  """`style`: "paper" (the TBA paper's prompt) or "chat" (the tokenizer's chat template,
  with `thinking` its reasoning switch: Qwen3's enable_thinking; None: the default; and
  `system` its system turn: None = the template's default, which may be its own text)."""
  if style == "paper":
    if system is not None:
      raise ValueError("the paper prompt style has no system turn")
    return PAPER_PROMPT.format(question=question)
  if style == "chat":
    if tokenizer is None:
      raise ValueError("the chat prompt style needs a tokenizer")
    return tokenizer.chat_prompt(question, system=system, thinking=thinking)
  raise ValueError(f"unknown prompt style {style!r} (paper, chat)")


def _hub_file(split: str) -> str:
  try:
    import huggingface_hub
    return huggingface_hub.hf_hub_download(
        HUB_ID, f"main/{split}-00000-of-00001.parquet", repo_type="dataset")
  except Exception as e:
    raise DataError(f"could not fetch GSM8K ({HUB_ID}, {split}) from the Hugging Face hub "
                    f"({type(e).__name__}: {e}); pass a local path (a directory with "
                    f"{split}.jsonl, or a .jsonl/.parquet file)") from None


def data_file(split: str, path: str | None = None) -> str:
  """The file `load(split, path)` reads: the hub's, or one of a local path (tasks.split_file:
  the path itself when it is a file, then every split is that file)."""
  return _hub_file(split) if path is None else split_file(path, split, "GSM8K")


def load(split: str, path: str | None = None, limit: int | None = None) -> list[Problem]:
  """GSM8K `split` ("train" / "test") from the hub, or from a local path (`data_file`)."""
  file = data_file(split, path)
  rows = read_records(file)
  if limit is not None:
    rows = rows[:limit]
  problems = []
  for i, row in enumerate(rows):
    if "question" not in row or "answer" not in row:
      raise DataError(f"{file}: row {i} lacks 'question'/'answer' (keys: {sorted(row)})")
    try:
      gold = gold_answer(row["answer"])
    except ValueError as e:
      raise DataError(f"{file}: row {i}: {e}") from None
    problems.append(Problem(i, {"question": row["question"], "answer": row["answer"]}, gold))
  return problems
