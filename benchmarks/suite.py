r"""A suite of tasks: each arm and seed run one after another; curves, time to target, accuracy.

  python -m benchmarks.suite --tasks all --seeds 3 --peer trl        # validation (default)
  python -m benchmarks.suite --tasks NAME --seeds 2 --arms tba "tba:optim.learning_rate=1e-5" \
      "trl:lr=2e-5,beta=0.02"                                         # ablations, peer tuning
  python -m benchmarks.suite --tasks all --seeds 3 --peer trl --split test \
      --frozen RECIPE_ID --configs_tried N                            # a frozen recipe, once

Tasks are configs/suite.py's (TASKS: a description, the task section, a budget, a target).
Arms: `tba` (the task's config: the cpu recipe on that task), `tba:KEY=VALUE,...` (the same
with config overrides), `trl` / `trl:lr=..,beta=..,prompts=..,k=..` (TRL's GRPOTrainer,
benchmarks/trl_grpo.py). Runs never overlap (2 cores): every seed of every arm of every task
in turn, each for its task's budget (--minutes overrides it, validation only), evaluated on
the grid that trl_grpo.Schedule states (every --eval_seconds of training).

Writes --results_dir/suite_<split>_<time>.json after every run: per task, arm and seed the
curves (training seconds with evaluation time subtracted, updates, accuracy and its standard
error, every eval/* metric tba_jax logged), and per task and arm over seeds: time and updates
to the task's target (mean +- s.e. over the seeds that reached it; the others counted and
named), final and peak accuracy and final minus peak (mean +- s.e.), and issue 48's bars for
each tba arm against the best TRL arm (bars: no fall, final, time). At the end: the
accuracy curves against training minutes and updates (suite_<split>_<time>.png), the table.
Seeds run apart (another day, another invocation) are pooled into one table with
`--pool REPORT...` (the same split, machine, budgets, grid and recipe; no seed twice).

The protocol (docs/benchmarks.md, "Protocol for recipe work"; benchmarks/protocol.py):
every validation run is recorded in validation_runs.jsonl as it starts; --split test needs
--frozen and --configs_tried, at least 2 seeds (3 on headline tasks) and the task's own
budget, reads each (task, recipe) once (test_reads.jsonl; --reread_reason to read again,
recorded), and refuses a peer with fewer configurations tried than tba (--unequal_tuning_ok,
recorded). --tiny runs the tba arms on each task's tiny random model (tests: seconds),
recorded under "NAME,tiny": no configuration of the task.
"""
import argparse
import datetime
import json
import os
import platform
import sys

import numpy as np

from benchmarks import protocol, trl_grpo
from benchmarks.trl_grpo import Schedule, TrlSettings

MIN_TEST_SEEDS, HEADLINE_TEST_SEEDS = 2, 3
HEADLINE_TASKS = ("add_mul_1d",)  # the cpu recipe's task (README): HEADLINE_TEST_SEEDS on test
# Keys the suite sets for every tba arm (trl_grpo.tba_overrides): not an arm's to change.
SUITE_KEYS = ("seed", "max_train_seconds", "eval.")


# ----- Arms ----------------------------------------------------------------------------------
def parse_arm(text: str) -> tuple[str, object]:
  """("tba", [overrides]) or ("trl", TrlSettings) of an arm spec; ValueError when malformed."""
  family, _, rest = text.partition(":")
  if family == protocol.PEER:
    return family, TrlSettings.parse(rest)
  if family != protocol.OURS:
    raise ValueError(f"arm {text!r}: expected tba[:KEY=VALUE,...] or trl[:lr=..,beta=..]")
  overrides = [o for o in rest.split(",") if o]
  for o in overrides:
    if "=" not in o or o.startswith(SUITE_KEYS):
      raise ValueError(f"arm {text!r}: {o!r} is not a KEY=VALUE the arm may set (the suite "
                       f"sets {', '.join(SUITE_KEYS)})")
  return family, overrides


def arm_spec(family: str, arm) -> str:
  """The canonical name of a parsed arm (ledgers, reports)."""
  return trl_grpo.tba_spec(arm) if family == protocol.OURS else arm.spec()


