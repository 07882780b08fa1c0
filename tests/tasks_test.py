"""GSM8K answer extraction, reward, loading, the offline arithmetic task and its splits."""
import os

import pytest

from tba_jax.errors import DataError
from tba_jax.tasks import Problem, arithmetic, gsm8k, hold_out, read_records

DATA = os.path.join(os.path.dirname(__file__), "data")


@pytest.mark.parametrize("text,want", [
    ("The answer is 1,234.", 1234.0),
    ("She has -5 apples, then 12.50 dollars", 12.5),
    ("first 3 then 4 then 72", 72.0),
    ("costs $1,000,000 in total", 1e6),
    ("ratio .5", 0.5),
    ("no number here", None),
    ("", None),
    ("negative result: -17", -17.0),
    # The paper's pattern (bbartoldson/TBA src/gsm8k_utils.py L10): signs, exponents,
    # trailing dots; alternatives tried in order, so a decimal with an exponent splits.
    ("1e3", 1000.0),
    ("so x = 2e-3", 0.002),
    ("-.5", -0.5),
    ("The answer is 3.", 3.0),
    ("+7", 7.0),
    ("12-3", -3.0),
    ("1.5e3", 3.0),
    ("1E3", 3.0),
    ("1e+2 and then .5.5", 0.5),
])
def test_extract_answer_takes_the_last_match_of_the_papers_pattern(text, want):
  assert gsm8k.extract_answer(text) == want


def test_gold_answer_is_the_number_after_hashes():
  assert gsm8k.gold_answer("48/2 = <<48/2=24>>24\n#### 72") == 72.0
  assert gsm8k.gold_answer("... #### 1,080") == 1080.0
  with pytest.raises(ValueError, match="no '####'"):
    gsm8k.gold_answer("just 5")


def test_reward_compares_as_floats():
  assert gsm8k.reward("so she has 72.0 clips", 72.0) == 1.0
  assert gsm8k.reward("72 clips, wait, 73", 72.0) == 0.0
  assert gsm8k.reward("I don't know", 72.0) == 0.0
  assert gsm8k.reward("The total is 1,080", 1080.0) == 1.0
  assert gsm8k.reward("1e3 dollars", 1000.0) == 1.0
  assert gsm8k.reward("she is +7 up", 7.0) == 1.0


def test_load_local_jsonl_directory_and_file(tmp_path):
  problems = gsm8k.load("test", DATA + "/gsm8k_test.jsonl")
  assert len(problems) == 20 and problems[0].id == 0
  assert problems[0].fields["question"].startswith("Janet")
  assert problems[0].target == 18.0
  assert gsm8k.load("test", DATA + "/gsm8k_test.jsonl", limit=3)[2] == problems[2]
  (tmp_path / "test.jsonl").write_text(open(DATA + "/gsm8k_test.jsonl").read())
  assert gsm8k.load("test", str(tmp_path)) == problems
  with pytest.raises(DataError, match="no train.jsonl"):
    gsm8k.load("train", str(tmp_path))
  with pytest.raises(DataError, match="does not exist"):
    gsm8k.load("test", "/nonexistent/gsm8k.jsonl")


def test_paper_prompt_format():
  assert gsm8k.make_prompt("2+2?", "paper") == "[MATH TASK] Problem:\n2+2?\n\nSolution:\n"
  with pytest.raises(ValueError, match="unknown prompt style"):
    gsm8k.make_prompt("q", "fancy")


