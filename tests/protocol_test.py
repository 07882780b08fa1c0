"""benchmarks/protocol.py: the ledgers count what was tried on validation and let each recipe
read a task's test split once; the fingerprint names a recipe, not a run."""
import re

import pytest

from benchmarks import protocol
from benchmarks.protocol import OURS, PEER, Arm, Ledger, ProtocolError, ReadStatement
from configs import common, gsm8k

FROZEN = ReadStatement(frozen="cpu-v1", configs_tried=2)


def _tried(ledger, task, family, prints, seeds=(0,)):
  for fp in prints:
    for seed in seeds:
      ledger.record_validation(task, f"{family}:{fp}", family, fp, seed, 600.0)


def _print(config) -> str:
  return protocol.fingerprint(config.to_dict(), common.base().to_dict())


def test_the_fingerprint_ignores_seed_workdir_and_evaluation_but_not_the_lr():
  base = gsm8k.get_config("tiny")
  assert _print(gsm8k.get_config("tiny,seed=3,eval.every=1,eval.num_samples=7,log.every=5")) == (
      _print(base))
  defaults = common.base().to_dict()
  assert protocol.fingerprint({**base.to_dict(), "workdir": "/elsewhere"}, defaults) == (
      _print(base))
  assert _print(gsm8k.get_config("tiny,optim.learning_rate=2e-3")) != _print(base)


def test_a_key_added_at_its_default_leaves_every_fingerprint_but_a_set_one_changes_it():
  """A new option, off by default, is not a new recipe for every recipe that leaves it off;
  a recipe that sets it, or sets an old key back to its default, is a different one."""
  recipe, defaults = gsm8k.get_config("tiny").to_dict(), common.base().to_dict()
  before = protocol.fingerprint(recipe, defaults)
  with_key = {**recipe, "optim": {**recipe["optim"], "new_knob": 0}}
  grown = {**defaults, "optim": {**defaults["optim"], "new_knob": 0}}
  assert protocol.fingerprint(with_key, grown) == before
  set_on = {**recipe, "optim": {**recipe["optim"], "new_knob": 1}}
  assert protocol.fingerprint(set_on, grown) != before
  lr = defaults["optim"]["learning_rate"]  # the tiny recipe sets its own lr
  assert recipe["optim"]["learning_rate"] != lr
  at_default = {**recipe, "optim": {**recipe["optim"], "learning_rate": lr}}
  assert protocol.fingerprint(at_default, defaults) != before


def test_configurations_tried_count_distinct_recipes_per_task_and_family(tmp_path):
  ledger = Ledger(str(tmp_path))
  _tried(ledger, "a", OURS, ["r1", "r2"], seeds=(0, 1, 2))  # seeds of a recipe: one config
  _tried(ledger, "a", PEER, ["p1"])
  _tried(ledger, "b", OURS, ["r3"])
  assert ledger.configs_tried("a", OURS) == 2
  assert ledger.configs_tried("a", PEER) == 1
  assert ledger.configs_tried("b", OURS) == 1 and ledger.configs_tried("b", PEER) == 0
  assert len(ledger.validation_runs()) == 8  # every run is a line


def test_a_test_read_needs_a_frozen_name_and_the_configurations_tried(tmp_path):
  ledger = Ledger(str(tmp_path))
  _tried(ledger, "a", OURS, ["r1"])
  for statement in (ReadStatement(), ReadStatement(frozen="x"), ReadStatement(configs_tried=3)):
    with pytest.raises(ProtocolError, match="--frozen RECIPE_ID"):
      protocol.plan_test_reads(ledger, [Arm("a", "tba", OURS, "r1")], statement, [0, 1])


def test_a_recipe_never_run_on_validation_is_refused_on_test(tmp_path):
  ledger = Ledger(str(tmp_path))
  _tried(ledger, "a", OURS, ["r1", "r2"])
  with pytest.raises(ProtocolError, match="never run on a's validation split"):
    protocol.plan_test_reads(ledger, [Arm("a", "tba", OURS, "r9")], FROZEN, [0, 1])
  with pytest.raises(ProtocolError, match="never run on b's validation split"):
    protocol.plan_test_reads(ledger, [Arm("b", "tba", OURS, "r1")], FROZEN, [0, 1])


