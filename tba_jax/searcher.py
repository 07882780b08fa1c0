"""A searcher: its prompt shard, the lagging policy, the frozen reference, rewards.

One `search_once` call: take the newest published weights from the mailbox,
draw the next prompts of this searcher's shard, pick the batch's sampling
temperature (`Exploration`), sample S completions of each,
score the batch with the task's reward stage, compute the reference model's
per-token log-probs of each completion, and add the stamped entries (policy
version, searcher id) to the searcher's local replay buffer. `run` repeats that
in a thread until told to stop; an exception is kept with its traceback for the
trainer to report. The searchers of a process are driven together by
`searcher_pool.SearcherPool`.
"""
from __future__ import annotations

import dataclasses
import threading
import time
import traceback
from typing import Callable, Sequence

import jax
import numpy as np

from tba_jax import batch as batch_lib
from tba_jax import sharding, train_step
from tba_jax.entries import Entry
from tba_jax.model import Params
from tba_jax.replay_buffer import ReplayBuffer
from tba_jax.rewards import RewardBatch, RewardFn
from tba_jax.sampler import Rollouts, Sampler
from tba_jax.tasks import Problem
from tba_jax.weight_sync import Mailbox


class PromptStream:
  """A shard of prompt ids, reshuffled every epoch from (seed, epoch)."""

  def __init__(self, ids: Sequence[int], seed: int):
    if not ids:
      raise ValueError("a searcher got an empty prompt shard (more searchers than prompts?)")
    self.ids, self.seed = np.asarray(ids), seed
    self.epoch = self.position = 0

  def take(self, n: int) -> list[int]:
    out = []
    while len(out) < n:
      order = np.random.default_rng([self.seed, self.epoch]).permutation(self.ids)
      chunk = order[self.position:self.position + n - len(out)]
      out.extend(int(i) for i in chunk)
      self.position += len(chunk)
      if self.position == len(order):
        self.epoch, self.position = self.epoch + 1, 0
    return out

  def state_dict(self) -> dict:
    return {"epoch": self.epoch, "position": self.position}

  def load_state_dict(self, state: dict) -> None:
    self.epoch, self.position = int(state["epoch"]), int(state["position"])


# Teacher-forced per-token log-probs of the completion columns (the trainer's
# own function, so reference and policy log-probs are computed identically).
_completion_logprobs = jax.jit(train_step.completion_token_logprobs,
                               static_argnames=("model_config", "completion_len", "temperature",
                                                "remat"))


@dataclasses.dataclass(frozen=True)
class Exploration:
  """A searcher batch's sampling temperature: with probability `prob` one drawn from
  U(low, high), else the sampler's (Lee et al., GFNOrg/red-teaming gfn_trainer.py
  L279-285: prob 0.5, U(0.5, 2.0) for GPT-2). Only sampling changes: reference
  and trainer log-probs stay at the sampler's temperature, and TB needs no
  correction for off-policy samples. prob 0 (the default) never explores."""
  prob: float = 0.0
  low: float = 1.0
  high: float = 1.0

  def __post_init__(self):
    if not 0 <= self.prob <= 1 or not 0 < self.low <= self.high:
      raise ValueError(f"exploration needs 0 <= prob <= 1 and 0 < low <= high; got {self}")

  def temperature(self, rng: np.random.Generator, default: float) -> float:
    if self.prob and rng.random() < self.prob:
      return float(rng.uniform(self.low, self.high))
    return default


@dataclasses.dataclass
class SearchStats:
  num_samples: int = 0
  num_batches: int = 0
  busy_seconds: float = 0.0
  reward_sum: float = 0.0
  tokens: int = 0


