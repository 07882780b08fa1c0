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
from conftest import TEST_CACHE

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _command(workdir, arg, experiment="gsm8k"):
  return [sys.executable, "-m", f"experiments.{experiment}",
          f"--config=configs/{experiment}.py:{arg}",
          f"--workdir={workdir}", f"--compilation_cache={TEST_CACHE}"]


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


@pytest.mark.slow  # ~24 s on 2 cores (2026-12-04): out of the default suite
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
  worker = lambda log, faults: subprocess.run(
      [sys.executable, os.path.join(ROOT, "tests", "resume_worker.py"), log, faults,
       *_command(workdir, arg)[3:]], cwd=ROOT, env=_env(), capture_output=True,
      text=True, timeout=400)
  killed = worker(logs[0], "stop_at_step=5")
  assert killed.returncode == -signal.SIGKILL, killed.stdout[-2000:] + killed.stderr[-3000:]
  assert "stop_at_step=5: sending this process SIGKILL" in killed.stdout
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


@pytest.mark.slow  # ~27 s on 2 cores (2026-12-04): out of the default suite
def test_redteam_tiny_runs_async_to_the_end_with_evaluations_and_an_export(tmp_path, tiny_run):
  workdir, out = tiny_run("redteam")  # README's smoke test, shared with readme_test.py
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
  assert "  model     random (gpt2, 41.9K parameters, 2 layers)" in out.stdout
  # Whether it learned: the headline metrics from the step-0 evaluation to the last.
  start, end = evals[0], evals[6]
  headline = ", ".join(f"eval/{k} {start['eval/' + k]:.3f} -> {end['eval/' + k]:.3f}"
                       for k in ("attack_success_rate", "toxicity", "diversity"))
  keys = [f"eval/{k}" for k in ("attack_success_rate", "toxicity", "diversity")]
  *_, finished, report = out.stdout.strip().splitlines()
  from tba_jax import metrics
  scores = lambda r: {k: v for k, v in r.items() if k.startswith("eval/")}
  assert finished == f"Finished at step 6: {metrics.summary(keys, scores(start), scores(end))}"
  assert finished.startswith(f"Finished at step 6: {headline}; "
                             "eval/distinct_successful_attacks ")
  assert finished.endswith(f"eval/pass@16 0.000, eval/pass@32 0.000, eval/sampled_pass@1 "
                           f"{end['eval/sampled_pass@1']:.3f} ± "
                           f"{end['eval/sampled_pass@1_se']:.3f}")
  at_start = ", ".join(f"eval/{k} {start['eval/' + k]:.3f}"
                       for k in ("attack_success_rate", "toxicity", "diversity"))
  assert f"\nstep 0: {at_start}; eval/distinct_successful_attacks " in out.stdout
  # The successful attacks of the last evaluation, for a person to read, with the replies.
  path = os.path.join(workdir, "successful_attacks.txt")
  assert report == f"The successful attacks, with the victim's replies: {path}"
  with open(path) as f:
    text = f.read()
  wins = round(end["eval/attack_success_rate"] * 32)
  assert f"step 6: {wins} of 32 sampled attacks succeeded, " \
      f"{end['eval/distinct_successful_attacks']:.0f} distinct" in text
  # Its plot shows them (experiments/plot.py).
  from experiments import plot
  fig = plot.plot([workdir], str(tmp_path / "rt.png"))
  assert [(ax.get_title(), len(ax.lines[0].get_xdata())) for ax in fig.axes[1::2]] == [
      ("reward_mean", 6), ("eval/attack_success_rate", 2), ("eval/toxicity", 2),
      ("eval/diversity", 2)]


