"""A searcher: its prompt shard, the lagging policy, the frozen reference, rewards.

One `search_once` call: take the newest published weights from the mailbox,
draw the next prompts of this searcher's shard, pick the batch's sampling
temperature (`Exploration`), sample S completions of each,
score the batch with the task's reward stage, compute the reference model's
per-token log-probs of each completion, and add the stamped entries (policy
version, searcher id) to the searcher's local replay buffer. The searchers of a
process are driven together by `searcher_pool.SearcherPool` (threads, restarts).
`streaming.StreamingSearcher` is the same searcher over continuous batching
(sampler.num_slots > 0): it commits prompt groups as they end.

What the pool needs for lossless checkpoints and restarts: the prompts of a batch
are "in flight" from the moment they are taken until its entries are committed
to the local buffer (entries, cursor and counters change together, under a lock
held only for that copy). `snapshot()` returns the undrained entries with a
state whose cursor puts the prompts in flight back at the front of the stream,
so a resume samples them again instead of skipping them; `restart()` after a
failed batch does the same in place. A searcher that keeps several batches (or
slots) in flight provides the same: its unfinished work is dropped and its
prompts re-queued.
"""
from __future__ import annotations

import dataclasses
import threading
import time
from typing import Callable, Sequence

import jax
import numpy as np

from tba_jax import batch as batch_lib
from tba_jax import model as model_lib
from tba_jax import sharding
from tba_jax.entries import Entry
from tba_jax.model import ModelConfig, Params
from tba_jax.replay_buffer import ReplayBuffer
from tba_jax.rewards import RewardBatch, RewardFn
from tba_jax.sampler import Sampler
from tba_jax.tasks import Problem
from tba_jax.weight_sync import Mailbox


class PromptStream:
  """A shard of prompt ids, reshuffled every epoch from (seed, epoch).

  Prompts handed back with `requeue` (work dropped by a restart or a checkpoint)
  are taken first, before the shuffled order continues.
  """

  def __init__(self, ids: Sequence[int], seed: int):
    if not ids:
      raise ValueError("a searcher got an empty prompt shard (more searchers than prompts?)")
    self.ids, self.seed = np.asarray(ids), seed
    self.epoch = self.position = 0
    self.requeued: list[int] = []

  def take(self, n: int) -> list[int]:
    out, self.requeued = self.requeued[:n], self.requeued[n:]
    while len(out) < n:
      order = np.random.default_rng([self.seed, self.epoch]).permutation(self.ids)
      chunk = order[self.position:self.position + n - len(out)]
      out.extend(int(i) for i in chunk)
      self.position += len(chunk)
      if self.position == len(order):
        self.epoch, self.position = self.epoch + 1, 0
    return out

  def requeue(self, ids: Sequence[int]) -> None:
    """`ids` (taken earlier, in that order) are taken again before anything else."""
    self.requeued = [int(i) for i in ids] + self.requeued

  def state_dict(self) -> dict:
    return {"epoch": self.epoch, "position": self.position, "requeued": list(self.requeued)}

  def load_state_dict(self, state: dict) -> None:
    self.epoch, self.position = int(state["epoch"]), int(state["position"])
    self.requeued = [int(i) for i in state.get("requeued", [])]  # absent in older checkpoints


