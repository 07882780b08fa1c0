"""The MATH task: loading (local files, hub layouts, errors), boxed answers, the task built
from configs/math.py scored by math_verify, and the tiny recipe end to end (slow)."""
import json
import os

import jax
import numpy as np
import pytest

from configs import math as math_config
from tba_jax import config_builders, config_checks
from tba_jax.errors import DataError
from tba_jax import tokenizer as tokenizer_lib
from tba_jax.tasks import math as math_task
from tba_jax.tasks import split_file


@pytest.mark.parametrize("text,want", [
    ("so $x = \\boxed{6}$.", "6"),
    ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
    ("first \\boxed{1} then \\boxed{\\left( 2, \\frac{\\pi}{2} \\right)}",
     "\\left( 2, \\frac{\\pi}{2} \\right)"),
    ("\\fbox{7}", "7"),
    ("the answer is \\boxed 5$.", "5"),
    ("\\boxed{unclosed {", None),
    ("no box, 42", None),
    ("\\boxed", None),
])
def test_extract_boxed_takes_the_last_balanced_box(text, want):
  assert math_task.extract_boxed(text) == want


def test_answer_of_reads_after_the_thinking():
  assert math_task.answer_of("<think>\\boxed{3}?</think> so \\boxed{4}") == "4"
  assert math_task.answer_of("<think>\\boxed{3}?</think> no box") is None


def test_load_fixtures_gold_from_answer_or_the_solutions_box():
  train = math_task.load("train", math_config.TINY_DATA)
  test = math_task.load("test", math_config.TINY_DATA)
  assert (len(train), len(test)) == (8, 6)
  assert train[0].fields["question"] == "What is the value of $3^2 + 4^2$?" and train[0].target == "25"
  assert train[1].target == "\\frac{1}{2}"  # no `answer` field: the solution's box
  assert train[6].target == "\\left( 2, \\frac{\\pi}{2} \\right)"
  assert [p.id for p in test] == list(range(6)) and test[3].target == "\\text{(C)}"
  assert math_task.load("test", math_config.TINY_DATA, limit=2) == test[:2]


def test_split_files_in_a_hub_snapshot_layout_and_bad_paths(tmp_path):
  os.makedirs(tmp_path / "data")
  rows = [{"problem": "p", "solution": "s \\boxed{1}"}]
  for name in ("train-00000-of-00001.jsonl", "test-00000-of-00001.jsonl"):
    (tmp_path / "data" / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
  assert split_file(str(tmp_path), "test", "MATH").endswith("data/test-00000-of-00001.jsonl")
  assert math_task.load("train", str(tmp_path))[0].target == "1"
  (tmp_path / "test-extra.jsonl").write_text("")
  with pytest.raises(DataError, match="several candidates"):
    split_file(str(tmp_path), "test", "MATH")
  with pytest.raises(DataError, match="MATH path '/no/such' does not exist"):
    math_task.load("test", "/no/such")
  (tmp_path / "bad.jsonl").write_text(json.dumps({"problem": "p", "solution": "no box"}) + "\n")
  with pytest.raises(DataError, match="row 0 has no 'answer' and no \\\\boxed"):
    math_task.load("train", str(tmp_path / "bad.jsonl"))


def test_the_hub_offline_names_the_dataset_and_the_local_alternative():
  with pytest.raises(DataError, match="could not fetch MATH \\(nlile/hendrycks-MATH-benchmark\\)"):
    math_task.load("test")


def test_every_recipe_validates_and_tba_prime_is_its_table():
  for variant in math_config.VARIANTS:
    config_checks.validate(math_config.get_config(variant))
  c = math_config.get_config("tba_prime")
  assert (c.loss.name, c.loss.log_z, c.loss.beta_start, c.loss.beta_end) == (
      "tb", "behaviour", 0.001, 0.001)
  assert (c.optim.learning_rate, c.optim.b2, c.optim.weight_decay, c.sync.every) == (
      3e-6, 0.99, 0.01, 3)
  assert c.buffer.num_prompts * c.buffer.samples_per_prompt == 256
  assert c.task.max_prompt_len + c.sampler.max_new_tokens == 1024
  assert math_config.get_config("tba_prime_ratio").loss.name == "ratio"
  assert math_config.get_config("tba_prime_qwen3").task.thinking == "off"


def test_the_built_task_scores_gold_solutions_one_and_others_zero():
  """configs/math.py:tiny's task, through the Evaluator with a generator that answers
  each test problem with its reference solution (or with problem 0's)."""
  from tba_jax.evaluation import Evaluator
  from tba_jax.sampler import Rollouts
  from tba_jax.tasks import as_stage
  c = math_config.get_config("tiny")
  tok = tokenizer_lib.byte_tokenizer()
  task = config_builders.build_task(c.task, tok)
  problems = task.test
  prompts = list(config_builders.encode_prompts(problems, task, tok, c.task.max_prompt_len).values())
  by_prompt = {tuple(p): i for i, p in enumerate(prompts)}

  def generate(solution_of):
    def fn(params, batch, key):
      texts = [solution_of(by_prompt[tuple(p)]) for p in batch]
      ids = [tok.encode(t) + [tok.eos_ids[0]] for t in texts]
      width = max(map(len, ids))
      tokens = np.array([i + [tok.pad_id] * (width - len(i)) for i in ids], np.int32)
      zeros = np.zeros(tokens.shape, np.float32)
      return Rollouts(tokens=tokens, logprobs=zeros, tempered_logprobs=zeros,
                      lengths=np.array([len(i) for i in ids], np.int32), num_decode_steps=width)
    return fn

  def evaluate(solution_of):
    return Evaluator(problems=problems, prompt_tokens=prompts, decode=tok.decode,
                     reward=as_stage(task.reward).build(None), eos_ids=tok.eos_ids,
                     batch_size=4, greedy=generate(solution_of), answer=task.answer,
                     progress=False)(None, jax.random.key(0))

  assert evaluate(lambda i: problems[i].fields["answer"])["eval/greedy_pass@1"] == 1.0
  # Problem 0's solution (56) answers no other problem.
  assert evaluate(lambda i: problems[0].fields["answer"])["eval/greedy_pass@1"] == pytest.approx(1 / 6)


@pytest.mark.slow
def test_the_tiny_recipe_runs_end_to_end(tmp_path):
  from tba_jax import loop
  from tba_jax.metrics import read_jsonl
  c = math_config.get_config("tiny,mesh.num_devices=1,export=false")
  loop.run(c, str(tmp_path))
  rows = [r for r in read_jsonl(str(tmp_path / "metrics.jsonl")) if "reward_mean" in r]
  assert [r["step"] for r in rows] == [1, 2, 3, 4]
  evals = [r for r in read_jsonl(str(tmp_path / "metrics.jsonl")) if "eval/pass@2" in r]
  assert evals and all(0 <= r["eval/greedy_pass@1"] <= 1 for r in evals)
