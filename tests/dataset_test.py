"""The data set task (tba_jax/tasks/dataset.py): the three schemas read as the same problems,
chat prompts rendered by the template (or without one), splits from names, files or a fixed
seed, and each bad input one named error before the run writes its workdir."""
import json
import os
import sys
import types

import pytest

from tba_jax import tasks, verifiers
from tba_jax.errors import ConfigError, DataError, UserError
from tba_jax.tasks import dataset
from tba_jax.tokenizer import byte_tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHIPPED = os.path.join(ROOT, "configs", "data", "arithmetic_verl")
BYTES_CHAT = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"


def _question(i: int) -> str:
  return f"What is {i} + 1?"


def _verl(i: int) -> dict:
  return {"data_source": "toy", "prompt": [{"role": "user", "content": _question(i)}],
          "ability": "math", "reward_model": {"style": "rule", "ground_truth": str(i + 1)},
          "extra_info": {"index": i}}


def _trl(i: int) -> dict:
  return {"prompt": [{"role": "user", "content": _question(i)}], "solution": str(i + 1)}


def _qa(i: int) -> dict:
  return {"question": _question(i), "answer": f"{i} + 1 = {i + 1}\n#### {i + 1}"}


def _write(path, rows) -> str:
  with open(path, "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in rows)
  return str(path)


def _task(path, reward="", max_prompt_len=64, style="chat", **source):
  return dataset.make_task(dataset.Source(str(path), **source), byte_tokenizer(),
                           reward=reward, prompting=dataset.Prompting(style),
                           max_prompt_len=max_prompt_len)


# ----- Schemas ----------------------------------------------------------------------------
def test_each_schema_is_detected_from_its_columns_and_a_named_one_wins():
  assert dataset.detect_format(_verl(0)) == "verl"
  assert dataset.detect_format(_trl(0)) == "trl"
  assert dataset.detect_format(_qa(0)) == "qa"
  assert dataset.detect_format(_verl(0), "trl") == "trl"  # a verl row has TRL's prompt too
  with pytest.raises(DataError, match=r"cannot tell the data set's schema from its columns "
                                      r"\(input, output\): expected verl: .*; trl: .*; qa: "):
    dataset.detect_format({"input": 1, "output": 2})
  with pytest.raises(ConfigError, match="task.format='csv': must be 'auto' or one of 'verl', "
                                        "'trl', 'qa'"):
    dataset.detect_format(_qa(0), "csv")


def test_the_config_offers_the_formats_the_task_knows_and_every_recipe_passes(monkeypatch):
  from configs import dataset as dataset_config
  from experiments import dataset as dataset_experiment
  from tba_jax import choices, config_builders, config_checks
  assert choices.DATASET_FORMATS == ("auto", *dataset.FORMATS)
  monkeypatch.setitem(config_builders.TASKS, "dataset", dataset_experiment.TASKS["dataset"])
  for variant in dataset_config.VARIANTS:
    config = dataset_config.get_config(variant)
    config_checks.validate(config)
    assert config.task.name == "dataset" and config.task.path == "" and config.variant == variant
  config.unlock()
  config.task.format = "csv"
  with pytest.raises(ConfigError, match="task.format='csv': must be one of 'auto', 'verl', "
                                        "'trl', 'qa'"):
    config_checks.validate(config)


def test_the_three_schemas_of_one_data_set_make_the_same_task(tmp_path):
  """Chat prompts (verl, TRL) and a plain question under prompt_style chat: one text per
  problem; GSM8K's "#### 5" and the ground truth "5" one gold; the same seeded splits."""
  tasks = {kind: _task(_write(tmp_path / f"{kind}.jsonl", [make(i) for i in range(20)]),
                       validation_fraction=0.25, test_fraction=0.2)
           for kind, make in (("verl", _verl), ("trl", _trl), ("qa", _qa))}
  for split in ("train", "validation", "test"):
    seen = {k: [(p.id, t.prompt(p), p.target) for p in getattr(t, split)]
            for k, t in tasks.items()}
    assert seen["verl"] == seen["trl"] == seen["qa"], split
  assert [len(tasks["qa"].test), len(tasks["qa"].validation), len(tasks["qa"].train)] == [4, 4, 12]
  p = tasks["qa"].train[0]
  assert tasks["qa"].prompt(p) == BYTES_CHAT.format(_question(p.id)) and p.target == p.id + 1.0
  assert all(t.templated_prompts for t in tasks.values())
  assert all(t.reward == verifiers.VerifierReward("paper_regex") for t in tasks.values())
  assert tasks["verl"].train[0].fields == _verl(tasks["verl"].train[0].id)  # the row, whole


def test_the_shipped_parquet_file_is_the_jsonl_file_in_verls_schema():
  parquet = dataset.read_rows(SHIPPED + ".parquet")
  assert parquet == dataset.read_rows(SHIPPED + ".jsonl")
  assert len(parquet) == 24 and dataset.detect_format(parquet[0]) == "verl"
  task = _task(SHIPPED + ".parquet", max_prompt_len=96, validation_fraction=0.2,
               test_fraction=0.2)
  assert (len(task.train), len(task.validation), len(task.test)) == (15, 4, 5)
  assert all(isinstance(p.target, float) for p in task.train + list(task.test))


# ----- Prompts ----------------------------------------------------------------------------
def test_chat_prompts_use_the_template_and_a_plain_rendering_without_one():
  messages = [{"role": "user", "content": "What is 2 + 3?"}]
  tokenizer = byte_tokenizer()
  render, templated = dataset.renderer(tokenizer, dataset.Prompting("{question}="), chat=True)
  assert render(messages) == BYTES_CHAT.format("What is 2 + 3?") and templated
  assert render("Hi") == BYTES_CHAT.format("Hi")  # a text prompt among messages: a user turn
  ids = tokenizer.encode_prompt(render(messages), templated=True)
  assert ids[0] == tokenizer.hf.convert_tokens_to_ids("<|im_start|>")  # one token, no BOS
  # A system turn and a suffix, where the messages have no system turn of their own.
  render, _ = dataset.renderer(tokenizer, dataset.Prompting("chat", " Be brief.", "Be kind."),
                               chat=True)
  assert render(messages) == ("<|im_start|>system\nBe kind.<|im_end|>\n" +
                              BYTES_CHAT.format("What is 2 + 3? Be brief."))
  # Text prompts keep the prompt style when the data set has no messages.
  render, templated = dataset.renderer(tokenizer, dataset.Prompting("Q: {question}\nA:"),
                                       chat=False)
  assert render("What is 2 + 3?") == "Q: What is 2 + 3?\nA:" and not templated
  tokenizer.hf.chat_template = None
  render, templated = dataset.renderer(tokenizer, dataset.Prompting("chat"), chat=True)
  assert render([{"role": "system", "content": "Be kind."}, *messages]) == (
      "system: Be kind.\nuser: What is 2 + 3?\nassistant: ") and not templated


def test_a_prompt_that_is_neither_text_nor_messages_is_named_with_its_row(tmp_path):
  rows = [_trl(0), {"prompt": [{"role": "user"}], "solution": "1"}]
  with pytest.raises(DataError, match=r"trl.jsonl: row 1: the prompt is neither text nor a "
                                      r"list of chat messages"):
    _task(_write(tmp_path / "trl.jsonl", rows))


# ----- Splits -----------------------------------------------------------------------------
def test_split_files_in_a_directory_and_files_of_their_own(tmp_path):
  import pyarrow as pa
  import pyarrow.parquet as pq
  folder = tmp_path / "data"
  folder.mkdir()
  _write(folder / "train.jsonl", [_qa(i) for i in range(10)])
  pq.write_table(pa.Table.from_pylist([_qa(i) for i in range(100, 103)]),
                 str(folder / "test.parquet"))
  task = _task(folder, validation_fraction=0.2)
  assert [p.target for p in task.test] == [101.0, 102.0, 103.0]  # the file's, whole
  assert len(task.validation) == 2 and len(task.train) == 8
  again = _task(folder, validation_fraction=0.2)
  assert [p.id for p in again.validation] == [p.id for p in task.validation]  # a fixed seed
  other = _write(tmp_path / "mine.jsonl", [_qa(i) for i in range(200, 205)])
  task = _task(folder, validation_fraction=0.2, validation_path=other, split_names=(
      "train", "validation", "eval"))
  assert [p.target for p in task.validation] == [201.0, 202.0, 203.0, 204.0, 205.0]
  assert len(task.train) == 9 and len(task.test) == 1  # no "eval" file: 10% of train


def test_a_json_file_is_a_list_of_objects_or_one_object_a_line(tmp_path):
  rows = [_qa(i) for i in range(3)]
  (tmp_path / "list.json").write_text(json.dumps(rows))
  assert dataset.read_rows(str(tmp_path / "list.json")) == rows
  assert dataset.read_rows(_write(tmp_path / "lines.json", rows)) == rows
  (tmp_path / "bad.json").write_text(json.dumps([1, 2]))
  with pytest.raises(DataError, match="bad.json: expected a JSON list of objects, or one "
                                      "object a line"):
    dataset.read_rows(str(tmp_path / "bad.json"))
  with pytest.raises(DataError, match=r"rows.csv: not a \.parquet, \.jsonl or \.json file"):
    dataset.read_rows(str(tmp_path / "rows.csv"))


def test_one_file_is_cut_into_test_then_validation_with_fixed_seeds(tmp_path):
  path = _write(tmp_path / "qa.jsonl", [_qa(i) for i in range(40)])
  task = _task(path, validation_fraction=0.1, test_fraction=0.25)
  ids = [sorted(p.id for p in getattr(task, s)) for s in ("train", "validation", "test")]
  assert list(map(len, ids)) == [27, 3, 10]
  assert sorted(sum(ids, [])) == list(range(40))
  assert ids[2] == sorted(tasks.hold_out(list(range(40)), 0.25, seed=dataset.TEST_SEED)[1])
  with pytest.raises(ConfigError, match="task.test_fraction=0.5: it leaves none of the 1 rows"):
    _task(_write(tmp_path / "one.jsonl", [_qa(0)]), test_fraction=0.5)


def test_a_hub_id_is_read_through_the_datasets_library(monkeypatch):
  asked = []

  class Split(list):
    def to_list(self):
      return list(self)

  def load_dataset(name):
    asked.append(name)
    return {"train": Split(_trl(i) for i in range(10)), "test": Split([_trl(50), _trl(51)])}

  monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
  task = _task("someone/toy-math", validation_fraction=0.2)
  assert asked == ["someone/toy-math"]
  assert [p.target for p in task.test] == [51.0, 52.0] and len(task.train) == 8
  with pytest.raises(DataError, match=r"has no split 'training' \(it has train, test\)"):
    _task("someone/toy-math", split_names=("training", "validation", "test"))
  empty = lambda name: {"train": Split(_trl(i) for i in range(10)), "test": Split()}
  monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=empty))
  with pytest.raises(DataError, match=r"^someone/toy-math \(test split\): the test split is "
                                      r"empty$"):
    _task("someone/toy-math")
  monkeypatch.setitem(sys.modules, "datasets", None)  # not installed
  with pytest.raises(DataError, match="needs the `datasets` library: pip install datasets"):
    _task("someone/toy-math")