def fingerprint(task: str, family: str, arm, schedule: Schedule, tiny: bool) -> str:
  spec = trl_grpo.config_spec(task, tiny)
  if family == protocol.OURS:
    return trl_grpo.tba_fingerprint(spec, arm, schedule)
  return trl_grpo.trl_fingerprint(spec, arm, schedule)


# ----- Statistics over seeds --------------------------------------------------------------------
def mean_se(values) -> dict:
  """{"mean", "se" (over the values; None for fewer than 2), "n"}; mean None when empty."""
  x = np.asarray(list(values), np.float64)
  if not len(x):
    return {"mean": None, "se": None, "n": 0}
  return {"mean": float(x.mean()),
          "se": trl_grpo.standard_error(x) if len(x) > 1 else None, "n": int(len(x))}


def aggregate(runs: dict, target: float) -> dict:
  """Over seeds ({seed: curves}): time and updates to `target` over the seeds that reached it
  (the others listed), final and peak accuracy, final minus peak."""
  hits = {seed: trl_grpo.reached(c, target) for seed, c in runs.items()}
  got = [h for h in hits.values() if h is not None]
  final = {s: c["evals"][-1]["accuracy"] for s, c in runs.items()}
  peak = {s: max(e["accuracy"] for e in c["evals"]) for s, c in runs.items()}
  return {"target": target,
          "time_to_target_s": mean_se(h["seconds"] for h in got),
          # a seed that never reached it at its last evaluation's time: a lower bound
          "time_to_target_or_end_s": mean_se(
              (h or runs[s]["evals"][-1])["seconds"] for s, h in hits.items()),
          "updates_to_target": mean_se(h["updates"] for h in got if h["updates"] is not None),
          "reached": len(got), "seeds": len(runs),
          "never_reached": sorted(s for s, h in hits.items() if h is None),
          "final": mean_se(final.values()), "peak": mean_se(peak.values()),
          "final_minus_peak": mean_se(final[s] - peak[s] for s in runs),
          "updates": mean_se(c["evals"][-1]["updates"] or 0 for c in runs.values())}


def _pm(stat: dict, fmt: str = "{:.3f}") -> str:
  if stat["mean"] is None:
    return "-"
  return fmt.format(stat["mean"]) + ("" if stat["se"] is None else
                                     " +- " + fmt.format(stat["se"]))


def table(report: dict) -> str:
  """The report's aggregates, one line per task and arm."""
  lines = [f"{'task / arm':<40} {'to target (s)':>17} {'reached':>8} {'updates':>12} "
           f"{'final':>15} {'peak':>15} {'final-peak':>15}"]
  for name, t in report["tasks"].items():
    lines.append(f"{name}: target {t['target']}, budget {t['budget_s']:g} s; {t['eval_grid']}")
    for spec, a in t["arms"].items():
      g = a["aggregate"]
      lines.append(f"  {spec[:38]:<38} {_pm(g['time_to_target_s'], '{:.0f}'):>17} "
                   f"{g['reached']}/{g['seeds']:<6} {_pm(g['updates_to_target'], '{:.0f}'):>12} "
                   f"{_pm(g['final']):>15} {_pm(g['peak']):>15} "
                   f"{_pm(g['final_minus_peak']):>15}")
      if g["never_reached"]:
        lines.append(f"  {'':<38} seeds {g['never_reached']} never reached {t['target']}")
    b = protocol.bars(t)
    for spec, arm in b["arms"].items():
      said = ", ".join(f"{k} {'-' if v is None else 'met' if v else 'NOT met'}"
                       for k, v in arm.items() if k != "time_ratio")
      ratio = "" if arm["time_ratio"] is None else f" ({arm['time_ratio']:.2f}x)"
      lines.append(f"  bars, {spec} against {b['peer'] or 'no peer'}: {said}{ratio}")
    if "configs_tried" in t:
      lines.append(f"  configurations tried on validation: {t['configs_tried']}")
  return "\n".join(lines)


