"""benchmarks/suite.py: the statistics over seeds (time to target with seeds that never reach
it, standard errors), the arm specs, the command line's protocol refusals, and a tiny run."""
import datetime
import json
import math
import os
import re
import sys
import types

import pytest

import configs
from benchmarks import protocol, suite


def _curves(points):
  """Curves of (seconds, updates, accuracy) evaluations."""
  return {"evals": [dict(seconds=t, updates=u, accuracy=a, se=0.05, metrics={})
                    for t, u, a in points], "train": []}


def test_time_to_target_averages_the_seeds_that_reached_it_and_names_the_others():
  runs = {"0": _curves([(0, 0, 0.3), (60, 5, 0.82), (120, 10, 0.9)]),
          "1": _curves([(0, 0, 0.4), (60, 6, 0.7), (130, 12, 0.85)]),
          "2": _curves([(0, 0, 0.2), (60, 5, 0.5), (120, 11, 0.6)])}
  g = suite.aggregate(runs, target=0.8)
  assert (g["reached"], g["seeds"], g["never_reached"]) == (2, 3, ["2"])
  assert g["time_to_target_s"]["mean"] == pytest.approx(95.0)  # (60 + 130) / 2
  assert g["time_to_target_s"]["se"] == pytest.approx(35.0)    # std(ddof=1) 49.5 / sqrt 2
  assert g["updates_to_target"]["mean"] == pytest.approx(8.5)  # (5 + 12) / 2
  assert g["final"]["mean"] == pytest.approx((0.9 + 0.85 + 0.6) / 3)
  finals = [0.9, 0.85, 0.6]
  se = math.sqrt(sum((x - sum(finals) / 3) ** 2 for x in finals) / 2 / 3)
  assert g["final"]["se"] == pytest.approx(se)
  assert g["peak"]["mean"] == pytest.approx((0.9 + 0.85 + 0.6) / 3)
  assert g["final_minus_peak"]["mean"] == pytest.approx(0.0)


def test_final_minus_peak_counts_a_fall_and_one_seed_has_no_standard_error():
  g = suite.aggregate({"0": _curves([(0, 0, 0.3), (60, 5, 0.95), (120, 10, 0.75)])}, 0.9)
  assert g["final_minus_peak"] == {"mean": pytest.approx(-0.2), "se": None, "n": 1}
  assert g["time_to_target_s"] == {"mean": 60.0, "se": None, "n": 1}
  nobody = suite.aggregate({"0": _curves([(0, 0, 0.3), (60, 5, 0.5)])}, 0.9)
  assert nobody["time_to_target_s"] == {"mean": None, "se": None, "n": 0}
  assert nobody["never_reached"] == ["0"]
  assert "never reached" in suite.table({"tasks": {"t": {
      "target": 0.9, "budget_s": 600.0, "eval_grid": "grid", "arms": {"tba": {
          "aggregate": nobody}}, "configs_tried": {"tba": 1, "trl": 0}}}})


def test_the_bars_judge_each_tba_arm_against_the_trl_arm_with_the_best_final():
  def arm(points_by_seed):
    runs = {str(i): _curves(p) for i, p in enumerate(points_by_seed)}
    return {"runs": runs, "aggregate": suite.aggregate(runs, target=0.8)}
  task = {"target": 0.8, "arms": {
      "tba": arm([[(0, 0, 0.3), (100, 9, 0.9)], [(0, 0, 0.3), (120, 9, 0.88)],
                  [(0, 0, 0.3), (110, 9, 0.92)]]),
      "tba:x=1": arm([[(0, 0, 0.3), (100, 9, 0.95), (200, 19, 0.85)],
                      [(0, 0, 0.3), (100, 9, 0.78), (200, 19, 0.75)]]),
      "trl:lr=1e-05": arm([[(0, 0, 0.3), (900, 20, 0.7)]]),
      # the peer: two seeds reach 0.8 at 200 and 300 s, one never does (its end: 900 s)
      "trl:lr=2e-05": arm([[(0, 0, 0.3), (200, 5, 0.9)], [(0, 0, 0.3), (300, 7, 0.85)],
                           [(0, 0, 0.3), (900, 20, 0.8 - 1e-9)]])}}
  b = protocol.bars(task)
  assert b["peer"] == "trl:lr=2e-05" and set(b["arms"]) == {"tba", "tba:x=1"}
  assert task["arms"]["trl:lr=2e-05"]["aggregate"]["time_to_target_or_end_s"]["mean"] == (
      pytest.approx((200 + 300 + 900) / 3))
  assert b["arms"]["tba"] == {"holds": True, "final": True, "time": True,
                              "time_ratio": pytest.approx(110 / ((200 + 300 + 900) / 3))}
  # falls of 0.10 and 0.03 (mean 0.065), a seed that never reached 0.8, and a mean final
  # (0.80) below the peer's 0.85 minus its standard error (0.029)
  assert b["arms"]["tba:x=1"] == {"holds": False, "final": False, "time": False,
                                  "time_ratio": None}
  alone = protocol.bars({"target": 0.8, "arms": {"tba": task["arms"]["tba"]}})
  assert alone == {"peer": None, "arms": {"tba": {"holds": True, "final": None, "time": None,
                                                  "time_ratio": None}}}
  printed = suite.table({"tasks": {"t": task | {"budget_s": 900.0, "eval_grid": "grid"}}})
  assert "bars, tba against trl:lr=2e-05: holds met, final met, time met (0.24x)" in printed
  assert "bars, tba:x=1 against trl:lr=2e-05: holds NOT met, final NOT met, time NOT met" in printed


