"""A searcher: its prompt shard, the lagging policy, the frozen reference, rewards.

One `search_once` call: take the newest published weights from the mailbox,
draw the next prompts of this searcher's shard, sample S completions of each,
score them with the task reward, compute the reference model's per-token
log-probs of each completion, and add the stamped entries (policy version,
searcher id) to the searcher's local replay buffer. `run` repeats that in a
thread until told to stop; an exception is kept with its traceback for the
trainer to report.
"""
from __future__ import annotations

import dataclasses
import threading
import time
import traceback
from typing import Callable, Sequence

import jax
import numpy as np

from tba_jax import sharding, train_step
from tba_jax.model import ModelConfig, Params
from tba_jax.entries import Entry
from tba_jax.replay_buffer import ReplayBuffer
from tba_jax.sampler import Sampler
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


@dataclasses.dataclass
class SearchStats:
  num_samples: int = 0
  num_batches: int = 0
  busy_seconds: float = 0.0
  reward_sum: float = 0.0
  tokens: int = 0


class Searcher:
  """Generates, scores and stores completions for one shard of the prompts."""

  def __init__(self, searcher_id: int, *, model_config: ModelConfig, sampler: Sampler, mesh,
               ref_params: Params, mailbox: Mailbox, stream: PromptStream,
               prompt_tokens: dict[int, list[int]], golds: dict[int, float],
               decode: Callable[[Sequence[int]], str], reward: Callable[[str, float], float],
               num_prompts: int, num_samples: int, max_prompt_len: int, temperature: float,
               pad_id: int, seed: int):
    self.id, self.model_config, self.sampler, self.mesh = searcher_id, model_config, sampler, mesh
    self.ref_params = ref_params  # frozen reference, on this searcher's devices
    self.mailbox, self.stream = mailbox, stream
    self.prompt_tokens, self.golds, self.decode, self.reward = prompt_tokens, golds, decode, reward
    self.num_prompts, self.num_samples = num_prompts, num_samples
    self.max_prompt_len, self.temperature, self.pad_id = max_prompt_len, temperature, pad_id
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
      key = jax.random.fold_in(self.key, self.num_batches)
      out = self.sampler(params, [self.prompt_tokens[i] for i in rows], key)
      ref = self._reference_logprobs(rows, out)
      texts = [self.decode(out.tokens[r, :out.lengths[r]]) for r in range(len(rows))]
      eos = set(self.sampler.options.eos_ids)
      entries = []
      for r, i in enumerate(rows):
        n = int(out.lengths[r])
        reward = self.reward(texts[r], self.golds[i])
        entries.append(Entry(
            prompt_id=i, prompt=self.prompt_tokens[i], completion=out.tokens[r, :n],
            reward=reward, ref_logprobs=ref[r, :n], behaviour_logprobs=out.tempered_logprobs[r, :n],
            version=version, searcher_id=self.id,
            ended_with_eos=n > 0 and int(out.tokens[r, n - 1]) in eos))
        self.stats.reward_sum += reward
        self.stats.tokens += n
      self.buffer.add_many(entries)
      self.num_batches += 1
      self.stats.num_batches += 1
      self.stats.num_samples += len(rows)
      self.stats.busy_seconds += time.perf_counter() - start
      return len(rows)

  def _reference_logprobs(self, rows: list[int], out) -> np.ndarray:
    tp, tc = self.max_prompt_len, out.tokens.shape[1]
    tokens = np.full((len(rows), tp + tc), self.pad_id, np.int32)
    mask = np.zeros((len(rows), tp + tc), np.int32)
    for r, i in enumerate(rows):
      p = self.prompt_tokens[i]
      tokens[r, tp - len(p):tp], mask[r, tp - len(p):tp] = p, 1
      tokens[r, tp:] = out.tokens[r]
      mask[r, tp:tp + out.lengths[r]] = 1
    # Pad the batch to the sampler's batch bucket so this compiles once per bucket.
    b = next(b for b in self.sampler.batch_buckets if b >= len(rows))
    pad = lambda x: np.concatenate([x, np.zeros((b - len(rows), x.shape[1]), x.dtype)])
    place = lambda x: jax.device_put(x, sharding.batch_sharding("searcher", self.mesh, 2))
    out_lp = _completion_logprobs(self.model_config, self.ref_params, place(pad(tokens)),
                                  place(pad(mask)), completion_len=tc,
                                  temperature=self.temperature)
    return np.where(mask[:, tp:] > 0, np.asarray(out_lp)[:len(rows)], 0.0)

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
