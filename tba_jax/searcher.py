"""A searcher: its prompt shard, the lagging policy, the frozen reference, rewards.

  searcher = Searcher(id, rows=StaticRows(sampler),        # or streaming.StreamingRows
                      mailbox=weight_sync.Mailbox(0, params),
                      prompts=PromptShard(ids, tokens, problems, max_len),
                      scoring=Scoring(reward, decode, ref_params),
                      num_prompts=P, num_samples=S, seed=seed)
  searcher.search_once()   # at least num_prompts more prompt groups scored and committed

A searcher has two halves. Its `rows`, a `RowSource` (tba_jax/rows.py), samples:
it takes prompts from the searcher, decodes their S samples each with the mailbox's
newest weights, and hands back the prompt groups whose S rows have all ended (a
`Group` of `Sample` records). Two sources exist: `StaticRows` (P prompts x S at a
time through the static sampler, waiting for the longest row) and
`streaming.StreamingRows` (a continuous-batching pool, tba_jax/continuous.py).
The searcher owns everything else: the prompt stream, the commit lock and the
in-flight prompts, the exploration temperature of each choice (`Exploration`),
and `score(groups) -> [Entry]`: one reward-stage batch and one reference forward
for the groups, stamped with the versions each row was sampled under. Committed
entries wait in `buffer` until the pool drains them into the global buffer. The
searchers of a process are driven together by `searcher_pool.SearcherPool`
(threads, restarts; its `PoolSearcher` protocol is what it relies on).

What the pool needs for lossless checkpoints and restarts: a prompt is "in
flight" from the moment it is taken until its group's entries are committed to
the local buffer (entries, in-flight list, cursors and counters change together,
under a lock held only for that copy). `snapshot()` returns the undrained entries
with a state whose cursor puts the prompts in flight back at the front of the
stream, so a resume samples them again instead of skipping them; `restart()`
after a failed search does the same in place, and the row source drops its
unfinished work.
"""
from __future__ import annotations

import dataclasses
import threading
import time
from typing import Callable, Mapping, Sequence

import jax
import numpy as np

from tba_jax import batch as batch_lib
from tba_jax import model as model_lib
from tba_jax import sharding
from tba_jax.entries import Entry, normalized
from tba_jax.model import ModelConfig, Params
from tba_jax.rows import Group, RowSource
from tba_jax.tasks import Problem, RewardBatch, RewardFn, reward_texts
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


@dataclasses.dataclass(frozen=True)
class PromptShard:
  """The prompts a searcher samples: its shard of the prompt ids (a stride over every
  searcher of the run, walked by a PromptStream), and by prompt id the token ids and the
  task data (dicts the run's searchers share)."""
  ids: Sequence[int]
  tokens: Mapping[int, Sequence[int]]
  problems: Mapping[int, Problem]
  max_len: int  # the prompts' token budget (task.max_prompt_len): the scoring passes' width


@dataclasses.dataclass(frozen=True)
class Scoring:
  """What `Searcher.score` needs besides the samples: the task's reward stage built on the
  searcher's devices, the detokenizer whose texts it reads, and the reference policy:
  `ref_params` of `ref_model_config` (None: the sampler's model; a LoRA policy's reference is
  its base model, adapters off), on the same devices. Every `mismatch_every`-th search the
  samples' log-probs are recomputed as the trainer would (0: never)."""
  reward: RewardFn
  decode: Callable[[Sequence[int]], str]
  ref_params: Params
  ref_model_config: ModelConfig | None = None
  mismatch_every: int = 0


# Teacher-forced per-token log-probs of the completion columns (the function the trainer's
# update uses, so reference and policy log-probs are computed identically).
_completion_logprobs = jax.jit(model_lib.completion_token_logprobs,
                               static_argnames=("model_config", "completion_len", "temperature",
                                                "remat", "prompt_group"))


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
  # Multi-turn rows (zero without an environment), summed over samples: model turns; tool
  # calls, tool errors, reply functions that raised (an error reply went back) and seconds in
  # the environment's replies, of the replies that entered the context; replies that did not
  # fit in their row (it ended there, uncounted above); correct samples (reward > 0) and
  # those of them that called a tool.
  turns: int = 0
  tool_calls: int = 0
  tool_errors: int = 0
  reply_failures: int = 0
  tool_seconds: float = 0.0
  replies_dropped: int = 0
  correct: int = 0
  correct_with_tool: int = 0