def pool(reports: list[dict]) -> dict:
  """One report of the runs of several (seeds of one recipe run at different times): per task
  and arm the runs of every report, re-aggregated. ValueError where they cannot be pooled: a
  split, machine, target, budget or evaluation grid that differs, a recipe (fingerprint) that
  differs under one arm name, or one seed run twice."""
  if not reports:
    raise ValueError("nothing to pool")
  problems = [f"{key}: {sorted({str(r[key]) for r in reports})}" for key in ("split", "machine")
              if len({str(r[key]) for r in reports}) > 1]
  out = {"split": reports[0]["split"], "machine": reports[0]["machine"], "tiny": False,
         "pooled": [r["date"] for r in reports], "tasks": {}}
  for r in reports:
    for name, t in r["tasks"].items():
      into = out["tasks"].setdefault(name, {k: t[k] for k in (
          "description", "target", "budget_s", "eval_grid")} | {"arms": {}})
      for k in ("target", "budget_s", "eval_grid"):
        if t[k] != into[k]:
          problems.append(f"{name}: {k} {into[k]!r} in one report, {t[k]!r} in {r['date']}")
      for spec, arm in t["arms"].items():
        a = into["arms"].setdefault(spec, {"fingerprint": arm["fingerprint"], "runs": {}})
        if arm["fingerprint"] != a["fingerprint"]:
          problems.append(f"{name} / {spec}: recipe {a['fingerprint']} in one report, "
                          f"{arm['fingerprint']} in {r['date']}")
        for seed, curves in arm["runs"].items():
          if seed in a["runs"]:
            problems.append(f"{name} / {spec}: seed {seed} in two reports (one is {r['date']})")
          a["runs"][seed] = curves
  if problems:
    raise ValueError("cannot pool these reports:\n  " + "\n  ".join(problems))
  for t in out["tasks"].values():
    for a in t["arms"].values():
      a["runs"] = dict(sorted(a["runs"].items(), key=lambda kv: int(kv[0])))
      a["aggregate"] = aggregate(a["runs"], t["target"])
    t["bars"] = protocol.bars(t)
  return out