# Teacher-forced per-token log-probs of the completion columns (the function the trainer's
# update uses, so reference and policy log-probs are computed identically).
_completion_logprobs = jax.jit(model_lib.completion_token_logprobs,
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
  mismatch: float = float("nan")  # the latest sampler-vs-trainer check (_check_mismatch)


class Searcher:
  """Generates, scores and stores completions for one shard of the prompts.

  The sampler holds the model, its devices, the temperature and the special
  ids; `reward` is the task's reward stage built on the same devices. The
  reference is `ref_params` of `ref_model_config` (None: the sampler's model;
  a LoRA policy's reference is its base model, adapters off).
  """

  def __init__(self, searcher_id: int, *, sampler: Sampler, ref_params: Params,
               mailbox: Mailbox, stream: PromptStream, prompt_tokens: dict[int, list[int]],
               problems: dict[int, Problem], decode: Callable[[Sequence[int]], str],
               reward: RewardFn, num_prompts: int, num_samples: int, max_prompt_len: int,
               seed: int, ref_model_config: ModelConfig | None = None,
               explore: Exploration = Exploration(), mismatch_every: int = 0):
    self.id, self.sampler, self.explore, self.seed = searcher_id, sampler, explore, seed
    self.mismatch_every = mismatch_every  # batches between sampler-vs-trainer checks (0: off)
    self.ref_params = ref_params  # frozen reference, on this searcher's devices
    self.ref_model_config = ref_model_config or sampler.model_config
    self.mailbox, self.stream = mailbox, stream
    self.prompt_tokens, self.problems = prompt_tokens, problems
    self.decode, self.reward = decode, reward
    self.num_prompts, self.num_samples, self.max_prompt_len = num_prompts, num_samples, max_prompt_len
    self.key = jax.random.fold_in(jax.random.key(seed), searcher_id)
    # Local staging, drained into the global buffer (which de-duplicates if configured).
    self.buffer = ReplayBuffer(max_per_prompt=10**9, dedup=False)
    self.num_batches = 0  # committed batches; batch b samples with fold_in(key, b)
    self.stats = SearchStats()
    # Held while prompts are taken and while a batch's entries, cursor and counters are
    # committed (a copy), never for a whole batch: a snapshot waits for no sampling.
    self._commit = threading.Lock()
    self._in_flight: list[int] = []  # prompts taken whose entries are not committed yet

  def set_reference(self, params: Params) -> None:
    """Reference reset (TBA-prime): batches scored from now on use `params`."""
    self.ref_params = params  # read once per batch (_reference_logprobs)

  def search_once(self) -> int:
    """One batch of prompts x S samples into the local buffer; returns #samples."""
    start = time.perf_counter()
    version, params = self.mailbox.get()  # newest weights; the old ones stay valid
    with self._commit:
      ids = self._in_flight = self.stream.take(self.num_prompts)
      # A retried batch (after a restart) samples with the key and temperature of the
      # batch it replaces: both come from (seed, searcher, batch index), so a resumed
      # searcher repeats the choices too.
      key = jax.random.fold_in(self.key, self.num_batches)
      rng = np.random.default_rng([self.seed, self.id, self.num_batches])
    temperature = self.explore.temperature(rng, self.sampler.options.temperature)
    # [P] prompts -> [P * S] rows, prompt-major: row r is prompt ids[r // S].
    rows = [i for i in ids for _ in range(self.num_samples)]
    out = self.sampler(params, [self.prompt_tokens[i] for i in rows], key,
                       temperature=temperature)
    entries = self._score(rows, [out.tokens[r, :out.lengths[r]] for r in range(len(rows))],
                          [out.tempered_logprobs[r, :out.lengths[r]] for r in range(len(rows))],
                          [temperature] * len(rows), [(version, version)] * len(rows),
                          policy=(version, params))
    with self._commit:  # a snapshot sees the whole batch, or its prompts in flight
      self._record(entries)
      self._in_flight = []
      self.num_batches += 1
      self.stats.num_batches += 1
      self.stats.busy_seconds += time.perf_counter() - start
    return len(rows)

  def _score(self, rows: list[int], completions: list[np.ndarray], behaviour: list[np.ndarray],
             temperatures: list[float], versions: list[tuple[int, int]],
             policy: tuple[int, Params] | None = None) -> list[Entry]:
    """Entries of completions[r] of prompt rows[r]: the reward stage scores them all in one
    batch, and the reference log-probs come from one forward pass. `behaviour` holds the
    tempered per-token log-probs the sampler recorded; versions[r] = (oldest, newest).
    `policy` = (version, params) the rows of that version were sampled with: every
    `mismatch_every`-th batch their log-probs are recomputed as the trainer would (module
    doc: the sampler's numbers against the trainer's function, same weights)."""
    prompts = [self.prompt_tokens[i] for i in rows]
    eos = set(self.sampler.options.eos_ids)
    ended = np.array([c.size > 0 and int(c[-1]) in eos for c in completions])
    rewards = np.asarray(self.reward(RewardBatch(
        problems=[self.problems[i] for i in rows], prompts=prompts, completions=completions,
        ended_with_eos=ended, texts=[self.decode(c) for c in completions])), np.float32)
    if rewards.shape != (len(rows),):
      raise ValueError(f"the reward stage returned shape {rewards.shape} for {len(rows)} "
                       "completions; expected one reward per completion")
    ref = self._teacher_forced(self.ref_model_config, self.ref_params, prompts, completions)
    if policy is not None and self.mismatch_every and \
        self.stats.num_batches % self.mismatch_every == 0:
      self._check_mismatch(policy, prompts, completions, behaviour, temperatures, versions)
    return [Entry(prompt_id=i, prompt=prompts[r], completion=completions[r],
                  reward=float(rewards[r]), ref_logprobs=ref[r, :completions[r].size],
                  behaviour_logprobs=behaviour[r], version=versions[r][0], searcher_id=self.id,
                  ended_with_eos=bool(ended[r]), temperature=temperatures[r],
                  last_version=versions[r][1])
            for r, i in enumerate(rows)]

  def _record(self, entries: list[Entry]) -> None:
    """Scored entries into the local buffer and the counters (the caller holds the lock)."""
    self.buffer.add_many(entries)
    self.stats.num_samples += len(entries)
    self.stats.reward_sum += float(sum(e.reward for e in entries))
    self.stats.tokens += sum(e.length for e in entries)

  def _check_mismatch(self, policy, prompts, completions, behaviour, temperatures, versions):
    """stats.mismatch: mean over the rows sampled wholly under `policy`'s version (at the
    sampler's own temperature) of |log pi(y)| recomputed by the trainer's function minus the
    sampler's, in nats per sequence; ~1e-5 in float32, more in bfloat16 (numerics only)."""
    version, params = policy
    rows = [r for r, v in enumerate(versions) if v == (version, version) and
            temperatures[r] == self.sampler.options.temperature]
    if not rows:
      return
    lp = self._teacher_forced(self.sampler.model_config, params, [prompts[r] for r in rows],
                              [completions[r] for r in rows])
    gaps = [abs(float(np.sum(lp[i, :completions[r].size], dtype=np.float64) -
                      np.sum(behaviour[r], dtype=np.float64))) for i, r in enumerate(rows)]
    self.stats.mismatch = float(np.mean(gaps))

  def _teacher_forced(self, model_config: ModelConfig, params: Params, prompts: list[list[int]],
                      completions: list[np.ndarray]) -> np.ndarray:
    """[N, Tc] per-token log-probs of the completions under `params` (the trainer's
    function, at the sampler's temperature), 0 past each one's end."""
    n, tp, tc = len(prompts), self.max_prompt_len, self.sampler.options.max_new_tokens
    # Pad the batch to the sampler's batch bucket so this compiles once per bucket.
    b = batch_lib.bucket(n, self.sampler.batch_buckets, "batch size")
    tokens, mask = batch_lib.token_rows(prompts + [[]] * (b - n), completions + [[]] * (b - n),
                                        batch_lib.Layout(tp, tc, self.sampler.options.pad_id))
    place = lambda x: jax.device_put(x, sharding.batch_sharding("searcher", self.sampler.mesh, 2))
    lp = _completion_logprobs(model_config, params, place(tokens), place(mask),
                              completion_len=tc,
                              temperature=self.sampler.options.temperature)
    return np.where(mask[:n, tp:] > 0, np.asarray(lp)[:n], 0.0)

  # --- Restarts and checkpoints (SearcherPool) -----------------------------------------------
  def in_flight(self) -> list[int]:
    """Prompt ids taken whose entries are not committed yet."""
    with self._commit:
      return list(self._in_flight)

  def restart(self) -> None:
    """After a failed `search_once`: its prompts go back to the front of the stream.

    The retried batch samples with the same key, and with the newest weights the
    mailbox holds (read at the start of every batch).
    """
    with self._commit:
      self.stream.requeue(self._in_flight)
      self._in_flight = []

  def snapshot(self) -> tuple[list[Entry], dict]:
    """(entries not yet drained, the state that goes with them), taken together.

    The state's cursor puts the prompts in flight back at the front of the
    stream: `load_snapshot` of both loses nothing committed and skips no prompt.
    The counters continue across a resume; busy time is per process (a fraction
    of its wall-clock), so it starts again.
    """
    with self._commit:
      stream = self.stream.state_dict()
      stream["requeued"] = self._in_flight + stream["requeued"]
      stats = {k: v for k, v in dataclasses.asdict(self.stats).items()
               if k not in ("busy_seconds", "mismatch")}
      return self.buffer.peek_new(), {"stream": stream, "stats": stats, **self._cursor()}

  def _cursor(self) -> dict:
    """Where this searcher's random choices continue (saved by `snapshot`)."""
    return {"num_batches": self.num_batches}

  def load_snapshot(self, entries: Sequence[Entry], state: dict) -> None:
    """A `snapshot`: its entries reach the global buffer at the next merge."""
    with self._commit:
      self.stream.load_state_dict(state["stream"])
      self.num_batches = int(state["num_batches"])
      self.stats = SearchStats(**state.get("stats", {}))  # absent in older checkpoints
      self._in_flight = []
      self.buffer.add_many(entries)
