"""The protocol for recipe work as files: what was tried on validation, what read the test split,
and the bars a recipe is judged by.

docs/benchmarks.md, "Protocol for recipe work", states the rules; this module keeps the two
append-only ledgers that enforce them (benchmarks/results/, committed with the results):

  validation_runs.jsonl  one line per run on a validation split (task, arm, recipe
                         fingerprint, seed, budget): how many configurations were tried on a
                         task, per arm family, is counted from here, not from memory
  test_reads.jsonl       one line per read of a test split (task, arm, fingerprint, the frozen
                         recipe's name, the configurations each family tried, the reason for a
                         re-read, whether unequal tuning was accepted)

A recipe's fingerprint hashes the settings where it differs from the config's defaults
(configs/common.py), without what does not change what is trained: the seed, the evaluation,
the run's bookkeeping (log, checkpoint, export) and the recipe's name. Another seed or another
evaluation grid is the same recipe; another lr is not; nor does a key added to the config with
a default that leaves training as it was make every recipe a new one. A changed default is a
change of code, as a changed loss is: neither is in the hash, and LAB_LOG says when one was
made.

`bars` judges each tba arm of a suite task against its best TRL arm by issue 48's bars (no
fall, final, time); benchmarks/suite.py prints and stores the verdict with every report.
"""
from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import os

from tba_jax import run_config

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
VALIDATION_RUNS, TEST_READS = "validation_runs.jsonl", "test_reads.jsonl"
# Top-level settings that do not change what is trained (module docstring).
NOT_THE_RECIPE = ("seed", "workdir", "eval", "log", "checkpoint", "export", "variant")
OURS, PEER = "tba", "trl"  # the arm families whose tuning budgets are compared
HOLD_WITHIN, TIME_RATIO = 0.05, 0.8  # issue 48's bars (bars): no fall, time against the peer


class ProtocolError(Exception):
  """A run the protocol refuses; the message says which rule and how to proceed."""


def fingerprint(settings: dict, defaults: dict) -> str:
  """A hash of `settings` (a resolved config as a dict) where they differ from `defaults` (the
  same shape), without NOT_THE_RECIPE's sections."""
  base = run_config.flatten(defaults)
  kept = {k: v for k, v in run_config.flatten(settings).items()
          if k.split(".")[0] not in NOT_THE_RECIPE and (k not in base or base[k] != v)}
  text = json.dumps(kept, sort_keys=True, default=str)
  return hashlib.sha256(text.encode()).hexdigest()[:16]


def _now() -> str:
  return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


class Ledger:
  """The two ledgers of a results directory (append-only JSON lines)."""

  def __init__(self, directory: str = RESULTS):
    self.directory = directory

  def _read(self, name: str) -> list[dict]:
    path = os.path.join(self.directory, name)
    if not os.path.exists(path):
      return []
    with open(path) as f:
      return [json.loads(line) for line in f if line.strip()]

  def _append(self, name: str, entry: dict) -> dict:
    os.makedirs(self.directory, exist_ok=True)
    entry = {"date": _now(), **entry}
    with open(os.path.join(self.directory, name), "a") as f:
      f.write(json.dumps(entry) + "\n")
    return entry

  def validation_runs(self) -> list[dict]:
    return self._read(VALIDATION_RUNS)

  def test_reads(self) -> list[dict]:
    return self._read(TEST_READS)

  def record_validation(self, task: str, arm: str, family: str, fingerprint: str, seed: int,
                        budget_s: float) -> dict:
    """Appended when a validation run starts: a run that fails was still tried."""
    return self._append(VALIDATION_RUNS, dict(task=task, arm=arm, family=family,
                                              fingerprint=fingerprint, seed=seed,
                                              budget_s=budget_s))

  def configs_tried(self, task: str, family: str) -> int:
    """Distinct recipes of `family` run on `task`'s validation split (seeds of one recipe
    are one configuration)."""
    return len({r["fingerprint"] for r in self.validation_runs()
                if r["task"] == task and r["family"] == family})

  def record_test_read(self, entry: dict) -> dict:
    return self._append(TEST_READS, entry)


@dataclasses.dataclass(frozen=True)
class Arm:
  """One arm of a run on one task, as the protocol sees it."""
  task: str
  spec: str         # "tba", "tba:optim.learning_rate=1e-5", "trl:lr=2e-5,beta=0.02"
  family: str       # OURS or PEER
  fingerprint: str


@dataclasses.dataclass(frozen=True)
class ReadStatement:
  """What the command line states about a test read."""
  frozen: str = ""          # the frozen recipe's name (--frozen)
  configs_tried: int = -1   # configurations of ours tried on validation (--configs_tried)
  reread_reason: str = ""   # why a recipe's test split is read again (--reread_reason)
  unequal_tuning_ok: bool = False  # the peer tried fewer configurations, knowingly

  def problems(self) -> list[str]:
    if self.frozen and self.configs_tried >= 1:
      return []
    return ["--split test reads the test split once per frozen recipe: give --frozen "
            "RECIPE_ID (its name) and --configs_tried N (how many configurations were tried "
            "on validation to choose it)"]