def plot(report: dict, path: str) -> None:
  """Accuracy against training minutes and against updates, a row per task, a line per run."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  tasks = report["tasks"]
  fig, axes = plt.subplots(len(tasks), 2, figsize=(12, 3.5 * len(tasks)), squeeze=False)
  for row, (name, t) in enumerate(tasks.items()):
    for col, (x, scale, label) in enumerate((("seconds", 60.0, "training minutes"),
                                             ("updates", 1.0, "updates"))):
      ax = axes[row, col]
      for i, (spec, a) in enumerate(t["arms"].items()):
        for j, curves in enumerate(a["runs"].values()):
          evals = curves["evals"]
          ax.plot([e[x] / scale for e in evals], [e["accuracy"] for e in evals], marker=".",
                  color=f"C{i}", alpha=0.7, label=spec if j == 0 else None)
      ax.axhline(t["target"], color="grey", linestyle=":")
      ax.set_xlabel(label)
      ax.set_title(f"{name}: sampled pass@1 ({report['split']})")
      ax.grid(alpha=0.3)
      ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)


# ----- The command ------------------------------------------------------------------------------
def _machine(cpuinfo: str = "/proc/cpuinfo") -> str:
  """The CPU's model, its widest vector extension (AVX2 and AVX-512 machines differ 4-6x on
  one run, so their reports never pool) and its core count."""
  model, flags = platform.processor(), set()
  if os.path.exists(cpuinfo):
    with open(cpuinfo) as f:
      lines = f.read().splitlines()
    model = next((l.split(":", 1)[1].strip() for l in lines if l.startswith("model name")), model)
    flags = set(next((l.split(":", 1)[1].split() for l in lines if l.startswith("flags")), []))
  vector = next((name for flag, name in (("avx512f", "AVX-512"), ("avx2", "AVX2"))
                 if flag in flags), "")
  return ", ".join(filter(None, (model, vector, f"{os.cpu_count()} cores")))


def check_test_run(args, names: list[str], statement: protocol.ReadStatement) -> None:
  """The command line's part of the protocol for --split test, before anything is built (the
  ledgers' part: protocol.plan_test_reads)."""
  problems = statement.problems()
  if args.minutes:
    problems.append("--minutes: the test split is read at each task's own budget (budget_s)")
  if args.tiny:
    problems.append("--tiny: a test read is of a real recipe")
  for name in names:
    need = HEADLINE_TEST_SEEDS if name in HEADLINE_TASKS else MIN_TEST_SEEDS
    if args.seeds < need:
      problems.append(f"{name}: {need} seeds at least on the test split (--seeds {args.seeds})")
  if problems:
    raise protocol.refusal(problems)


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--tasks", default="all", help="'all' or NAME,NAME (configs/suite.py)")
  parser.add_argument("--arms", nargs="+", default=["tba"], help="tba, tba:K=V,..., trl:lr=..")
  parser.add_argument("--peer", default="", choices=("", "trl"), help="add the peer's arm")
  parser.add_argument("--seeds", type=int, default=1, help="seeds per arm")
  parser.add_argument("--first_seed", type=int, default=0)
  parser.add_argument("--split", default="validation", choices=("validation", "test"))
  parser.add_argument("--minutes", type=float, default=0.0,
                      help="> 0: this budget for every task instead of its own (validation)")
  parser.add_argument("--eval_seconds", type=float, default=60.0)
  parser.add_argument("--eval_samples", type=int, default=8, help="samples per problem")
  parser.add_argument("--tiny", action="store_true", help="tba arms on tiny random models")
  parser.add_argument("--frozen", default="", help="test: the frozen recipe's name")
  parser.add_argument("--configs_tried", type=int, default=-1,
                      help="test: configurations of tba tried on validation to choose it")
  parser.add_argument("--reread_reason", default="", help="test: why read a recipe again")
  parser.add_argument("--unequal_tuning_ok", action="store_true",
                      help="test: accept a peer with fewer configurations tried (recorded)")
  parser.add_argument("--results_dir", default=protocol.RESULTS)
  parser.add_argument("--workdir", default="/tmp/tba_suite")
  parser.add_argument("--pool", nargs="+", default=[], metavar="REPORT",
                      help="no run: pool these suite_*.json (seeds run apart) into one table")
  args = parser.parse_args(argv)
  if args.pool:
    return pool_command(args.pool, args.results_dir)
  statement = protocol.ReadStatement(args.frozen, args.configs_tried, args.reread_reason,
                                     args.unequal_tuning_ok)
  from configs import suite as suite_config
  names = list(suite_config.TASKS) if args.tasks == "all" else args.tasks.split(",")
  unknown = [n for n in names if n not in suite_config.TASKS]
  if unknown:
    parser.error(f"unknown tasks {unknown}; configs/suite.py has {', '.join(suite_config.TASKS)}")
  try:
    arms = [parse_arm(a) for a in args.arms + ([args.peer] if args.peer else [])]
  except ValueError as e:
    parser.error(str(e))
  arms = list({arm_spec(*a): a for a in arms}.items())  # one of each, in order
  if args.tiny and any(family == protocol.PEER for _, (family, _) in arms):
    parser.error("--tiny runs tba arms only (the peer has no tiny model)")
  try:
    if args.split == "test":
      check_test_run(args, names, statement)
  except protocol.ProtocolError as e:
    sys.exit(f"error: {e}")

  # ----- The recipes and the ledgers: every check before the first run ------------------
  tasks = {n: suite_config.TASKS[n] for n in names}
  seeds = list(range(args.first_seed, args.first_seed + args.seeds))
  ledger = protocol.Ledger(args.results_dir)
  schedules = {n: Schedule(round(args.minutes * 60, 6) or t["budget_s"], args.eval_seconds,
                           args.eval_samples, args.split) for n, t in tasks.items()}
  prints = {(n, spec): fingerprint(n, family, arm, schedules[n], args.tiny)
            for n in tasks for spec, (family, arm) in arms}
  reads = []
  if args.split == "test":
    try:
      reads = protocol.plan_test_reads(
          ledger, [protocol.Arm(n, spec, family, prints[n, spec])
                   for n in tasks for spec, (family, _) in arms], statement, seeds)
    except protocol.ProtocolError as e:
      sys.exit(f"error: {e}")
  for entry in reads:  # recorded before the runs: a read that fails was still a read
    ledger.record_test_read(entry)

  # ----- Run: task by task, arm by arm, seed by seed ----------------------------------------
  stamp, path = _new_report(args.results_dir, f"suite_{args.split}")
  report = {"split": args.split, "date": stamp, "command": sys.argv if argv is None else argv,
            "machine": _machine(), "tiny": args.tiny, "tasks": {}}
  for name, task in tasks.items():
    schedule = schedules[name]
    ledger_name = name + (",tiny" if args.tiny else "")  # a tiny model's runs try nothing
    t = report["tasks"][name] = {
        "description": task["description"], "target": task["target"],
        "budget_s": schedule.budget_s, "eval_grid": schedule.grid(), "arms": {}}
    if args.split == "test":
      t["frozen"] = args.frozen
    for spec, (family, arm) in arms:
      a = t["arms"][spec] = {"fingerprint": prints[name, spec], "runs": {}}
      for seed in seeds:
        if args.split == "validation":
          ledger.record_validation(ledger_name, spec, family, prints[name, spec], seed,
                                   schedule.budget_s)
        where = os.path.join(args.workdir, stamp, name, spec.replace(":", "_").replace(",", "_")
                             .replace("=", "-"), f"seed{seed}")
        if family == protocol.OURS:
          curves = trl_grpo.tba_arm(trl_grpo.config_spec(name, args.tiny), arm, seed,
                                    schedule, where)
        else:
          curves = trl_grpo.trl_arm(name, arm, seed, schedule, where, args.results_dir)
        a["runs"][str(seed)] = curves
        a["aggregate"] = aggregate(a["runs"], task["target"])
        t["bars"] = protocol.bars(t)
        _write(path, report)  # after every run: a suite cut short keeps what it measured
    # On test, as the reads recorded them (the stated count where it exceeds the ledger's).
    t["configs_tried"] = (next(r["configs_tried"] for r in reads if r["task"] == name) if reads
                          else {f: ledger.configs_tried(ledger_name, f)
                                for f in (protocol.OURS, protocol.PEER)})
    _write(path, report)
  plot(report, path[:-len(".json")] + ".png")
  print(table(report))
  print(f"results: {path} (curves: .png)")
  return report


