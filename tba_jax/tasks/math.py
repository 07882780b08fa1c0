r"""MATH (Hendrycks et al. 2021): competition problems whose answers are LaTeX, in the
12,000 / 500 train / test split of Lightman et al. (2023, "Let's Verify Step by
Step", PRM800K) that most math-RL recipes train and test on. Its 500 test problems
are MATH-500. The validation split is task.validation_fraction of train (5%: 600
problems, drawn with a fixed seed by tasks.hold_out), the other 11,400 are trained on.

Data: from the hub (`HUB_ID`, the split as parquet files; the dataset TBA-prime's MATH
configs name, bbartoldson/tba-prime configs/inference/math_1b.toml L12), or a local
path: a directory with train.jsonl / test.jsonl (or .parquet, or one file per split
whose name starts with it), or one file. Each row has `problem` and `solution` (the
worked solution, its answer in a \boxed{}), and optionally `answer`; without it the
gold is the solution's last boxed expression. A problem's `answer` is the solution,
its `gold` the answer string, which `task.verifier` compares completions to
(tba_jax/verifiers.py; math_verify for MATH: "\frac{1}{2}" and "0.5" are one answer).

Evaluation is the runtime's (evaluation.py): greedy pass@1, and sampled pass@1 and
pass@k for k = 1, 2, 4, ..., eval.num_samples (the unbiased estimator of Chen et al.
2021) over `eval.num_problems` test problems (0: all 500 of MATH-500).
"""
from __future__ import annotations

from tba_jax.errors import DataError
from tba_jax.tasks import Problem, read_records, split_file
from tba_jax.verifiers import final_part

HUB_ID = "nlile/hendrycks-MATH-benchmark"
_BOXES = ("\\boxed", "\\fbox")


def extract_boxed(text: str) -> str | None:
  r"""The contents of the last \boxed{...} (or \fbox{...}, or "\boxed 5") in `text`,
  braces balanced; None when there is none or it is unclosed."""
  start, box = max((text.rfind(b), b) for b in _BOXES)
  if start < 0:
    return None
  rest = text[start + len(box):]
  if rest.startswith(" "):  # "\boxed 5": up to the next space or "$"
    word = rest[1:].split("$")[0].split()
    return word[0] if word else None
  if not rest.startswith("{"):
    return None
  depth = 0
  for i, ch in enumerate(rest):
    depth += {"{": 1, "}": -1}.get(ch, 0)
    if depth == 0:
      return rest[1:i]
  return None


def answer_of(completion: str) -> str | None:
  """A completion's final answer as evaluation counts it: its last boxed expression
  after any thinking (None: none boxed)."""
  return extract_boxed(final_part(completion))


def _hub_dir() -> str:
  try:
    import huggingface_hub
    return huggingface_hub.snapshot_download(HUB_ID, repo_type="dataset",
                                             allow_patterns=["*.parquet", "*.jsonl"])
  except Exception as e:
    raise DataError(f"could not fetch MATH ({HUB_ID}) from the Hugging Face hub "
                  f"({type(e).__name__}: {e}); pass a local path (a directory with "
                  "train.jsonl / test.jsonl, or a .jsonl/.parquet file)") from None


def data_file(split: str, path: str | None = None) -> str:
  """The file `load(split, path)` reads (tasks.split_file of the hub's snapshot or `path`)."""
  return split_file(_hub_dir() if path is None else path, split, "MATH")


def load(split: str, path: str | None = None, limit: int | None = None) -> list[Problem]:
  """MATH `split` ("train" / "test") from the hub, or from a local path (module docstring)."""
  file = data_file(split, path)
  rows = read_records(file)[:limit]
  problems = []
  for i, row in enumerate(rows):
    if "problem" not in row or "solution" not in row:
      raise DataError(f"{file}: row {i} lacks 'problem'/'solution' (keys: {sorted(row)})")
    gold = row.get("answer") or extract_boxed(row["solution"])
    if not gold:
      raise DataError(f"{file}: row {i} has no 'answer' and no \\boxed{{}} answer in its "
                       f"solution: {row['solution'][-80:]!r}")
    problems.append(Problem(i, {"question": row["problem"], "answer": row["solution"]},
                            str(gold)))
  return problems
