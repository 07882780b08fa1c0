"""`python -m experiments.gsm8k` / `redteam` end to end: kill and lossless resume, SIGTERM,
config errors, plots.

The tiny config's plain run is README's smoke command (readme_test.py)."""
import json
import os
import signal
import subprocess
import sys
import time

import orbax.checkpoint as ocp
import pytest

from configs import gsm8k as gsm8k_config
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


def _read_log(path):
  with open(path) as f:
    return [json.loads(line) for line in f]


def test_a_run_killed_after_a_checkpoint_resumes_with_every_entry_and_no_prompt_twice(tmp_path):
  # Async (2 CPU devices): the searcher samples ahead of the trainer; the fault injection
  # SIGKILLs the process after step 5's update, past the checkpoint of step 4, which holds
  # the entries committed since the sync of step 3.
  from resume_worker import digest
  from tba_jax import config_builders
  from tba_jax import tokenizer as tokenizer_lib
  from tba_jax.checkpoint import Checkpointer
  from tba_jax.replay_buffer import ReplayBuffer
  from tba_jax.searcher import PromptStream
  workdir, logs = str(tmp_path / "run"), [str(tmp_path / f"log{i}.jsonl") for i in (1, 2)]
  arg = ("tiny,mesh.num_cpu_devices=2,sync.mode=async,sync.every=3,num_train_steps=8,"
         "checkpoint.every=2,"
         "eval.every=0,export=false,buffer.dedup=false,buffer.max_per_prompt=1000000")
  worker = lambda log, extra: subprocess.run(
      [sys.executable, os.path.join(ROOT, "tests", "resume_worker.py"), log,
       *_command(workdir, arg + extra)[3:]], cwd=ROOT, env=_env(), capture_output=True,
      text=True, timeout=400)
  killed = worker(logs[0], ",fault.stop_at_step=5")
  assert killed.returncode == -signal.SIGKILL, killed.stdout[-2000:] + killed.stderr[-3000:]
  assert "fault.stop_at_step=5: sending this process SIGKILL" in killed.stdout
  assert _steps(workdir) == [2, 4]
  resumed = worker(logs[1], "")
  assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-3000:]
  line = next(x for x in resumed.stdout.splitlines() if x.startswith("Resumed from step"))
  assert line.startswith("Resumed from step 4 ("), line

  # What the killed run's searcher had committed when checkpoint 4 was taken.
  first = _read_log(logs[0])
  snap = max(i for i in range(first.index({"save": 4})) if "snapshot" in first[i])
  before = [r for r in first[:snap] if "commit" in r]
  assert all(r["thread"].startswith("searcher-") for r in before)
  generated = {d for r in before for d in r["commit"]}
  assert len(generated) > 8 * 4  # many batches, more than a checkpoint's worth of merges
  second = _read_log(logs[1])
  handed_back = [r for r in second if "commit" in r and r["thread"] == "MainThread"]
  assert first[snap]["snapshot"] > 0  # the checkpoint held entries not merged yet ...
  assert len(handed_back) == 1 and first[snap]["snapshot"] == len(handed_back[0]["commit"])

  # ... and every entry is in the resumed run's buffer (its last checkpoint; nothing evicted).
  ckpt = Checkpointer(os.path.join(workdir, "checkpoints"))
  restored = ckpt.manager.restore(8, args=ocp.args.Composite(buffer=ocp.args.StandardRestore()))
  buffer = ReplayBuffer(max_per_prompt=10**9, dedup=False)
  buffer.load_state_dict(restored["buffer"])
  ckpt.close()
  final = {digest(e) for e in buffer.entries()}
  assert not generated - final, f"{len(generated - final)} of {len(generated)} entries lost"

  # The prompts of the batches committed before the checkpoint, then those of the resumed
  # run, are the prompt stream's own sequence: none skipped, none sampled twice.
  c = gsm8k_config.get_config(arg)
  train = config_builders.build_task(c.task, tokenizer_lib.byte_tokenizer()).train
  per = c.sampler.num_samples_per_prompt
  after = [r for r in second if "commit" in r and r["thread"].startswith("searcher-")]
  taken = [p for r in before + after for p in r["rows"][::per]]
  stream = PromptStream([p.id for p in train], seed=c.seed)
  assert taken == stream.take(len(taken))
  rows = read_jsonl(os.path.join(workdir, "metrics.jsonl"))
  assert [r["step"] for r in rows if "loss" in r] == list(range(1, 9))


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
  arg = "tiny,num_train_steps=12,checkpoint.every=3"
  run = lambda extra: subprocess.run(_command(workdir, arg + extra, "redteam"), cwd=ROOT,
                                     env=_env(), capture_output=True, text=True, timeout=600)
  killed = run(",fault.stop_at_step=7")  # SIGKILL after step 7's update
  assert killed.returncode == -signal.SIGKILL, killed.stdout[-2000:] + killed.stderr[-3000:]
  assert _steps(workdir) == [3, 6]
  out = run("")
  assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
  assert any(line.startswith("Resumed from step 6 (") for line in out.stdout.splitlines())
  rows = read_jsonl(os.path.join(workdir, "metrics.jsonl"))
  assert [r["step"] for r in rows if "loss" in r] == list(range(1, 13))
  assert [r["step"] for r in rows if "eval/diversity" in r] == [0, 12]


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
