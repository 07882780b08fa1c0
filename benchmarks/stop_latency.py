r"""How long a stop request takes: SIGTERM a few seconds into an evaluation, time the exit.

  python -m benchmarks.stop_latency --config "cpu,eval.num_samples=8,eval.every=2" \
      --workdir /tmp/tba_stop            # the `cpu` recipe, 32 problems x 8 samples (256)
  python -m benchmarks.stop_latency --config tiny --eval_step 3 --workdir /tmp/tba_stop_tiny

Runs `python -m experiments.gsm8k --config configs/gsm8k.py:CONFIG` in a fresh --workdir,
sends it SIGTERM --delay seconds after the evaluation at --eval_step began (the step's
metrics row is written just before it; step 0: the run's setup row, before the starting
policy's evaluation), and reports the seconds from the signal to the saved checkpoint
("SIGTERM: saved a checkpoint at step N") and to the process's exit, the step saved, and
whether the evaluation was abandoned. It then reruns the same command, waits for
"Resumed from step N", and kills the rerun. Exit status 1 when the run did not exit 0
within --limit seconds of the signal, saved no checkpoint, saved another step than the
evaluation's, or the rerun did not resume from it. The runs' output: WORKDIR.log,
WORKDIR.rerun.log.

Measured (docs/resume.md, "How long a stop takes"): `--config
tiny,eval.num_samples=2048,eval.batch_size=8 --eval_step 3 --delay 0.5` on a 2-core EPYC
shared with other jobs (2026-12-05): checkpoint 0.2 s and exit 1.3 s after the signal, the
rerun resumed from step 3. The `cpu` recipe (the first command above; 2-core Xeon with
AVX-512, quiet, 2026-12-05): checkpoint 7.5 s and exit 9.0 s after the signal, resumed.
"""
import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAVED = re.compile(r"SIGTERM: saved a checkpoint at step (\d+) in")
ABANDONED = re.compile(r"step (\d+): evaluation abandoned after ([\d.]+) s")
RESUMED = re.compile(r"Resumed from step (\d+) \(")


class Run:
  """A run of the experiment whose output lines are kept with their arrival times."""

  def __init__(self, config: str, workdir: str, log: str):
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    self.log = open(log, "w")
    self.lines: list[tuple[float, str]] = []
    self.proc = subprocess.Popen(
        [sys.executable, "-m", "experiments.gsm8k", f"--config=configs/gsm8k.py:{config}",
         f"--workdir={workdir}"], cwd=ROOT, env=env, text=True, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT)
    self.reader = threading.Thread(target=self._read, daemon=True)
    self.reader.start()

  def _read(self):
    for line in self.proc.stdout:  # text mode: tqdm's "\r" ends a line too
      self.lines.append((time.perf_counter(), line.rstrip("\n")))
      self.log.write(line)
      self.log.flush()

  def first(self, pattern: re.Pattern) -> tuple[float, re.Match] | None:
    return next(((t, m) for t, line in list(self.lines) if (m := pattern.search(line))), None)

  def wait_for(self, pattern: re.Pattern, timeout: float) -> tuple[float, re.Match] | None:
    end = time.perf_counter() + timeout
    while time.perf_counter() < end and self.proc.poll() is None:
      if (found := self.first(pattern)) is not None:
        return found
      time.sleep(0.05)
    self.reader.join(timeout=5)
    return self.first(pattern)

  def tail(self, n: int = 30) -> str:
    return "\n".join(line for _, line in self.lines[-n:])


def evaluation_started(metrics_path: str, step: int) -> bool:
  """Whether the evaluation at `step` began: the run's metrics row of that step (step 0: its
  setup row) is written just before it."""
  if not os.path.exists(metrics_path):
    return False
  with open(metrics_path) as f:
    for line in f:
      try:
        row = json.loads(line)
      except json.JSONDecodeError:  # a line being written
        continue
      if row.get("step") == step and ("run" in row if step == 0 else "loss" in row):
        return True
  return False


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--config", default="cpu,eval.num_samples=8,eval.every=2",
                      help="configs/gsm8k.py's argument: VARIANT[,key=value,...]")
  parser.add_argument("--workdir", required=True, help="removed first if it exists")
  parser.add_argument("--eval_step", type=int, default=2,
                      help="the step whose evaluation is signalled (0: the starting policy's)")
  parser.add_argument("--delay", type=float, default=3.0,
                      help="seconds into the evaluation at which SIGTERM is sent")
  parser.add_argument("--limit", type=float, default=20.0,
                      help="seconds from the signal within which the run must have exited")
  parser.add_argument("--timeout", type=float, default=1800.0,
                      help="seconds to wait for the evaluation, and for the rerun's resume")
  args = parser.parse_args()

  shutil.rmtree(args.workdir, ignore_errors=True)
  run = Run(args.config, args.workdir, args.workdir.rstrip("/") + ".log")
  metrics_path = os.path.join(args.workdir, "metrics.jsonl")
  end = time.perf_counter() + args.timeout
  while not evaluation_started(metrics_path, args.eval_step):
    if run.proc.poll() is not None or time.perf_counter() > end:
      run.proc.kill()
      sys.exit(f"the run ended or timed out before step {args.eval_step}'s evaluation:\n"
               f"{run.tail()}")
    time.sleep(0.05)
  time.sleep(args.delay)
  sent = time.perf_counter()
  run.proc.send_signal(signal.SIGTERM)
  try:
    code = run.proc.wait(timeout=max(args.limit * 10, 300))
  except subprocess.TimeoutExpired:
    run.proc.kill()
    code = run.proc.wait()
  exited = time.perf_counter() - sent
  run.reader.join(timeout=10)
  saved, abandoned = run.first(SAVED), run.first(ABANDONED)
  step = int(saved[1].group(1)) if saved else None
  print(f"config {args.config}: SIGTERM {args.delay:g} s into step {args.eval_step}'s "
        f"evaluation")
  print(f"  exit {code} after {exited:.1f} s; checkpoint "
        + (f"of step {step} saved after {saved[0] - sent:.1f} s" if saved else "NOT saved"))
  print("  evaluation " + (f"abandoned at step {abandoned[1].group(1)}, "
                           f"{abandoned[1].group(2)} s after it began" if abandoned
                           else "NOT abandoned (it finished, or the signal came outside it)"))
  failures = []
  if code != 0 or exited > args.limit:
    failures.append(f"exit {code} after {exited:.1f} s (limit {args.limit:g} s)")
  if step != args.eval_step:
    failures.append(f"saved step {step}, not the evaluation's step {args.eval_step}")
  if not abandoned:
    failures.append("the evaluation was not abandoned")

  rerun = Run(args.config, args.workdir, args.workdir.rstrip("/") + ".rerun.log")
  t0 = time.perf_counter()
  resumed = rerun.wait_for(RESUMED, args.timeout)
  rerun.proc.kill()
  rerun.proc.wait()
  if resumed:
    print(f"  rerun: resumed from step {resumed[1].group(1)} after {resumed[0] - t0:.1f} s "
          "(then killed)")
  else:
    print(f"  rerun: did NOT resume:\n{rerun.tail()}")
  if not resumed or int(resumed[1].group(1)) != step:
    failures.append(f"the rerun did not resume from step {step}")
  if failures:
    print(f"FAILED: {'; '.join(failures)}\nthe run's output ends:\n{run.tail()}")
    sys.exit(1)
  print("OK")


if __name__ == "__main__":
  main()