# ----- Bad input: one named error each ---------------------------------------------------
def _bad_inputs(tmp_path) -> dict:
  """name -> (the file, task keyword arguments, the error's type and a piece of its text)."""
  rows = [_verl(i) for i in range(10)]
  long = [dict(r) for r in rows]
  for i in (3, 7):
    long[i] = {**rows[i], "prompt": [{"role": "user", "content": "x" * (40 + i)}]}
  no_reward_model = rows[:4] + [{k: v for k, v in rows[4].items() if k != "reward_model"}]
  latex = [dict(r, reward_model={"ground_truth": "\\frac{a}{b}"}) for r in rows]
  _write(tmp_path / "empty.jsonl", [])
  return {
      "missing column": (_write(tmp_path / "a.jsonl", no_reward_model), dict(format="verl"),
                         DataError, "a.jsonl: row 4 has no 'reward_model' column, which format "
                         "'verl' needs"),
      "empty split": (_write(tmp_path / "b.jsonl", rows), dict(test_path=str(
          tmp_path / "empty.jsonl")), DataError, "empty.jsonl: the file holds no rows"),
      # the byte template adds 19 tokens: 62 and 66
      "long prompt": (_write(tmp_path / "c.jsonl", long), dict(max_prompt_len=50), ConfigError,
                      "task.max_prompt_len=50: 2 of 10 prompts are longer (the longest, row 7 "
                      f"of {tmp_path / 'c.jsonl'}, has 66 tokens); raise "
                      "task.max_prompt_len to at least 66"),
      "unparsable truth": (_write(tmp_path / "d.jsonl", latex), dict(reward="paper_regex"),
                           DataError, "the checker paper_regex cannot parse the ground truth "
                           "'\\\\frac{a}{b}' (10 of 10 rows)"),
  }