def test_arithmetic_splits_are_seeded_disjoint_and_answer_formatted():
  train, validation, test = arithmetic.make_problems("+*", 2, 9, seed=0, test_fraction=0.25,
                                                     validation_fraction=0.25)
  assert (len(train), len(validation), len(test)) == (64, 32, 32)
  questions = [{p.fields["question"] for p in s} for s in (train, validation, test)]
  assert sum(map(len, questions)) == 128 and len(set.union(*questions)) == 128  # disjoint
  for split in (train, validation, test):
    assert [p.id for p in split] == list(range(len(split)))  # unique ids within a split
  assert arithmetic.make_problems("+*", 2, 9, seed=0, test_fraction=0.25,
                                  validation_fraction=0.25) == (train, validation, test)
  assert arithmetic.make_problems("+*", 2, 9, seed=1, test_fraction=0.25,
                                  validation_fraction=0.25)[1] != validation
  for p in train + validation + test:
    a, op, b = p.fields["question"].removeprefix("What is ").removesuffix("?").split()
    assert p.target == (int(a) * int(b) if op == "*" else int(a) + int(b))
    assert gsm8k.gold_answer(p.fields["answer"]) == p.target
    assert gsm8k.reward(f"The answer is {int(p.target)}.", p.target) == 1.0
  with pytest.raises(ValueError, match="ops"):
    arithmetic.make_problems("/", 2, 9, seed=0, test_fraction=0.25)
  with pytest.raises(ValueError, match="empty split"):
    arithmetic.make_problems("+", 1, 2, seed=0, test_fraction=0.25, validation_fraction=0.75)


@pytest.mark.parametrize("ops,low,high,seed", [("+*", 2, 9, 0), ("+", 1, 4, 0), ("*", 7, 8, 3)])
def test_the_test_split_is_the_one_before_there_was_a_validation_split(ops, low, high, seed):
  """Earlier test figures stay comparable: the test split is the old code's (below, as it
  was), and validation and train are its former train split."""
  import numpy as np
  triples = [(a, op, b) for op in ops for a in range(low, high + 1) for b in range(low, high + 1)]
  order = np.random.default_rng(seed).permutation(len(triples))
  num_test = int(round(0.25 * len(triples)))
  old_test = [(i, "What is {} {} {}?".format(*triples[k])) for i, k in enumerate(order[:num_test])]
  old_train = {"What is {} {} {}?".format(*triples[k]) for k in order[num_test:]}
  train, validation, test = arithmetic.make_problems(ops, low, high, seed=seed,
                                                     test_fraction=0.25, validation_fraction=0.25)
  assert [(p.id, p.fields["question"]) for p in test] == old_test
  assert {p.fields["question"] for p in train + validation} == old_train


def test_two_op_answers_follow_precedence():
  assert arithmetic.evaluate(3, "+", 4, "*", 2) == 11
  assert arithmetic.evaluate(3, "*", 4, "+", 2) == 14
  assert arithmetic.evaluate(9, "-", 4, "-", 2) == 3
  assert arithmetic.evaluate(9, "-", 4, "*", 2) == 1
  train, validation, test = arithmetic.make_problems("+-*", 2, 5, seed=0, test_fraction=0.25,
                                                     validation_fraction=0.25, form="two_op")
  assert len(train + validation + test) == 9 * 4 ** 3
  for p in train + validation + test:
    expression = p.fields["question"].removeprefix("What is ").removesuffix("?")
    assert p.target == eval(expression)  # Python's precedence is the usual one
    assert gsm8k.gold_answer(p.fields["answer"]) == p.target


def test_word_problems_are_varied_seeded_and_never_negative():
  train, validation, test = arithmetic.make_problems("+-*", 2, 9, seed=0, test_fraction=0.25,
                                                     validation_fraction=0.25, form="word")
  problems = train + validation + test
  assert len(problems) == 2 * (64 + 28 + 64)  # two templates per op; "-" only with a > b
  assert len({p.fields["question"] for p in problems}) == len(problems)
  assert all(p.target >= 0 for p in problems)
  assert len({p.fields["question"].split()[0] for p in problems}) > 5  # names and "There"
  again = arithmetic.make_problems("+-*", 2, 9, seed=0, test_fraction=0.25,
                                   validation_fraction=0.25, form="word")
  assert again == (train, validation, test)
  for p in problems:
    a, op, b = p.fields["answer"].split("=")[0].split()
    assert p.target == arithmetic.evaluate(int(a), op, int(b))
    assert a in p.fields["question"] and b in p.fields["question"]


