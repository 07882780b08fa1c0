r"""A pipeline model of TBA's runtime: searchers, the replay buffer, the trainer and its
syncs as a discrete-event simulation over a layout, a config and per-role costs (plain
Python, no JAX; the costs and where each comes from: benchmarks/pipeline_costs.py).

  from benchmarks import pipeline_model as pm
  r = pm.simulate(pm.Layout(num_searchers=3), pm.RunConfig(...), pm.Costs(...), 200)
  r.seconds_per_update, r.update_seconds, r.trainer_idle, r.staleness_hist, ...

What it follows of the code (tba_jax/loop.py, searcher_pool.py, schedule.py,
replay_buffer.py; docs/pipeline_model.md says it at length): async searchers sample P
prompts x S under the newest published version, paced ones wait while holding their share
of a window unmerged; the trainer waits only for the pre-fill, draws B slots x K by the m
rule, trains, and every k steps publishes, merges and marks a sync; alternate mode runs a
round of max(B, ceil(k B m)) prompts in the trainer's thread at each window's first step.
Staleness = the trainer's updates done minus each trained sample's version. Each role has
its own device group unless `layout.shared`: then n busy roles each run at
`shared_throughput / n` of their solo speed (processor sharing).

Not modelled: streaming (continuous-batching) searchers, evaluations, compilation, the
host-side cost of merges and sampling, de-duplication (every sample is a new entry),
global buffer caps, prompt order within a shard (walked in order, not reshuffled).
"""
from __future__ import annotations

import collections
import dataclasses
import itertools
import math
import random
import statistics
from typing import Callable

MODES = ("async", "alternate")


@dataclasses.dataclass(frozen=True)
class Layout:
  """Where the roles run (module doc, "Devices")."""
  num_searchers: int = 1            # searchers, each on its own device group
  mode: str = "async"               # sync.mode: async | alternate
  shared: bool = False              # every role on one device group (one device, 2 CPU cores)
  shared_throughput: float = 1.0    # busy roles on a shared group get this / n each

  def __post_init__(self):
    if self.num_searchers < 1 or self.mode not in MODES or not self.shared_throughput > 0:
      raise ValueError(f"num_searchers={self.num_searchers} (>= 1), mode={self.mode!r} "
                       f"(one of {MODES}), shared_throughput={self.shared_throughput} (> 0)")


@dataclasses.dataclass(frozen=True)
class RunConfig:
  """The config keys the pipeline depends on (configs/*.py names in comments)."""
  num_prompts: int                  # B (buffer.num_prompts)
  samples_per_prompt: int           # K (buffer.samples_per_prompt)
  samples_per_search: int           # S (sampler.num_samples_per_prompt)
  prompts_per_search: int           # P (sampler.num_prompts_per_batch)
  sync_every: int                   # k (sync.every)
  m: float                          # buffer.m
  prefill: int                      # buffer.prefill: completions before step 1
  paced: bool = False               # sync.paced
  reuse_latest: bool = True         # buffer.reuse_latest
  max_per_prompt: int = 100         # buffer.max_per_prompt
  num_train_prompts: int = 7473     # the task's training prompts (GSM8K: 7,473)

  def __post_init__(self):
    counts = (self.num_prompts, self.samples_per_prompt, self.samples_per_search,
              self.prompts_per_search, self.sync_every, self.max_per_prompt,
              self.num_train_prompts)
    if min(counts) < 1 or not 0.0 <= self.m <= 1.0 or self.prefill < 0:
      raise ValueError(f"counts must be >= 1, 0 <= m <= 1, prefill >= 0: {self}")

  @property
  def window_prompts(self) -> int:
    """The prompts k steps want from the latest sync (schedule.Schedule.of)."""
    return max(self.num_prompts, math.ceil(self.sync_every * self.num_prompts * self.m))