class Searcher:
  """Generates, scores and stores completions for one shard of the prompts.

  The sampler holds the model, its devices, the temperature and the special
  ids; `reward` is the task's reward stage built on the same devices.
  """

  def __init__(self, searcher_id: int, *, sampler: Sampler, ref_params: Params,
               mailbox: Mailbox, stream: PromptStream, prompt_tokens: dict[int, list[int]],
               problems: dict[int, Problem], decode: Callable[[Sequence[int]], str],
               reward: RewardFn, num_prompts: int, num_samples: int, max_prompt_len: int,
               seed: int, explore: Exploration = Exploration()):
    self.id, self.sampler, self.explore, self.seed = searcher_id, sampler, explore, seed
    self.ref_params = ref_params  # frozen reference, on this searcher's devices
    self.mailbox, self.stream = mailbox, stream
    self.prompt_tokens, self.problems = prompt_tokens, problems
    self.decode, self.reward = decode, reward
    self.num_prompts, self.num_samples, self.max_prompt_len = num_prompts, num_samples, max_prompt_len
    self.key = jax.random.fold_in(jax.random.key(seed), searcher_id)
    # Local staging, drained into the global buffer (which de-duplicates if configured).
    self.buffer = ReplayBuffer(max_per_prompt=10**9, dedup=False)
    self.num_batches = 0
    self.stats = SearchStats()
    self.error: str | None = None
    self.lock = threading.Lock()  # held for a whole batch: checkpoints see whole batches

  def set_reference(self, params: Params) -> None:
    """Reference reset (TBA-prime): later samples are scored against `params`."""
    with self.lock:
      self.ref_params = params

  def search_once(self) -> int:
    """One batch of prompts x S samples into the local buffer; returns #samples."""
    with self.lock:
      start = time.perf_counter()
      version, params = self.mailbox.get()  # newest weights; the old ones stay valid
      ids = self.stream.take(self.num_prompts)
      # [P] prompts -> [P * S] rows, prompt-major: row r is prompt ids[r // S].
      rows = [i for i in ids for _ in range(self.num_samples)]
      prompts = [self.prompt_tokens[i] for i in rows]
      # Drawn from (seed, searcher, batch index): a resumed searcher repeats the choices.
      temperature = self.explore.temperature(
          np.random.default_rng([self.seed, self.id, self.num_batches]),
          self.sampler.options.temperature)
      out = self.sampler(params, prompts, jax.random.fold_in(self.key, self.num_batches),
                         temperature=temperature)
      completions = [out.tokens[r, :out.lengths[r]] for r in range(len(rows))]
      eos = set(self.sampler.options.eos_ids)
      ended = np.array([c.size > 0 and int(c[-1]) in eos for c in completions])
      rewards = np.asarray(self.reward(RewardBatch(
          problems=[self.problems[i] for i in rows], prompts=prompts, completions=completions,
          ended_with_eos=ended, texts=[self.decode(c) for c in completions])), np.float32)
      if rewards.shape != (len(rows),):
        raise ValueError(f"the reward stage returned shape {rewards.shape} for {len(rows)} "
                         "completions; expected one reward per completion")
      ref = self._reference_logprobs(prompts, out)
      entries = [Entry(prompt_id=i, prompt=prompts[r], completion=completions[r],
                       reward=float(rewards[r]), ref_logprobs=ref[r, :completions[r].size],
                       behaviour_logprobs=out.tempered_logprobs[r, :completions[r].size],
                       version=version, searcher_id=self.id, ended_with_eos=bool(ended[r]),
                       temperature=temperature)
                 for r, i in enumerate(rows)]
      self.buffer.add_many(entries)
      self.num_batches += 1
      self.stats.num_batches += 1
      self.stats.num_samples += len(rows)
      self.stats.reward_sum += float(rewards.sum())
      self.stats.tokens += int(out.lengths.sum())
      self.stats.busy_seconds += time.perf_counter() - start
      return len(rows)

  def _reference_logprobs(self, prompts: list[list[int]], out: Rollouts) -> np.ndarray:
    """[N, Tc] reference log-probs of the sampled completions, 0 past each one's end."""
    n, tp, tc = len(prompts), self.max_prompt_len, out.tokens.shape[1]
    # Pad the batch to the sampler's batch bucket so this compiles once per bucket.
    b = next(b for b in self.sampler.batch_buckets if b >= n)
    completions = [out.tokens[r, :out.lengths[r]] for r in range(n)] + [[]] * (b - n)
    tokens, mask = batch_lib.token_rows(prompts + [[]] * (b - n), completions, tp, tc,
                                        self.sampler.options.pad_id)
    place = lambda x: jax.device_put(x, sharding.batch_sharding("searcher", self.sampler.mesh, 2))
    lp = _completion_logprobs(self.sampler.model_config, self.ref_params, place(tokens),
                              place(mask), completion_len=tc,
                              temperature=self.sampler.options.temperature)
    return np.where(mask[:n, tp:] > 0, np.asarray(lp)[:n], 0.0)

  def run(self, stop: threading.Event) -> None:
    """Thread body: search until `stop` is set; an exception is kept, then re-raised."""
    try:
      while not stop.is_set():
        self.search_once()
    except BaseException:  # reported by the trainer with the traceback
      self.error = traceback.format_exc()
      stop.set()

  def state_dict(self) -> dict:
    with self.lock:
      # The counters continue across a resume; busy time is per process (a fraction of its
      # wall-clock), so it starts again.
      stats = {k: v for k, v in dataclasses.asdict(self.stats).items() if k != "busy_seconds"}
      return {"stream": self.stream.state_dict(), "num_batches": self.num_batches,
              "stats": stats}

  def load_state_dict(self, state: dict) -> None:
    with self.lock:
      self.stream.load_state_dict(state["stream"])
      self.num_batches = int(state["num_batches"])
      self.stats = SearchStats(**state.get("stats", {}))  # absent in older checkpoints