def test_num_problems_draws_a_seeded_subset():
  train, validation, test = arithmetic.make_problems("+-*", 10, 99, seed=0, test_fraction=0.25,
                                                     validation_fraction=0.25, num_problems=400)
  assert (len(train), len(validation), len(test)) == (200, 100, 100)
  with pytest.raises(ValueError, match="only 4 problems"):
    arithmetic.make_problems("+", 1, 2, seed=0, test_fraction=0.25, num_problems=5)


def test_hold_out_is_seeded_keeps_ids_and_leaves_train():
  problems = [Problem(i, {"question": str(i)}) for i in range(40)]
  rest, held = hold_out(problems, 0.05)
  assert len(held) == 2 and len(rest) == 38 and hold_out(problems, 0.05) == (rest, held)
  assert sorted(p.id for p in rest + held) == list(range(40))  # ids kept, disjoint
  assert len(hold_out(problems[:3], 0.05)[1]) == 1  # at least one
  assert hold_out(problems, 0.0) == (problems, [])
  with pytest.raises(ValueError, match="leaves none"):
    hold_out(problems[:1], 0.5)


def test_gsm8k_validation_is_held_out_of_train_and_test_is_untouched(tmp_path):
  from configs import gsm8k as gsm8k_config
  from tba_jax import config_builders, tokenizer
  for split in ("train", "test"):
    (tmp_path / f"{split}.jsonl").write_text(open(f"{DATA}/gsm8k_{split}.jsonl").read())
  c = gsm8k_config.get_config(f"tiny,task.name=gsm8k,task.data_path={tmp_path}")
  task = config_builders.build_task(c.task, tokenizer.byte_tokenizer())
  assert (len(task.train), len(task.validation)) == (38, 2)  # 5% of the 40, at least one
  assert sorted(p.id for p in task.train + task.validation) == list(range(40))  # row numbers
  assert task.test == gsm8k.load("test", str(tmp_path))
  again = config_builders.build_task(c.task, tokenizer.byte_tokenizer())
  assert again.validation == task.validation  # a fixed seed, not the run's


def test_default_hub_path_reads_the_parquet_file_with_the_declared_dependencies(tmp_path,
                                                                               monkeypatch):
  # The hub's GSM8K files are parquet: their reader must come with `pip install -e .`.
  import re

  import huggingface_hub
  import pyarrow
  import pyarrow.parquet
  with open(os.path.join(os.path.dirname(DATA), "..", "setup.py")) as f:
    install_requires = re.search(r"install_requires=\[(.*?)\]", f.read(), re.S).group(1)
  assert '"pyarrow"' in install_requires
  rows = read_records(DATA + "/gsm8k_test.jsonl")
  parquet = tmp_path / "main" / "test-00000-of-00001.parquet"
  parquet.parent.mkdir()
  pyarrow.parquet.write_table(pyarrow.Table.from_pylist(rows), str(parquet))
  requested = []

  def download(repo_id, filename, repo_type):
    requested.append((repo_id, filename, repo_type))
    return str(tmp_path / filename)

  monkeypatch.setattr(huggingface_hub, "hf_hub_download", download)
  problems = gsm8k.load("test")  # task.data_path "" -> the hub
  assert requested == [("openai/gsm8k", "main/test-00000-of-00001.parquet", "dataset")]
  assert problems == gsm8k.load("test", DATA + "/gsm8k_test.jsonl")


def test_a_malformed_jsonl_line_is_named_by_file_and_line(tmp_path):
  path = tmp_path / "test.jsonl"
  good = '{"question": "q", "answer": "#### 1"}\n'
  path.write_text(good + "\n" + '{"question": "q" "answer": "#### 2"}\n')
  with pytest.raises(DataError, match=rf"^{path}, line 3: not valid JSON \(Expecting ',' "
                                      r"delimiter, column 18\)"):
    gsm8k.load("test", str(path))
  path.write_text(good + "[1, 2]\n")
  with pytest.raises(DataError, match=rf"^{path}, line 2: expected a JSON object, got list"):
    gsm8k.load("test", str(path))