def test_the_report_draws_every_run_against_minutes_and_updates(tmp_path):
  runs = {"0": _curves([(0, 0, 0.3), (60, 5, 0.9)]), "1": _curves([(0, 0, 0.2), (70, 6, 0.8)])}
  report = {"split": "validation", "tasks": {
      name: {"target": 0.8, "arms": {"tba": {"runs": runs}, "trl:lr=1e-05": {"runs": runs}}}
      for name in ("a", "b")}}
  suite.plot(report, str(tmp_path / "suite.png"))
  assert (tmp_path / "suite.png").stat().st_size > 0


def test_arm_specs_parse_and_the_suites_own_keys_are_refused():
  assert suite.parse_arm("tba") == ("tba", [])
  assert suite.parse_arm("tba:optim.learning_rate=1e-5,loss.beta_end=0.1") == (
      "tba", ["optim.learning_rate=1e-5", "loss.beta_end=0.1"])
  family, settings = suite.parse_arm("trl:lr=2e-5,beta=0.02")
  assert (family, settings.lr, settings.beta, settings.k) == ("trl", 2e-5, 0.02, 8)
  assert suite.arm_spec(family, settings) == "trl:lr=2e-05,beta=0.02,prompts=4,k=8"
  for bad in ("tba:seed=3", "tba:eval.every_seconds=5", "tba:max_train_seconds=9",
              "tba:optim.learning_rate", "grpo", "trl:gamma=1"):
    with pytest.raises(ValueError):
      suite.parse_arm(bad)


@pytest.fixture
def fake_tasks(monkeypatch):
  """A configs.suite with two tasks (the CLI's refusals come before any config is built)."""
  fake = types.SimpleNamespace(TASKS={
      "a": dict(description="a", task={}, budget_s=600.0, target=0.8),
      "b": dict(description="b", task={}, budget_s=900.0, target=0.8)})
  monkeypatch.setitem(sys.modules, "configs.suite", fake)
  monkeypatch.setattr(configs, "suite", fake, raising=False)
  monkeypatch.setattr(suite, "HEADLINE_TASKS", ("b",))


@pytest.mark.parametrize("extra, message", [
    ([], "--frozen RECIPE_ID"),
    (["--frozen", "v1"], "--configs_tried N"),
    (["--frozen", "v1", "--configs_tried", "2", "--minutes", "1"], "each task's own budget"),
    (["--frozen", "v1", "--configs_tried", "2", "--seeds", "1"], "a: 2 seeds at least"),
    (["--frozen", "v1", "--configs_tried", "2", "--seeds", "2"], "b: 3 seeds at least"),
])
def test_the_test_split_is_refused_without_the_protocols_statement(fake_tasks, tmp_path, capsys,
                                                                   extra, message):
  with pytest.raises(SystemExit) as e:
    suite.main(["--tasks", "all", "--split", "test", "--results_dir", str(tmp_path), *extra])
  assert message in str(e.value.code)
  assert not os.listdir(tmp_path)  # nothing recorded, nothing run


def test_the_tiny_peer_and_unknown_tasks_are_refused(fake_tasks, capsys):
  for argv, message in ((["--tiny", "--peer", "trl"], "tba arms only"),
                        (["--tasks", "zz"], "unknown tasks")):
    with pytest.raises(SystemExit):
      suite.main(argv)
    assert message in capsys.readouterr().err


@pytest.mark.slow  # two tiny tba_jax runs in subprocesses: 20 s on 2 idle cores, 70 s busy
def test_a_tiny_validation_suite_writes_curves_aggregates_and_the_ledger(tmp_path):
  from configs import suite as suite_config
  name = next(iter(suite_config.TASKS))
  report = suite.main(["--tasks", name, "--tiny", "--seeds", "2", "--minutes", "0.05",
                       "--eval_seconds", "1", "--eval_samples", "2",
                       "--results_dir", str(tmp_path), "--workdir", str(tmp_path / "runs")])
  arm = report["tasks"][name]["arms"]["tba"]
  assert set(arm["runs"]) == {"0", "1"}
  for curves in arm["runs"].values():
    evals = curves["evals"]
    assert len(evals) >= 2 and evals[0]["updates"] == 0 and evals[-1]["updates"] > 0
    assert all(e["seconds"] >= 0 and 0 <= e["accuracy"] <= 1 for e in evals)
  assert arm["aggregate"]["seeds"] == 2
  ledger = protocol.Ledger(str(tmp_path))
  assert [(r["task"], r["seed"]) for r in ledger.validation_runs()] == [
      (f"{name},tiny", 0), (f"{name},tiny", 1)]  # not configurations of the task itself
  assert report["tasks"][name]["configs_tried"] == {"tba": 1, "trl": 0}
  path, = [f for f in os.listdir(tmp_path) if f.startswith("suite_validation_")]
  with open(tmp_path / path) as f:
    assert json.load(f)["tasks"][name]["arms"]["tba"]["fingerprint"] == arm["fingerprint"]


