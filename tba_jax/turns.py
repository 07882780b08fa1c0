"""Multi-turn sampling: model turns and environment replies in one KV cache row each.

  turns = TurnSampler(sampler, environment, encode, decode)
  out = turns(params, prompts, key, problems=problems)   # TurnRollouts
  rows = TurnRows(turns)        # a rows.RowSource of static batches with turns
  rows = streaming.StreamingRows(sampler, num_slots=N, turns=(environment, encode, decode))

Multi-turn rows are a capability of the continuous-batching pool (continuous.Stream with
`replies`, replies.py): a row decodes its turn in its slot; at a stop string the chunk ends,
the environment's reply runs in a thread pool while the other rows keep decoding, and its
tokens are appended to the row's cache, where they are conditioning (model mask 0). The
trajectory's tokens are exactly the model's context: a reply is tokenized once and never
decoded and re-encoded. `TurnSampler` runs one batch through a pool as wide as the batch's
bucket; the streaming searcher keeps a pool of its own busy (streaming.py). The reward reads
each row's reward-mask tokens (environment.SCORES).

Randomness: the token of column j is drawn with fold_in(fold_in(key, row id), j), as the
static sampler draws it, so a row's tokens depend on its row id and the replies.

Axis legend: B rows, M max_new_tokens (the trajectory's tokens, replies included).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import jax
import numpy as np

from tba_jax import batch as batch_lib
from tba_jax import continuous
from tba_jax.replies import Replies, TurnStats
from tba_jax.rows import Feed, Group, Sample, Sampled
from tba_jax.sampler import Rollouts, Sampler
from tba_jax.tasks.environment import Environment


@dataclasses.dataclass(frozen=True)
class TurnRollouts(Rollouts):
  """sampler.Rollouts with each row's turns (an evaluator reads it as Rollouts)."""
  model_mask: np.ndarray = None    # [B, M] int32: 1 = a model token, 0 = reply / padding
  reward_mask: np.ndarray = None   # [B, M] int32: 1 = a token the reward reads (module doc)
  turns: np.ndarray = None         # [B] int32: model turns
  # [B] what the row's environment did (searcher.SearchStats): int32, tool_seconds float64.
  tool_calls: np.ndarray = None
  tool_errors: np.ndarray = None
  reply_failures: np.ndarray = None
  tool_seconds: np.ndarray = None
  replies_dropped: np.ndarray = None


class TurnSampler:
  """Multi-turn completions of a batch of prompts through `sampler`'s model, devices and
  decoding settings (a continuous.Stream as wide as the batch's bucket); `encode` / `decode`
  the tokenizer's (text <-> ids, no special tokens added or parsed: Tokenizer.encode_text).
  `problems`: prompt token tuple -> Problem, for callers that pass none (an evaluator)."""

  def __init__(self, sampler: Sampler, environment: Environment,
               encode: Callable[[str], list[int]], decode: Callable[[Sequence[int]], str], *,
               chunk_steps: int = continuous.DEFAULT_CHUNK_STEPS, problems: dict | None = None):
    self.sampler, self.encode, self.decode = sampler, encode, decode
    self.replies = Replies(environment, encode, decode)  # one thread pool for every batch
    self.chunk_steps, self.problems = chunk_steps, problems or {}

  def __call__(self, params, prompts: Sequence[Sequence[int]], rng_key,
               temperature: float | None = None, problems: Sequence[Any] | None = None
               ) -> TurnRollouts:
    if not prompts:
      raise ValueError("no prompts")
    n, m = len(prompts), self.sampler.options.max_new_tokens
    if problems is None:
      problems = [self.problems.get(tuple(int(x) for x in p)) for p in prompts]
    stream = continuous.Stream(
        self.sampler, params, rng_key, num_slots=batch_lib.bucket(n, self.sampler.batch_buckets,
                                                                  "batch size"),
        max_prompt_len=max(map(len, prompts)), chunk_steps=self.chunk_steps,
        replies=self.replies)
    stream.add(prompts, range(n), temperature, problems)
    done = continuous.drain(stream)
    rows = [done[i] for i in range(n)]
    stats = [c.turn_stats for c in rows]
    masks = lambda name: batch_lib.right_pad([getattr(s, name) for s in stats], m, 0)[0]
    counts = lambda name, dtype: np.array([getattr(s, name) for s in stats], dtype)
    return TurnRollouts(
        **vars(continuous.rollouts(rows, self.sampler.options)),
        model_mask=masks("model_mask"), reward_mask=masks("reward_mask"),
        turns=counts("turns", np.int32), tool_calls=counts("tool_calls", np.int32),
        tool_errors=counts("tool_errors", np.int32),
        reply_failures=counts("reply_failures", np.int32),
        tool_seconds=counts("tool_seconds", np.float64),
        replies_dropped=counts("replies_dropped", np.int32))


# What a row's rows.Sample takes of its TurnRollouts (the per-row fields of TurnStats).
_SAMPLE_FIELDS = tuple(f.name for f in dataclasses.fields(TurnStats))


class TurnRows:
  """A rows.RowSource of static batches with turns: num_prompts prompts x S rows through
  a TurnSampler, one batch per `sample` (rows.StaticRows's cursor and keys)."""

  def __init__(self, turns: TurnSampler):
    self.turns, self.sampler = turns, turns.sampler
    self.num_batches = 0

  def sample(self, feed: Feed) -> Sampled:
    version, params = feed.mailbox.get()
    with feed.lock:
      ids, b = feed.take(feed.num_prompts), self.num_batches
    temperature = feed.temperature(b)
    s = feed.num_samples
    rows = [i for i in ids for _ in range(s)]  # prompt-major, as StaticRows
    out = self.turns(params, [feed.prompt_tokens[i] for i in rows],
                     jax.random.fold_in(feed.key, b), temperature=temperature,
                     problems=[feed.problems[i] for i in rows])

    def row(r):
      k = out.lengths[r]
      per_row = {f: getattr(out, f)[r] for f in _SAMPLE_FIELDS}
      per_row = {f: x[:k] if np.ndim(x) else x.item() for f, x in per_row.items()}
      return Sample(out.tokens[r, :k], out.tempered_logprobs[r, :k], version, version,
                    **per_row)

    groups = [Group(i, temperature, tuple(row(k * s + j) for j in range(s)))
              for k, i in enumerate(ids)]
    return Sampled(groups, (version, params))

  def committed(self, groups: Sequence[Group]) -> None:
    self.num_batches += 1

  def drop(self) -> None:
    pass

  def cursor(self) -> dict:
    return {"num_batches": self.num_batches}

  def load_cursor(self, state: dict) -> None:
    self.num_batches = int(state["num_batches"])