@dataclasses.dataclass(frozen=True)
class Costs:
  """Solo seconds of each unit of work on its role's device group, and where each came from
  ("measured: <where>" / "predicted: <how>")."""
  search_batch_s: float             # one searcher batch: P prompts x S rows, scored
  update_s: float                   # one update of B x K rows
  sync_s: float                     # one weight publish, on the trainer's clock
  sources: tuple[tuple[str, str], ...] = ()

  def __post_init__(self):
    if not (self.search_batch_s > 0 and self.update_s > 0 and self.sync_s >= 0):
      raise ValueError(f"search_batch_s and update_s must be > 0, sync_s >= 0: {self}")


@dataclasses.dataclass(frozen=True)
class Result:
  """What a simulated run did, over its steady state (the steps after the first quarter)."""
  seconds_per_update: float         # wall seconds per update
  update_seconds: float             # median wall seconds of one update (the loop's step_seconds)
  trainer_idle: float               # fraction of the wall time the trainer is not updating
  searcher_idle: float              # mean over searchers of the fraction not sampling
  staleness_hist: dict              # staleness -> trained samples
  samples_produced: int             # committed by the searchers (merged or not), whole run
  samples_trained: int              # B x K x updates (draws: replay counts again)
  distinct_trained: int             # distinct samples among them
  fresh_per_update: float           # samples trained for the first time, per update
  latest_staleness_mean: float      # mean staleness of the m branch's samples
  prefill_seconds: float            # wall time before the first update
  wall_seconds: float               # wall time of the whole run
  samples_per_update: int           # B x K

  @property
  def staleness_mean(self) -> float:
    n = sum(self.staleness_hist.values())
    return sum(s * c for s, c in self.staleness_hist.items()) / max(n, 1)

  @property
  def staleness_max(self) -> int:
    return max(self.staleness_hist, default=0)

  @property
  def trained_per_second(self) -> float:
    """Samples trained per wall second in the steady state (a replayed one counts again)."""
    return self.samples_per_update / self.seconds_per_update

  @property
  def fresh_per_second(self) -> float:
    """Samples trained for the first time per wall second in the steady state."""
    return self.fresh_per_update / self.seconds_per_update


# ---------------------------------------------------------------------------
# The event engine: actors are generators yielding Work or Wait.
# ---------------------------------------------------------------------------
@dataclasses.dataclass
class Work:
  """`seconds` of solo work on device group `group`; `label` names it in the timeline."""
  group: str
  seconds: float
  label: str


@dataclasses.dataclass
class Wait:
  """Blocks until `ready()` holds (checked after every event)."""
  ready: Callable[[], bool]


class Engine:
  """Runs actors (generators of Work / Wait) on device groups with processor sharing."""

  def __init__(self, throughput: dict[str, float]):
    self.now = 0.0
    self.throughput = throughput    # group -> shared throughput when > 1 actor is busy on it
    self.intervals: list[tuple[str, str, float, float]] = []  # (actor, label, start, end)
    self._actors: dict[str, list] = {}  # name -> [generator, request, remaining, start]

  def add(self, name: str, actor) -> None:
    self._actors[name] = [actor, None, 0.0, 0.0]
    self._step(name)

  def _step(self, name: str) -> None:
    a = self._actors[name]
    try:
      a[1] = next(a[0])
    except StopIteration:
      a[1] = None
      return
    if isinstance(a[1], Work):
      a[2], a[3] = a[1].seconds, self.now

  def in_progress(self) -> list[tuple[str, str, float, float]]:
    """The work under way now, as intervals ending now."""
    return [(name, a[1].label, a[3], self.now) for name, a in self._actors.items()
            if isinstance(a[1], Work)]

  def run(self, done: Callable[[], bool], horizon: float) -> None:
    """Until `done()`; raises when every actor waits (a deadlock) or past `horizon` s."""
    while not done():
      woke = True
      while woke:  # wake waiters and finish zero-length work, which may happen at once
        woke = False
        for name, a in self._actors.items():
          req = a[1]
          if (isinstance(req, Wait) and req.ready()) or (isinstance(req, Work) and a[2] <= 0):
            if isinstance(req, Work):
              self.intervals.append((name, req.label, a[3], self.now))
            self._step(name)
            woke = True
        if done():
          return
      busy = {n: a for n, a in self._actors.items() if isinstance(a[1], Work)}
      if not busy:
        raise RuntimeError(f"deadlock at t={self.now:.3f}: every actor waits")
      per_group = collections.Counter(a[1].group for a in busy.values())
      rate = {g: 1.0 if c == 1 else self.throughput.get(g, 1.0) / c
              for g, c in per_group.items()}
      dt = min(a[2] / rate[a[1].group] for a in busy.values())
      self.now += dt
      for a in busy.values():
        a[2] -= dt * rate[a[1].group]
        if a[2] < 1e-12:
          a[2] = 0.0
      if self.now > horizon:
        raise RuntimeError(f"the simulation passed its horizon of {horizon:.0f} s")