def _report(date, seeds, fingerprint="f1", machine="cpu X, 2 cores", grid="every 60 s"):
  return {"split": "validation", "date": date, "machine": machine, "tasks": {"t": {
      "description": "d", "target": 0.8, "budget_s": 600.0, "eval_grid": grid, "arms": {"tba": {
          "fingerprint": fingerprint,
          "runs": {str(s): _curves([(0, 0, 0.3), (60, 5, a)]) for s, a in seeds.items()}}}}}}


def test_pooled_reports_aggregate_every_seed_as_one_run_would(tmp_path):
  pooled = suite.pool([_report("d1", {1: 0.9, 2: 0.7}), _report("d0", {0: 0.85})])
  arm = pooled["tasks"]["t"]["arms"]["tba"]
  assert list(arm["runs"]) == ["0", "1", "2"] and pooled["pooled"] == ["d1", "d0"]
  together = suite.aggregate({str(s): _curves([(0, 0, 0.3), (60, 5, a)])
                              for s, a in {0: 0.85, 1: 0.9, 2: 0.7}.items()}, 0.8)
  assert arm["aggregate"] == together and together["reached"] == 2
  paths = []
  for i, r in enumerate([_report("d1", {1: 0.9, 2: 0.7}), _report("d0", {0: 0.85})]):
    paths.append(str(tmp_path / f"r{i}.json"))
    with open(paths[-1], "w") as f:
      json.dump(r, f)
  written = suite.main(["--pool", *paths, "--results_dir", str(tmp_path / "out")])
  assert written["tasks"]["t"]["arms"]["tba"]["aggregate"] == together
  assert [f for f in os.listdir(tmp_path / "out") if f.endswith(".json")][0].startswith(
      "suite_validation_pooled_")


def test_two_pools_in_one_second_write_two_files(tmp_path, monkeypatch):
  now = datetime.datetime(2026, 12, 8, 4, 4, 52)
  monkeypatch.setattr(suite, "datetime", types.SimpleNamespace(
      datetime=types.SimpleNamespace(now=lambda: now)))
  path = str(tmp_path / "r.json")
  with open(path, "w") as f:
    json.dump(_report("d0", {0: 0.85}), f)
  out = str(tmp_path / "out")
  dates = [suite.main(["--pool", path, "--results_dir", out])["date"] for _ in range(3)]
  assert dates == ["20261208_040452", "20261208_040452_2", "20261208_040452_3"]
  assert sorted(f for f in os.listdir(out) if f.endswith(".json")) == [
      f"suite_validation_pooled_{d}.json" for d in dates]


@pytest.mark.parametrize("other, says", [
    (_report("d1", {0: 0.9}), "seed 0 in two reports"),
    (_report("d1", {1: 0.9}, fingerprint="f2"), "recipe f1 in one report, f2"),
    (_report("d1", {1: 0.9}, machine="cpu Y, 2 cores"), "machine"),
    (_report("d1", {1: 0.9}, grid="every 120 s"), "eval_grid"),
])
def test_reports_that_are_not_one_experiment_are_not_pooled(other, says):
  with pytest.raises(ValueError, match=re.escape(says)):
    suite.pool([_report("d0", {0: 0.85}), other])


def test_pool_names_a_missing_or_foreign_file(tmp_path):
  foreign = tmp_path / "metrics.json"
  foreign.write_text('{"loss": 1.0}')
  for path, says in [(tmp_path / "absent.json", "not a readable suite report"),
                     (foreign, "not a suite report")]:
    with pytest.raises(SystemExit, match=re.escape(f"--pool {path}: {says}")):
      suite.main(["--pool", str(path), "--results_dir", str(tmp_path)])


@pytest.mark.parametrize("flags, named", [
    ("fpu avx avx2 fma", "AMD EPYC, AVX2, 2 cores"),
    ("avx avx2 avx512f avx512dq", "AMD EPYC, AVX-512, 2 cores"),
    ("fpu sse2", "AMD EPYC, 2 cores"),
])
def test_the_machine_names_its_widest_vector_extension(tmp_path, monkeypatch, flags, named):
  cpuinfo = tmp_path / "cpuinfo"
  cpuinfo.write_text(f"processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: {flags}\n"
                     f"processor\t: 1\nmodel name\t: AMD EPYC\nflags\t\t: {flags}\n")
  monkeypatch.setattr(os, "cpu_count", lambda: 2)
  assert suite._machine(str(cpuinfo)) == named
