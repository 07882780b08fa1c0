"""`python -m experiments.gsm8k` / `redteam` end to end: kill and resume, SIGTERM, config
errors, plots.

The tiny config's plain run is README's smoke command (readme_test.py)."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tba_jax.metrics import read_jsonl

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _command(workdir, arg, experiment="gsm8k"):
  return [sys.executable, "-m", f"experiments.{experiment}",
          f"--config=configs/{experiment}.py:{arg}",
          f"--workdir={workdir}", f"--compilation_cache={os.path.expanduser('~/.cache/tba_jax_test_xla')}"]


def _env():
  env = dict(os.environ)
  env.pop("XLA_FLAGS", None)  # one CPU device: the roles share it and alternate
  env["PYTHONUNBUFFERED"] = "1"
  return env


def _start(workdir, arg, experiment="gsm8k"):
  return subprocess.Popen(_command(workdir, arg, experiment), cwd=ROOT, env=_env(),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _steps(workdir):
  d = os.path.join(workdir, "checkpoints")
  return sorted(int(s) for s in os.listdir(d) if s.isdigit()) if os.path.isdir(d) else []


def _wait_for_checkpoint(proc, workdir, timeout=240):
  deadline = time.time() + timeout
  while time.time() < deadline and proc.poll() is None:
    if _steps(workdir):
      return
    time.sleep(0.2)
  proc.kill()
  raise AssertionError(f"no checkpoint appeared: {proc.stdout.read()[-3000:]}")


def test_sigkill_mid_run_then_rerun_resumes_to_the_final_step(tmp_path):
  workdir = str(tmp_path)
  arg = "tiny,num_train_steps=40,checkpoint.every=2,eval.every=0"
  proc = _start(workdir, arg)
  _wait_for_checkpoint(proc, workdir)
  proc.send_signal(signal.SIGKILL)
  proc.wait(timeout=30)
  killed_at = _steps(workdir)
  assert killed_at and killed_at[-1] < 40, killed_at
  out = subprocess.run(_command(workdir, arg), cwd=ROOT, env=_env(), capture_output=True,
                       text=True, timeout=300)
  assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
  resumed = [line for line in out.stdout.splitlines() if line.startswith("Resumed from step")]
  assert resumed, out.stdout[-2000:]
  step, entries = resumed[0].split()[3], resumed[0].split("(")[1].split()[0]
  assert int(step) >= killed_at[-1] and int(entries) > 0
  assert _steps(workdir)[-1] == 40
  rows = read_jsonl(os.path.join(workdir, "metrics.jsonl"))
  assert [r["step"] for r in rows if "loss" in r] == list(range(1, 41))


def test_redteam_tiny_runs_async_to_the_end_with_evaluations_and_an_export(tmp_path):
  workdir = str(tmp_path)
  out = subprocess.run(_command(workdir, "tiny", "redteam"), cwd=ROOT, env=_env(),
                       capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
  assert "mode      async" in out.stdout  # 2 CPU devices: 1 trainer + 1 searcher
  rows = read_jsonl(os.path.join(workdir, "metrics.jsonl"))
  evals = {r["step"]: r for r in rows if "eval/attack_success_rate" in r}
  assert sorted(evals) == [0, 6]  # before and after training
  for r in evals.values():
    assert 0 <= r["eval/attack_success_rate"] <= 1 and 0 <= r["eval/toxicity"] <= 1
    assert -1 <= r["eval/diversity"] <= 2
  train = [r for r in rows if "loss" in r]
  assert [r["step"] for r in train] == list(range(1, 7))
  # The tempered target's reference weight 1 / (gamma tau) and beta tau at steps 1 and 6
  # (tiny: tau 2 -> 1 and gamma 1 -> 1.2 over 4 steps; beta 0.05).
  assert train[0]["ref_weight"] == pytest.approx(1 / (1.05 * 1.75), rel=1e-5)
  assert train[0]["beta"] == pytest.approx(0.05 * 1.75, rel=1e-5)
  assert train[-1]["ref_weight"] == pytest.approx(1 / 1.2, rel=1e-5)
  # freeze_step 4: the buffer stops growing there.
  sizes = [r["buffer_entries"] for r in train]
  assert sizes[4:] == [sizes[3]] * 2 and sizes[3] <= 64
  assert os.path.exists(os.path.join(workdir, "export", "config.json"))
  assert "Finished at step 6: eval/attack_success_rate" in out.stdout


def test_redteam_sigkill_mid_run_then_rerun_resumes_to_the_final_step(tmp_path):
  workdir = str(tmp_path)
  arg = "tiny,num_train_steps=30"
  proc = _start(workdir, arg, "redteam")
  _wait_for_checkpoint(proc, workdir)
  proc.send_signal(signal.SIGKILL)
  proc.wait(timeout=30)
  killed_at = _steps(workdir)
  assert killed_at and killed_at[-1] < 30, killed_at
  out = subprocess.run(_command(workdir, arg, "redteam"), cwd=ROOT, env=_env(),
                       capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
  assert any(line.startswith("Resumed from step") for line in out.stdout.splitlines())
  rows = read_jsonl(os.path.join(workdir, "metrics.jsonl"))
  assert [r["step"] for r in rows if "loss" in r] == list(range(1, 31))
  assert [r["step"] for r in rows if "eval/diversity" in r] == [0, 30]


def test_sigterm_saves_a_checkpoint_and_exits_cleanly(tmp_path):
  workdir = str(tmp_path)
  proc = _start(workdir, "tiny,num_train_steps=100000,checkpoint.every=1000,eval.every=0")
  deadline = time.time() + 240
  metrics = tmp_path / "metrics.jsonl"
  while time.time() < deadline and proc.poll() is None:
    if metrics.exists() and any("loss" in line for line in metrics.read_text().splitlines()):
      break
    time.sleep(0.2)
  proc.send_signal(signal.SIGTERM)
  output, _ = proc.communicate(timeout=120)
  assert proc.returncode == 0, output[-3000:]
  assert "SIGTERM: saved a checkpoint" in output
  assert _steps(workdir) and _steps(workdir)[-1] < 1000


@pytest.mark.parametrize("args,message", [
    # The override inside the config argument ...
    (["--config=configs/gsm8k.py:tiny,eval.greedy=flase"],
     "eval.greedy='flase': not a boolean (true/false, 1/0, yes/no)"),
    (["--config=configs/gsm8k.py:tiny,eval.gredy=true"],
     "unknown config key 'eval.gredy'; did you mean 'eval.greedy'?"),
    # ... and as a flag.
    (["--config=configs/gsm8k.py:tiny", "--config.eval.greedy=flase"],
     "--config.eval.greedy='flase': not a boolean (true/false, 1/0, yes/no)"),
    (["--config=configs/gsm8k.py:tiny", "--config.eval.gredy=true"],
     "unknown config key 'eval.gredy'; did you mean 'eval.greedy'?"),
    (["--config", "configs/gsm8k.py:tiny", "--config.eval.gredy=true"],  # "--config X" form
     "unknown config key 'eval.gredy'; did you mean 'eval.greedy'?"),
    (["--config=configs/gsm8k.py:tiny", "--config.num_train_steps=1.5"],
     "--config.num_train_steps='1.5': not an int"),
    (["--config=configs/gsm8k.py:tiny", "--config.sync.mode=asynch"],
     "config: sync.mode='asynch': must be one of 'async', 'alternate' (did you mean 'async'?)"),
])
def test_config_errors_are_one_line_and_leave_no_workdir(tmp_path, args, message):
  workdir = tmp_path / "run"
  out = subprocess.run([sys.executable, "-m", "experiments.gsm8k", *args, f"--workdir={workdir}"],
                       cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=120)
  assert out.returncode != 0
  assert out.stderr.strip().splitlines()[-1] == f"error: {message}", out.stderr[-2000:]
  assert len(out.stderr.strip().splitlines()) <= 2, out.stderr[-2000:]  # no traceback
  assert not workdir.exists()


def test_plot_overlays_runs(tmp_path):
  for name, rewards in (("async", [0.1, 0.4]), ("sync", [0.1, 0.2])):
    d = tmp_path / name
    d.mkdir()
    rows = [{"step": 0, "wall_time": 0.0, "eval/greedy_pass@1": 0.1}] + [
        {"step": i + 1, "wall_time": 10.0 * (i + 1), "reward_mean": r} for i, r in enumerate(rewards)]
    (d / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
  out = tmp_path / "fig.png"
  subprocess.run([sys.executable, "-m", "experiments.plot", str(tmp_path / "async"),
                  str(tmp_path / "sync"), "--out", str(out)], cwd=ROOT, check=True, timeout=120)
  assert out.stat().st_size > 10_000
  with pytest.raises(subprocess.CalledProcessError):
    subprocess.run([sys.executable, "-m", "experiments.plot", str(tmp_path / "missing"), "--out",
                    str(out)], cwd=ROOT, check=True, timeout=120, capture_output=True)
