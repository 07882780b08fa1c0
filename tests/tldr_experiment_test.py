"""`python -m experiments.tldr --config configs/tldr.py:tiny` end to end in async mode, the
standalone evaluation of its export, and resume after SIGKILL (slow)."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tba_jax.metrics import read_jsonl
from conftest import TEST_CACHE

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CACHE = f"--compilation_cache={TEST_CACHE}"


def _command(module, workdir, arg="tiny", *extra):
  return [sys.executable, "-m", f"experiments.{module}", f"--config=configs/tldr.py:{arg}",
          f"--workdir={workdir}", CACHE, *extra]


def _env():
  env = dict(os.environ)
  env.pop("XLA_FLAGS", None)  # the run splits the CPU into its 2 devices itself
  env["PYTHONUNBUFFERED"] = "1"
  return env


def _run(command):
  out = subprocess.run(command, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=900)
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
  return out.stdout


@pytest.mark.slow  # ~29 s on 2 cores (2026-12-04): out of the default suite
def test_tiny_runs_async_with_win_rate_before_and_after_an_export_that_evaluates_alike(tmp_path):
  workdir = str(tmp_path / "run")
  stdout = _run(_command("tldr", workdir))
  assert "mode      async (searchers sample in threads" in stdout
  assert "task      tldr: 10 train / 1 validation / 4 test problems" in stdout
  rows = read_jsonl(os.path.join(workdir, "metrics.jsonl"))
  assert [r["step"] for r in rows if "loss" in r] == list(range(1, 7))
  evals = [r for r in rows if "eval/win_rate" in r]
  assert [r["step"] for r in evals] == [0, 3, 6]
  for r in evals:
    assert 0.0 <= r["eval/win_rate"] <= 1.0 and r["eval/perplexity"] > 1.0
    assert r["eval/perplexity_per_token"] > r["eval/perplexity"] and r["eval/kl"] >= 0.0
  assert evals[0]["eval/kl"] == pytest.approx(0.0, abs=1e-6)  # the policy is the reference
  assert max(r["staleness_mean"] for r in rows if "loss" in r) > 0  # async: samples lag
  export = os.path.join(workdir, "export")
  assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(os.listdir(export))
  assert json.load(open(os.path.join(export, "config.json")))["architectures"] == \
      ["GPTNeoXForCausalLM"]
  # The export evaluated on its own, with the run's sampling key for its last step.
  stdout = _run(_command("evaluate_tldr", workdir))
  assert f"Evaluated {export}: " in stdout
  final = json.load(open(os.path.join(workdir, "finished.json")))
  alone = json.loads(open(os.path.join(workdir, "evaluation.jsonl")).read().splitlines()[-1])
  for key in ("eval/win_rate", "eval/gold_reward", "eval/perplexity", "eval/kl"):
    assert alone[key] == pytest.approx(final[key], rel=1e-4, abs=1e-6), key


@pytest.mark.slow  # a second TL;DR run; LoRA's evaluation and export are in lora_test
def test_tiny_with_lora_evaluates_against_the_base_and_exports_its_adapter(tmp_path):
  """LoRA: the step-0 evaluation's reference is the base model under its own config (it
  used to run the base's weights with the adapters' config and stop)."""
  workdir = str(tmp_path / "run")
  _run(_command("tldr", workdir, "tiny,model.lora.rank=4,num_train_steps=3,eval.every=0"))
  rows = read_jsonl(os.path.join(workdir, "metrics.jsonl"))
  evals = [r for r in rows if "eval/kl" in r]
  assert [r["step"] for r in evals] == [0, 3]
  assert evals[0]["eval/kl"] == pytest.approx(0.0, abs=1e-6)  # adapters start at 0
  assert evals[1]["eval/kl"] > 0  # trained adapters moved the policy off the base
  export = os.path.join(workdir, "export")
  assert {"config.json", "model.safetensors", "adapter"} <= set(os.listdir(export))
  assert json.load(open(os.path.join(workdir, "finished.json")))["step"] == 3


def _steps(workdir):
  d = os.path.join(workdir, "checkpoints")
  return sorted(int(s) for s in os.listdir(d) if s.isdigit()) if os.path.isdir(d) else []


# The checkpoint machinery is the GSM8K job's (experiment_test.py, default suite); this repeats
# its kill-and-resume for the TL;DR job, in async mode (a few minutes on 2 shared cores).
@pytest.mark.slow
def test_sigkill_mid_run_then_rerun_resumes_to_the_final_step(tmp_path):
  workdir = str(tmp_path)
  arg = "tiny,num_train_steps=20,checkpoint.every=4,eval.every=0"
  proc = subprocess.Popen(_command("tldr", workdir, arg), cwd=ROOT, env=_env(),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  deadline = time.time() + 600
  while time.time() < deadline and proc.poll() is None and not _steps(workdir):
    time.sleep(0.2)
  proc.send_signal(signal.SIGKILL)
  output = proc.communicate(timeout=60)[0]
  killed_at = _steps(workdir)
  assert killed_at and killed_at[-1] < 20, (killed_at, output[-3000:])
  stdout = _run(_command("tldr", workdir, arg))
  resumed = [line for line in stdout.splitlines() if line.startswith("Resumed from step")]
  assert resumed and int(resumed[0].split()[3]) >= killed_at[-1], stdout[-2000:]
  assert _steps(workdir)[-1] == 20
  rows = read_jsonl(os.path.join(workdir, "metrics.jsonl"))
  assert [r["step"] for r in rows if "loss" in r] == list(range(1, 21))
  assert [r["step"] for r in rows if "eval/win_rate" in r] == [0, 20]
