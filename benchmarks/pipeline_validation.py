r"""The pipeline model (benchmarks/pipeline_model.py) against the runs this work measured.

  python -m benchmarks.pipeline_validation            # prints the table, writes the JSON
  python -m benchmarks.pipeline_validation --check    # exit 1 if the JSON is not today's

Each case is a measured run: its layout and config, per-role costs taken from component
benchmarks (each with its source), and what the run measured, read from the lab log
(benchmarks/results/LAB_LOG.md) or recomputed from its curves in benchmarks/results/*.json.
A row says "in-sample" where a cost came from the run it predicts. Roles that share two CPU
cores are processor-shared with shared_throughput 1.0 (each of two busy roles at half its
solo speed): an assumption, not a fit. Every row is written, within 15% or not.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

from benchmarks import pipeline_costs
from benchmarks.pipeline_model import Costs, Layout, RunConfig, simulate

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "benchmarks", "results")
OUT = os.path.join(RESULTS, "pipeline_model_validation.json")
LOG = "benchmarks/results/LAB_LOG.md"
HOST_MEMORY = f"{LOG} 'Host memory, shared prefills and paced searchers' (Xeon, 2026-12-03)"
ASYNC = f"{LOG} 'Asynchronous TBA vs synchronous on-policy training' (2-core CPU, 2026-11-30)"
PACED = f"{LOG} 'Paced searchers with the decaying lr' (EPYC, 2026-12-04)"
H200_AGAIN = f"{LOG} 'One H200 again, 2026-12-04 afternoon'"
PINNED = f"{LOG} 'Each role on its own core against synchronous training' (EPYC, 2026-12-06)"
PINNED_K4 = f"{LOG} 'The pinned arm at k = 4: predicted before it ran' (EPYC, 2026-12-06)"
TOLERANCE = 0.15

# ----- Per-role costs, each with where it came from ------------------------------------------
# The `cpu` recipe of 2026-12-03 on the Xeon: an update of 4 x 8 rows (24 + 32 tokens); a
# searcher batch of 4 prompts x 8 sampled, scored by the reference, and every 4th batch the
# sampler-vs-trainer check (searcher.mismatch_every=4), a forward like the reference's.
XEON_COSTS = Costs(
    search_batch_s=3.97 + 1.96 + 1.96 / 4, update_s=6.23, sync_s=0.169,
    sources=(("update", f"measured: benchmarks.train_step --keep_freed_memory, {HOST_MEMORY}"),
             ("search", f"measured: benchmarks.searcher_batch 3.97 s sampling + 1.96 s "
              f"scoring, {HOST_MEMORY}; predicted: + 1.96 / 4 s for the check"),
             ("sync", "measured: benchmarks.weight_sync, 135M float32, 2-core CPU 2026-11-30")))


def async_speedup_costs(update_s: float, idle: float, rows: int) -> Costs:
  """The 2026-11-30 recipe (4 x 4 rows): the update alone is the synchronous arm's median
  step; its search round (4 prompts x 4) is its trainer's idle share of the time; a batch of
  4 x 8 rows scales it by the sampler's measured tokens/s at 16 and 32 rows."""
  round_16 = idle / (1 - idle) * update_s
  tok_s = {16: 79.7 + (106.1 - 79.7) * 8 / 24, 32: 106.1}  # batch 8 and 32 tok/s, interpolated
  return Costs(
      search_batch_s=round_16 * (rows / tok_s[rows]) / (16 / tok_s[16]), update_s=update_s,
      sync_s=0.169,
      sources=(("update", f"measured (in-sample for the sync arm): its median step, {ASYNC}"),
               ("search", "measured (in-sample for the sync arm): its trainer idle fraction x "
                "its step; 32 rows: x the sampler's tok/s ratio (LAB_LOG.md 'Sampler')"),
               ("sync", "measured: benchmarks.weight_sync, 135M float32")))


def epyc_costs(cores: str, update_s: float, sample_s: float, reference_s: float,
               sync_s: float, sync_source: str) -> Costs:
  """The `cpu` recipe's costs measured on the EPYC of 2026-12-06, alone, on `cores`
  (taskset): the update (benchmarks.train_step), the searcher batch's sampling and scoring
  (benchmarks.searcher_batch)."""
  return Costs(
      search_batch_s=sample_s + reference_s + reference_s / 4, update_s=update_s, sync_s=sync_s,
      sources=(("update", f"measured: benchmarks.train_step --keep_freed_memory on {cores}, "
                f"{PINNED}"),
               ("search", f"measured: benchmarks.searcher_batch on {cores}, {sample_s} s sampling "
                f"+ {reference_s} s scoring, {PINNED}; predicted: + {reference_s} / 4 s for the "
                "check"),
               ("sync", sync_source)))