@pytest.mark.slow  # ~40 s; the GSM8K kill-and-resume test above stays in the default suite
def test_redteam_sigkill_mid_run_then_rerun_resumes_to_the_final_step(tmp_path):
  workdir = str(tmp_path)
  arg = "tiny,num_train_steps=12,checkpoint.every=3"
  run = lambda faults: subprocess.run(
      [sys.executable, os.path.join(ROOT, "tests", "fault_worker.py"), faults, "redteam",
       *_command(workdir, arg, "redteam")[3:]], cwd=ROOT, env=_env(), capture_output=True,
      text=True, timeout=600)
  killed = run("stop_at_step=7")  # SIGKILL after step 7's update
  assert killed.returncode == -signal.SIGKILL, killed.stdout[-2000:] + killed.stderr[-3000:]
  assert _steps(workdir) == [3, 6]
  out = run("")
  assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
  assert any(line.startswith("Resumed from step 6 (") for line in out.stdout.splitlines())
  rows = read_jsonl(os.path.join(workdir, "metrics.jsonl"))
  assert [r["step"] for r in rows if "loss" in r] == list(range(1, 13))
  assert [r["step"] for r in rows if "eval/diversity" in r] == [0, 12]


def _signal_after_training_began(workdir, arg, signum):
  """Starts the run, sends `signum` once a step is logged; (exit status, output)."""
  proc = _start(workdir, arg)
  deadline = time.time() + 240
  metrics = os.path.join(workdir, "metrics.jsonl")
  while time.time() < deadline and proc.poll() is None:
    if os.path.exists(metrics) and '"loss"' in open(metrics).read():
      break
    time.sleep(0.2)
  proc.send_signal(signum)
  output, _ = proc.communicate(timeout=120)
  return proc.returncode, output


@pytest.mark.slow  # ~10 s; Ctrl-C's test above takes the same path (tba_jax/interrupts.py)
def test_sigterm_saves_a_checkpoint_and_exits_cleanly(tmp_path):
  workdir = str(tmp_path)
  code, output = _signal_after_training_began(
      workdir, "tiny,num_train_steps=100000,checkpoint.every=1000,eval.every=0", signal.SIGTERM)
  assert code == 0, output[-3000:]
  # On a line of its own, not glued to the progress bar (stdout and stderr share the pipe).
  assert any(line.startswith("SIGTERM: saved a checkpoint") for line in output.split("\n"))
  assert _steps(workdir) and _steps(workdir)[-1] < 1000