# ---------------------------------------------------------------------------
# The replay buffer: replay_buffer.py's windows and m rule over (id, version, window) entries.
# ---------------------------------------------------------------------------
class Buffer:
  """Per-prompt entries (newest `max_per_prompt`), sync windows and the m rule."""

  def __init__(self, max_per_prompt: int, rng: random.Random):
    self.max_per_prompt, self.rng = max_per_prompt, rng
    self.entries: dict[int, collections.deque] = {}
    self.prompts: list[int] = []      # every prompt seen, for the any-prompt branch
    self.size = 0
    self.window = 0                   # entries added now belong to this window
    self.pending: set[int] = set()    # prompts refreshed since the last mark_sync
    self.latest: list[int] = []       # prompts refreshed at the latest sync
    self.latest_left: list[int] = []  # those the m branch has not taken yet

  def add(self, prompt: int, entry_id: int, version: int) -> None:
    per = self.entries.get(prompt)
    if per is None:
      per = self.entries[prompt] = collections.deque(maxlen=self.max_per_prompt)
      self.prompts.append(prompt)
    self.size += len(per) < self.max_per_prompt  # a full deque drops its oldest
    per.append((entry_id, version, self.window))
    self.pending.add(prompt)

  def mark_sync(self) -> None:
    if self.pending:  # else the latest prompts stay those of the previous window
      self.latest, self.pending = sorted(self.pending), set()
      self.latest_left = list(self.latest)
      self.window += 1

  def sample(self, num_prompts: int, k: int, m: float,
             reuse_latest: bool) -> tuple[list[tuple], list[bool]]:
    """B slots x K entries (module doc: the m rule; with replacement only below K), and
    for each row whether the m branch drew it."""
    rows, latest, taken = [], [], set()
    for _ in range(num_prompts):
      prompt = None
      from_latest = self.rng.random() < m
      if from_latest:
        if not self.latest_left and reuse_latest:
          self.latest_left = list(self.latest)  # another pass over the latest prompts
        prompt = self._take_latest(taken)
        if prompt is not None:  # its newest generation: the window of its newest entry
          newest = self.entries[prompt][-1][2]
          pool = list(itertools.takewhile(lambda e: e[2] == newest,
                                          reversed(self.entries[prompt])))
      if prompt is None:  # the any-prompt branch: a prompt not in this batch (a few tries)
        from_latest = False
        for _ in range(8):
          prompt = self.prompts[self.rng.randrange(len(self.prompts))]
          if prompt not in taken:
            break
        pool = list(self.entries[prompt])
      taken.add(prompt)
      rows += (self.rng.sample(pool, k) if len(pool) >= k else
               pool + [self.rng.choice(pool) for _ in range(k - len(pool))])
      latest += [from_latest] * k
    return rows, latest

  def _take_latest(self, taken: set) -> int | None:
    """A latest prompt not yet taken and not in this batch, removed from latest_left."""
    left = self.latest_left
    tries = [self.rng.randrange(len(left)) for _ in range(min(8, len(left)))]
    for i in itertools.chain(tries, range(len(left))):  # a few random tries, then a scan
      if left[i] not in taken:
        prompt, left[i] = left[i], left[-1]  # order within latest_left does not matter
        left.pop()
        return prompt
    return None


