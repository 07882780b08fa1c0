"""Environments: what answers a model between its turns (tool calls, and when a trajectory is
done).

  env = Environment(reply=tool_reply({"calculator": calculator}), stop=("</tool>",))
  task = Task(..., environment=env)   # the searchers and the evaluator then run turns

A trajectory of a task with an environment:
  first observation  the task's prompt, Task.prompt(problem), as for any task;
  model turn         decoded until a stop string (`stop`, e.g. "</tool>"), an EOS, the turn's
                     token limit (`max_turn_tokens`) or the trajectory's (the sampler's
                     max_new_tokens, every token of every turn and reply together);
  reply              after a turn that ended at a stop string, `reply(problem, turn_text)`
                     (run in a thread pool, off the decode loop) returns the environment's
                     text, which is tokenized and appended to the row's KV cache, and the model
                     continues; None: the trajectory is done. A turn that ended at EOS or a
                     limit is the last one, and so is the `max_turns`-th;
  reward             the task's reward stage, as for any task. Its RewardBatch's completion holds
                     every turn and every reply; its text is what the environment's `score`
                     picks (SCORES): the model's last turn by default, so that a tool's printed
                     output is never taken for the model's final answer, or the transcript.
The replies' tokens are conditioning: the entry's model_mask is 0 there, so no log pi, log
pi_ref or baseline counts them (tba_jax/turns.py samples the turns).

Tool calls come in two formats (tasks/tool_calls.py): our tag, `tool_reply` below, for
models without a chat template that declares tools, and the format the template declares
(Hermes / Qwen JSON), answered with the template's own tool turn.

A reply function that raises is the model's doing (its code broke the tool): the row gets an
error reply (`failure_reply`) and the run counts it; SandboxUnavailable, the machine's
doing, is raised instead (FATAL), and a tool that needs the sandbox probes it when its
environment is built (tasks/tool_use.py).
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable, Mapping

import numpy as np

from tba_jax.choices import TOOL_SCORES
from tba_jax.tasks import Problem
from tba_jax.tasks.tools import SandboxUnavailable

# Reply failures that stop the rollout instead of becoming an error reply: the machine, not
# the model's turn, is at fault, and every later call would fail the same way.
FATAL = (SandboxUnavailable,)


@dataclasses.dataclass(frozen=True)
class Reply:
  """An environment's answer to one model turn, with what the run's metrics count."""
  text: str
  tool_calls: int = 1   # tool calls this reply answers (0: a plain message)
  error: bool = False   # the tool failed (an error string went back to the model)
  failed: bool = False  # the reply function raised; this is failure_reply's text
  # The reply's tokens where the environment tokenized it itself (a chat template's tool
  # turn, whose markup holds the template's special tokens: tasks/tool_calls.py); None: the
  # model reads `text` as plain text (Tokenizer.encode_text).
  ids: tuple[int, ...] | None = None


# (the row's problem, or None where the caller has none; the model's turn text, the stop
# string included) -> a Reply, a plain string (one successful tool call), or None: done.
ReplyFn = Callable[[Problem | None, str], "Reply | str | None"]


def _last_turn(model_mask: np.ndarray) -> np.ndarray:
  """1 on the last maximal run of model tokens (the model's final turn), 0 elsewhere."""
  own = np.asarray(model_mask) > 0
  out = np.zeros(own.shape, np.int32)
  if own.any():
    end = own.size - int(np.argmax(own[::-1]))  # one past the last model token
    out[end - int(np.argmin(np.append(own[:end][::-1], False))):end] = 1  # back to its start
  return out


# Environment.score (config task.tools.score) -> fn(model_mask [n]) -> reward_mask [n]: 1 on
# the tokens whose text the task's reward reads (tasks.reward_texts).
SCORES: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    # The model's own final turn: a task that asks for a final answer.
    "last_turn": _last_turn,
    # Every turn and every reply: a task whose reward reads the whole exchange.
    "transcript": lambda model_mask: np.ones(np.shape(model_mask), np.int32),
}
assert tuple(SCORES) == TOOL_SCORES  # the config's choices


@dataclasses.dataclass(frozen=True)
class Environment:
  """The environment of a multi-turn task (module doc)."""
  reply: ReplyFn
  stop: tuple[str, ...] = ("</tool>",)  # a model turn ends at the first of these
  max_turns: int = 4           # model turns per trajectory (the last never gets a reply)
  max_turn_tokens: int = 64    # tokens of one model turn
  max_reply_tokens: int = 32   # tokens of one reply (longer ones are cut)
  num_workers: int = 8         # threads running replies (tools) beside the decode loop
  score: str = "last_turn"     # what the reward reads (SCORES): "last_turn" | "transcript"

  def __post_init__(self):
    if self.score not in SCORES:
      raise ValueError(f"Environment.score={self.score!r}: choose from {sorted(SCORES)}")
    if not self.stop or not all(self.stop):
      raise ValueError(f"Environment.stop={self.stop!r}: needs at least one non-empty string")
    for name in ("max_turns", "max_turn_tokens", "max_reply_tokens", "num_workers"):
      if getattr(self, name) < 1:
        raise ValueError(f"Environment.{name}={getattr(self, name)} must be >= 1")


def as_reply(out: Reply | str | None) -> Reply | None:
  if out is None or isinstance(out, Reply):
    return out
  if isinstance(out, str):
    return Reply(out)
  raise TypeError(f"an environment's reply must be a Reply, a str or None; got {type(out)}")


def failure_reply(error: Exception) -> Reply:
  """The error reply that stands for a reply function that raised (module doc)."""
  return Reply(f"error: {type(error).__name__}: {error}", error=True, failed=True)


_CALL = re.compile(r"<tool>(.*?)</tool>\s*$", re.S)


def tool_reply(tools: Mapping[str, Callable[[str], str]], *, default: str | None = None,
               bare_calls: bool = False) -> ReplyFn:
  """A ReplyFn for turns that end in `<tool>NAME: ARGUMENT</tool>`: runs tools[NAME] on the
  argument and answers `<result>OUTPUT</result>` (a tool's output starting with "error"
  counts as a tool error). `default`: the tool of a call without "NAME:" (None: such a call
  is an error). A turn without a call is the last one (done), unless `bare_calls`: then the
  whole turn is a call of the `default` tool (the tiny recipe's random model, which never
  writes the tags)."""

  def reply(problem: Any, text: str) -> Reply | None:
    del problem  # tools answer the call alone
    match = _CALL.search(text)
    if match is None and not bare_calls:
      return None
    # A bare call: the turn up to its stop tag (a prompt that opened the tag itself).
    call = (match.group(1) if match else text.rsplit("</tool>", 1)[0]).strip()
    name, sep, argument = call.partition(":")
    name = name.strip()
    if not sep or name not in tools:
      name, argument = default, call
    if name is None:
      return Reply(f"<result>error: unknown tool; use one of {sorted(tools)} as "
                   f"<tool>NAME: ARGUMENT</tool></result>", error=True)
    out = tools[name](argument.strip())
    return Reply(f"<result>{out}</result>", error=out.startswith("error"))

  return reply
