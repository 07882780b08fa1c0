r"""Your data set and reward function (experiments/dataset.py, tba_jax/tasks/dataset.py).

Usage: python -m experiments.dataset --config configs/dataset.py:VARIANT --workdir DIR \
         --config.task.path=FILE_OR_DIR_OR_HUB_ID [--config.task.reward=PATH.py:FUNCTION]

Variants:

  tiny     The GSM8K smoke test's random 2-layer model and byte tokenizer, 2 steps, offline:
           checks a data file and a reward function end to end in seconds (its scores mean
           nothing). On the shipped verl-schema file and TRL-style reward function:
             python -m experiments.dataset --config configs/dataset.py:tiny \
                 --config.task.path=configs/data/arithmetic_verl.parquet \
                 --config.task.reward=configs/data/trl_reward.py:reward_func \
                 --workdir /tmp/dataset_tiny
           Hardware: any CPU. Measured 2026-12-06 on a shared 2-core machine (load 4-6, other
           test runs beside it): 23-43 s a run (tests/dataset_experiment_test.py), 57 s with
           verl_reward.py:compute_score and a cold compilation cache.
  smollm2  configs/gsm8k.py:cpu's recipe (the embedded SmolLM2-135M-Instruct, 2 CPU devices,
           8 steps) on the data set, prompts through the model's chat template:
             python -m experiments.dataset --config configs/dataset.py:smollm2 \
                 --config.task.path=configs/data/arithmetic_verl.parquet --workdir DIR
           Measured once on that file, 2026-12-06, seed 0, a shared 2-core machine (load 4-6,
           other test runs beside it): 6 min 57 s; the trained batches' reward (share correct)
           0.281 at step 1, 0.344-0.500 over steps 3-8. Its validation split is 1 row (5% of
           24): the evaluation's 0.000 -> 0.500 (2 samples) says little.

task (besides the base's prompt_style, question_suffix, system_prompt, max_prompt_len,
validation_fraction, num_train_problems):
  path       a .parquet / .jsonl / .json file (the train split), a directory of split files,
             or a hub data set id (needs `pip install datasets`)
  format     "auto" (from the columns), "verl", "trl" or "qa"
  reward     "" = the built-in checker the ground truths call for (all numbers: GSM8K's
             last-number rule; else math_verify), "paper_regex", "math_verify", or a function:
             PATH.py:FUNCTION or module.path:FUNCTION of TRL's or verl's signature
  *_split    the splits' names in a directory or hub data set
  validation_path, test_path   files of their own for those splits
  test_fraction  without a test split: this share of train is held out as it (fixed seed)
"""
from configs import common, gsm8k
from tba_jax.choices import DATASET_FORMATS
from tba_jax.config_checks import declare, key

VARIANTS = ("tiny", "smollm2")


def _dataset(c, **task):
  keys = declare(dict(
      path="",            # a data file, a directory of split files, or a hub data set id
      format=key("auto", DATASET_FORMATS),  # the schema: "auto" = from the train split's columns
      reward="",          # "" = by the ground truths; a checker; or PATH.py:FUNCTION
      train_split="train", validation_split="validation", test_split="test",
      validation_path="", test_path="",  # "" = from `path`, or held out of train
      # without a test split: this share of train is held out as it (a fixed seed)
      test_fraction=key(0.1, "[0, 1)"),
  ), "task.")
  for name, value in {**keys, **task}.items():
    c.task[name] = value
  c.task.name = "dataset"


def _tiny(c):
  gsm8k.RECIPES["tiny"](c)
  c.num_train_steps = 2
  # Chat prompts: a data set of messages is rendered by the byte tokenizer's template.
  _dataset(c, prompt_style="chat", max_prompt_len=96, validation_fraction=0.2,
           test_fraction=0.2)
  c.eval.update(every=0, split="validation")
  c.checkpoint.update(every=2)


def _smollm2(c):
  gsm8k.RECIPES["cpu"](c)
  _dataset(c, prompt_style="chat", question_suffix="", max_prompt_len=128)


RECIPES = {"tiny": _tiny, "smollm2": _smollm2}
assert tuple(RECIPES) == VARIANTS


def get_config(arg: str = "tiny"):
  return common.from_recipes(arg, "configs/dataset.py", RECIPES)