# ---------------------------------------------------------------------------
# The run: searchers and the trainer as actors.
# ---------------------------------------------------------------------------
class _Run:
  """The state the actors share: weights version, staging lists, buffer, counters."""

  def __init__(self, layout: Layout, c: RunConfig, costs: Costs, num_updates: int, seed: int):
    self.layout, self.c, self.costs, self.num_updates = layout, c, costs, num_updates
    self.buffer = Buffer(c.max_per_prompt, random.Random(seed))
    self.version = 0                      # the mailbox: updates done at the latest publish
    self.staged = [[] for _ in range(layout.num_searchers)]  # committed, not merged
    n = layout.num_searchers
    self.shards = [list(range(i, c.num_train_prompts, n)) or [i] for i in range(n)]
    self.cursor = [0] * n
    self.produced = 0
    self.steps_done = 0
    self.step_ends: list[float] = []
    self.staleness: list[int] = []
    self.trained_ids: set[int] = set()
    self.latest_staleness: list[int] = []  # the m branch's samples
    self.fresh: list[int] = []             # per step, samples trained for the first time
    self.train_start = 0.0
    self.engine = Engine({"shared": layout.shared_throughput})

  def group(self, role: str, i: int = 0) -> str:
    return "shared" if self.layout.shared else (role if role == "trainer" else f"searcher{i}")

  def search_batch(self, i: int):
    """One batch of searcher i: P prompts of its shard x S samples, under the version it
    read at the start (the staleness it will carry)."""
    version = self.version
    shard, c = self.shards[i], self.c
    prompts = [shard[(self.cursor[i] + j) % len(shard)] for j in range(c.prompts_per_search)]
    self.cursor[i] += c.prompts_per_search
    yield Work(self.group("searcher", i), self.costs.search_batch_s, "search")
    for p in prompts:
      for _ in range(c.samples_per_search):
        self.staged[i].append((p, self.produced, version))
        self.produced += 1

  def merge(self) -> None:
    for staged in self.staged:
      for prompt, entry_id, version in staged:
        self.buffer.add(prompt, entry_id, version)
      staged.clear()

  def searcher(self, i: int):
    """async: batches until the run ends (paced: not while holding a window's share)."""
    c = self.c
    share = math.ceil(c.window_prompts / self.layout.num_searchers) * c.samples_per_search
    while True:
      if c.paced and len(self.staged[i]) >= share:
        yield Wait(lambda: len(self.staged[i]) < share)
      yield from self.search_batch(i)

  def search_round(self, num_prompts: int):
    """alternate: searchers one after another in the trainer's thread, then merged."""
    n = self.layout.num_searchers
    per = math.ceil(num_prompts / (n * self.c.prompts_per_search))
    for i in range(n):
      for _ in range(per):
        yield from self.search_batch(i)
    self.merge()

  def trainer(self):
    c, alternate = self.c, self.layout.mode == "alternate"
    # ----- Pre-fill
    if alternate:
      while self.buffer.size < c.prefill or not self.buffer.prompts:
        yield from self.search_round(c.num_prompts)
    else:
      # The loop merges what the searchers committed until the buffer holds the pre-fill
      # (paced searchers resume as their entries are merged).
      while self.buffer.size < max(c.prefill, 1):
        yield Wait(lambda: any(self.staged))
        self.merge()
    self.buffer.mark_sync()
    self.train_start = self.engine.now
    # ----- Train: a window's round (alternate), sample, update, sync
    for step in range(self.num_updates):
      if alternate and step > 0 and step % c.sync_every == 0:
        yield from self.search_round(c.window_prompts)
        self.buffer.mark_sync()
      rows, latest = self.buffer.sample(c.num_prompts, c.samples_per_prompt, c.m,
                                        c.reuse_latest)
      # Staleness enters here, as in the loop: updates done minus each sample's version.
      self.staleness += [step - version for _, version, _ in rows]
      self.latest_staleness += [step - v for (_, v, _), new in zip(rows, latest) if new]
      before = len(self.trained_ids)
      self.trained_ids.update(entry_id for entry_id, _, _ in rows)
      self.fresh.append(len(self.trained_ids) - before)  # samples trained for the first time
      yield Work(self.group("trainer"), self.costs.update_s, "update")
      done = step + 1
      if done % c.sync_every == 0:
        yield Work(self.group("trainer"), self.costs.sync_s, "sync")
        self.version = done
        if not alternate:
          self.merge()
          self.buffer.mark_sync()
      self.steps_done = done
      self.step_ends.append(self.engine.now)


