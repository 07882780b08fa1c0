"""configs/tools.py:tiny end to end: turns through the whole runtime, and a SIGKILL resume
whose restored buffer holds the environment-token masks it saved."""
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from tba_jax import replay_buffer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(workdir, *overrides):
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  env.update(PYTHONPATH=ROOT, PYTHONUNBUFFERED="1")
  cache = os.path.expanduser(os.environ.get("TBA_JAX_TEST_CACHE", "~/.cache/tba_jax_test_xla"))
  arg = "configs/tools.py:tiny" + "".join("," + o for o in overrides)
  return subprocess.run([sys.executable, "-m", "experiments.tools", "--config", arg,
                         "--workdir", workdir, f"--compilation_cache={cache}"], cwd=ROOT,
                        env=env, capture_output=True, text=True, timeout=900)


# Async with a streaming searcher; alternate mode slow-marked (~15 s; the loop's tests run
# alternate mode, turns_test the multi-turn rows), as is the static async run (SIGKILL test).
@pytest.mark.parametrize("overrides", [
    pytest.param(("sync.mode=alternate",), marks=pytest.mark.slow),
    ("sync.mode=async", "sampler.num_slots=4")])
def test_tiny_tool_run_trains_to_the_end_calling_its_tool(tmp_path, overrides):
  from tba_jax.metrics import read_jsonl
  workdir = str(tmp_path / "run")
  done = _run(workdir, *overrides)
  assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
  assert "Finished at step 6" in done.stdout
  steps = [r for r in read_jsonl(os.path.join(workdir, "metrics.jsonl")) if "loss" in r]
  assert [r["step"] for r in steps] == list(range(1, 7))
  assert all(np.isfinite(r["loss"]) for r in steps)
  # Rows stopped at a call and went on after the reply: more than one turn, tool calls counted.
  assert max(r["tools/turns_per_sample"] for r in steps) > 1
  assert max(r["tools/calls_per_sample"] for r in steps) > 0


@pytest.mark.slow
def test_tiny_tool_run_resumes_after_sigkill_with_masks_intact(tmp_path):
  import orbax.checkpoint as ocp
  workdir = str(tmp_path / "run")
  killed = _run(workdir, "fault.stop_at_step=4")  # SIGKILL after step 4 (checkpoint at 3)
  assert killed.returncode == -signal.SIGKILL, killed.stdout[-2000:] + killed.stderr[-3000:]
  state = ocp.PyTreeCheckpointer().restore(os.path.join(workdir, "checkpoints", "3", "buffer"))
  state = {k: np.asarray(v) for k, v in state.items()}
  names = [n for n in replay_buffer._STATE_ARRAYS if n in state]
  size = dict(zip(names, state["sizes"]))
  saved_mask = state["model_mask"][:int(size["model_mask"])]
  assert (saved_mask == 0).any() and (saved_mask == 1).any()  # replies and model tokens
  buffer = replay_buffer.ReplayBuffer(1000, None, "oldest", seed=0)
  buffer.load_state_dict(state)  # what the resumed run does with it
  restored = [e for e in buffer.entries()]
  assert sum(int((e.model_mask == 0).sum()) for e in restored) == int((saved_mask == 0).sum())
  resumed = _run(workdir)
  assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-3000:]
  assert "Resumed from step 3" in resumed.stdout and "Finished at step 6" in resumed.stdout
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    assert '"tools/turns_per_sample"' in f.read()


def test_every_tools_recipe_passes_the_config_check_and_builds_its_task(monkeypatch):
  from configs import tools as tools_config
  from experiments import tools as tools_experiment
  from tba_jax import config_builders, config_checks
  from tba_jax.tokenizer import byte_tokenizer
  for name, build in tools_experiment.TASKS.items():
    monkeypatch.setitem(config_builders.TASKS, name, build)
  for variant in tools_config.VARIANTS:
    config_checks.validate(tools_config.get_config(variant))
  c = tools_config.get_config("tiny")
  task = config_builders.build_task(c.task, byte_tokenizer())
  assert task.environment is not None and task.environment.max_turns == 2
  assert "<tool>" in task.prompt(task.train[0]) and len(task.test) == 8
  c = tools_config.get_config("cpu")
  task = config_builders.build_task(c.task, byte_tokenizer())
  a, b = (int(x) for x in task.train[0].fields["question"].split("?")[0].split()[-3::2])
  assert 100 <= a < 1000 and 100 <= b < 1000 and task.train[0].target == a * b
  assert task.environment.reply(None, "<tool>123 * 456</tool>").text == "<result>56088</result>"
