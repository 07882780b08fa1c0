"""`tba` (experiments/cli.py): the experiments found and listed with their variants without
JAX, clear errors for bad names, and (slow) train -> config.yaml -> rerun / eval / export."""
import importlib
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from conftest import ROOT, TEST_CACHE
from experiments import cli

# Every experiment module of the package, with its config file's default variant.
EXPERIMENTS = {"dataset": "tiny", "echo": "tiny", "gsm8k": "cpu", "math": "tba_prime",
               "redteam": "gpt2", "sft": "gpt2", "tldr": "pythia410m", "tools": "tiny"}


def _tba(*args, timeout=60):
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  env.update(PYTHONPATH=ROOT, PYTHONUNBUFFERED="1")
  return subprocess.run([sys.executable, "-m", "experiments.cli", *args], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=timeout)


def test_the_experiments_are_found_in_the_package_with_their_config_files_variants():
  found = cli.experiments()
  assert {name: e.default for name, e in found.items()} == EXPERIMENTS
  for name, e in found.items():
    config = importlib.import_module(f"configs.{name}")
    recipes = getattr(config, "RECIPES", None)
    assert e.variants == (tuple(recipes) if recipes else ("tiny",)), name  # echo: one recipe
    assert e.default in e.variants


def test_help_lists_every_experiment_and_its_variants_without_importing_jax():
  out = _tba("--help")
  assert out.returncode == 0, out.stderr
  assert out.stdout.startswith("`tba`: every experiment's command line as one command")
  for name, e in cli.experiments().items():
    listed = ", ".join(f"{v} (default)" if v == e.default else v for v in e.variants)
    assert f"variants: {listed}\n" in out.stdout, name
    assert re.search(rf"^  {name} +{re.escape(e.summary)}$", out.stdout, re.M), name
  for job in ("evaluate_tldr", "launch", "plot", "saved_config", "cli"):
    assert not re.search(rf"^  {job} ", out.stdout, re.M)
  probe = subprocess.run([sys.executable, "-c", "import sys; from experiments import cli; "
                          "cli.usage(); print('jax' in sys.modules)"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
  assert probe.stdout.strip() == "False", probe.stderr


@pytest.mark.parametrize("args, message", [
    (["trian", "gsm8k"], "unknown command 'trian'; did you mean 'train'?"),
    (["train", "gms8k"], "unknown experiment 'gms8k'; did you mean 'gsm8k'?"),
    (["eval", "nothing"], "unknown experiment 'nothing' (choose from dataset, echo, gsm8k"),
    (["train"], "tba train: name the experiment first"),
    (["export", "--workdir", "/tmp/x"], "tba export: name the experiment first")])
def test_bad_command_and_experiment_names_get_one_clear_error(args, message):
  out = _tba(*args)
  assert out.returncode == 1 and out.stdout == ""
  assert out.stderr.startswith("error: " + message), out.stderr


def test_eval_of_a_workdir_without_config_yaml_says_what_to_give(tmp_path):
  out = _tba("eval", "gsm8k", "--workdir", str(tmp_path))
  assert out.returncode == 1
  assert f"{tmp_path}/config.yaml does not exist: give the run's config with --config" in \
      out.stderr


def test_setup_declares_the_console_script():
  setup = open(os.path.join(ROOT, "setup.py")).read()
  target = re.search(r'"tba = ([\w.]+):(\w+)"', setup)
  assert target and getattr(importlib.import_module(target.group(1)), target.group(2)) is cli.main


def _safetensors(path):
  from safetensors.numpy import load_file
  return load_file(os.path.join(path, "model.safetensors"))


@pytest.mark.slow  # four runs of the tiny GSM8K recipe's programs: a few minutes on 2 cores
def test_a_runs_config_yaml_reruns_it_and_tba_evaluates_and_exports_the_run(tmp_path):
  cache = f"--compilation_cache={TEST_CACHE}"
  first, second = str(tmp_path / "first"), str(tmp_path / "second")
  arg = "configs/gsm8k.py:tiny,num_train_steps=2,checkpoint.every=2,eval.every=0"
  done = _tba("train", "gsm8k", "--config", arg, "--config.sampler.temperature=0.9",
              "--workdir", first, cache, timeout=900)
  assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
  saved = open(os.path.join(first, "config.yaml")).read()
  assert "temperature: 0.9\n" in saved and "num_train_steps: 2\n" in saved
  # The same config from the file, in a new workdir: the same resolved config, written again.
  again = _tba("train", "gsm8k", "--config", os.path.join(first, "config.yaml"),
               "--workdir", second, cache, timeout=900)
  assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-3000:]
  body = lambda text: text.split("\n", 2)[2]  # after the header, which names the path
  assert body(open(os.path.join(second, "config.yaml")).read()) == body(saved)
  finished = json.load(open(os.path.join(first, "finished.json")))
  # In its own workdir the file passes the checkpoint's config check: nothing left to do.
  rerun = _tba("train", "gsm8k", "--config", os.path.join(first, "config.yaml"),
               "--workdir", first, cache, timeout=900)
  assert rerun.returncode == 0 and "this run finished at step 2" in rerun.stdout, rerun.stderr
  # tba eval: the run's export under config.yaml, with the run's key for its last step.
  evaluated = _tba("eval", "gsm8k", "--workdir", first, cache, timeout=900)
  assert evaluated.returncode == 0, evaluated.stderr[-3000:]
  alone = json.loads(open(os.path.join(first, "evaluation.jsonl")).read().splitlines()[-1])
  for key in ("eval/greedy_pass@1", "eval/sampled_pass@1"):
    assert alone[key] == pytest.approx(finished[key], abs=1e-6), key
  # tba export: the newest checkpoint (the last step) is the policy the run exported.
  out = str(tmp_path / "exported")
  exported = _tba("export", "gsm8k", "--workdir", first, "--out", out, cache, timeout=900)
  assert exported.returncode == 0, exported.stderr[-3000:]
  assert "Exported the checkpoint of step 2" in exported.stdout
  theirs, ours = _safetensors(os.path.join(first, "export")), _safetensors(out)
  assert sorted(theirs) == sorted(ours)
  for name in theirs:
    np.testing.assert_array_equal(theirs[name], ours[name])


def test_every_documented_tba_command_names_a_known_command_experiment_and_variant():
  text = open(os.path.join(ROOT, "docs", "configs.md")).read()
  blocks = re.findall(r"```bash\n(.*?)```", text, re.S)
  commands = [line.split("#")[0].split() for b in blocks for line in b.splitlines()
              if line.startswith("tba ")]
  assert len(commands) >= 6
  found = cli.experiments()
  for args in commands:
    if args[1] in ("--help", "plot"):
      continue
    assert args[1] in cli.COMMANDS and args[2] in found, args
    spec = args[args.index("--config") + 1] if "--config" in args else ""
    if spec.startswith("configs/"):
      assert spec.partition(":")[2].split(",")[0] in found[args[2]].variants, args