class Staged:
  """A searcher's committed entries until the pool drains them: validated where they are
  made (entries.normalized: frozen arrays, float32 rewards, as every host will hold them),
  then a plain list under a lock."""

  def __init__(self):
    self._entries: list[Entry] = []
    self._lock = threading.Lock()

  def add_many(self, entries: Sequence[Entry]) -> None:
    entries = [normalized(e) for e in entries]
    with self._lock:
      self._entries.extend(entries)

  def drain_new(self) -> list[Entry]:
    """Every entry added since the previous drain, oldest first."""
    with self._lock:
      out, self._entries = self._entries, []
      return out

  def peek_new(self) -> list[Entry]:
    """What `drain_new` would return, without draining (a checkpoint of the searcher)."""
    with self._lock:
      return list(self._entries)


# ---------------------------------------------------------------------------
# The searcher.
# ---------------------------------------------------------------------------
class Searcher:
  """Generates, scores and stores completions for one shard of the prompts.

  `rows` samples (its sampler holds the model, its devices, the temperature and the
  special ids) with the newest weights in `mailbox`; `prompts` are the ones it samples,
  `num_prompts` groups of `num_samples` rows per search, and `scoring` how they are scored.
  Its randomness comes from (seed, searcher_id): the order of its shard, each batch's key
  and temperature (`explore`), so a resumed or restarted searcher repeats its choices.
  """

  def __init__(self, searcher_id: int, *, rows: RowSource, mailbox: Mailbox,
               prompts: PromptShard, scoring: Scoring, num_prompts: int, num_samples: int,
               seed: int, explore: Exploration = Exploration()):
    self.id, self.rows, self.explore, self.seed = searcher_id, rows, explore, seed
    self.mailbox, self.stream = mailbox, PromptStream(prompts.ids, seed=seed + searcher_id)
    # What a row source reads of its searcher (rows.Feed), and the scoring pass's widths.
    self.prompt_tokens, self.problems = prompts.tokens, prompts.problems
    self.max_prompt_len = prompts.max_len
    self.num_prompts, self.num_samples = num_prompts, num_samples
    self.decode, self.reward = scoring.decode, scoring.reward
    self.ref_params = scoring.ref_params  # swapped by set_reference (reference resets)
    self.ref_model_config = scoring.ref_model_config or rows.sampler.model_config
    self.mismatch_every = scoring.mismatch_every  # searches between sampler-vs-trainer checks
    self.key = jax.random.fold_in(jax.random.key(seed), searcher_id)
    self.buffer = Staged()  # committed entries, drained into the global buffer
    self.stats = SearchStats()
    # Held while prompts are taken and while entries, the in-flight list, cursors and
    # counters are committed (a copy), never for a whole batch: a snapshot waits for no
    # sampling.
    self.lock = threading.Lock()
    self._in_flight: list[int] = []  # prompts taken whose entries are not committed, in order

  # --- What a row source uses (Feed) ---------------------------------------------------------
  def take(self, n: int) -> list[int]:
    ids = self.stream.take(n)
    self._in_flight.extend(ids)
    return ids

  def temperature(self, index: int) -> float:
    # From (seed, searcher, index): a resumed or restarted searcher repeats the choice.
    rng = np.random.default_rng([self.seed, self.id, index])
    return self.explore.temperature(rng, self.rows.sampler.options.temperature)

  def set_reference(self, params: Params) -> None:
    """Reference reset (TBA-prime): groups scored from now on use `params`."""
    self.ref_params = params  # read once per reward batch (score)

  # --- Searching -----------------------------------------------------------------------------
  def search_once(self) -> int:
    """Samples until at least `num_prompts` more groups were committed (a static batch's
    worth: the pool's rounds, stop checks and restarts keep that granularity); returns how
    many samples were committed."""
    start, committed = time.perf_counter(), 0
    while committed < self.num_prompts * self.num_samples:
      sampled = self.rows.sample(self)
      # Groups in taking order, at most num_prompts per reward batch.
      for at in range(0, len(sampled.groups), self.num_prompts):
        piece = sampled.groups[at:at + self.num_prompts]
        entries = self.score(piece, sampled.policy)
        with self.lock:  # a snapshot sees a group's entries, or its prompt in flight
          self._record(entries)
          self._record_turns(piece, entries)
          for group in piece:
            self._in_flight.remove(group.prompt_id)
          self.rows.committed(piece)
      committed += len(sampled.groups) * self.num_samples
    with self.lock:
      self.stats.num_batches += 1
      self.stats.busy_seconds += time.perf_counter() - start
    return committed

  def score(self, groups: Sequence[Group], policy: tuple[int, Params] | None = None
            ) -> list[Entry]:
    """The entries of `groups`' samples, prompt-major: the reward stage scores them all in
    one batch, and the reference log-probs come from one forward pass. `policy` =
    (version, params) the rows of that version were sampled with: every
    `mismatch_every`-th search their log-probs are recomputed as the trainer would
    (`_check_mismatch`: the sampler's numbers against the trainer's function, same
    weights)."""
    rows = [(group, sample) for group in groups for sample in group.samples]
    prompts = [self.prompt_tokens[group.prompt_id] for group, _ in rows]
    completions = [sample.tokens for _, sample in rows]
    eos = set(self.rows.sampler.options.eos_ids)
    ended = np.array([c.size > 0 and int(c[-1]) in eos for c in completions])
    rewards = np.asarray(self.reward(RewardBatch(
        problems=[self.problems[group.prompt_id] for group, _ in rows], prompts=prompts,
        completions=completions, ended_with_eos=ended,
        texts=reward_texts(self.decode, completions, [s.reward_mask for _, s in rows]))),
        np.float32)
    if rewards.shape != (len(rows),):
      raise ValueError(f"the reward stage returned shape {rewards.shape} for {len(rows)} "
                       "completions; expected one reward per completion")
    ref = self._teacher_forced(self.ref_model_config, self.ref_params, prompts, completions)
    if (policy is not None and self.mismatch_every and
        self.stats.num_batches % self.mismatch_every == 0):
      self._check_mismatch(policy, rows, prompts)
    return [Entry(prompt_id=group.prompt_id, prompt=prompts[r], completion=sample.tokens,
                  reward=float(rewards[r]), ref_logprobs=ref[r, :sample.tokens.size],
                  behaviour_logprobs=sample.behaviour_logprobs, version=sample.first_version,
                  searcher_id=self.id, ended_with_eos=bool(ended[r]),
                  temperature=group.temperature, last_version=sample.last_version,
                  model_mask=sample.model_mask)
            for r, (group, sample) in enumerate(rows)]

  def _record(self, entries: list[Entry]) -> None:
    """Scored entries into the local buffer and the counters (the caller holds the lock)."""
    self.buffer.add_many(entries)
    self.stats.num_samples += len(entries)
    self.stats.reward_sum += float(sum(e.reward for e in entries))
    self.stats.tokens += sum(e.length for e in entries)

  def _record_turns(self, groups: Sequence[Group], entries: list[Entry]) -> None:
    """The turn counters of `groups`' samples (entries in the same order; lock held)."""
    samples = [sample for group in groups for sample in group.samples]
    if not any(sample.model_mask is not None for sample in samples):
      return  # single-turn rows: the counters stay 0
    st = self.stats
    for sample, entry in zip(samples, entries):
      st.turns += sample.turns
      st.tool_calls += sample.tool_calls
      st.tool_errors += sample.tool_errors
      st.reply_failures += sample.reply_failures
      st.tool_seconds += sample.tool_seconds
      st.replies_dropped += sample.replies_dropped
      st.correct += entry.reward > 0
      st.correct_with_tool += entry.reward > 0 and sample.tool_calls > 0

  def _check_mismatch(self, policy, rows, prompts) -> None:
    """stats.mismatch: mean over the rows sampled wholly under `policy`'s version (at the
    sampler's own temperature) of |log pi(y)| recomputed by the trainer's function minus the
    sampler's, in nats per sequence; ~1e-5 in float32, more in bfloat16 (numerics only)."""
    version, params = policy
    sampler = self.rows.sampler
    picked = [r for r, (group, sample) in enumerate(rows)
              if (sample.first_version, sample.last_version) == (version, version) and
              group.temperature == sampler.options.temperature]
    if not picked:
      return
    samples = [rows[r][1] for r in picked]
    lp = self._teacher_forced(sampler.model_config, params, [prompts[r] for r in picked],
                              [s.tokens for s in samples])
    # Over the model's own tokens (an environment's reply has no sampler log-probs).
    own = lambda s, x: x if s.model_mask is None else np.where(s.model_mask > 0, x, 0.0)
    gaps = [abs(float(np.sum(own(s, lp[i, :s.tokens.size]), dtype=np.float64) -
                      np.sum(own(s, s.behaviour_logprobs), dtype=np.float64)))
            for i, s in enumerate(samples)]
    self.stats.mismatch = float(np.mean(gaps))

  def _teacher_forced(self, model_config: ModelConfig, params: Params, prompts: list[list[int]],
                      completions: list[np.ndarray]) -> np.ndarray:
    """[N, W] per-token log-probs of the completions under `params` (the trainer's
    function, at the sampler's temperature), 0 past each one's end; W (<= max_new_tokens)
    the sampler's length bucket of the longest."""
    sampler = self.rows.sampler
    n = len(prompts)
    width = batch_lib.completion_width(max(map(len, completions)),
                                       sampler.options.max_new_tokens, sampler.length_buckets)
    layout = batch_lib.Layout(self.max_prompt_len, width, sampler.options.pad_id)
    # Pad the batch to the sampler's batch bucket so this compiles once per bucket.
    b = batch_lib.bucket(n, sampler.batch_buckets, "batch size")
    tokens, mask = batch_lib.token_rows(prompts + [[]] * (b - n), completions + [[]] * (b - n),
                                        layout)
    place = lambda x: jax.device_put(x, sharding.batch_sharding("searcher", sampler.mesh, 2))
    # A group's samples share their prompt (score's rows): it runs once per group.
    k = self.num_samples
    lp = _completion_logprobs(model_config, params, place(tokens), place(mask),
                              completion_len=layout.completion_len,
                              temperature=sampler.options.temperature,
                              prompt_group=k if batch_lib.shares_prompts(
                                  tokens, mask, layout.prompt_len, k) else 1)
    return np.where(mask[:n, layout.prompt_len:] > 0, np.asarray(lp)[:n], 0.0)

  # --- Restarts and checkpoints (SearcherPool) -----------------------------------------------
  def in_flight(self) -> list[int]:
    """Prompt ids taken whose entries are not committed yet."""
    with self.lock:
      return list(self._in_flight)

  def restart(self) -> None:
    """After a failed `search_once`: its prompts go back to the front of the stream and
    the row source drops its unfinished work (the retry reads the newest weights)."""
    with self.lock:
      self.stream.requeue(self._in_flight)
      self._in_flight = []
      self.rows.drop()

  def snapshot(self) -> tuple[list[Entry], dict]:
    """(entries not yet drained, the state that goes with them), taken together.

    The state's cursor puts the prompts in flight back at the front of the
    stream: `load_snapshot` of both loses nothing committed and skips no prompt.
    The counters continue across a resume; busy time is per process (a fraction
    of its wall-clock), so it starts again.
    """
    with self.lock:
      stream = self.stream.state_dict()
      stream["requeued"] = self._in_flight + stream["requeued"]
      stats = {k: v for k, v in dataclasses.asdict(self.stats).items()
               if k not in ("busy_seconds", "mismatch")}
      return self.buffer.peek_new(), {"stream": stream, "stats": stats, **self.rows.cursor()}

  def load_snapshot(self, entries: Sequence[Entry], state: dict) -> None:
    """A `snapshot`: its entries reach the global buffer at the next merge."""
    with self.lock:
      self.stream.load_state_dict(state["stream"])
      self.rows.load_cursor(state)
      self.stats = SearchStats(**state.get("stats", {}))  # absent in older checkpoints
      self._in_flight = []
      self.buffer.add_many(entries)
