"""A run's evaluations as the loop takes them: the evaluator's scores at a step, against
TB's target of the update that made the params, written with their time; each
evaluation's completions saved (eval.save_samples: WORKDIR/SAMPLES_DIR); the headline
metrics said against the starting policy's, and a warning when the first (higher is
better) falls well below its peak.

What an evaluation computes is evaluation.py's `Evaluator`; this module is the run's use
of it (the searchers' reference, the metrics writer, the progress output).
"""
from __future__ import annotations

import json
import os
import time

import jax
import tqdm

from tba_jax import config_builders as build
from tba_jax import metrics, sharding
from tba_jax.metrics import MetricsWriter, PeakWatch
from tba_jax.searcher_pool import SearcherPool
from tba_jax.target_distance import StepTarget

# eval.save_samples: every evaluation's completions, WORKDIR/eval_samples/step_NNNNNN.jsonl.
SAMPLES_DIR = "eval_samples"


class RunEvaluation:
  """evaluate(params, step): the evaluator's scores, written with their time; the headline
  metrics against the starting policy's on the progress output, and a warning when the
  first (higher is better) falls well below its peak."""

  def __init__(self, c, workdir, task, evaluator, pool: SearcherPool, publish, eval_index,
               eval_mesh, writer: MetricsWriter, is_main: bool):
    self.c, self.workdir, self.task, self.evaluator, self.pool = c, workdir, task, evaluator, pool
    self.publish, self.eval_index, self.eval_mesh = publish, eval_index, eval_mesh
    self.writer, self.is_main = writer, is_main
    self.headline = [m.key for m in task.headline]
    self.peak_watch = PeakWatch(f"held-out {self.headline[0]}") if self.headline else None
    # Step 0's scores, maybe logged by an earlier segment of this run.
    self.first = metrics.evaluation(writer.path, 0) if is_main else {}

  def __call__(self, params, step: int, wall_time: float | None = None, final: bool = False,
               should_stop=None) -> dict | None:
    """The scores (written, and said on the progress output), or None when `should_stop`
    (Evaluator) ended the evaluation: nothing is written then."""
    start = time.perf_counter()
    reference = reference_config = None
    # A task's metrics and the distance to TB's target read the searchers' reference.
    if self.task.evaluation is not None or self.evaluator.target is not None:
      reference_config, reference = self.pool.reference()  # with LoRA the base's config
      if self.eval_index != 0:
        reference = jax.device_put(reference, sharding.param_shardings(
            reference_config, "searcher", self.eval_mesh))
    key_at = lambda s: jax.random.fold_in(jax.random.key(self.c.seed + 1), s)
    # TB's target of the update that made these params (step 0: of the first update). The
    # reference is the policy of step 0 or of the latest reset (loss.ref_reset_every), made
    # before this step's evaluation: at that step the params are the reference.
    lo, u = self.c.loss, max(step, 1)
    ref_weight = build.ref_weight_schedule(lo)
    ref_step = step - step % lo.ref_reset_every if lo.ref_reset_every else 0
    at = StepTarget(float(build.beta_schedule(lo)(u)),
                    float(ref_weight(u)) if ref_weight else 1.0, ref_step, key_at(ref_step),
                    at_reference=step == ref_step)
    scores = self.evaluator(self.publish(params, self.eval_index), key_at(step),
                            reference=reference, reference_config=reference_config,
                            should_stop=should_stop, step_target=at)
    if scores is None:
      if self.is_main:
        tqdm.tqdm.write(f"step {step}: evaluation abandoned after "
                        f"{time.perf_counter() - start:.1f} s (stop request)")
      return None
    self.writer.write(step, {**scores, "eval_seconds": time.perf_counter() - start},
                      wall_time=wall_time)
    if self.is_main and self.c.eval.save_samples:
      write_samples(os.path.join(self.workdir, SAMPLES_DIR, f"step_{step:06d}.jsonl"),
                    self.evaluator.samples)
    if self.peak_watch is not None and self.headline[0] in scores:
      warning = self.peak_watch(step, scores[self.headline[0]],
                                scores.get(self.headline[0] + "_se", 0.0))
      if warning and self.is_main:
        tqdm.tqdm.write(warning)
    if final or not self.is_main:
      return scores  # the run says "Finished at step N: summary" after its export
    if step == 0:
      self.first = scores
      print(f"step 0: {metrics.summary(self.headline, {}, scores)}", flush=True)
    else:  # whether the run learns: the headline metrics since step 0
      tqdm.tqdm.write(f"step {step}: {self.summary(scores)}")
    return scores

  def summary(self, scores: dict) -> str:
    return metrics.summary(self.headline, self.first, scores)


def write_samples(path: str, rows: list[dict]) -> None:
  """`rows` as JSON lines at `path`, whole or absent (written aside, then moved)."""
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path + ".tmp", "w") as f:
    for row in rows:
      f.write(json.dumps(row) + "\n")
  os.replace(path + ".tmp", path)