def test_a_second_test_read_of_a_recipe_is_refused_naming_the_first(tmp_path):
  ledger = Ledger(str(tmp_path))
  _tried(ledger, "a", OURS, ["r1", "r2"])
  arms = [Arm("a", "tba", OURS, "r1")]
  for entry in protocol.plan_test_reads(ledger, arms, FROZEN, [0, 1]):
    ledger.record_test_read(entry)
  first = ledger.test_reads()[0]
  assert (first["frozen"], first["configs_tried"]) == ("cpu-v1", {OURS: 2, PEER: 0})
  again = Arm("a", "tba:seed_aside", OURS, "r1")  # another arm name, the same recipe
  with pytest.raises(ProtocolError, match=re.escape(
      f"already read the test split on {first['date']} (as 'tba', frozen 'cpu-v1'")):
    protocol.plan_test_reads(ledger, [again], ReadStatement("cpu-v2", 2), [0, 1])
  # Another task's test split, or another recipe of this one, is not a re-read.
  _tried(ledger, "b", OURS, ["r1"])
  protocol.plan_test_reads(ledger, [Arm("b", "tba", OURS, "r1"), Arm("a", "tba", OURS, "r2")],
                           FROZEN, [0, 1])
  # With a reason it is allowed, and the reason is recorded.
  entry, = protocol.plan_test_reads(ledger, [again], ReadStatement("cpu-v1", 2, "crashed"), [0])
  assert entry["reread_reason"] == "crashed"


def test_the_stated_count_may_not_be_below_the_ledgers(tmp_path):
  ledger = Ledger(str(tmp_path))
  _tried(ledger, "a", OURS, ["r1", "r2", "r3"])
  with pytest.raises(ProtocolError, match="--configs_tried 2, but .* holds 3"):
    protocol.plan_test_reads(ledger, [Arm("a", "tba", OURS, "r1")], FROZEN, [0, 1])
  entry, = protocol.plan_test_reads(ledger, [Arm("a", "tba", OURS, "r1")],
                                    ReadStatement("cpu-v1", 5), [0, 1])  # runs before the ledger
  assert entry["configs_tried"][OURS] == 5


def test_a_peer_with_less_tuning_is_refused_unless_accepted_and_recorded(tmp_path):
  ledger = Ledger(str(tmp_path))
  _tried(ledger, "a", OURS, ["r1", "r2"])
  _tried(ledger, "a", PEER, ["p1"])
  arms = [Arm("a", "tba", OURS, "r1"), Arm("a", "trl", PEER, "p1")]
  with pytest.raises(ProtocolError, match=r"the peer \(trl\) tried 1 configurations on "
                                          "validation, tba 2"):
    protocol.plan_test_reads(ledger, arms, FROZEN, [0, 1])
  entries = protocol.plan_test_reads(ledger, arms, ReadStatement("cpu-v1", 2,
                                                                 unequal_tuning_ok=True), [0, 1])
  assert all(e["unequal_tuning_ok"] for e in entries)
  _tried(ledger, "a", PEER, ["p2"])
  entries = protocol.plan_test_reads(ledger, arms, FROZEN, [0, 1])
  assert entries[1]["configs_tried"] == {OURS: 2, PEER: 2}


def test_a_test_run_launched_outside_the_suite_is_refused(tmp_path):
  ledger = Ledger(str(tmp_path))
  with pytest.raises(ProtocolError, match="python -m benchmarks.suite --split test"):
    protocol.check_recorded_read(ledger, "a", "p1")
  _tried(ledger, "a", PEER, ["p1"])
  ledger.record_test_read(dict(task="a", arm="trl", family=PEER, fingerprint="p1"))
  protocol.check_recorded_read(ledger, "a", "p1")