def simulate(layout: Layout, c: RunConfig, costs: Costs, num_updates: int = 100,
             seed: int = 0, horizon_s: float = 1e9) -> Result:
  """Runs the pipeline for `num_updates` updates; the steady state is the steps after the
  first quarter (at least one step)."""
  if num_updates < 4:
    raise ValueError(f"num_updates={num_updates}: at least 4 (a quarter is the warm-up)")
  run = _Run(layout, c, costs, num_updates, seed)
  run.engine.add("trainer", run.trainer())
  if layout.mode == "async":
    for i in range(layout.num_searchers):
      run.engine.add(f"searcher{i}", run.searcher(i))
  run.engine.run(lambda: run.steps_done >= num_updates, horizon_s)
  # The steady state: whole windows of k after the first quarter (a window's round and sync
  # counted once), or the steps after the first quarter when there are not two windows.
  k = c.sync_every
  warm, last = max(k, num_updates // 4 // k * k), num_updates // k * k
  if last <= warm:
    warm, last = num_updates // 4, num_updates
  t0, t1 = run.step_ends[warm - 1], run.step_ends[last - 1]
  intervals = run.engine.intervals + run.engine.in_progress()
  busy = _busy(intervals, t0, t1)
  span = max(t1 - t0, 1e-12)
  updates = [e - s for _, label, s, e in intervals if label == "update" and t0 <= s < t1]
  searcher_busy = [busy.get((f"searcher{i}", "search"), 0.0) for i in range(layout.num_searchers)]
  if layout.mode == "alternate":  # the searchers' work runs in the trainer's thread
    searcher_busy = [busy.get(("trainer", "search"), 0.0) / layout.num_searchers] * \
        layout.num_searchers
  return Result(
      seconds_per_update=span / (last - warm),
      update_seconds=statistics.median(updates),
      trainer_idle=_fraction(1.0 - busy.get(("trainer", "update"), 0.0) / span),
      searcher_idle=_fraction(1.0 - sum(searcher_busy) / len(searcher_busy) / span),
      staleness_hist=dict(sorted(collections.Counter(run.staleness).items())),
      samples_produced=run.produced,
      samples_trained=len(run.staleness),
      distinct_trained=len(run.trained_ids),
      fresh_per_update=sum(run.fresh[warm:last]) / (last - warm),
      latest_staleness_mean=sum(run.latest_staleness) / max(len(run.latest_staleness), 1),
      prefill_seconds=run.train_start, wall_seconds=run.engine.now,
      samples_per_update=c.num_prompts * c.samples_per_prompt)


def _fraction(x: float) -> float:
  return min(1.0, max(0.0, x))  # float rounding of the summed intervals


def _busy(intervals, t0: float, t1: float) -> dict:
  """(actor, label) -> seconds of its work inside [t0, t1]."""
  out = collections.defaultdict(float)
  for actor, label, start, end in intervals:
    out[(actor, label)] += max(0.0, min(end, t1) - max(start, t0))
  return out

