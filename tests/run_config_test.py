"""A run's WORKDIR/config.yaml (tba_jax/run_config.py) read back through `--config
W/config.yaml` (experiments/launch.py, experiments/saved_config.py): the same resolved
config, every key's type kept, and a file of another experiment refused by name."""
import os

import pytest

from conftest import ROOT
from experiments import launch
from tba_jax import run_config
from tba_jax.errors import ConfigError


def _reread(path, default_config):
  """The config `--config path` gives the experiment of `default_config` (launch's reading)."""
  argv = launch._saved_configs(["prog", "--config", path], default_config)
  return launch._load_config_file(argv[2])


@pytest.mark.parametrize("experiment, spec", [
    ("gsm8k", "configs/gsm8k.py:tiny,num_train_steps=3,sampler.temperature=0.9,loss.beta_end=1e-5"),
    ("gsm8k", "configs/suite.py:word,tiny"),   # another config file's recipe, same keys
    ("tools", "configs/tools.py:cpu,task.tools.call_format=tag"),
    ("tldr", "configs/tldr.py:tiny"),
    ("dataset", "configs/dataset.py:tiny"),
    ("sft", "configs/sft.py:tiny")])     # a job with a base of its own
def test_config_yaml_reads_back_as_the_same_config_with_the_same_types(tmp_path, experiment,
                                                                       spec):
  config = launch._load_config_file(os.path.join(ROOT, spec))
  path = run_config.write(str(tmp_path / "run"), config.to_dict())
  assert path == str(tmp_path / "run" / "config.yaml")
  assert open(path).read().startswith("# The resolved config of the run in this directory")
  again = _reread(path, f"{experiment}.py:{config.variant}")
  want, got = run_config.flatten(config.to_dict()), run_config.flatten(again.to_dict())
  assert got == want
  assert {k: type(v) for k, v in got.items()} == {k: type(v) for k, v in want.items()}
  assert again.is_locked  # as every config file's: a mistyped override is still refused


def test_the_rewrite_reads_both_spellings_and_leaves_other_flags(tmp_path):
  argv = ["prog", "--config=W/config.yaml", "--config.seed=3", "--config", "X/c.yml",
          "--workdir", "W"]
  out = launch._saved_configs(argv, "tools.py:tiny")
  own = os.path.join(launch._CONFIGS, "tools.py")
  assert out[1] == f"--config={launch._SAVED}:{own}:{os.path.abspath('W/config.yaml')}"
  assert out[4] == f"{launch._SAVED}:{own}:{os.path.abspath('X/c.yml')}"
  assert out[2] == "--config.seed=3" and out[5:] == ["--workdir", "W"]
  plain = ["prog", "--config", "configs/gsm8k.py:tiny"]
  assert launch._saved_configs(plain, "gsm8k.py:cpu") == plain


def test_a_file_of_another_experiment_is_refused_naming_its_keys(tmp_path):
  tools = launch._load_config_file(os.path.join(ROOT, "configs/tools.py:tiny"))
  path = run_config.write(str(tmp_path), tools.to_dict())
  with pytest.raises(ConfigError, match=r"unknown \['task.digits', 'task.num_test'"):
    _reread(path, "gsm8k.py:cpu")  # the tools keys are not GSM8K's
  gsm8k = launch._load_config_file(os.path.join(ROOT, "configs/gsm8k.py:tiny")).to_dict()
  del gsm8k["sampler"]["top_k"]
  path = run_config.write(str(tmp_path), gsm8k)
  with pytest.raises(ConfigError, match=r"missing \['sampler.top_k'\]"):
    _reread(path, "gsm8k.py:cpu")


def test_a_value_of_the_wrong_type_or_a_file_that_is_no_config_is_refused(tmp_path):
  c = launch._load_config_file(os.path.join(ROOT, "configs/gsm8k.py:tiny")).to_dict()
  c["sampler"]["max_new_tokens"] = "many"
  path = run_config.write(str(tmp_path), c)
  with pytest.raises(ConfigError, match="sampler.max_new_tokens='many'"):
    _reread(path, "gsm8k.py:cpu")
  (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
  with pytest.raises(ConfigError, match="not a run's config.yaml"):
    _reread(str(tmp_path / "list.yaml"), "gsm8k.py:cpu")


def test_a_missing_config_yaml_is_named_before_anything_runs(tmp_path):
  message = launch._missing_config_file(["prog", "--config", str(tmp_path / "config.yaml")])
  assert message.startswith(f"config file '{tmp_path}/config.yaml' does not exist (a run writes")
