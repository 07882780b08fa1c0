"""Tasks: problems, prompts and reward stages, the types every task is made of.

  Problem(id, fields, target)    # one problem: the fields its prompt is made from, a target
  Task(train, test, prompt, reward, validation=..., ...)
  train, validation = hold_out(train, fraction=0.05)  # a seeded validation split
  score = task.reward.build(mesh)   # a RewardStage: loads any models onto `mesh`, jits them
  rewards = score(batch)            # RewardBatch (N completions) -> float32 [N]

A reward stage is anything with `build(mesh) -> fn(RewardBatch) -> rewards`: a rule in
Python (`TextReward`, GSM8K's answer check), a reward model's score
(tasks/model_rewards.py), or a victim model's replies scored by a classifier
(tasks/redteam.py). Each searcher builds it once, on its own devices, and calls what
it gets on every batch it samples (the evaluator the same on its devices); a stage sees
whole batches, so model calls are batched and jitted; the searcher never knows which
kind it holds.
"""

import dataclasses
import json
import os
from typing import Any, Callable, Mapping, Protocol, Sequence

import numpy as np

from tba_jax.errors import DataError, UserError


@dataclasses.dataclass(frozen=True)
class Problem:
  """One training or test problem of a task."""
  id: int  # stable within a split: the replay buffer's prompt id
  # What the task's prompt is made from: GSM8K / MATH / arithmetic {"question", "answer"
  # (the reference solution)}, TL;DR {"query", "reference"}, red-teaming {"prompt"}.
  fields: Mapping[str, Any]
  # What a rule-based reward checks a completion against: GSM8K's number, MATH's LaTeX
  # string ("\\frac{1}{2}"); None where a model scores the completion.
  target: Any = None


@dataclasses.dataclass(frozen=True)
class RewardBatch:
  """N completions, one row each (a searcher batch is prompt-major: S rows per prompt)."""
  problems: Sequence[Problem]        # [N] the task data of each row's prompt
  prompts: Sequence[Sequence[int]]   # [N] prompt token ids, as sampled (BOS included)
  completions: Sequence[np.ndarray]  # [N] completion token ids, the EOS token included
  ended_with_eos: np.ndarray         # [N] bool; False = cut off at the length limit
  # [N] what the reward reads (special tokens skipped): the decoded completion, or of a
  # multi-turn row the tokens its environment's `score` picks (reward_texts).
  texts: Sequence[str]

  def __len__(self) -> int:
    return len(self.problems)


def reward_texts(decode: Callable[[Sequence[int]], str], completions: Sequence[np.ndarray],
                 reward_masks: Sequence[np.ndarray | None] | None = None) -> list[str]:
  """RewardBatch.texts of `completions`: each one decoded, where its reward mask is 1 (a
  multi-turn row's: tasks.environment.SCORES, e.g. the model's last turn only, so that a
  tool's output is not read as the model's answer; padded rows are cut to the completion's
  length); all of it where the mask (or `reward_masks`) is None. The searchers' reward batches
  and the evaluation's both come from here."""
  masks = [None] * len(completions) if reward_masks is None else reward_masks
  return [decode(c if m is None else np.asarray(c)[np.asarray(m)[:len(c)] > 0])
          for c, m in zip(completions, masks)]


RewardFn = Callable[[RewardBatch], np.ndarray]  # -> float32 [N]


class RewardStage(Protocol):
  def build(self, mesh) -> RewardFn:
    """The scorer for one searcher (or the evaluator) on `mesh`, a searcher mesh."""


@dataclasses.dataclass(frozen=True)
class TextReward:
  """fn(completion text, problem target) -> reward, in Python, per completion (GSM8K's 0/1
  check)."""
  fn: Callable[[str, Any], float]

  def build(self, mesh) -> RewardFn:
    del mesh  # no devices involved
    return lambda batch: np.array([self.fn(text, problem.target) for text, problem
                                   in zip(batch.texts, batch.problems)], np.float32)


def as_stage(reward: RewardStage | Callable[[str, Any], float]) -> RewardStage:
  """A RewardStage as it is; a plain (text, target) -> float function as a TextReward."""
  return reward if hasattr(reward, "build") else TextReward(reward)


@dataclasses.dataclass(frozen=True)
class Metric:
  """A metrics.jsonl key and what it measures, as the plot, the progress output and the
  final line show it."""
  key: str        # "eval/win_rate"
  label: str      # "win rate against the reference summaries"
  unit: str = ""  # "fraction", "nats", ...; "" when the label says it all


# A task scored by its reward alone (a custom Task's defaults): the mean reward of the
# trained batches and of the held-out evaluation's completions.
REWARD_METRIC = Metric("reward_mean", "train reward (mean of the trained batch)")
REWARD_HEADLINE = (Metric("eval/sampled_pass@1", "held-out reward, sampled (mean)"),
                   Metric("eval/greedy_pass@1", "held-out reward, greedy (mean)"))


