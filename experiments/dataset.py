r"""Your data set (verl / TRL / question-answer schema) and reward function, no code.

A parquet / JSONL / JSON file, a directory of split files or a hub data set in verl's, TRL's
or question / answer schema (tba_jax/tasks/dataset.py), scored by a function of TRL's or
verl's signature (tba_jax/tasks/reward_functions.py) or a built-in checker. Recipes in
configs/dataset.py; docs/datasets.md.

  python -m experiments.dataset --config configs/dataset.py:tiny \
      --config.task.path=configs/data/arithmetic_verl.parquet \
      --config.task.reward=configs/data/trl_reward.py:reward_func --workdir /tmp/dataset_tiny

The flags are experiments/launch.py's, shared by every experiment.
"""
from experiments import launch
from tba_jax.tasks import dataset


def _task(t, tokenizer):
  """The config's task section unpacked into the data set task's arguments."""
  source = dataset.Source(
      t.path, t.format, (t.train_split, t.validation_split, t.test_split),
      validation_path=t.validation_path, test_path=t.test_path,
      validation_fraction=t.validation_fraction, test_fraction=t.test_fraction)
  return dataset.make_task(
      source, tokenizer, reward=t.reward, max_prompt_len=t.max_prompt_len,
      prompting=dataset.Prompting(t.prompt_style, t.question_suffix, t.system_prompt),
      num_train_problems=t.num_train_problems, name=t.name)


# config task.name -> fn(task section, tokenizer) -> Task (config_builders.TASKS).
TASKS = {"dataset": _task}

if __name__ == "__main__":
  launch.main("dataset.py:tiny", tasks=TASKS)