def h200_costs() -> Costs:
  """gpu.sh's short run: 140 rows of 32 + 256 tokens, 7 x 24 rows searched a batch."""
  role = pipeline_costs.role_model("rho-1b", "H200")
  return Costs(search_batch_s=role.search_batch_s(72, 3, 32, 256),
               update_s=role.update_s(140, 288, 1, 7), sync_s=role.publish_s,
               sources=role.sources)


# ----- What the runs measured ---------------------------------------------------------------
def pinned_seconds_per_update(arm: str, name: str = "async_pinned_10min_epyc.json") -> float:
  """Training-clock seconds per update of a benchmarks.async_pinned arm (benchmarks/results/
  NAME), from its second evaluation to its last (compilation, pre-fill and the first updates
  left out)."""
  with open(os.path.join(RESULTS, name)) as f:
    evals = json.load(f)[arm]["evals"]
  return (evals[-1]["seconds"] - evals[1]["seconds"]) / (evals[-1]["updates"] - evals[1]["updates"])


def curve_seconds_per_update(name: str) -> float:
  """Training-clock seconds per update over the last three quarters of a run's curve
  (benchmarks/results/NAME: trl_grpo's [seconds, updates, ...] rows, evaluations off)."""
  with open(os.path.join(RESULTS, name)) as f:
    train = json.load(f)["tba_jax"]["train"]
  (t0, u0, *_), (t1, u1, *_) = train[len(train) // 4], train[-1]
  return (t1 - t0) / (u1 - u0)


@dataclasses.dataclass(frozen=True)
class Case:
  name: str
  layout: Layout
  config: RunConfig
  costs: Costs
  metric: str                     # "update_seconds" (the median step) or "seconds_per_update"
  measured: float | str           # seconds, or the results file whose curve gives them
  staleness: float | None         # measured mean staleness, where recorded
  source: str
  in_sample: str = ""
  num_updates: int = 60


def _cpu_recipe(paced: bool, prompts: int = 96, sync_every: int = 2) -> RunConfig:
  return RunConfig(4, 8, 8, 4, sync_every, 0.95, 32, paced=paced, num_train_prompts=prompts)


SHARED = Layout(num_searchers=1, shared=True)
ALTERNATE = Layout(num_searchers=1, mode="alternate", shared=True)
ASYNC_ARM = RunConfig(4, 4, 8, 4, 2, 0.95, 32, num_train_prompts=96)
SYNC_ARM = RunConfig(4, 4, 4, 4, 1, 1.0, 16, max_per_prompt=4, num_train_prompts=96)


def cases() -> list[Case]:
  run1, run2 = async_speedup_costs(7.8, 0.401, 32), async_speedup_costs(6.9, 0.395, 32)
  sync1, sync2 = async_speedup_costs(7.8, 0.401, 16), async_speedup_costs(6.9, 0.395, 16)
  return [
      Case("xeon cpu recipe, async unpaced", SHARED, _cpu_recipe(False), XEON_COSTS,
           "update_seconds", 12.2, 3.1, f"median step, {HOST_MEMORY}"),
      Case("xeon cpu recipe, async paced", SHARED, _cpu_recipe(True), XEON_COSTS,
           "update_seconds", 8.7, 2.6, f"median step, {HOST_MEMORY}"),
      Case("xeon cpu recipe, alternate", ALTERNATE, _cpu_recipe(False), XEON_COSTS,
           "seconds_per_update", 420 / 26, None,
           f"420 s of training clock / 26 updates (compilation and pre-fill in it), {HOST_MEMORY}"),
      Case("async_speedup run 1, sync arm (alternate, k=1, m=1, S=K)", ALTERNATE, SYNC_ARM, sync1,
           "update_seconds", 7.8, 0.0, f"median step, {ASYNC}",
           in_sample="the update's and the round's seconds are this run's"),
      Case("async_speedup run 1, async arm", SHARED, ASYNC_ARM, run1, "update_seconds", 13.0,
           4.78, f"median step, {ASYNC}"),
      Case("async_speedup run 2, sync arm", ALTERNATE, SYNC_ARM, sync2, "update_seconds", 6.9,
           0.0, f"median step, {ASYNC} (second invocation)",
           in_sample="the update's and the round's seconds are this run's"),
      Case("async_speedup run 2, async arm", SHARED, ASYNC_ARM, run2, "update_seconds", 13.1,
           5.33, f"median step, {ASYNC} (second invocation)"),
      Case("epyc cpu recipe, paced, 25 min, seed 0", SHARED, _cpu_recipe(True), XEON_COSTS,
           "seconds_per_update", "tba_paced_25min_epyc.json", 4.5,
           f"training clock per update, its curve; staleness: the mean of its thirds, {PACED}; "
           "the costs are the Xeon's (none measured on this EPYC)"),
      Case("epyc cpu recipe, paced, 25 min, seed 1", SHARED, _cpu_recipe(True), XEON_COSTS,
           "seconds_per_update", "tba_recipe_seed1_25min_epyc.json", None,
           f"training clock per update, its curve, {PACED}; the Xeon's costs"),
      Case("epyc cpu recipe, unpaced (no clip, cosine), 25 min", SHARED, _cpu_recipe(False),
           XEON_COSTS, "seconds_per_update", "tba_cosine_25min_epyc.json", None,
           f"training clock per update, its curve, {PACED}; the Xeon's costs"),
      Case("epyc cpu recipe, trainer and free-running searcher on a core each (two processes)",
           Layout(num_searchers=1), _cpu_recipe(False, prompts=64),
           epyc_costs("one core each", 12.65, 6.19, 4.16, 3.63,
                      "measured (in-sample): the run's mean weight broadcast + merge"),
           "seconds_per_update", pinned_seconds_per_update("pinned"), 3.52,
           f"training clock per update from its second evaluation to its last, {PINNED}",
           in_sample="the sync's seconds are this run's"),
      Case("the same at k=4 (predicted before it ran)", Layout(num_searchers=1),
           _cpu_recipe(False, prompts=64, sync_every=4),
           epyc_costs("one core each", 12.65, 6.19, 4.16, 3.63,
                      "measured: the k=2 run's mean weight broadcast + merge"),
           "seconds_per_update", pinned_seconds_per_update("pinned", "async_pinned_k4_10min_epyc.json"),
           6.58,
           f"training clock per update from its second evaluation to its last, {PINNED_K4}"),
      Case("epyc cpu recipe, synchronous on both cores (alternate, k=1, m=1, S=K)", ALTERNATE,
           RunConfig(4, 8, 8, 4, 1, 1.0, 32, max_per_prompt=8, num_train_prompts=64),
           epyc_costs("both cores", 9.24, 3.74, 2.48, 0.169,
                      "measured: benchmarks.weight_sync, 135M float32, 2-core CPU 2026-11-30"),
           "seconds_per_update", pinned_seconds_per_update("sync"), 0.0,
           f"training clock per update from its second evaluation to its last, {PINNED}"),
      Case("h200 gpu.sh short run (rho1b shape, one device, alternate)",
           Layout(num_searchers=1, mode="alternate", shared=True),
           RunConfig(7, 20, 24, 3, 2, 0.95, 140, num_train_prompts=1000), h200_costs(),
           "update_seconds", 0.95, None, f"median step of its 20 updates, {H200_AGAIN}",
           num_updates=20),
  ]


def row(case: Case) -> dict:
  """One validation row: the case's inputs, the prediction and the measurement."""
  r = simulate(case.layout, case.config, case.costs, case.num_updates)
  measured = (curve_seconds_per_update(case.measured) if isinstance(case.measured, str)
              else case.measured)
  predicted = getattr(r, case.metric)
  error = predicted / measured - 1
  return {
      "case": case.name,
      "config": {"layout": dataclasses.asdict(case.layout),
                 "run": dataclasses.asdict(case.config),
                 "costs_s": {"search_batch": _round(case.costs.search_batch_s),
                             "update": _round(case.costs.update_s),
                             "sync": _round(case.costs.sync_s)},
                 "cost_sources": dict(case.costs.sources),
                 "simulated_updates": case.num_updates},
      "metric": case.metric,
      "measured_seconds": _round(measured), "predicted_seconds": _round(predicted),
      "error": _round(error), "within_15_percent": abs(error) <= TOLERANCE,
      "measured_staleness_mean": case.staleness,
      "predicted_staleness_mean": _round(r.staleness_mean),
      "predicted_trainer_idle": _round(r.trainer_idle),
      "predicted_searcher_idle": _round(r.searcher_idle),
      "source": case.source, "in_sample": case.in_sample or "no"}


def rows() -> list[dict]:
  return [row(c) for c in cases()]


def _round(x: float) -> float:
  return float(f"{x:.4g}")


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--check", action="store_true",
                      help="compare with the committed JSON instead of writing it")
  args = parser.parse_args(argv)
  table = rows()
  print("| case | metric | measured s | predicted s | error | staleness measured / predicted |"
        " in-sample |\n|---|---|---|---|---|---|---|")
  for t in table:
    stale = t["measured_staleness_mean"]
    print(f"| {t['case']} | {t['metric']} | {t['measured_seconds']:.3g} | "
          f"{t['predicted_seconds']:.3g} | {t['error']:+.0%} | "
          f"{'--' if stale is None else f'{stale:.2f}'} / {t['predicted_staleness_mean']:.2f} | "
          f"{t['in_sample']} |")
  within = sum(t["within_15_percent"] for t in table)
  print(f"\n{within} of {len(table)} rows within 15%")
  if args.check:
    with open(OUT) as f:
      sys.exit(0 if json.load(f) == table else f"{OUT} is not what the model computes today")
  with open(OUT, "w") as f:
    json.dump(table, f, indent=1)
    f.write("\n")


if __name__ == "__main__":
  main()