@dataclasses.dataclass(frozen=True)
class Task:
  """What the runtime needs of a task: problems, a prompt for each, a reward.

  Three splits: the searchers train on `train`; settings are chosen on `validation` (what
  the recipe work's periodic evaluation reads, config eval.split); `test` is read once, for
  the figure a recipe reports. Problem ids are unique within a split (train ids are the
  replay buffer's prompt ids)."""
  train: Sequence[Problem]
  test: Sequence[Problem]
  prompt: Callable[[Problem], str]  # the text the model continues
  # A reward stage (module doc: built on each searcher's devices, scores whole batches), or
  # a plain (completion text, problem target) -> float function (a TextReward).
  reward: RewardStage | Callable[[str, Any], float]
  # Held out from training like `test`, for choosing settings; () = none (refused only
  # where an evaluation reads it: eval.split="validation").
  validation: Sequence[Problem] = ()
  # True: prompt texts are rendered by the tokenizer's chat template and carry its special
  # tokens, so tokenizing them adds none (Tokenizer.encode_prompt).
  templated_prompts: bool = False
  # A completion's final answer (evaluation counts the distinct ones); None: not reported.
  answer: Callable[[str], Any] | None = None
  # The task's own evaluation metrics: an object with build(mesh) -> fn(RewardBatch,
  # evaluation.Policy) -> {name: per-row values or one float} (evaluation.MetricsFn), called
  # on every completion of an evaluation pass; None: only the reward-based metrics.
  evaluation: Any = None
  name: str = "custom"  # in the banner and in metrics.jsonl's record of the run
  # What says whether a run learned: the trained batches' reward, described for this task,
  # and the evaluation metrics the final line and each evaluation's progress line give as
  # `start -> now`, and the plot tool draws (the first is the headline).
  reward_metric: Metric = REWARD_METRIC
  headline: tuple[Metric, ...] = REWARD_HEADLINE
  # Multi-turn tasks: a tasks.environment.Environment (tool calls answered between the
  # model's turns); None: one turn, the completion is the model's alone.
  environment: Any = None

  def check(self, eval_split: str = "test") -> None:
    """Refuses an empty split before a run uses it: the searchers shard `train` and the
    evaluation reads `eval_split` ("validation" / "test"), and either would fail deep
    inside, after writing the workdir."""
    for split in ("train", eval_split):
      if not len(getattr(self, split)):
        raise UserError(f"the {self.name} task has no {split} problems (Task.{split} is empty)"
                        + (": evaluate on the test split (eval.split=test), or give the task "
                           "a validation split" if split == "validation" else ""))


# The seed of every validation split carved from a train split (`hold_out`): fixed, not the
# run's seed, so runs of different seeds choose their settings on the same problems.
VALIDATION_SEED = 0


def hold_out(problems: Sequence[Problem], fraction: float, seed: int = VALIDATION_SEED
             ) -> tuple[list[Problem], list[Problem]]:
  """(rest, validation): round(fraction x N) problems (at least one when fraction > 0) drawn
  with `seed`, the rest in their order. Ids are kept (unique within each split, as they
  were in `problems`), so a train problem keeps its row number in the data file."""
  num = max(1, round(fraction * len(problems))) if fraction > 0 else 0
  if num >= len(problems) and num:
    raise ValueError(f"a validation fraction of {fraction} leaves none of the "
                     f"{len(problems)} problems to train on")
  held = set(np.random.default_rng(seed).permutation(len(problems))[:num].tolist())
  return ([p for i, p in enumerate(problems) if i not in held],
          [p for i, p in enumerate(problems) if i in held])


def split_file(path: str, split: str, what: str) -> str:
  """The file holding `split` ("train" / "test") of a local data path: the path itself
  when it is a file; in a directory `{split}.jsonl` or `.parquet`, else the one file
  below it whose name starts with the split (a hub snapshot's
  data/test-00000-of-00001.parquet). `what` names the data set in errors."""
  if os.path.isfile(path):
    return path
  if not os.path.isdir(path):
    raise DataError(f"{what} path {path!r} does not exist")
  for ext in (".jsonl", ".parquet"):
    if os.path.exists(os.path.join(path, split + ext)):
      return os.path.join(path, split + ext)
  found = sorted(os.path.join(d, f) for d, _, files in os.walk(path) for f in files
                 if f.startswith(split) and f.endswith((".jsonl", ".parquet")))
  if len(found) != 1:
    raise DataError(f"{path}: no {split}.jsonl or {split}.parquet" +
                    (f" (several candidates: {found})" if found else ""))
  return found[0]


def read_records(path: str) -> list[dict]:
  """The rows of a .jsonl file (one JSON object a line) or a .parquet file, as dicts.

  A file with no rows, a line that is not JSON or not an object: a DataError naming
  the file and the line.
  """
  if path.endswith(".parquet"):
    try:
      import pyarrow.parquet as pq
    except ImportError:
      raise ImportError(f"reading {path} needs pyarrow: pip install pyarrow") from None
    return _some(path, pq.read_table(path).to_pylist())
  rows = []
  with open(path) as f:
    for number, line in enumerate(f, 1):
      if not line.strip():
        continue
      try:
        row = json.loads(line)
      except json.JSONDecodeError as e:
        # (json's "Invalid control character at" ends with the column it leaves out)
        raise DataError(f"{path}, line {number}: not valid JSON "
                        f"({e.msg.removesuffix(' at')}, column {e.colno})") from None
      if not isinstance(row, dict):
        raise DataError(f"{path}, line {number}: expected a JSON object, got {type(row).__name__}")
      rows.append(row)
  return _some(path, rows)


def _some(path: str, rows: list[dict]) -> list[dict]:
  if not rows:
    raise DataError(f"{path}: the file holds no rows (it is empty)")
  return rows