@pytest.mark.parametrize("case", ["missing column", "empty split", "long prompt",
                                  "unparsable truth"])
def test_each_bad_input_is_one_named_error_and_no_workdir_is_written(tmp_path, case,
                                                                     monkeypatch):
  from configs import dataset as dataset_config
  from experiments import dataset as dataset_experiment
  from tba_jax import config_builders, loop
  path, kw, error, text = _bad_inputs(tmp_path)[case]
  config = dataset_config.get_config("tiny")
  config.unlock()
  config.task.update(path=path, **kw)
  with pytest.raises(error) as built:  # the builder, as the run calls it
    dataset_experiment.TASKS["dataset"](config.task, byte_tokenizer())
  assert text in str(built.value) and "\n" not in str(built.value)
  monkeypatch.setitem(config_builders.TASKS, "dataset", dataset_experiment.TASKS["dataset"])
  workdir = tmp_path / "run"
  with pytest.raises(UserError) as ran:
    loop.run(config, str(workdir))
  assert str(ran.value) == str(built.value)
  assert not workdir.exists()


def test_math_verify_is_chosen_for_latex_golds_and_refuses_one_it_cannot_parse(tmp_path):
  rows = [_verl(i) for i in range(6)]
  rows[2] = dict(rows[2], reward_model={"ground_truth": "\\frac{1}{2}"})
  task = _task(_write(tmp_path / "latex.jsonl", rows), test_fraction=0.2)
  assert task.reward == verifiers.VerifierReward("math_verify")
  golds = [p.target for p in [*task.train, *task.validation, *task.test]]
  assert [g for g in golds if isinstance(g, str)] == ["\\frac{1}{2}"]
  rows[4] = dict(rows[4], reward_model={"ground_truth": "?"})
  with pytest.raises(DataError, match=r"latex.jsonl: row 4: the checker math_verify cannot "
                                      r"parse the ground truth '\?' \(1 of 6 rows\)"):
    _task(_write(tmp_path / "latex.jsonl", rows), test_fraction=0.2)


def test_a_missing_ground_truth_is_refused_only_where_a_built_in_checker_needs_it(tmp_path):
  rows = [{"prompt": _question(i)} for i in range(6)]  # TRL's prompt-only data set
  path = _write(tmp_path / "prompts.jsonl", rows)
  with pytest.raises(DataError, match="prompts.jsonl: row 0 has no ground truth"):
    _task(path)
  reward = str(tmp_path / "r.py")
  with open(reward, "w") as f:
    f.write("def reward_func(prompts, completions, **kw):\n  return [1.0] * len(prompts)\n")
  task = _task(path, reward=f"{reward}:reward_func", test_fraction=0.2)
  assert task.reward.kind == "trl" and all(p.target is None for p in task.train)
