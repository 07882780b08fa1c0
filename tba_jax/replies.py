"""The environment's side of multi-turn rows: what answers a row between its model turns.

A continuous.Stream given `replies=Replies(environment, encode, decode)` runs multi-turn
rows (tba_jax/turns.py: the batch and row-source wrappers). When a row's turn ends on device
(continuous.py, slot_programs.py), the host asks this side:
  turn_ended  was it the last turn (EOS, environment.max_turns, a limit with no stop string
              in its text)? If not, the row is cut back to the shortest prefix of its turn
              whose text holds a stop string (the device checks the stop strings as the
              tokenizer spells them alone and after a space, `stop_sequences`; the model may
              spell one with other tokens) and environment.reply(problem, text) starts in a
              thread pool, off the decode loop: a slow tool stalls only its own row. A reply
              function that raises is answered by environment.failure_reply
              (environment.FATAL ends the rollout).
  take        the reply once it came back: its tokens, which the pool appends to the row's
              cache. A reply is tokenized once, as plain text (Tokenizer.encode_text: a
              printed "<|im_end|>" is no special token), or comes as ids (Reply.ids: a chat
              template's tool turn, tasks/tool_calls.py), and those ids are what the model
              sees: nothing is decoded and re-encoded. None ends the row: the environment is
              done, or the reply does not fit in the row (replies_dropped; the call counters
              count replies that entered the context).
  stats       a finished row's model mask (0 on reply tokens), reward mask (the tokens the
              reward reads, environment.SCORES) and counters.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import time
from typing import Any, Callable, Sequence

import numpy as np

from tba_jax import batch as batch_lib
from tba_jax.tasks.environment import FATAL, SCORES, Environment, as_reply, failure_reply

REPLY_BUCKETS = (8, 16, 32, 64, 128, 256, 512)


@dataclasses.dataclass
class TurnStats:
  """What a multi-turn row's environment did (searcher.SearchStats counts it); the fields are
  rows.Sample's."""
  model_mask: np.ndarray | None = None  # [n] int32: 1 = a model token, 0 = a reply token
  reward_mask: np.ndarray | None = None  # [n] int32: 1 = a token whose text the reward reads
  turns: int = 1  # model turns
  tool_calls: int = 0
  tool_errors: int = 0
  reply_failures: int = 0  # reply functions that raised
  tool_seconds: float = 0.0
  replies_dropped: int = 0  # replies with no room left in the row


@dataclasses.dataclass
class TurnRow:
  """The host's record of a multi-turn row in flight."""
  problem: Any  # what its environment replies to
  stats: TurnStats = dataclasses.field(default_factory=TurnStats)
  reply_columns: list = dataclasses.field(default_factory=list)  # (start, end) of each reply
  cut: int = 0  # the columns kept of the turn whose reply is pending
  future: Any = None  # the pending reply: (Reply | None, seconds)

  @property
  def waiting(self) -> bool:
    return self.future is not None


class Replies:
  """The environment's side of a pool's multi-turn rows (module doc); `encode` / `decode`
  the tokenizer's (text <-> ids, no special tokens added or parsed: Tokenizer.encode_text).
  One thread pool runs the replies of every pool built with it."""

  def __init__(self, environment: Environment, encode: Callable[[str], list[int]],
               decode: Callable[[Sequence[int]], str]):
    self.environment, self.encode, self.decode = environment, encode, decode
    self.stops = stop_sequences(environment, encode)
    self.reply_bucket = batch_lib.bucket(environment.max_reply_tokens, REPLY_BUCKETS,
                                         "environment max_reply_tokens")
    self.executor = concurrent.futures.ThreadPoolExecutor(environment.num_workers,
                                                          thread_name_prefix="tba-env")

  def turn_ended(self, row: TurnRow, columns: np.ndarray, eos_ids: Sequence[int]) -> bool:
    """Row's turn ended with its `columns` (every column filled): True when its reply started
    (the row waits for it), False when it was the row's last turn."""
    env = self.environment
    if int(columns[-1]) in eos_ids or row.stats.turns >= env.max_turns:
      return False
    start = row.reply_columns[-1][1] if row.reply_columns else 0
    turn = [int(x) for x in columns[start:]]
    holds_stop = lambda ids: any(stop in self.decode(ids) for stop in env.stop)
    if not holds_stop(turn):
      return False  # a limit, with no tool call pending
    cut = next(j for j in range(1, len(turn) + 1) if holds_stop(turn[:j]))
    row.cut = start + cut
    row.future = self.executor.submit(self._reply, row.problem, self.decode(turn[:cut]))
    return True

  def _reply(self, problem, text: str):
    begin = time.perf_counter()
    try:
      out = self.environment.reply(problem, text)
    except FATAL:
      raise
    except Exception as e:  # the model's turn broke the reply function: it reads why
      out = failure_reply(e)
    return as_reply(out), time.perf_counter() - begin

  def take(self, row: TurnRow, room: int) -> list[int] | None:
    """Row's reply, which came back: the tokens to append (at most `room`), counted; None
    when the row is finished (module doc)."""
    reply, seconds = row.future.result()  # re-raises environment.FATAL
    row.future = None
    if reply is None:
      return None
    # A chat template's tool turn comes tokenized (its markup's special tokens parsed); any
    # other reply is plain text (module doc).
    ids = list(reply.ids) if reply.ids is not None else self.encode(reply.text)
    ids = ids[:self.environment.max_reply_tokens]
    s = row.stats
    if not ids or len(ids) > room:
      s.replies_dropped += 1
      return None
    s.tool_calls += reply.tool_calls
    s.tool_errors += int(reply.error)
    s.reply_failures += int(reply.failed)
    s.tool_seconds += seconds
    s.turns += 1
    row.reply_columns.append((row.cut, row.cut + len(ids)))
    return ids

  def stats(self, row: TurnRow, length: int) -> TurnStats:
    """The finished row's stats, its masks over its `length` columns included."""
    model_mask = np.ones(length, np.int32)
    for start, end in row.reply_columns:
      model_mask[start:end] = 0
    return dataclasses.replace(row.stats, model_mask=model_mask,
                               reward_mask=SCORES[self.environment.score](model_mask))

  @staticmethod
  def wait(rows: Sequence[TurnRow]) -> None:
    """Until one of the pending replies of `rows` comes back."""
    pending = [row.future for row in rows if row.waiting]
    if pending:
      concurrent.futures.wait(pending, return_when=concurrent.futures.FIRST_COMPLETED)


def stop_sequences(environment: Environment, encode) -> tuple[tuple[int, ...], ...]:
  """The stop strings as token sequences, as the tokenizer spells them alone and after a
  space (other spellings are caught on the host: module doc)."""
  seqs = {tuple(encode(s)) for s in environment.stop} | {
      tuple(encode(" " + s))[1:] for s in environment.stop if len(encode(" " + s)) > 1}
  return tuple(sorted(s for s in seqs if s))