@pytest.mark.slow  # ~25 s on 2 cores (2026-12-04): out of the default suite
def test_ctrl_c_saves_a_checkpoint_at_the_step_it_stopped_and_the_rerun_resumes_there(tmp_path):
  workdir = str(tmp_path)
  arg = "tiny,checkpoint.every=1000,eval.every=0,export=false"
  code, output = _signal_after_training_began(workdir, arg + ",num_train_steps=100000",
                                              signal.SIGINT)
  assert code == 0 and "Traceback" not in output, output[-3000:]
  assert "Ctrl-C: stopping after this step, with a checkpoint (Ctrl-C again stops" in output
  saved = next(line for line in output.split("\n") if line.startswith("Ctrl-C: saved"))
  step = int(saved.split("at step ")[1].split()[0])
  assert _steps(workdir) == [step]
  assert [r["step"] for r in read_jsonl(f"{workdir}/metrics.jsonl") if "loss" in r] == \
      list(range(1, step + 1))
  # The rerun (a resumable key raised by 2) continues from that step.
  out = subprocess.run(_command(workdir, f"{arg},num_train_steps={step + 2}"), cwd=ROOT,
                       env=_env(), capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
  assert f"Resumed from step {step} (" in out.stdout
  assert out.stdout.strip().splitlines()[-1].startswith(f"Finished at step {step + 2}: ")
  assert [r["step"] for r in read_jsonl(f"{workdir}/metrics.jsonl") if "loss" in r] == \
      list(range(1, step + 3))


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


def _gsm8k_copy(directory, train=None, test=None):
  """A GSM8K directory from the fixtures; `train` / `test`: that file's text instead."""
  directory.mkdir()
  for split, text in (("train", train), ("test", test)):
    fixture = os.path.join(ROOT, "tests", "data", f"gsm8k_{split}.jsonl")
    (directory / f"{split}.jsonl").write_text(open(fixture).read() if text is None else text)
  return directory


def _refused(tmp_path, args, experiment="gsm8k", cwd=ROOT):
  """Runs a command that must fail; its stderr lines (at most 5, no traceback), and checks
  that it wrote no workdir."""
  workdir = tmp_path / "run"
  out = subprocess.run([sys.executable, "-m", f"experiments.{experiment}", *args,
                        f"--workdir={workdir}"], cwd=cwd, env={**_env(), "PYTHONPATH": ROOT},
                       capture_output=True, text=True, timeout=180)
  lines = out.stderr.strip().splitlines()
  assert out.returncode == 1 and len(lines) <= 5 and "Traceback" not in out.stderr, out.stderr
  assert lines[0].startswith("error: ") and not workdir.exists(), out.stderr
  return " ".join(lines)


GSM8K_TINY = "--config=configs/gsm8k.py:tiny,task.name=gsm8k,task.max_prompt_len=512"


def test_a_corrupt_jsonl_line_is_one_error_naming_the_file_and_the_line(tmp_path):
  lines = open(os.path.join(ROOT, "tests", "data", "gsm8k_train.jsonl")).read().splitlines()
  data = _gsm8k_copy(tmp_path / "data", train="\n".join(lines[:2] + ['{"question": "cut'] +
                                                         lines[2:]) + "\n")
  error = _refused(tmp_path, [f"{GSM8K_TINY},task.data_path={data}"])
  assert error == (f"error: {data}/train.jsonl, line 3: not valid JSON (Invalid control "
                   "character, column 18)")  # the line's end, inside the cut string


@pytest.mark.parametrize("split", ["train", "test"])
def test_an_empty_data_file_is_refused_by_name_before_the_workdir_exists(tmp_path, split):
  data = _gsm8k_copy(tmp_path / "data", **{split: ""})
  error = _refused(tmp_path, [f"{GSM8K_TINY},task.data_path={data}"])
  assert error == f"error: {data}/{split}.jsonl: the file holds no rows (it is empty)"


def test_one_file_as_both_splits_is_refused_unless_asked_for(tmp_path):
  train = os.path.join(ROOT, "tests", "data", "gsm8k_train.jsonl")
  error = _refused(tmp_path, [f"{GSM8K_TINY},task.data_path={train}"])
  assert error.startswith(f"error: task.data_path: {train} would be both the train and the "
                          "test split") and "task.test_on_train=true" in error
  from tba_jax import config_builders, tokenizer
  c = gsm8k_config.get_config(f"tiny,task.name=gsm8k,task.data_path={train},"
                              "task.test_on_train=true")
  task = config_builders.build_task(c.task, tokenizer.byte_tokenizer())
  assert task.test == task.train and len(task.train) == 40  # asked for: evaluated on train


@pytest.mark.parametrize("args,experiment,message", [
    (["--config=configs/gsm8k.py:tiny"], "tldr",
     "error: experiments.tldr runs tldr configs; this one has task.name='arithmetic'. Run it "
     "with: python -m experiments.gsm8k --config=configs/gsm8k.py:tiny --workdir={workdir}"),
    (["--config=configs/tldr.py:tiny"], "redteam",
     "error: experiments.redteam runs redteam configs; this one has task.name='tldr'. Run it "
     "with: python -m experiments.tldr --config=configs/tldr.py:tiny --workdir={workdir}"),
    (["--config=configs/redteam.py:tiny"], "gsm8k",
     "error: experiments.gsm8k runs gsm8k / arithmetic configs; this one has "
     "task.name='redteam'. Run it with: python -m experiments.redteam "
     "--config=configs/redteam.py:tiny --workdir={workdir}"),
    (["--config=configs/gsm9k.py:tiny"], "gsm8k",
     "error: config file 'configs/gsm9k.py' does not exist (the configs are dataset.py, echo.py, gsm8k.py, "
     f"math.py, redteam.py, sft.py, suite.py, tldr.py, tools.py in {ROOT}/configs); did you mean configs/gsm8k.py?"),
    (["--config=configs/gsm8k.py:tiny,task.max_prompt_len=3"], "gsm8k",
     "error: task.max_prompt_len=3: 8 of 8 prompts are longer (the longest, problem 0's, has "
     "15 tokens); raise task.max_prompt_len to at least that"),
], ids=["tldr-gsm8k", "redteam-tldr", "gsm8k-redteam", "config-path", "max_prompt_len"])
def test_run_time_errors_are_one_line_and_leave_no_workdir(tmp_path, args, experiment, message):
  assert _refused(tmp_path, args, experiment) == message.format(workdir=tmp_path / "run")


def test_outside_the_repository_root_the_config_path_error_says_where_to_run(tmp_path):
  error = _refused(tmp_path, ["--config=configs/gsm8k.py:tiny"], cwd=tmp_path)
  assert error == (f"error: config file 'configs/gsm8k.py' not found from {tmp_path}: a config "
                   "path is relative to the current directory. Run from the repository root "
                   f"({ROOT}) or give the full path: --config={ROOT}/configs/gsm8k.py:tiny")


@pytest.mark.parametrize("raised,debug,shown", [
    ("UserError('the data is wrong')", "", "error: the data is wrong"),
    ("UserError('the data is wrong')", "1", "tba_jax.errors.UserError: the data is wrong"),
    ("ZeroDivisionError('a bug')", "", "ZeroDivisionError: a bug"),
])
def test_user_errors_are_one_line_unless_tba_debug_and_bugs_keep_their_traceback(
    tmp_path, raised, debug, shown):
  job = ("import sys; from experiments import launch; from tba_jax.errors import UserError\n"
         f"def job(config, workdir): raise {raised}\n"
         "launch.main('gsm8k.py:tiny', job=job)")
  out = subprocess.run([sys.executable, "-c", job, f"--workdir={tmp_path}"], cwd=ROOT,
                       env={**_env(), "TBA_DEBUG": debug}, capture_output=True, text=True,
                       timeout=120)
  lines = out.stderr.strip().splitlines()
  assert out.returncode == 1 and lines[-1] == shown, out.stderr
  assert ("Traceback" in out.stderr) == (shown != "error: the data is wrong"), out.stderr


def _metrics_file(directory, task, rows):
  """A metrics.jsonl as a run of `task` (a tasks.Task) writes it: its setup row, then rows."""
  import dataclasses
  directory.mkdir()
  setup = {"task": {"name": task.name, "metrics": [
      dataclasses.asdict(m) for m in (task.reward_metric, *task.headline)]}}
  lines = [{"step": 0, "wall_time": 0.0, "run": setup}] + rows
  (directory / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in lines) + "\n")


