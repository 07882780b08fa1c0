"""Users' reward functions by name (config task.reward=PATH.py:FUNCTION or
module.path:FUNCTION), in the two signatures the field writes them in, told apart by their
parameters:

  TRL   reward_func(prompts, completions, **columns) -> list[float]: one call per batch;
        `completions` are texts, or [{"role": "assistant", "content": text}] lists when the
        prompts are chat messages (as TRL passes them); every other column of the data set
        (and `completion_ids`) is a keyword argument holding one value per completion.
  verl  compute_score(data_source, solution_str, ground_truth, extra_info) -> float | dict:
        one call per completion; a dict's "score" is the reward, its other numeric keys are
        evaluation metrics (eval/reward_KEY, `ScoreDetails`).

`FunctionReward` is a reward stage (tasks.RewardStage) like any other: each searcher and the
evaluator call it on whole batches. A function that raises, returns the wrong number of
rewards or something that is not a finite number stops the batch with a RewardFunctionError
naming the function and the row (a TRL function that raised on a batch is called again row
by row to find it). Searchers score in threads: a function must not rely on being in the
main thread (math-verify's default signal-based timeouts do: pass timeouts of None to it).
Training batches do not log a verl dict's extra keys; only evaluations do (calling the
function once more per completion).
"""
from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import inspect
import math
import os
import re
import sys
from typing import Callable

import numpy as np

from tba_jax.errors import ConfigError, UserError

# kind -> how errors name its signature.
SIGNATURES = {"trl": "TRL's signature", "verl": "verl's signature"}
VERL_ARGS = ("data_source", "solution_str", "ground_truth", "extra_info")
_TRL_ARGS = ("prompts", "completions", "completion_ids")


class RewardFunctionError(UserError):
  """A user's reward function failed on a batch: the message names it and the row."""


def load_function(spec: str) -> Callable:
  """The function that `spec` ("PATH.py:NAME" or "module.path:NAME") names."""
  where, sep, name = spec.rpartition(":")
  if not (sep and where and name):
    raise ConfigError(f"task.reward={spec!r}: expected PATH.py:FUNCTION or "
                      "module.path:FUNCTION (or a built-in checker: paper_regex, math_verify)")
  if where.endswith(".py"):
    if not os.path.isfile(where):
      raise ConfigError(f"task.reward={spec!r}: the file {where!r} does not exist (from "
                        f"{os.getcwd()})")
    module_name = "_tba_reward_" + re.sub(r"\W", "_", os.path.abspath(where))
    module_spec = importlib.util.spec_from_file_location(module_name, where)
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[module_name] = module  # (dataclasses and pickling look modules up there)
    try:
      module_spec.loader.exec_module(module)
    except Exception as e:
      raise ConfigError(f"task.reward={spec!r}: importing {where} raised "
                        f"{type(e).__name__}: {e}") from e
  else:
    try:
      module = importlib.import_module(where)
    except ImportError as e:
      raise ConfigError(f"task.reward={spec!r}: cannot import the module {where!r} ({e})") from e
  fn = getattr(module, name, None)
  if not callable(fn):
    found = sorted(n for n, v in vars(module).items()
                   if inspect.isfunction(v) and not n.startswith("_"))
    raise ConfigError(f"task.reward={spec!r}: {where} has no function {name!r} (its functions: "
                      f"{', '.join(found) or 'none'})")
  return fn


def kind_of(fn: Callable, spec: str) -> str:
  """"trl" or "verl", from the function's parameter names."""
  names = set(inspect.signature(fn).parameters)
  if "solution_str" in names:
    return "verl"
  if "completions" in names:
    return "trl"
  raise ConfigError(
      f"task.reward={spec!r}: its parameters ({', '.join(inspect.signature(fn).parameters)}) "
      "are neither TRL's reward_func(prompts, completions, **kwargs) nor verl's "
      "compute_score(data_source, solution_str, ground_truth, extra_info)")