def plan_test_reads(ledger: Ledger, arms: list[Arm], statement: ReadStatement,
                    seeds: list[int]) -> list[dict]:
  """The test_reads.jsonl entries of `arms`, or ProtocolError naming every rule they break.

  Rules: a frozen recipe's name and the configurations tried are stated; each arm's recipe
  was run on its task's validation split; no (task, fingerprint) was read on test before
  (unless a reason is given, recorded); the stated count is not below the ledger's; a peer
  arm's family tried at least as many configurations as ours (unless accepted, recorded).
  Nothing is written: record them with Ledger.record_test_read before the runs start."""
  problems = statement.problems()
  validated = {(r["task"], r["fingerprint"]) for r in ledger.validation_runs()}
  earlier = {(r["task"], r["fingerprint"]): r for r in ledger.test_reads()}
  entries = []
  for arm in arms:
    ours = ledger.configs_tried(arm.task, OURS)
    peer = ledger.configs_tried(arm.task, PEER)
    if (arm.task, arm.fingerprint) not in validated:
      problems.append(f"{arm.task} / {arm.spec}: recipe {arm.fingerprint} was never run on "
                      f"{arm.task}'s validation split ({VALIDATION_RUNS}); settings are chosen "
                      "there first")
    before = earlier.get((arm.task, arm.fingerprint))
    if before and not statement.reread_reason:
      problems.append(f"{arm.task} / {arm.spec}: recipe {arm.fingerprint} already read the "
                      f"test split on {before['date']} (as {before['arm']!r}, frozen "
                      f"{before['frozen']!r}; {TEST_READS}); a second read needs "
                      "--reread_reason (recorded)")
    if 0 < statement.configs_tried < ours:
      problems.append(f"{arm.task}: --configs_tried {statement.configs_tried}, but "
                      f"{VALIDATION_RUNS} holds {ours} configurations of {OURS} on it")
    ours = max(ours, statement.configs_tried)
    if arm.family == PEER and peer < ours and not statement.unequal_tuning_ok:
      problems.append(f"{arm.task}: the peer ({PEER}) tried {peer} configurations on "
                      f"validation, {OURS} {ours}; give it the same tuning budget (more "
                      f"{PEER}:lr=..,beta=.. arms on validation) or pass --unequal_tuning_ok "
                      "(recorded)")
    entries.append(dict(task=arm.task, arm=arm.spec, family=arm.family,
                        fingerprint=arm.fingerprint, frozen=statement.frozen, seeds=seeds,
                        configs_tried={OURS: ours, PEER: peer},
                        reread_reason=statement.reread_reason if before else "",
                        unequal_tuning_ok=statement.unequal_tuning_ok))
  if problems:
    raise refusal(problems)
  return entries


def refusal(problems: list[str]) -> ProtocolError:
  return ProtocolError("refused by the protocol (docs/benchmarks.md, \"Protocol for recipe "
                       "work\"):\n  " + "\n  ".join(dict.fromkeys(problems)))


def check_recorded_read(ledger: Ledger, task: str, fingerprint: str) -> None:
  """ProtocolError unless test_reads.jsonl records a read of `task` by `fingerprint` (a
  test-split run launched by the suite, which recorded it first)."""
  if not any(r["task"] == task and r["fingerprint"] == fingerprint
             for r in ledger.test_reads()):
    raise ProtocolError(f"the test split is read through python -m benchmarks.suite --split "
                        f"test (it records the read); {task} / {fingerprint} has no record in "
                        f"{os.path.join(ledger.directory, TEST_READS)}")


def bars(task: dict) -> dict:
  """Issue 48's bars for each tba arm of a task (its aggregates) against the peer, the TRL
  arm with the highest mean final: `holds`, final minus peak (mean over seeds) >= -HOLD_WITHIN;
  `final`, the arm's mean final >= the peer's minus one standard error; `time`, every seed
  reached the target and the arm's mean time to it is <= TIME_RATIO x the peer's, a peer seed
  that never reached it counted at its last evaluation (a lower bound, so the ratio errs
  against tba). {"peer": spec or None, "arms": {spec: {bar: bool or None (no peer), "time_ratio"}}}."""
  arms = task["arms"]
  peers = [s for s in arms if s.split(":")[0] == PEER]
  peer = max(peers, key=lambda s: arms[s]["aggregate"]["final"]["mean"], default=None)
  out = {"peer": peer, "arms": {}}
  for spec, a in arms.items():
    if spec in peers:
      continue
    g = a["aggregate"]
    b = out["arms"][spec] = {"holds": g["final_minus_peak"]["mean"] >= -HOLD_WITHIN,
                             "final": None, "time": None, "time_ratio": None}
    if peer is None:
      continue
    p = arms[peer]["aggregate"]
    b["final"] = g["final"]["mean"] >= p["final"]["mean"] - (p["final"]["se"] or 0.0)
    if g["reached"] == g["seeds"]:
      b["time_ratio"] = g["time_to_target_s"]["mean"] / p["time_to_target_or_end_s"]["mean"]
    b["time"] = b["time_ratio"] is not None and b["time_ratio"] <= TIME_RATIO
  return out