def test_plot_shows_each_task_s_headline_metrics_for_runs_side_by_side(tmp_path):
  from experiments import plot
  from tba_jax.tasks import Task, redteam, tldr
  train = lambda rewards: [{"step": i + 1, "wall_time": 60.0 * (i + 1), "reward_mean": r}
                           for i, r in enumerate(rewards)]
  for name, task, evals in (
      ("tldr_a", tldr, [{"eval/win_rate": 0.5, "eval/perplexity": 1.2, "eval/kl": 0.0},
                        {"eval/win_rate": 0.8, "eval/perplexity": 1.1, "eval/kl": 0.3}]),
      ("tldr_b", tldr, [{"eval/win_rate": 0.5, "eval/perplexity": 1.2, "eval/kl": 0.0},
                        {"eval/win_rate": 0.6, "eval/perplexity": "nan", "eval/kl": 0.1}]),
      ("rt", redteam, [{"eval/attack_success_rate": 0.1, "eval/toxicity": 0.2,
                        "eval/diversity": 0.5}] * 2)):
    t = Task(train=[], test=[], prompt=str, reward=None, name=name.split("_")[0],
             reward_metric=task.REWARD_METRIC, headline=task.HEADLINE)
    rows = train([0.1, 0.4, 0.2]) + [{"step": 0, "wall_time": 0.0, **evals[0]},
                                     {"step": 3, "wall_time": 200.0, **evals[1]}]
    _metrics_file(tmp_path / name, t, rows)
  out = tmp_path / "fig.png"
  cli = subprocess.run([sys.executable, "-m", "experiments.plot", *(str(tmp_path / n) for n in
                        ("tldr_a", "tldr_b", "rt")), "--out", str(out)], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
  assert cli.returncode == 0, cli.stderr
  assert out.stat().st_size > 10_000
  fig = plot.plot([str(tmp_path / n) for n in ("tldr_a", "tldr_b", "rt")], str(out))
  # One row per metric (the two reward_means differ in label): steps left, wall-clock right.
  assert [ax.get_title() for ax in fig.axes[1::2]] == ["reward_mean", "eval/win_rate", "eval/perplexity", "eval/kl",
                          "reward_mean", "eval/attack_success_rate", "eval/toxicity",
                          "eval/diversity"]
  panels = {ax.get_title(): ax for ax in fig.axes[1::2]}
  left = {ax.get_title(): ax for ax in fig.axes[0::2]}
  win = left["win rate against the reference summaries (gold reward model)"]
  assert win.get_ylabel() == "fraction" and win.get_xlabel() == "trainer step"
  # Both TL;DR runs in one panel, each at its evaluations' steps; the red-teaming run apart.
  assert [(l.get_label(), list(l.get_xdata()), list(l.get_ydata())) for l in win.lines] == \
      [("tldr_a", [0, 3], [0.5, 0.8]), ("tldr_b", [0, 3], [0.5, 0.6])]
  assert [list(l.get_xdata()) for l in panels["eval/perplexity"].lines] == [[0, 200 / 60], [0]]
  assert panels["eval/kl"].get_xlabel() == "wall-clock (min)"
  assert [l.get_label() for l in panels["eval/diversity"].lines] == ["rt"]
  with pytest.raises(subprocess.CalledProcessError) as missing:
    subprocess.run([sys.executable, "-m", "experiments.plot", str(tmp_path / "missing"), "--out",
                    str(out)], cwd=ROOT, check=True, timeout=120, capture_output=True, text=True)
  assert missing.value.stderr == (f"error: {tmp_path}/missing/metrics.jsonl does not exist (is "
                                  f"{tmp_path}/missing a run's workdir?)\n")


def test_plot_draws_the_metrics_asked_for_beside_the_tasks(tmp_path):
  """--metrics: the distance to TB's target (its label and unit) and any other key."""
  from experiments import plot
  from tba_jax.tasks import Task, gsm8k
  t = Task(train=[], test=[], prompt=str, reward=None, name="gsm8k",
           reward_metric=gsm8k.REWARD_METRIC, headline=gsm8k.HEADLINE)
  _metrics_file(tmp_path / "run", t, [
      {"step": 0, "wall_time": 0.0, "eval/sampled_pass@1": 0.2, "eval/policy_kl": 0.0,
       "eval/target_kl": 1.5},
      {"step": 4, "wall_time": 9.0, "eval/sampled_pass@1": 0.6, "eval/policy_kl": 3.0,
       "eval/target_kl": 1.4, "loss": 2.0}])
  fig = plot.plot([str(tmp_path / "run")], str(tmp_path / "fig.png"),
                  extra=plot.extra_metrics(["eval/policy_kl", "eval/target_kl", "loss"]))
  titles = [ax.get_title() for ax in fig.axes[1::2]]
  assert titles[-3:] == ["eval/policy_kl", "eval/target_kl", "loss"]
  policy_kl = fig.axes[2 * titles.index("eval/policy_kl")]
  assert policy_kl.get_ylabel() == "nats" and policy_kl.get_title().startswith("KL(pi || pi_ref)")
  assert [list(l.get_ydata()) for l in policy_kl.lines] == [[0.0, 3.0]]