def _accepts(fn: Callable) -> tuple[set[str], bool, set[str]]:
  """(its named parameters, whether it takes **kwargs, those without a default)."""
  params = inspect.signature(fn).parameters.values()
  named = {p.name for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
  required = {p.name for p in params if p.default is p.empty and
              p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
  return named, any(p.kind == p.VAR_KEYWORD for p in params), required


def load(spec: str, *, prompt_column: str, chat: bool, columns: set[str]) -> "FunctionReward":
  """The reward stage of the function `spec` names, for a data set with `columns` (its
  prompts in `prompt_column`; `chat`: they are messages). A parameter the calls cannot
  fill is a ConfigError now, not a failed batch later."""
  fn = load_function(spec)
  kind = kind_of(fn, spec)
  named, _, required = _accepts(fn)
  given = (set(VERL_ARGS) if kind == "verl" else
           {*_TRL_ARGS} | (columns - {prompt_column}))
  missing = sorted(required - given)
  if missing:
    why = ("verl does not pass" if kind == "verl" else
           f"no column of the data set holds (columns: {', '.join(sorted(columns))})")
    raise ConfigError(f"task.reward={spec!r} ({SIGNATURES[kind]}) needs "
                      f"{', '.join(map(repr, missing))}, which {why}")
  return FunctionReward(fn, spec, kind, prompt_column, chat)


@dataclasses.dataclass(frozen=True)
class FunctionReward:
  """A reward stage calling a user's function (module docstring)."""
  fn: Callable
  spec: str            # task.reward, as errors name it
  kind: str            # "trl" or "verl"
  prompt_column: str   # the data set's prompt column (TRL's `prompts`)
  chat: bool           # the prompts are messages: TRL completions as message lists

  def build(self, mesh) -> Callable:
    del mesh  # a Python function: no devices involved
    return self.score

  def score(self, batch) -> np.ndarray:
    """float32 [N]: one reward per completion of `batch` (a tasks.RewardBatch)."""
    return np.asarray(self.details(batch)[0], np.float32)

  def details(self, batch) -> tuple[list[float], list[dict[str, float]]]:
    """(rewards, each row's other numeric values: a verl dict's keys besides "score")."""
    if self.kind == "verl":
      return self._verl(batch)
    return self._trl(batch), [{} for _ in batch.texts]

  # ----- TRL: one call per batch ------------------------------------------------------
  def _trl_arguments(self, batch) -> dict:
    named, any_keyword, _ = _accepts(self.fn)
    rows = [p.fields for p in batch.problems]
    # (a column named as one of TRL's own arguments is left out: the argument wins)
    columns = {c for r in rows for c in r} - {self.prompt_column, *_TRL_ARGS}
    out = dict(prompts=[r.get(self.prompt_column) for r in rows],
               completions=[[{"role": "assistant", "content": t}] if self.chat else t
                            for t in batch.texts],
               completion_ids=[np.asarray(c).tolist() for c in batch.completions],
               **{c: [r.get(c) for r in rows] for c in sorted(columns)})
    return {k: v for k, v in out.items() if any_keyword or k in named}

  def _trl(self, batch) -> list[float]:
    kwargs = self._trl_arguments(batch)
    try:
      out = self.fn(**kwargs)
    except Exception as e:
      raise self._blame(batch, kwargs, e) from e
    try:
      values = list(out)
    except TypeError:
      raise RewardFunctionError(f"{self._name()} returned {type(out).__name__} for a batch of "
                                f"{len(batch)} completions; expected a list of {len(batch)} "
                                "floats (TRL's reward_func)") from None
    if len(values) != len(batch):
      raise RewardFunctionError(
          f"{self._name()} returned {len(values)} rewards for a batch of {len(batch)} "
          f"completions (rows {_ids(batch)}); expected one float per completion")
    return [self._number(v, batch, j) for j, v in enumerate(values)]

  def _blame(self, batch, kwargs: dict, error: Exception) -> RewardFunctionError:
    """The error naming the first row that raises alone (else the batch)."""
    for j in range(len(batch)):
      try:
        self.fn(**{k: v[j:j + 1] for k, v in kwargs.items()})
      except Exception as e:
        return RewardFunctionError(f"{self._name()} raised {type(e).__name__}: {e} on "
                                   f"{_row(batch, j)}")
    return RewardFunctionError(f"{self._name()} raised {type(error).__name__}: {error} on a "
                               f"batch of {len(batch)} completions (rows {_ids(batch)}); on each "
                               "row alone it did not")

  # ----- verl: one call per completion -------------------------------------------------
  def _verl(self, batch) -> tuple[list[float], list[dict[str, float]]]:
    named, any_keyword, _ = _accepts(self.fn)
    rewards, extras = [], []
    for j, (problem, text) in enumerate(zip(batch.problems, batch.texts)):
      row = problem.fields
      args = dict(data_source=row.get("data_source", ""), solution_str=text,
                  ground_truth=problem.target, extra_info=row.get("extra_info"))
      try:
        out = self.fn(**{k: v for k, v in args.items() if any_keyword or k in named})
      except Exception as e:
        raise RewardFunctionError(f"{self._name()} raised {type(e).__name__}: {e} on "
                                  f"{_row(batch, j)}") from e
      if isinstance(out, dict):
        if "score" not in out:
          raise RewardFunctionError(
              f"{self._name()} returned a dict without 'score' (keys: {', '.join(map(str, out))}) "
              f"on {_row(batch, j)}; verl's compute_score returns a float or a dict with 'score'")
        extras.append({str(k): float(v) for k, v in out.items()
                       if k != "score" and _is_number(v)})
        out = out["score"]
      else:
        extras.append({})
      rewards.append(self._number(out, batch, j))
    return rewards, extras

  def _number(self, value, batch, j: int) -> float:
    if _is_number(value) and math.isfinite(float(value)):
      return float(value)
    raise RewardFunctionError(f"{self._name()} returned {value!r} on {_row(batch, j)}; a reward "
                              "must be a finite number")

  def _name(self) -> str:
    return f"the reward function {self.spec} ({SIGNATURES[self.kind]})"


def _is_number(value) -> bool:
  """A float, an int, or a bool (verl's DAPO scorer returns {"acc": True, ...}) as 0 / 1."""
  return isinstance(value, (int, float, np.number, np.bool_))


def _ids(batch) -> str:
  ids = [p.id for p in batch.problems]
  return ", ".join(map(str, ids[:8])) + (", ..." if len(ids) > 8 else "")


def _row(batch, j: int) -> str:
  """Row j of a batch as an error names it: its data row and the completion's start."""
  return (f"row {batch.problems[j].id} of the data set (its completion: "
          f"{batch.texts[j][:60]!r})")


@dataclasses.dataclass(frozen=True)
class ScoreDetails:
  """Task.evaluation of a verl function: each numeric key its dicts return besides "score"
  (in every row of the pass) as an evaluation metric, eval/reward_KEY (per row and mean)."""
  reward: FunctionReward

  def build(self, mesh) -> Callable:
    del mesh
    return lambda batch, policy: self.metrics(batch)

  def metrics(self, batch) -> dict[str, np.ndarray]:
    _, extras = self.reward.details(batch)
    keys = set(extras[0]).intersection(*extras[1:]) if extras else set()
    return {f"reward_{k}": np.array([e[k] for e in extras], np.float64) for k in sorted(keys)}