def pool_command(paths: list[str], results_dir: str) -> dict:
  """--pool: the reports at `paths` pooled (pool), written as suite_<split>_pooled_<time>.json
  (+ .png) and printed."""
  reports = []
  for p in paths:
    try:
      with open(p) as f:
        reports.append(json.load(f))
    except (OSError, json.JSONDecodeError) as e:
      sys.exit(f"error: --pool {p}: not a readable suite report ({e})")
    if not {"split", "machine", "date", "tasks"} <= reports[-1].keys():
      sys.exit(f"error: --pool {p}: not a suite report (no split, machine, date or tasks)")
  try:
    report = pool(reports)
  except ValueError as e:
    sys.exit(f"error: {e}")
  stamp, path = _new_report(results_dir, f"suite_{report['split']}_pooled")
  report["date"], report["command"] = stamp, ["--pool", *paths]
  _write(path, report)
  plot(report, path[:-len(".json")] + ".png")
  print(table(report))
  print(f"pooled {len(paths)} reports: {path} (curves: .png)")
  return report


def _new_report(results_dir: str, prefix: str) -> tuple[str, str]:
  """(stamp, results_dir/prefix_stamp.json) for a report: the time, with _2, _3, ... after it
  when a report of the same second is there (two pools in one second overwrote the first)."""
  stamp = base = datetime.datetime.now().strftime("%Y%m%d_%H%M%S")
  n = 1
  while os.path.exists(os.path.join(results_dir, f"{prefix}_{stamp}.json")):
    n += 1
    stamp = f"{base}_{n}"
  return stamp, os.path.join(results_dir, f"{prefix}_{stamp}.json")


def _finite(value):
  """`value` with every NaN as None (strict JSON has no NaN)."""
  if isinstance(value, dict):
    return {k: _finite(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [_finite(v) for v in value]
  return None if isinstance(value, float) and value != value else value


def _write(path: str, report: dict) -> None:
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path + ".tmp", "w") as f:
    json.dump(_finite(report), f, indent=1)
  os.replace(path + ".tmp", path)


if __name__ == "__main__":
  main()
