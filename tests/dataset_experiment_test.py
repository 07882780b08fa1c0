"""configs/dataset.py:tiny from the command line: README's command on the shipped verl-schema
parquet file and TRL-style reward function, functions of both signatures scoring what the
run evaluates, and a bad input that stops before the workdir is written."""
import glob
import json
import os
import re
import shlex
import subprocess
import sys

import pytest

from conftest import ROOT, TEST_CACHE
from tba_jax.metrics import read_jsonl

SHIPPED = os.path.join(ROOT, "configs", "data", "arithmetic_verl.parquet")


def _readme_command() -> list[str]:
  """README's command under "Your dataset and reward", as arguments."""
  with open(os.path.join(ROOT, "README.md")) as f:
    text = f.read()
  block = re.compile(r"```bash\n(.*?)```", re.S).search(
      text, text.index("## Your dataset and reward")).group(1)
  return shlex.split(block.replace("\\\n", " "))


def _run(args: list[str], workdir: str) -> subprocess.CompletedProcess:
  """`python -m experiments.dataset ...` with --workdir set to `workdir`."""
  args = list(args)
  if "--workdir" in args:
    args[args.index("--workdir") + 1] = workdir
  else:
    args += ["--workdir", workdir]
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # one CPU device, a user's
  env.update(PYTHONPATH=ROOT, PYTHONUNBUFFERED="1")
  return subprocess.run([sys.executable, *args[1:], f"--compilation_cache={TEST_CACHE}"],
                        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)


def _samples(workdir: str) -> list[dict]:
  """The completions of the final evaluation (eval_samples/, the newest step)."""
  with open(sorted(glob.glob(os.path.join(workdir, "eval_samples", "*.jsonl")))[-1]) as f:
    return [json.loads(line) for line in f]


def _trained(workdir: str, out) -> list[dict]:
  assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
  assert "Finished at step 2" in out.stdout
  steps = [r for r in read_jsonl(os.path.join(workdir, "metrics.jsonl")) if "loss" in r]
  assert [r["step"] for r in steps] == [1, 2]
  return steps


@pytest.mark.slow  # a tiny run: compiling its programs takes 20-60 s on 2 cores
def test_the_readme_command_trains_the_tiny_model_on_the_shipped_files(tmp_path):
  args = _readme_command()
  assert args[:5] == ["python", "-m", "experiments.dataset", "--config",
                      "configs/dataset.py:tiny"]
  assert "--config.task.path=configs/data/arithmetic_verl.parquet" in args
  assert "--config.task.reward=configs/data/trl_reward.py:reward_func" in args
  workdir = str(tmp_path / "run")
  _trained(workdir, _run(args, workdir))
  from configs.data import trl_reward
  for row in _samples(workdir):  # the function's reward of each evaluated completion
    want = trl_reward.reward_func([row["prompt"]], [[{"role": "assistant",
                                                      "content": row["completion"]}]],
                                  reward_model=[row["reward_model"]])
    assert row["reward"] == want[0]


TRL = """
def reward_func(prompts, completions, reward_model, **kwargs):
  assert all(p[0]["role"] == "user" for p in prompts)
  return [len(c[0]["content"]) / 10 + float(r["ground_truth"])
          for c, r in zip(completions, reward_model)]
"""
VERL = """
def compute_score(data_source, solution_str, ground_truth, extra_info):
  assert data_source == "arithmetic" and extra_info["split"] == "train"
  return {"score": len(solution_str) / 10, "truth": float(ground_truth), "note": "x"}
"""


@pytest.mark.slow  # two tiny runs
@pytest.mark.parametrize("name, source", [("reward_func", TRL), ("compute_score", VERL)],
                         ids=["trl", "verl"])
def test_a_reward_function_of_either_signature_scores_every_completion(tmp_path, name, source):
  """Rewards that depend on the completion and the row (its length, its ground truth):
  each evaluated completion's reward is the function's; verl's extra key is a metric."""
  (tmp_path / "mine.py").write_text(source)
  workdir = str(tmp_path / "run")
  steps = _trained(workdir, _run(
      ["python", "-m", "experiments.dataset", "--config", "configs/dataset.py:tiny",
       f"--config.task.path={SHIPPED}", f"--config.task.reward={tmp_path / 'mine.py'}:{name}"],
      workdir))
  if name == "reward_func":  # every ground truth is at least 6
    assert all(r["reward_mean"] >= 6 for r in steps)
  rows = _samples(workdir)
  for row in rows:
    length = len(row["completion"]) / 10
    truth = float(row["reward_model"]["ground_truth"])
    assert row["reward"] == pytest.approx(length + (truth if name == "reward_func" else 0),
                                          rel=1e-6)
  if name == "compute_score":  # its extra numeric key, per completion and averaged
    assert all(row[f"{row['pass']}_reward_truth"] ==
               float(row["reward_model"]["ground_truth"]) for row in rows)
    final = [r for r in read_jsonl(os.path.join(workdir, "metrics.jsonl"))
             if "eval/greedy_reward_truth" in r][-1]
    greedy = [float(r["reward_model"]["ground_truth"]) for r in rows if r["pass"] == "greedy"]
    assert final["eval/greedy_reward_truth"] == pytest.approx(sum(greedy) / len(greedy))


def test_a_bad_input_on_the_command_line_is_one_error_paragraph_and_no_workdir(tmp_path):
  rows = tmp_path / "rows.jsonl"
  rows.write_text('{"question": "What is 1 + 1?", "answer": "2"}\n' * 5 +
                  '{"question": "What is 1 + 1?"}\n')
  workdir = tmp_path / "run"
  out = _run(["python", "-m", "experiments.dataset", "--config", "configs/dataset.py:tiny",
              f"--config.task.path={rows}"], str(workdir))
  assert out.returncode == 1, out.stdout[-2000:] + out.stderr[-3000:]
  assert "Traceback" not in out.stderr and out.stderr.strip().splitlines()[-1] == (
      f"error: {rows}: row 5 has no 'answer' column, which format 'qa' needs (question / "
      "answer); the row's columns: question")
  assert not workdir.exists()
