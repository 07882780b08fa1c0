"""The suite's tasks (configs/suite.py): each builds, fits its prompt length, differs from
the recipe it names only in the task section, evaluates on the split eval.split names, and
runs end to end at tiny size."""
import dataclasses
import json

import jax
import pytest

from configs import gsm8k as gsm8k_config
from configs import suite
from tba_jax import config_builders, config_checks, loop, sharding
from tba_jax import tokenizer as tokenizer_lib
from tba_jax.errors import ConfigError, UserError
from tba_jax.model import ModelConfig

NAMES = list(suite.TASKS)


def _sections(c) -> dict:
  return {k: v for k, v in c.to_dict().items() if k != "variant"}


@pytest.mark.parametrize("name", NAMES)
def test_each_task_is_the_recipe_with_only_its_task_section_changed(name):
  for variant, base in (("", "cpu"), (",tiny", "tiny")):
    c = suite.get_config(name + variant)
    config_checks.validate(c)
    recipe = _sections(gsm8k_config.get_config(base))
    mine = _sections(c)
    assert c.eval.split == "validation"  # the suite chooses its settings on validation
    recipe["eval"]["split"] = "validation"  # the tiny recipe evaluates on test
    assert {k: v for k, v in mine.items() if k != "task"} == {
        k: v for k, v in recipe.items() if k != "task"}
  assert set(suite.TASKS[name]) >= {"description", "task", "budget_s", "target"}
  assert 600 <= suite.TASKS[name]["budget_s"] <= 1500 and 0 < suite.TASKS[name]["target"] <= 1
  c = suite.get_config(f"{name},tiny,num_train_steps=2")  # overrides after ",tiny"
  assert c.num_train_steps == 2 and c.model.path == "random"


@pytest.mark.parametrize("name", NAMES)
def test_each_task_builds_with_disjoint_splits_and_its_prompts_fit(name):
  c = suite.get_config(f"{name},tiny")
  tok = tokenizer_lib.byte_tokenizer()
  task = config_builders.build_task(c.task, tok)
  splits = (task.train, task.validation, task.test)
  assert all(splits)
  questions = [{p.fields["question"] for p in s} for s in splits]
  assert sum(map(len, questions)) == len(set.union(*questions))  # no problem in two splits
  for split in splits:  # refuses a prompt longer than max_prompt_len
    config_builders.encode_prompts(split, task, tok, c.task.max_prompt_len)
  if name == "long_chat":  # the system turn comes first, the question after it
    prompt = task.prompt(task.validation[0])
    assert prompt.startswith("<|im_start|>system\nYou are a careful math tutor")
    assert task.validation[0].fields["question"] in prompt and task.templated_prompts


@pytest.mark.slow  # reads the real SmolLM2 tokenizer from its GGUF file
def test_each_tasks_prompts_fit_the_real_tokenizer_snugly():
  tok = config_builders.load_tokenizer(suite.get_config(NAMES[0]).model)
  for name in NAMES:
    c = suite.get_config(name)
    task = config_builders.build_task(c.task, tok)
    ids = config_builders.encode_prompts([*task.train, *task.validation, *task.test], task, tok,
                                         c.task.max_prompt_len)
    longest = max(map(len, ids.values()))
    assert c.task.max_prompt_len - 8 <= longest <= c.task.max_prompt_len, (name, longest)


def test_a_system_prompt_needs_the_chat_style():
  c = suite.get_config("add_mul_1d,tiny,task.system_prompt=Be brief.")
  with pytest.raises(ConfigError, match="task.system_prompt is set"):
    config_builders.build_task(c.task, tokenizer_lib.byte_tokenizer())


@pytest.mark.parametrize("split", ["validation", "test"])
def test_eval_split_selects_the_problems_evaluated(split):
  c = suite.get_config(f"word,tiny,eval.split={split},eval.num_problems=5")
  tok = tokenizer_lib.byte_tokenizer()
  task = config_builders.build_task(c.task, tok)
  mesh = sharding.make_mesh("searcher", jax.local_devices()[:1])
  evaluator = config_builders.evaluator(c.eval, c.sampler, task, tok,
                                        ModelConfig(**c.model.random.to_dict()), mesh,
                                        c.task.max_prompt_len, progress=False)
  assert list(evaluator.problems) == list(getattr(task, split))[:5]


def test_a_run_refuses_an_empty_validation_split_it_would_evaluate():
  task = config_builders.build_task(suite.get_config("add_mul_1d,tiny").task,
                                    tokenizer_lib.byte_tokenizer())
  task.check("validation")
  empty = dataclasses.replace(task, validation=())
  empty.check("test")  # not read: not needed
  with pytest.raises(UserError, match="no validation problems.*eval.split=test"):
    empty.check("validation")


@pytest.mark.parametrize("name", [pytest.param(n, marks=() if n == "long_chat" else
                                               pytest.mark.slow) for n in NAMES])
def test_each_tasks_tiny_config_runs_end_to_end(tmp_path, name):
  """Two steps of the tiny recipe on the task, evaluated on validation before and after (the
  longest prompts, long_chat's, in the default suite)."""
  c = suite.get_config(f"{name},tiny,num_train_steps=2,export=false,mesh.num_devices=1,"
                       "eval.num_samples=0,eval.num_problems=2")
  loop.run(c, str(tmp_path))
  with open(tmp_path / "metrics.jsonl") as f:
    rows = [json.loads(line) for line in f]
  assert rows[0]["run"]["task"]["eval_split"] == "validation"
  assert [r["step"] for r in rows if "reward_mean" in r] == [1, 2]
  assert sum("eval/greedy_pass@1" in r for r in rows) == 2  # before and after


@pytest.mark.slow  # 13 s on 2 cores (2026-12-05)
def test_the_base_rate_benchmark_reads_validation_accuracy_per_task():
  from benchmarks import base_rates
  rates = base_rates.main(["--tasks", "add_mul_1d,word", "--tiny", "--num_problems", "2"])
  assert set(rates) == {"add_mul_1d", "word"}
  assert all(0 <= r <= 1 for task in rates.values() for r in task.values())
